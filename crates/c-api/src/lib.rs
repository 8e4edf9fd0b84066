//! The C API: a thin layer over the Rust core, one file per handle type.
//!
//! Conventions (also written in the header's top comment):
//! - Every fallible function returns an `lf_status` and writes its results through
//!   out-parameters only on success. `lf_last_error_message()` holds the detail.
//! - Handles are opaque pointers created by `lf_<type>_<verb>` and released by
//!   `lf_<type>_free`, which accepts NULL. Handles are tokens into a table (`handle.rs`), not
//!   addresses, and are checked on every use, so a NULL, freed, foreign or wrong-type handle
//!   gives `LF_ERR_BAD_HANDLE` (or `LF_ERR_NULL_POINTER`) instead of undefined behaviour.
//! - No panic crosses the boundary: it becomes `LF_ERR_INTERNAL`.
//! - Values that come from C as enums are taken as integers and checked.

// What needs the core's memory and channels is built on Windows where they are (without the
// vulkan feature), its descriptor-typed functions answering LF_ERR_UNSUPPORTED there.
#[cfg_attr(not(unix), allow(dead_code))]
mod abi;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod alloc;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod buffer;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod buffer_io;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod channel;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod channel_config;
#[cfg(test)]
mod channel_tests;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod context;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod device;
#[cfg(any(unix, not(feature = "vulkan")))]
mod exclusive;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod export;
#[cfg(any(unix, not(feature = "vulkan")))]
mod gpu_messages;
mod handle;
pub mod location;
pub mod logging;
pub mod mpi;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod peers;
#[cfg_attr(not(unix), allow(dead_code))]
mod raw;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod receive;
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod send;
pub mod status;

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub(crate) use handle::{free_handle, handle_ref, new_handle};
use lava_flow::error::Error;
use status::{lf_status, set_last_error};

// Every type C holds through a handle, with its kind: the one list, so that the kinds are
// visibly distinct.
handle::handle_types! {
    location::lf_location => 1, "lf_location";
    #[cfg(any(unix, not(feature = "vulkan")))]
    context::lf_context => 2, "lf_context";
    #[cfg(any(unix, not(feature = "vulkan")))]
    buffer::lf_buffer => 3, "lf_buffer";
    #[cfg(any(unix, not(feature = "vulkan")))]
    channel::lf_channel => 4, "lf_channel";
    mpi::lf_mpi => 32, "lf_mpi";
}

/// A descriptor handed to C as its `int`, which C then owns.
#[cfg(unix)]
pub(crate) fn descriptor_to_c(handle: std::os::fd::OwnedFd, _function: &str) -> FfiResult<std::ffi::c_int> {
    Ok(std::os::fd::IntoRawFd::into_raw_fd(handle))
}

/// A descriptor handed to C as its `int`: Windows has handles, which an `int` cannot carry.
#[cfg(all(not(unix), not(feature = "vulkan")))]
pub(crate) fn descriptor_to_c(
    _handle: std::os::windows::io::OwnedHandle,
    function: &str,
) -> FfiResult<std::ffi::c_int> {
    Err(descriptor_unsupported(function))
}

/// A descriptor lent to C as its `int` (it stays the library's).
#[cfg(unix)]
pub(crate) fn descriptor_lent_to_c(handle: std::os::fd::BorrowedFd<'_>, _function: &str) -> FfiResult<std::ffi::c_int> {
    Ok(std::os::fd::AsRawFd::as_raw_fd(&handle))
}

/// A descriptor lent to C as its `int`: Windows has handles, which an `int` cannot carry.
#[cfg(all(not(unix), not(feature = "vulkan")))]
pub(crate) fn descriptor_lent_to_c(
    _handle: std::os::windows::io::BorrowedHandle<'_>,
    function: &str,
) -> FfiResult<std::ffi::c_int> {
    Err(descriptor_unsupported(function))
}

#[cfg(all(not(unix), not(feature = "vulkan")))]
fn descriptor_unsupported(function: &str) -> Failure {
    Failure {
        status: status::lf_status::LF_ERR_UNSUPPORTED,
        message: format!(
            "{function} hands out an int file descriptor, and Windows has handles, which the C API does not hand              out yet; wait in lf_recv with a timeout (or poll with lf_try_recv) instead of on a descriptor"
        ),
    }
}

/// Why an exported function failed: the status to return and the message to keep.
pub(crate) struct Failure {
    pub status: lf_status,
    pub message: String,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure { status: lf_status::from_error(&error), message: error.to_string() }
    }
}

pub(crate) type FfiResult<T = ()> = std::result::Result<T, Failure>;

