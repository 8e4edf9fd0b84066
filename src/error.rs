//! The one error type of lava-flow.
//!
//! Every variant carries a message that says what went wrong, with the context a user needs
//! (which file, which size, which peer) and, where there is one, how to fix it. The C API maps
//! each variant to one `lf_status` value (see `ffi::status`), so the variants are the status
//! classes a caller can branch on; the message is for humans.

use std::io;
use std::path::Path;

/// Shorthand for results whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument is out of range or malformed (size 0, unknown enum value, bad name, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A configuration file could not be read or does not describe what it must.
    #[error("config file {path}: {problem}")]
    Config { path: String, problem: String },

    /// Something that was looked up by name or address does not exist.
    #[error("not found: {0}")]
    NotFound(String),

    /// The system could not provide the memory (or the reservation, or the lock) asked for.
    #[error("out of memory: {0}")]
    OutOfMemory(String),

    /// The platform, driver or build lacks what the request needs.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// The operating system refused for lack of permission.
    #[error("permission denied: {0}")]
    PermissionDenied(String),

    /// A system call failed for another reason.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A Vulkan call failed.
    #[error("vulkan: {0}")]
    Vulkan(String),

    /// A non-blocking operation could not proceed now; retry later.
    #[error("would block: {0}")]
    WouldBlock(String),

    /// A blocking operation ran out of time.
    #[error("timed out: {0}")]
    Timeout(String),

    /// The process on the other side of a channel or import has gone away.
    #[error("peer gone: {0}")]
    PeerGone(String),

    /// Shared state that another process can write failed validation.
    #[error("corrupt shared state: {0}")]
    Corrupt(String),

    /// The object is in a state where the operation makes no sense (closed, released, ...).
    #[error("invalid state: {0}")]
    InvalidState(String),
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    pub(crate) fn config(path: &Path, problem: impl Into<String>) -> Self {
        Error::Config { path: path.display().to_string(), problem: problem.into() }
    }

    /// Wraps an OS error with what was being attempted; EPERM/EACCES and ENOMEM get their own
    /// variants so that callers (and C status codes) can tell them apart. (By the error's kind,
    /// which std derives from each OS's own codes: errno values on Unix, `ERROR_ACCESS_DENIED`,
    /// `ERROR_NOT_ENOUGH_MEMORY` and the like on Windows.)
    pub(crate) fn os(context: impl Into<String>, source: io::Error) -> Self {
        let context = context.into();
        match source.kind() {
            io::ErrorKind::PermissionDenied => Error::PermissionDenied(format!("{context}: {source}")),
            io::ErrorKind::OutOfMemory => Error::OutOfMemory(format!("{context}: {source}")),
            _ => Error::Io { context, source },
        }
    }

    /// The OS error of the last failed system call, with context.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn last_os(context: impl Into<String>) -> Self {
        Error::os(context, io::Error::last_os_error())
    }
}

/// A CUDA driver error as a lava-flow error: an unavailable driver is `Unsupported`; a failed
/// call is classed by its code (an invalid value, out of memory, no device; anything else is
/// the driver refusing in its present state).
impl From<lava_flow_cuda::Error> for Error {
    fn from(error: lava_flow_cuda::Error) -> Self {
        use lava_flow_cuda::sys;
        let message = error.to_string();
        match error.code() {
            None => Error::Unsupported(message),
            Some(sys::CUDA_ERROR_INVALID_VALUE) => Error::InvalidArgument(message),
            Some(sys::CUDA_ERROR_OUT_OF_MEMORY) => Error::OutOfMemory(message),
            Some(sys::CUDA_ERROR_NO_DEVICE | sys::CUDA_ERROR_NOT_SUPPORTED) => Error::Unsupported(message),
            Some(_) => Error::InvalidState(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform's codes for: not permitted, out of memory, no such file.
    #[cfg(unix)]
    const CODES: (i32, i32, i32) = (libc::EPERM, libc::ENOMEM, libc::ENOENT);
    /// `ERROR_ACCESS_DENIED`, `ERROR_NOT_ENOUGH_MEMORY`, `ERROR_FILE_NOT_FOUND`.
    #[cfg(windows)]
    const CODES: (i32, i32, i32) = (5, 8, 2);

    #[test]
    fn os_errors_are_classified_by_errno() {
        let (eperm, enomem, enoent) = CODES;
        let eperm = Error::os("mlock", io::Error::from_raw_os_error(eperm));
        assert!(matches!(eperm, Error::PermissionDenied(ref m) if m.starts_with("mlock: ")));
        let enomem = Error::os("mmap", io::Error::from_raw_os_error(enomem));
        assert!(matches!(enomem, Error::OutOfMemory(_)));
        let enoent = Error::os("open /x", io::Error::from_raw_os_error(enoent));
        assert!(matches!(enoent, Error::Io { .. }));
        assert!(enoent.to_string().starts_with("open /x: "));
    }
}
