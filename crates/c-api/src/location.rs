//! `lf_location`: where a process runs, and the scope between two processes.
//!
//! Ownership: an `lf_location` is exclusively owned by the caller that created it and is
//! released with `lf_location_free`. Locations are immutable, so one may be read from several
//! threads at once; freeing it while another thread reads it is undefined.

use std::ffi::{c_char, CString};

use super::raw;
use super::status::lf_status;
use super::{
    boundary, boundary_void, c_str, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult,
};
use lava_flow::types::{detect_scope, CommunicationScope, ProcessLocation, ProcessName};

/// Marks an unset `node_id` or `device_id`.
pub const LF_UNSET: i64 = -1;

/// Opaque handle on a process location.
#[allow(non_camel_case_types)]
pub struct lf_location {
    location: ProcessLocation,
    /// The hostname as C sees it, kept so `lf_location_hostname` can lend a pointer.
    hostname: CString,
    /// Likewise for `lf_location_host_id`.
    host_id: Option<CString>,
}

impl lf_location {
    pub(crate) fn boxed(location: ProcessLocation) -> FfiResult<*mut lf_location> {
        // validate_hostname rejects control characters and validate_host_id anything but
        // printable ASCII, so there is no interior NUL.
        let nul = |what: &str| Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("{what} contains a NUL byte"),
        };
        let hostname = CString::new(location.hostname.clone()).map_err(|_| nul("hostname"))?;
        let host_id = match &location.host_id {
            Some(id) => Some(CString::new(id.clone()).map_err(|_| nul("host identity"))?),
            None => None,
        };
        new_handle(lf_location { location, hostname, host_id })
    }

    /// The Rust location, for the other handle types' functions that take an `lf_location`.
    #[allow(dead_code)]
    pub(crate) fn location(&self) -> &ProcessLocation {
        &self.location
    }
}

/// The scope between two processes.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_scope {
    /// Same host: memory can be shared directly.
    LF_SCOPE_LOCAL = 1,
    /// Different hosts: data goes through the network (MPI).
    LF_SCOPE_REMOTE = 2,
}

fn optional_id(value: i64, arg: &str) -> FfiResult<Option<u32>> {
    match value {
        LF_UNSET => Ok(None),
        v => u32::try_from(v).map(Some).map_err(|_| Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("argument `{arg}` is {v}; use 0 to {} or LF_UNSET (-1)", u32::MAX),
        }),
    }
}

fn id_or_unset(id: Option<u32>) -> i64 {
    id.map_or(LF_UNSET, i64::from)
}

/// Detects the calling process's location: this host's name, its host identity
/// (`LF_HOST_ID` if set; see `lf_location_host_id`) and the NUMA node of the CPU the calling
/// thread runs on now (`device_id` is LF_UNSET). An invalid `LF_HOST_ID` is
/// LF_ERR_INVALID_ARGUMENT.
///
/// On success `*out` receives a new location to release with `lf_location_free`.
///
/// # Safety
/// `out` must be NULL (rejected with LF_ERR_NULL_POINTER) or point to writable storage.
#[no_mangle]
pub unsafe extern "C" fn lf_location_detect(out: *mut *mut lf_location) -> lf_status {
    boundary("lf_location_detect", || {
        let out = out_ptr(out, "out")?;
        let location = ProcessLocation::from_hostname()?;
        write_out(out, lf_location::boxed(location)?);
        Ok(())
    })
}

/// Builds a location by hand. `node_id` and `device_id` are 0..=UINT32_MAX or LF_UNSET.
///
/// # Safety
/// `hostname` must be NULL or a NUL-terminated string; `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_location_new(
    hostname: *const c_char,
    node_id: i64,
    device_id: i64,
    out: *mut *mut lf_location,
) -> lf_status {
    boundary("lf_location_new", || {
        let out = out_ptr(out, "out")?;
        let hostname = c_str(hostname, "hostname")?;
        let location =
            ProcessLocation::new(hostname, optional_id(node_id, "node_id")?, optional_id(device_id, "device_id")?)?;
        write_out(out, lf_location::boxed(location)?);
        Ok(())
    })
}