impl Failure {
    pub fn null(arg: &str) -> Self {
        Failure { status: lf_status::LF_ERR_NULL_POINTER, message: format!("argument `{arg}` is NULL") }
    }
}

/// Runs the body of an exported function: converts its error (or panic) into a status and
/// records the message, prefixed with the function's name, for `lf_last_error_message()`.
/// Inlined into each function, with the failures out of line: the success path of a message
/// call is the body and a test.
#[inline(always)]
pub(crate) fn boundary(function: &'static str, body: impl FnOnce() -> FfiResult) -> lf_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => lf_status::LF_OK,
        Ok(Err(failure)) => failed(function, failure),
        Err(panic) => panicked(function, panic),
    }
}

/// Records a failure's message for `lf_last_error_message()` and returns its status.
#[cold]
#[inline(never)]
fn failed(function: &'static str, failure: Failure) -> lf_status {
    set_last_error(format!("{function}: {}", failure.message));
    failure.status
}

/// Records a caught panic as an internal error.
#[cold]
#[inline(never)]
fn panicked(function: &'static str, panic: Box<dyn std::any::Any + Send>) -> lf_status {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    set_last_error(format!("{function}: internal error (a bug in lava-flow, please report it): {what}"));
    lf_status::LF_ERR_INTERNAL
}

/// Like [`boundary`] for functions that cannot report a status (the `_free` functions): a
/// failure is recorded for `lf_last_error_message()` and otherwise ignored.
pub(crate) fn boundary_void(function: &'static str, body: impl FnOnce() -> FfiResult) {
    let _ = boundary(function, body);
}

/// Writes a result through an out-parameter (checked non-NULL by the caller's `out_ptr`).
pub(crate) fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: every caller obtained `out` from `out_ptr`, which rejects NULL; the C caller
    // promises (in each function's `# Safety`) that it points to writable storage for a T.
    unsafe { out.write(value) }
}

/// Checks an out-parameter before any work is done, so that nothing is created and leaked
/// when the result could not be delivered.
pub(crate) fn out_ptr<T>(out: *mut T, arg: &str) -> FfiResult<*mut T> {
    if out.is_null() {
        Err(Failure::null(arg))
    } else {
        Ok(out)
    }
}

/// Borrows a C string argument as UTF-8.
pub(crate) fn c_str<'a>(ptr: *const c_char, arg: &str) -> FfiResult<&'a str> {
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    // SAFETY: non-NULL; the C caller promises a NUL-terminated string that outlives the call.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map_err(|_| Failure {
        status: lf_status::LF_ERR_INVALID_ARGUMENT,
        message: format!("argument `{arg}` is not valid UTF-8"),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A duplicate of `fd` at a high, rarely used number. Tests that check an fd *number* is
    /// closed after a call use it: other test threads open and close fds meanwhile, and the
    /// kernel gives them the lowest free numbers, so a high one is not reused under the check.
    pub(crate) fn dup_high(fd: i32) -> i32 {
        static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
        let floor = 700 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 300;
        // SAFETY: F_DUPFD_CLOEXEC only duplicates the descriptor.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) };
        assert!(high >= 0, "F_DUPFD_CLOEXEC: {}", std::io::Error::last_os_error());
        high
    }

    /// The calling thread's last error message.
    /// A memfd of `size` bytes (sealable where `sealing`), as a peer might send one.
    pub(crate) fn memfd(name: &str, size: u64, sealing: bool) -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(name).unwrap();
        let flags = libc::MFD_CLOEXEC | if sealing { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: a NUL-terminated name; the result is checked before it is owned.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate of the memfd just made.
        assert_eq!(unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), size as libc::off_t) }, 0);
        fd
    }

    /// An eventfd: an fd that is not memory.
    pub(crate) fn eventfd() -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: plain eventfd creation; the result is checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor that nothing else owns.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
    }

    pub(crate) fn last_error() -> String {
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        unsafe { CStr::from_ptr(status::lf_last_error_message()) }.to_string_lossy().into_owned()
    }
    use crate::status::lf_last_error_message;
    use std::ffi::CStr;

    #[test]
    fn a_panic_becomes_a_status_with_a_message() {
        let status = boundary("lf_test_fn", || panic!("invariant broken"));
        assert_eq!(status, lf_status::LF_ERR_INTERNAL);
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        let msg = unsafe { CStr::from_ptr(lf_last_error_message()) }.to_string_lossy().into_owned();
        assert!(msg.starts_with("lf_test_fn: internal error"), "{msg}");
        assert!(msg.ends_with("invariant broken"), "{msg}");
    }
}
