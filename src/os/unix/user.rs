//! The user this process runs as, for the same-user checks of peers and runtime dirs.

/// This process's real user id.
pub fn id() -> u32 {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// The default directory where this user's processes meet: `$XDG_RUNTIME_DIR/lava-flow` where
/// that variable names a directory, else `/tmp/lava-flow-$UID`. Also returns the value of
/// `XDG_RUNTIME_DIR` when it was set but passed over (not a directory), for the caller to say.
pub fn default_runtime_dir() -> (std::path::PathBuf, Option<std::ffi::OsString>) {
    use std::path::{Path, PathBuf};
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) if !x.is_empty() && Path::new(&x).is_dir() => (Path::new(&x).join("lava-flow"), None),
        xdg => (PathBuf::from(format!("/tmp/lava-flow-{}", id())), xdg.filter(|x| !x.is_empty())),
    }
}
