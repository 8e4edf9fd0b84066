//! The runtime directory, where channels meet: where it is, its checks (a real directory of
//! this user, closed to others), and the path of a channel's socket in it.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::os::user;

/// Overrides the runtime directory (tests, or several isolated groups of processes).
pub const RUNTIME_DIR_ENV: &str = crate::env::RUNTIME_DIR.name;

/// Where the runtime directory is (see [`runtime_dir`]), without creating or checking it.
pub fn runtime_dir_path() -> PathBuf {
    match std::env::var_os(RUNTIME_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let (dir, passed_over) = user::default_runtime_dir();
            if let Some(x) = passed_over {
                crate::logging::log_first!(
                    log::Level::Info,
                    "XDG_RUNTIME_DIR={} is not a directory: channel sockets go to {}; set {RUNTIME_DIR_ENV} to \
                     choose the directory",
                    Path::new(&x).display(),
                    dir.display()
                );
            }
            dir
        }
    }
}

/// The per-user directory holding rendezvous sockets, created if missing and checked.
pub fn runtime_dir() -> Result<PathBuf> {
    let dir = runtime_dir_path();
    match user::create_private_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::os(format!("creating runtime dir {}", dir.display()), e)),
    }
    let meta =
        std::fs::symlink_metadata(&dir).map_err(|e| Error::os(format!("checking runtime dir {}", dir.display()), e))?;
    if !meta.is_dir() {
        return Err(Error::PermissionDenied(format!(
            "runtime dir {} is not a directory (a symlink or file is in the way); remove it",
            dir.display()
        )));
    }
    if let Some(problem) = user::private_dir_problem(&meta) {
        return Err(Error::PermissionDenied(format!(
            "runtime dir {} {problem}: fix or remove it, or set {RUNTIME_DIR_ENV}",
            dir.display()
        )));
    }
    Ok(dir)
}

/// The socket path of channel `name` (already validated).
pub fn socket_path(name: &str) -> Result<PathBuf> {
    let path = runtime_dir()?.join(format!("{name}.sock"));
    if path.as_os_str().len() >= 108 {
        return Err(Error::invalid(format!(
            "socket path {} is longer than the 107 bytes a Unix socket allows; use a shorter \
             channel name or {RUNTIME_DIR_ENV}",
            path.display()
        )));
    }
    Ok(path)
}
