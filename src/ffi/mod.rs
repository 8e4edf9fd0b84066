//! The C API: a thin layer over the Rust core, one file per handle type.
//!
//! Conventions (also written in the header's top comment):
//! - Every fallible function returns an `lf_status` and writes its results through
//!   out-parameters only on success. `lf_last_error_message()` holds the detail.
//! - Handles are opaque pointers created by `lf_<type>_<verb>` and released by
//!   `lf_<type>_free`, which accepts NULL. Every handle is registered on creation and checked on
//!   every use, so a NULL, freed, foreign or wrong-type handle gives `LF_ERR_BAD_HANDLE` (or
//!   `LF_ERR_NULL_POINTER`) instead of undefined behaviour.
//! - No panic crosses the boundary: it becomes `LF_ERR_INTERNAL`.
//! - Values that come from C as enums are taken as integers and checked.

pub mod alloc;
pub mod buffer;
pub mod buffer_io;
pub mod channel;
pub mod context;
pub mod device;
pub mod export;
pub mod location;
pub mod status;

use std::any::{type_name, TypeId};
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use parking_lot::RwLock;

use crate::error::Error;
use status::{lf_status, set_last_error};

/// Why an exported function failed: the status to return and the message to keep.
pub(crate) struct Failure {
    pub status: lf_status,
    pub message: String,
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure {
            status: lf_status::from_error(&error),
            message: error.to_string(),
        }
    }
}

pub(crate) type FfiResult<T = ()> = std::result::Result<T, Failure>;

impl Failure {
    pub fn null(arg: &str) -> Self {
        Failure {
            status: lf_status::LF_ERR_NULL_POINTER,
            message: format!("argument `{arg}` is NULL"),
        }
    }
}

/// Runs the body of an exported function: converts its error (or panic) into a status and
/// records the message, prefixed with the function's name, for `lf_last_error_message()`.
pub(crate) fn boundary(function: &'static str, body: impl FnOnce() -> FfiResult) -> lf_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => lf_status::LF_OK,
        Ok(Err(failure)) => {
            set_last_error(format!("{function}: {}", failure.message));
            failure.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            set_last_error(format!(
                "{function}: internal error (a bug in lava-flow, please report it): {what}"
            ));
            lf_status::LF_ERR_INTERNAL
        }
    }
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

/// The set of live handles, keyed by address, with the Rust type each one points to.
///
/// Checking a handle is a hash lookup under a read lock; in exchange, a freed, foreign or
/// wrong-type pointer is reported instead of dereferenced.
fn registry() -> &'static RwLock<Live> {
    static LIVE: OnceLock<RwLock<Live>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// The C name of a handle type, for messages: `lava_flow::ffi::location::lf_location` ->
/// `lf_location`.
fn c_name<T>() -> &'static str {
    let full = type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Moves a value to the heap, registers it and returns the handle C will hold.
pub(crate) fn new_handle<T: 'static>(value: T) -> *mut T {
    let ptr = Box::into_raw(Box::new(value));
    registry()
        .write()
        .insert(ptr as usize, (TypeId::of::<T>(), c_name::<T>()));
    ptr
}

type Live = HashMap<usize, (TypeId, &'static str)>;

fn check_handle<T: 'static>(live: &Live, ptr: *const T, arg: &str) -> FfiResult<()> {
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    let message = match live.get(&(ptr as usize)) {
        Some((id, _)) if *id == TypeId::of::<T>() => return Ok(()),
        Some((_, actual)) => {
            format!("argument `{arg}` is an {actual} handle, not an {}", c_name::<T>())
        }
        None => format!(
            "argument `{arg}` is not a live {} handle (already freed, or never created by lava-flow)",
            c_name::<T>()
        ),
    };
    Err(Failure { status: lf_status::LF_ERR_BAD_HANDLE, message })
}

/// Borrows the value behind a handle after checking that it is live and of type T.
pub(crate) fn handle_ref<'a, T: 'static>(ptr: *const T, arg: &str) -> FfiResult<&'a T> {
    check_handle(&registry().read(), ptr, arg)?;
    // SAFETY: the registry holds exactly the pointers made by `new_handle::<T>` and not yet
    // passed to `free_handle`, so `ptr` points to a live, properly aligned T. The C contract
    // forbids freeing a handle while another call uses it.
    Ok(unsafe { &*ptr })
}

/// Unregisters a handle and drops its value. NULL is accepted and does nothing.
pub(crate) fn free_handle<T: 'static>(ptr: *mut T, arg: &str) -> FfiResult<()> {
    if ptr.is_null() {
        return Ok(());
    }
    {
        let mut live = registry().write();
        check_handle(&live, ptr, arg)?;
        live.remove(&(ptr as usize));
    }
    // SAFETY: the pointer was live in the registry (so it came from Box::into_raw in
    // `new_handle::<T>`) and has just been removed, so no other free can reach it.
    drop(unsafe { Box::from_raw(ptr) });
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The calling thread's last error message.
    pub(crate) fn last_error() -> String {
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        unsafe { CStr::from_ptr(status::lf_last_error_message()) }.to_string_lossy().into_owned()
    }
    use crate::ffi::status::lf_last_error_message;
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

    #[test]
    fn wrong_type_handles_are_named() {
        #[allow(non_camel_case_types)]
        struct lf_other;
        let other = new_handle(lf_other);
        let err = handle_ref::<location::lf_location>(other.cast(), "location").err().unwrap();
        assert_eq!(err.status, lf_status::LF_ERR_BAD_HANDLE);
        assert_eq!(err.message, "argument `location` is an lf_other handle, not an lf_location");
        assert!(free_handle::<location::lf_location>(other.cast(), "x").is_err(), "wrong type is not freed");
        free_handle(other, "other").ok().unwrap();
    }
}
