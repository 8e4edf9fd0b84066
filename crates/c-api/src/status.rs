//! `lf_status`, the per-thread last-error message, and the library version.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use super::raw;
use lava_flow::error::Error;

/// The result of every fallible lava-flow function. `LF_OK` is 0; every other value is a
/// class of failure, and `lf_last_error_message()` says what exactly went wrong.
///
/// In C the type is a `uint32_t`: values from a newer library may be outside this list.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_status {
    LF_OK = 0,
    /// An argument is out of range or malformed.
    LF_ERR_INVALID_ARGUMENT = 1,
    /// A pointer argument that must not be NULL is NULL.
    LF_ERR_NULL_POINTER = 2,
    /// A handle argument is not a live handle of the expected type (freed, foreign, wrong type).
    LF_ERR_BAD_HANDLE = 3,
    /// A configuration file is missing, unreadable or malformed.
    LF_ERR_CONFIG = 4,
    /// Something looked up by name or address does not exist.
    LF_ERR_NOT_FOUND = 5,
    /// The system could not provide the memory, reservation or lock asked for.
    LF_ERR_OUT_OF_MEMORY = 6,
    /// The platform, driver or build lacks what the request needs.
    LF_ERR_UNSUPPORTED = 7,
    /// The operating system refused for lack of permission.
    LF_ERR_PERMISSION_DENIED = 8,
    /// A system call failed.
    LF_ERR_IO = 9,
    /// A Vulkan call failed.
    LF_ERR_VULKAN = 10,
    /// A non-blocking operation cannot proceed now; retry later.
    LF_ERR_WOULD_BLOCK = 11,
    /// A blocking operation ran out of time.
    LF_ERR_TIMEOUT = 12,
    /// The peer process has gone away.
    LF_ERR_PEER_GONE = 13,
    /// Shared state written by another process failed validation.
    LF_ERR_CORRUPT = 14,
    /// The object is in a state where the operation makes no sense (closed, released, ...).
    LF_ERR_INVALID_STATE = 15,
    /// A bug in lava-flow was caught at the API boundary; the message has the details.
    LF_ERR_INTERNAL = 16,
}

impl lf_status {
    pub(crate) fn from_error(error: &Error) -> Self {
        use lf_status::*;
        match error {
            Error::InvalidArgument(_) => LF_ERR_INVALID_ARGUMENT,
            Error::Config { .. } => LF_ERR_CONFIG,
            Error::NotFound(_) => LF_ERR_NOT_FOUND,
            Error::OutOfMemory(_) => LF_ERR_OUT_OF_MEMORY,
            Error::Unsupported(_) => LF_ERR_UNSUPPORTED,
            Error::PermissionDenied(_) => LF_ERR_PERMISSION_DENIED,
            Error::Io { .. } => LF_ERR_IO,
            Error::Vulkan(_) => LF_ERR_VULKAN,
            Error::WouldBlock(_) => LF_ERR_WOULD_BLOCK,
            Error::Timeout(_) => LF_ERR_TIMEOUT,
            Error::PeerGone(_) => LF_ERR_PEER_GONE,
            Error::Corrupt(_) => LF_ERR_CORRUPT,
            Error::InvalidState(_) => LF_ERR_INVALID_STATE,
            // (Error is non_exhaustive: a new kind is internal until it gets a status of its own.)
            _ => LF_ERR_INTERNAL,
        }
    }

    /// The name and meaning of a status value, or a note that it is unknown. The strings are
    /// static and NUL-terminated for C.
    fn describe(code: u32) -> &'static str {
        match code {
            0 => "LF_OK: success\0",
            1 => "LF_ERR_INVALID_ARGUMENT: an argument is out of range or malformed\0",
            2 => "LF_ERR_NULL_POINTER: a pointer argument is NULL\0",
            3 => "LF_ERR_BAD_HANDLE: a handle is freed, foreign or of the wrong type\0",
            4 => "LF_ERR_CONFIG: a configuration file is missing, unreadable or malformed\0",
            5 => "LF_ERR_NOT_FOUND: not found\0",
            6 => "LF_ERR_OUT_OF_MEMORY: the system could not provide the memory\0",
            7 => "LF_ERR_UNSUPPORTED: not supported by this platform, driver or build\0",
            8 => "LF_ERR_PERMISSION_DENIED: the operating system refused for lack of permission\0",
            9 => "LF_ERR_IO: a system call failed\0",
            10 => "LF_ERR_VULKAN: a Vulkan call failed\0",
            11 => "LF_ERR_WOULD_BLOCK: cannot proceed now; retry later\0",
            12 => "LF_ERR_TIMEOUT: timed out\0",
            13 => "LF_ERR_PEER_GONE: the peer process has gone away\0",
            14 => "LF_ERR_CORRUPT: shared state failed validation\0",
            15 => "LF_ERR_INVALID_STATE: the object is closed, released or otherwise unusable\0",
            16 => "LF_ERR_INTERNAL: internal error in lava-flow (please report it)\0",
            _ => "unknown lf_status value\0",
        }
    }
}

impl std::fmt::Display for lf_status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(lf_status::describe(*self as u32).trim_end_matches('\0'))
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(message: String) {
    // Interior NULs would truncate the message in C; replace them rather than lose it.
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = message);
}

/// A static, NUL-terminated description of a status value, such as
/// `"LF_ERR_TIMEOUT: timed out"`. Never NULL; unknown values give `"unknown lf_status value"`.
///
/// Any value is safe to pass, one from a newer library too. Thread-safe.
#[no_mangle]
pub extern "C" fn lf_status_str(status: raw::lf_status) -> *const c_char {
    lf_status::describe(status).as_ptr().cast()
}

/// The message of the most recent failed lava-flow call on the calling thread: what went wrong
/// and, where possible, how to fix it. Empty if no call has failed on this thread. Successful
/// calls leave it unchanged.
///
/// Never NULL. The string belongs to lava-flow and stays valid until the next failing call on
/// the same thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn lf_last_error_message() -> *const c_char {
    // The CString lives in thread-local storage and is replaced only by a later failure on
    // this same thread, which is exactly the validity the documentation promises.
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// The library's version, `"MAJOR.MINOR.PATCH"`: compare with the header's
/// `LAVA_FLOW_VERSION_*` macros to detect a header/library mismatch. Never NULL, static.
#[no_mangle]
pub extern "C" fn lf_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn text(p: *const c_char) -> String {
        // SAFETY: the functions under test return static or thread-local NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
    }

    #[test]
    fn every_status_has_a_description_naming_it() {
        for code in 0..=lf_status::LF_ERR_INTERNAL as u32 {
            let s = text(lf_status_str(code));
            assert!(s.starts_with("LF_"), "{code}: {s}");
        }
        assert_eq!(text(lf_status_str(9999)), "unknown lf_status value");
        assert!(lf_status::LF_ERR_TIMEOUT.to_string().starts_with("LF_ERR_TIMEOUT"));
    }

    #[test]
    fn version_matches_cargo() {
        assert_eq!(text(lf_version()), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn last_error_is_per_thread() {
        set_last_error("here".into());
        std::thread::spawn(|| assert_eq!(text(lf_last_error_message()), "")).join().unwrap();
        assert_eq!(text(lf_last_error_message()), "here");
    }
}
