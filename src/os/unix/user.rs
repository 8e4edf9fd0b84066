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

/// Creates the directory `dir` closed to other users (mode 0700).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

/// What is wrong with a directory where this user's processes meet (`meta` of the directory
/// itself), or `None`: it must belong to this user and be closed to others.
pub fn private_dir_problem(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let uid = id();
    (meta.uid() != uid || meta.mode() & 0o077 != 0).then(|| {
        format!(
            "belongs to uid {} with mode {:o}; lava-flow needs it owned by uid {uid} and closed to others (0700)",
            meta.uid(),
            meta.mode() & 0o7777
        )
    })
}