/// Reads the location of the process named `process_name` from the JSON config file at
/// `path` (format: docs/locations.md). Errors name the file and the problem:
/// LF_ERR_CONFIG for a missing or malformed file, LF_ERR_NOT_FOUND when no process has that
/// name, LF_ERR_INVALID_ARGUMENT for a malformed name.
///
/// The location keeps the name: where this process joined MPI (by itself under an MPI
/// launcher, see `lf_context_create`, or by `lf_mpi_join`), a channel finds the process of
/// that name through MPI discovery (its rank and host), so the config's names must be the
/// processes' names there: LF_PROCESS_NAME, or `rank<N>` without it.
///
/// # Safety
/// `path` and `process_name` must be NULL or NUL-terminated strings; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_location_from_config(
    path: *const c_char,
    process_name: *const c_char,
    out: *mut *mut lf_location,
) -> lf_status {
    boundary("lf_location_from_config", || {
        let out = out_ptr(out, "out")?;
        let path = c_str(path, "path")?;
        let name = ProcessName::new(c_str(process_name, "process_name")?)?;
        let location = ProcessLocation::from_config(path, &name)?;
        write_out(out, lf_location::boxed(location)?);
        Ok(())
    })
}

/// Lends the hostname: `*out` points to a NUL-terminated string owned by the location and
/// valid until it is freed.
///
/// # Safety
/// `location` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_location_hostname(location: *const lf_location, out: *mut *const c_char) -> lf_status {
    boundary("lf_location_hostname", || {
        let out = out_ptr(out, "out")?;
        let location = handle_ref(location, "location")?;
        write_out(out, location.hostname.as_ptr());
        Ok(())
    })
}

/// Lends the host identity: `*out` points to a NUL-terminated string owned by the location
/// and valid until it is freed, or is NULL when the location has none (built by hand or read
/// from a config file: such locations are compared by hostname).
///
/// Detected locations carry the machine's boot id and the process's UTS, IPC and network
/// namespaces, so two containers on one machine differ; `LF_HOST_ID` overrides it.
///
/// # Safety
/// As `lf_location_hostname`.
#[no_mangle]
pub unsafe extern "C" fn lf_location_host_id(location: *const lf_location, out: *mut *const c_char) -> lf_status {
    boundary("lf_location_host_id", || {
        let out = out_ptr(out, "out")?;
        let location = handle_ref(location, "location")?;
        write_out(out, location.host_id.as_ref().map_or(std::ptr::null(), |id| id.as_ptr()));
        Ok(())
    })
}

/// The NUMA node, or LF_UNSET.
///
/// # Safety
/// As `lf_location_hostname`.
#[no_mangle]
pub unsafe extern "C" fn lf_location_node_id(location: *const lf_location, out: *mut i64) -> lf_status {
    boundary("lf_location_node_id", || {
        let out = out_ptr(out, "out")?;
        let location = handle_ref(location, "location")?;
        write_out(out, id_or_unset(location.location.node_id));
        Ok(())
    })
}

/// The GPU index, or LF_UNSET.
///
/// # Safety
/// As `lf_location_hostname`.
#[no_mangle]
pub unsafe extern "C" fn lf_location_device_id(location: *const lf_location, out: *mut i64) -> lf_status {
    boundary("lf_location_device_id", || {
        let out = out_ptr(out, "out")?;
        let location = handle_ref(location, "location")?;
        write_out(out, id_or_unset(location.location.device_id));
        Ok(())
    })
}

/// Whether two processes share a host (LF_SCOPE_LOCAL) or not (LF_SCOPE_REMOTE): their host
/// identities are compared when both have one, otherwise their hostnames, ignoring ASCII case.
///
/// # Safety
/// `mine` and `peer` must be NULL or pointers obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_scope_detect(
    mine: *const lf_location,
    peer: *const lf_location,
    out: *mut lf_scope,
) -> lf_status {
    boundary("lf_scope_detect", || {
        let out = out_ptr(out, "out")?;
        let mine = handle_ref(mine, "mine")?;
        let peer = handle_ref(peer, "peer")?;
        let scope = match detect_scope(&mine.location, &peer.location) {
            CommunicationScope::Local => lf_scope::LF_SCOPE_LOCAL,
            CommunicationScope::Remote => lf_scope::LF_SCOPE_REMOTE,
        };
        write_out(out, scope);
        Ok(())
    })
}

