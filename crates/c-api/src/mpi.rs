//! `lf_mpi`: lava-flow's membership in the application's MPI job, and every process of it by
//! rank and by name (the Rust API is `lava_flow::mpi::MpiWorld`).
//!
//! Ownership: an `lf_mpi` is owned by the caller that joined and released with `lf_mpi_free`,
//! which finalizes MPI when lava-flow initialised it and this was its last `lf_mpi`. The
//! getters only read what discovery found: any thread may call them at once. `lf_mpi_join` and
//! `lf_mpi_free` call MPI, so they must come from a thread that may call MPI.
//!
//! Built without the `mpi` feature, `lf_mpi_join` returns LF_ERR_UNSUPPORTED saying so, and
//! no `lf_mpi` can exist.

use std::ffi::{c_char, CStr, CString};

use super::location::lf_location;
use super::status::lf_status;
use super::{
    boundary, boundary_void, c_str, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult,
};
use lava_flow::mpi::{Communicator, MpiWorld, ThreadLevel};

/// `comm` argument of `lf_mpi_join`: MPI_COMM_WORLD. (Outside the range of an `MPI_Fint`, so it
/// can never be mistaken for a communicator.)
pub const LF_MPI_COMM_WORLD: i64 = -4_294_967_296;

/// Opaque handle on lava-flow's MPI world.
#[allow(non_camel_case_types)]
pub struct lf_mpi {
    world: MpiWorld,
    /// Every process's name as C sees it, in rank order, for `lf_mpi_process_name`.
    names: Vec<CString>,
    /// For `lf_mpi_topology_report`.
    topology_report: CString,
}

/// The thread support MPI provides (the values of the MPI standard's constants).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_mpi_thread_support {
    LF_MPI_THREAD_SINGLE = 0,
    LF_MPI_THREAD_FUNNELED = 1,
    LF_MPI_THREAD_SERIALIZED = 2,
    LF_MPI_THREAD_MULTIPLE = 3,
}

fn no_nul(text: &str, what: &str) -> FfiResult<CString> {
    CString::new(text)
        .map_err(|_| Failure { status: lf_status::LF_ERR_INTERNAL, message: format!("{what} contains a NUL byte") })
}

/// A rank from C, checked against the world.
fn checked_rank(mpi: &lf_mpi, rank: i32) -> FfiResult<usize> {
    u32::try_from(rank)
        .map_err(|_| Failure {
            status: lf_status::LF_ERR_INVALID_ARGUMENT,
            message: format!("rank {rank} is negative; ranks are 0 to {}", mpi.world.size() - 1),
        })
        .and_then(|rank| Ok(mpi.world.peer(rank)?.rank() as usize))
}