/// `"local"`, `"remote"` or `"unknown"` for an `lf_scope` value (any value is safe: one that
/// is not an `lf_scope` gives `"unknown"`). Static, never NULL.
#[no_mangle]
pub extern "C" fn lf_scope_str(scope: raw::lf_scope) -> *const c_char {
    let s: &'static str = match scope {
        1 => "local\0",
        2 => "remote\0",
        _ => "unknown\0",
    };
    s.as_ptr().cast()
}

/// Releases a location. NULL is accepted and ignored; a pointer that is not a live location
/// is ignored too, with a note in `lf_last_error_message()`.
///
/// # Safety
/// `location` must not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_location_free(location: *mut lf_location) {
    boundary_void("lf_location_free", || free_handle(location, "location"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::last_error;
    use std::ffi::CStr;
    use std::ptr;

    #[test]
    fn detect_and_compare() {
        unsafe {
            let mut me = ptr::null_mut();
            assert_eq!(lf_location_detect(&mut me), lf_status::LF_OK);
            let mut other = ptr::null_mut();
            let name = c"some-other-host";
            assert_eq!(lf_location_new(name.as_ptr(), LF_UNSET, 3, &mut other), lf_status::LF_OK);
            let mut scope = lf_scope::LF_SCOPE_LOCAL;
            assert_eq!(lf_scope_detect(me, other, &mut scope), lf_status::LF_OK);
            assert_eq!(scope, lf_scope::LF_SCOPE_REMOTE);
            assert_eq!(lf_scope_detect(me, me, &mut scope), lf_status::LF_OK);
            assert_eq!(scope, lf_scope::LF_SCOPE_LOCAL);
            let mut device = 0;
            assert_eq!(lf_location_device_id(other, &mut device), lf_status::LF_OK);
            assert_eq!(device, 3);
            let mut host = ptr::null();
            assert_eq!(lf_location_hostname(other, &mut host), lf_status::LF_OK);
            assert_eq!(CStr::from_ptr(host), name);
            // A hand-made location has no host identity; a detected one has.
            let mut host_id = c"x".as_ptr();
            assert_eq!(lf_location_host_id(other, &mut host_id), lf_status::LF_OK);
            assert!(host_id.is_null());
            assert_eq!(lf_location_host_id(me, &mut host_id), lf_status::LF_OK);
            assert!(!host_id.is_null() && !CStr::from_ptr(host_id).to_bytes().is_empty());
            lf_location_free(me);
            lf_location_free(other);
        }
    }

    #[test]
    fn bad_input_gives_status_and_message() {
        unsafe {
            assert_eq!(lf_location_detect(ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(last_error(), "lf_location_detect: argument `out` is NULL");

            let mut loc = ptr::null_mut();
            assert_eq!(lf_location_new(c"h".as_ptr(), -2, LF_UNSET, &mut loc), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("`node_id` is -2"), "{}", last_error());
            assert!(loc.is_null(), "out is untouched on failure");

            assert_eq!(lf_location_new(c"h".as_ptr(), 0, 0, &mut loc), lf_status::LF_OK);
            lf_location_free(loc);
            // A freed handle is refused, not dereferenced.
            let mut id = 0;
            assert_eq!(lf_location_node_id(loc, &mut id), lf_status::LF_ERR_BAD_HANDLE);
            assert!(last_error().contains("not a live lf_location handle"), "{}", last_error());
            // Double free is ignored and reported.
            lf_location_free(loc);
            assert!(last_error().starts_with("lf_location_free:"), "{}", last_error());
            lf_location_free(ptr::null_mut());

            let garbage = 0x1234usize as *const lf_location;
            assert_eq!(lf_location_device_id(garbage, &mut id), lf_status::LF_ERR_BAD_HANDLE);
        }
    }
}