/// Joins the application's MPI and finds every process of the communicator. Collective: every
/// process of the communicator calls it.
///
/// `comm` is `MPI_Comm_c2f(comm)` of the application's communicator, or LF_MPI_COMM_WORLD.
/// lava-flow works on a private duplicate of it, with MPI_ERRORS_RETURN. If the application has
/// initialised MPI, lava-flow never finalizes it; if not, lava-flow initialises it
/// (`MPI_Init_thread`, asking for MPI_THREAD_MULTIPLE: see `lf_mpi_thread_level`) and finalizes
/// it when the last `lf_mpi` is freed, or when this join fails and no `lf_mpi` is left. MPI
/// cannot be initialised again after that: a later join fails with LF_ERR_INVALID_STATE.
///
/// `process_name` names this process (1-64 of `A-Z a-z 0-9 - _ .`); NULL takes it from the
/// environment variable `LF_PROCESS_NAME`, or makes it `rank<N>`. Names must differ across
/// the world: a duplicate makes every process's join fail with LF_ERR_INVALID_ARGUMENT. A
/// failure caused by one process's input fails the join on every process, so none is left
/// waiting. Without the `mpi` feature: LF_ERR_UNSUPPORTED.
///
/// Where a context joined MPI_COMM_WORLD by itself (`lf_context_create` under an MPI launcher),
/// a join of LF_MPI_COMM_WORLD is that same join, with no collective: `process_name` must then
/// be NULL or the name that join gave this process, else LF_ERR_INVALID_STATE.
///
/// On success `*out` receives a new handle to release with `lf_mpi_free`.
///
/// # Safety
/// `process_name` must be NULL or a NUL-terminated string; `out` NULL (rejected) or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_join(comm: i64, process_name: *const c_char, out: *mut *mut lf_mpi) -> lf_status {
    boundary("lf_mpi_join", || {
        let out = out_ptr(out, "out")?;
        // Not UTF-8 is not refused here: the join refuses the name (it is not ASCII) on every
        // process at once, where an early return on this one would leave the others waiting.
        let process_name = (!process_name.is_null())
            // SAFETY: non-NULL; the caller promises a NUL-terminated string.
            .then(|| unsafe { CStr::from_ptr(process_name) }.to_string_lossy());
        let communicator = if comm == LF_MPI_COMM_WORLD { Communicator::World } else { Communicator::Fortran(comm) };
        let world = MpiWorld::join(communicator, process_name.as_deref())?;
        let names =
            world.peers().iter().map(|p| no_nul(p.name().as_str(), "a process name")).collect::<FfiResult<Vec<_>>>()?;
        let topology_report = no_nul(world.topology_report(), "the topology report")?;
        write_out(out, new_handle(lf_mpi { world, names, topology_report })?);
        Ok(())
    })
}

/// The number of processes in the world.
///
/// # Safety
/// `mpi` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_size(mpi: *const lf_mpi, out: *mut i32) -> lf_status {
    boundary("lf_mpi_size", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(out, mpi.world.size() as i32);
        Ok(())
    })
}

/// This process's rank in the communicator lava-flow joined.
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_rank(mpi: *const lf_mpi, out: *mut i32) -> lf_status {
    boundary("lf_mpi_rank", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(out, mpi.world.rank() as i32);
        Ok(())
    })
}

/// The thread support MPI provides: what lava-flow obtained when it initialised MPI
/// (MPI_THREAD_MULTIPLE where the library offers it), or what the application asked for.
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_thread_level(mpi: *const lf_mpi, out: *mut lf_mpi_thread_support) -> lf_status {
    boundary("lf_mpi_thread_level", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(
            out,
            match mpi.world.thread_level() {
                ThreadLevel::Single => lf_mpi_thread_support::LF_MPI_THREAD_SINGLE,
                ThreadLevel::Funneled => lf_mpi_thread_support::LF_MPI_THREAD_FUNNELED,
                ThreadLevel::Serialized => lf_mpi_thread_support::LF_MPI_THREAD_SERIALIZED,
                ThreadLevel::Multiple => lf_mpi_thread_support::LF_MPI_THREAD_MULTIPLE,
            },
        );
        Ok(())
    })
}

/// The largest message tag MPI accepts (`MPI_TAG_UB`; the standard guarantees 32767).
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_tag_ub(mpi: *const lf_mpi, out: *mut i32) -> lf_status {
    boundary("lf_mpi_tag_ub", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(out, mpi.world.tag_upper_bound());
        Ok(())
    })
}

/// Whether lava-flow initialised MPI (and so finalizes it when the last `lf_mpi` is freed).
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_initialized_mpi(mpi: *const lf_mpi, out: *mut bool) -> lf_status {
    boundary("lf_mpi_initialized_mpi", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(out, mpi.world.initialised_mpi());
        Ok(())
    })
}

/// The location of the process of rank `rank`: hostname, host identity and NUMA node
/// (`device_id` is LF_UNSET). Compare it with `lf_scope_detect`. A rank outside 0..size-1 is
/// LF_ERR_INVALID_ARGUMENT.
///
/// On success `*out` receives a new location to release with `lf_location_free`.
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_location(mpi: *const lf_mpi, rank: i32, out: *mut *mut lf_location) -> lf_status {
    boundary("lf_mpi_location", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        let rank = checked_rank(mpi, rank)?;
        write_out(out, lf_location::boxed(mpi.world.peers()[rank].location().clone())?);
        Ok(())
    })
}

/// Lends the name of the process of rank `rank`: `*out` points to a NUL-terminated string
/// owned by `mpi`, valid until it is freed. A rank outside 0..size-1 is
/// LF_ERR_INVALID_ARGUMENT.
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_process_name(mpi: *const lf_mpi, rank: i32, out: *mut *const c_char) -> lf_status {
    boundary("lf_mpi_process_name", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        let rank = checked_rank(mpi, rank)?;
        write_out(out, mpi.names[rank].as_ptr());
        Ok(())
    })
}

/// The rank of the process called `process_name`: LF_ERR_NOT_FOUND (listing the names there
/// are) when no process has that name, LF_ERR_INVALID_ARGUMENT when it is not a valid name.
///
/// # Safety
/// `mpi` as in `lf_mpi_size`; `process_name` NULL or a NUL-terminated string; `out` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_rank_of(mpi: *const lf_mpi, process_name: *const c_char, out: *mut i32) -> lf_status {
    boundary("lf_mpi_rank_of", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        let name = c_str(process_name, "process_name")?;
        write_out(out, mpi.world.rank_of(name)? as i32);
        Ok(())
    })
}

/// Lends a report of where MPI's shared-memory split (`MPI_COMM_TYPE_SHARED`) disagrees with
/// the processes' host identities, what lava-flow concluded and how to fix it; "" when they
/// agree. Disagreement is not an error: the host identities decide the scope. Rank 0 also
/// prints a non-empty report to stderr at the join. `*out` is owned by `mpi`.
///
/// # Safety
/// As `lf_mpi_size`.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_topology_report(mpi: *const lf_mpi, out: *mut *const c_char) -> lf_status {
    boundary("lf_mpi_topology_report", || {
        let out = out_ptr(out, "out")?;
        let mpi = handle_ref(mpi, "mpi")?;
        write_out(out, mpi.topology_report.as_ptr());
        Ok(())
    })
}

/// Releases the handle: frees lava-flow's private communicator and, when lava-flow initialised
/// MPI and this was its last `lf_mpi`, finalizes MPI (collective: every process frees its last
/// handle). Never finalizes MPI the application initialised. NULL is accepted and ignored; a
/// pointer that is not a live `lf_mpi` is ignored too, with a note in `lf_last_error_message()`.
///
/// # Safety
/// `mpi` must not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_mpi_free(mpi: *mut lf_mpi) {
    boundary_void("lf_mpi_free", || free_handle(mpi, "mpi"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::last_error;
    use std::ptr;

    #[test]
    fn bad_input_gives_status_and_message() {
        unsafe {
            assert_eq!(lf_mpi_join(LF_MPI_COMM_WORLD, ptr::null(), ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(last_error(), "lf_mpi_join: argument `out` is NULL");
            let mut size = 0;
            assert_eq!(lf_mpi_size(ptr::null(), &mut size), lf_status::LF_ERR_NULL_POINTER);
            let forged = 0x1234usize as *const lf_mpi;
            assert_eq!(lf_mpi_rank(forged, &mut size), lf_status::LF_ERR_BAD_HANDLE);
            assert!(last_error().contains("not a live lf_mpi handle"), "{}", last_error());
            lf_mpi_free(ptr::null_mut());
        }
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn without_the_feature_join_is_unsupported() {
        unsafe {
            let mut mpi = ptr::null_mut();
            assert_eq!(lf_mpi_join(LF_MPI_COMM_WORLD, ptr::null(), &mut mpi), lf_status::LF_ERR_UNSUPPORTED);
            assert!(last_error().contains("`mpi` feature"), "{}", last_error());
            assert!(mpi.is_null());
        }
    }
}
