//! The functions that make buffers from an `lf_context` and find them again: `lf_alloc`,
//! `lf_alloc_auto`, `lf_register` / `lf_deregister` (user memory), `lf_buffer_find`.
//!
//! Every function here is thread-safe: any number of threads may allocate, register and look
//! up through one context at once. The buffers they return are the caller's (`lf_free`).

use std::ffi::c_void;
use std::sync::Arc;

use super::buffer::{lf_buffer, release};
use super::context::lf_context;
use super::location::{lf_location, LF_UNSET};
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure};
use crate::memory::{BufferOrigin, HugepagePolicy, MemoryLocation};

/// `lf_alloc` flags: 0 uses the context's hugepage policy; these override it for one call.
pub const LF_ALLOC_HUGEPAGE_STRICT: u32 = 1;
pub const LF_ALLOC_HUGEPAGE_BEST_EFFORT: u32 = 2;

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

/// Allocates `size` bytes of shareable memory at `location` (an `LF_MEMORY_*` value).
/// `numa_node` picks the node for LF_MEMORY_CPU_NUMA (LF_UNSET: the calling thread's node) and
/// must be LF_UNSET otherwise. `flags`: 0, LF_ALLOC_HUGEPAGE_STRICT or
/// LF_ALLOC_HUGEPAGE_BEST_EFFORT. On success `*out` receives a buffer to release with
/// `lf_free`; ask it what it really got (`lf_buffer_location`, `lf_buffer_page_size`).
///
/// Errors: LF_ERR_INVALID_ARGUMENT (size 0, unknown location value or flag, a node that does
/// not exist — the message names the nodes there are), LF_ERR_OUT_OF_MEMORY (beyond what the
/// host has; no huge pages reserved under the strict policy — the message says how to
/// reserve them), LF_ERR_PERMISSION_DENIED (RLIMIT_MEMLOCK too small for GPU-pinned memory),
/// LF_ERR_UNSUPPORTED (a GPU location of a context without a device under `strict_gpu`).
/// Thread-safe.
///
/// GPU locations (LF_MEMORY_GPU_DEVICE_LOCAL, LF_MEMORY_GPU_HOST_VISIBLE) come from the
/// context's Vulkan device, pooled and exportable; without a device (and not `strict_gpu`)
/// they are CPU standard memory: `lf_buffer_location` says so and `lf_buffer_fallback_reason`
/// why. GPU-pinned memory is registered with Vulkan and CUDA where present
/// (`lf_buffer_registrations`).
///
/// # Safety
/// `context` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_alloc(
    context: *const lf_context,
    size: usize,
    location: u32,
    numa_node: i64,
    flags: u32,
    out: *mut *mut lf_buffer,
) -> lf_status {
    boundary("lf_alloc", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        let node = match numa_node {
            LF_UNSET => None,
            n => Some(
                u32::try_from(n)
                    .map_err(|_| invalid(format!("numa_node {n} is not a node number or LF_UNSET (-1)")))?,
            ),
        };
        let location = MemoryLocation::from_code(location, node)?;
        let policy = match flags {
            0 => context.config().hugepage_policy,
            LF_ALLOC_HUGEPAGE_STRICT => HugepagePolicy::Strict,
            LF_ALLOC_HUGEPAGE_BEST_EFFORT => HugepagePolicy::BestEffort,
            other => return Err(invalid(format!("flags {other:#x} are unknown; use 0 or one LF_ALLOC_* flag"))),
        };
        let buffer = context.allocate_with(size, location, policy)?;
        write_out(out, lf_buffer::into_handle(buffer)?);
        Ok(())
    })
}

/// Allocates `size` bytes where lava-flow's policy puts buffers from `mine` to `peer`:
/// different hosts get huge-page staging memory (best-effort), same-host peers standard
/// memory, or memory on `mine`'s NUMA node when the host has several. `*out` as `lf_alloc`.
///
/// # Safety
/// `context`, `mine` and `peer` must be NULL or pointers obtained from lava-flow; `out`
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_alloc_auto(
    context: *const lf_context,
    size: usize,
    mine: *const lf_location,
    peer: *const lf_location,
    out: *mut *mut lf_buffer,
) -> lf_status {
    boundary("lf_alloc_auto", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        let mine = handle_ref(mine, "mine")?.location();
        let peer = handle_ref(peer, "peer")?.location();
        write_out(out, lf_buffer::into_handle(context.allocate_auto(size, mine, peer)?)?);
        Ok(())
    })
}

/// Registers `size` bytes of the caller's memory at `ptr`, so that `lf_buffer_find` knows
/// it. Nothing is copied or freed: release the registration with `lf_deregister` (or
/// `lf_free`) before freeing the memory. Overlapping a known buffer, or unmapped memory, is
/// LF_ERR_INVALID_ARGUMENT. Registered buffers cannot be exported.
///
/// # Safety
/// `[ptr, ptr + size)` must stay valid memory until deregistered; `context` as `lf_alloc`.
#[no_mangle]
pub unsafe extern "C" fn lf_register(
    context: *const lf_context,
    ptr: *mut c_void,
    size: usize,
    out: *mut *mut lf_buffer,
) -> lf_status {
    boundary("lf_register", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        // SAFETY: the caller promises the range stays valid while registered.
        let buffer = unsafe { context.register(ptr.cast(), size)? };
        write_out(out, lf_buffer::into_handle(buffer)?);
        Ok(())
    })
}

/// Ends the registration of user memory made by `lf_register` with `context` and releases
/// the handle; the memory itself is untouched. A buffer that is not registered memory of
/// this context is refused (LF_ERR_INVALID_ARGUMENT) and stays valid.
///
/// # Safety
/// `context` and `buffer` must be NULL or pointers obtained from lava-flow; `buffer` must
/// not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_deregister(context: *const lf_context, buffer: *mut lf_buffer) -> lf_status {
    boundary("lf_deregister", || {
        let context = &handle_ref(context, "context")?.context;
        let live = &handle_ref(buffer, "buffer")?.buffer;
        let ours = Arc::ptr_eq(live.registry(), &context.inner.registry);
        if live.origin() != BufferOrigin::Registered || !ours {
            return Err(Failure {
                status: lf_status::LF_ERR_INVALID_ARGUMENT,
                message: format!(
                    "buffer {} is not memory registered with this context (it is {}); release it with lf_free",
                    live.id(),
                    live.origin()
                ),
            });
        }
        release(buffer)
    })
}

/// Finds the buffer of `context` that holds the address `ptr`: `*out` receives its handle
/// (borrowed: the same handle `lf_alloc`/`lf_import`/`lf_register` gave, not a new one) and,
/// when `offset` is not NULL, `*offset` how far into the buffer `ptr` is. LF_ERR_NOT_FOUND
/// when no buffer holds it. O(log n). Thread-safe.
///
/// # Safety
/// `context` as `lf_alloc`; `out` NULL or writable; `offset` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_find(
    context: *const lf_context,
    ptr: *const c_void,
    out: *mut *mut lf_buffer,
    offset: *mut usize,
) -> lf_status {
    boundary("lf_buffer_find", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        let not_found = |message: String| Failure { status: lf_status::LF_ERR_NOT_FOUND, message };
        let found = context
            .find(ptr.cast())
            .ok_or_else(|| not_found(format!("no lava-flow buffer of this context holds address {ptr:p}")))?;
        let handle = lf_buffer::handle_of(found.info.id).ok_or_else(|| {
            not_found(format!("buffer {} holds {ptr:p} but was made through the Rust API", found.info.id))
        })?;
        write_out(out, handle);
        if !offset.is_null() {
            write_out(offset, found.offset);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::buffer::{lf_buffer_location, lf_buffer_ptr, lf_free, LF_MEMORY_CPU_NUMA, LF_MEMORY_CPU_STANDARD};
    use crate::ffi::context::{lf_context_config, lf_context_create, lf_context_free};
    use crate::ffi::tests::last_error;
    use std::ptr;

    #[test]
    fn allocate_find_and_free() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(lf_alloc(context, 1000, LF_MEMORY_CPU_NUMA, LF_UNSET, 0, &mut buffer), lf_status::LF_OK);
            let mut location = 0;
            assert_eq!(lf_buffer_location(buffer, &mut location), lf_status::LF_OK);
            assert_eq!(location, LF_MEMORY_CPU_NUMA);
            let mut base = ptr::null_mut();
            assert_eq!(lf_buffer_ptr(buffer, &mut base), lf_status::LF_OK);
            let (mut found, mut offset) = (ptr::null_mut(), 0usize);
            let inside = base.cast::<u8>().add(999).cast();
            assert_eq!(lf_buffer_find(context, inside, &mut found, &mut offset), lf_status::LF_OK);
            assert_eq!((found, offset), (buffer, 999));
            lf_free(buffer);
            assert_eq!(lf_buffer_find(context, inside, &mut found, ptr::null_mut()), lf_status::LF_ERR_NOT_FOUND);
            lf_context_free(context);
        }
    }

    #[test]
    fn register_user_memory() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut memory = vec![0u8; 4096];
            let mut buffer = ptr::null_mut();
            let base = memory.as_mut_ptr().cast();
            assert_eq!(lf_register(context, base, 4096, &mut buffer), lf_status::LF_OK);
            let mut twice = ptr::null_mut();
            assert_eq!(lf_register(context, base, 16, &mut twice), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("overlaps"), "{}", last_error());
            let mut found = ptr::null_mut();
            assert_eq!(
                lf_buffer_find(context, base.cast::<u8>().add(10).cast(), &mut found, ptr::null_mut()),
                lf_status::LF_OK
            );
            assert_eq!(found, buffer);
            assert_eq!(lf_deregister(context, buffer), lf_status::LF_OK);
            assert_eq!(lf_register(context, ptr::null_mut(), 16, &mut twice), lf_status::LF_ERR_INVALID_ARGUMENT);
            lf_context_free(context);
        }
    }

    #[test]
    fn bad_input_gives_status_and_message() {
        unsafe {
            let mut context = ptr::null_mut();
            // Strict, without a GPU: GPU locations are refused, saying why.
            let strict = lf_context_config {
                gpu_policy: crate::ffi::device::LF_GPU_DISABLED,
                strict_gpu: 1,
                ..Default::default()
            };
            assert_eq!(lf_context_create(&strict, &mut context), lf_status::LF_OK);

            let mut buffer = ptr::null_mut();
            let cases: [(usize, u32, i64, u32, lf_status, &str); 6] = [
                (0, LF_MEMORY_CPU_STANDARD, LF_UNSET, 0, lf_status::LF_ERR_INVALID_ARGUMENT, "size 0"),
                (
                    usize::MAX,
                    LF_MEMORY_CPU_STANDARD,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_OUT_OF_MEMORY,
                    "more than this host",
                ),
                (64, 4242, LF_UNSET, 0, lf_status::LF_ERR_INVALID_ARGUMENT, "unknown memory location value 4242"),
                (64, LF_MEMORY_CPU_NUMA, 999, 0, lf_status::LF_ERR_INVALID_ARGUMENT, "NUMA node 999 does not exist"),
                (64, LF_MEMORY_CPU_STANDARD, LF_UNSET, 8, lf_status::LF_ERR_INVALID_ARGUMENT, "flags 0x8"),
                (
                    64,
                    crate::ffi::buffer::LF_MEMORY_GPU_DEVICE_LOCAL,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_UNSUPPORTED,
                    "strict_gpu forbids the CPU fallback: the context's GPU policy is Disabled",
                ),
            ];
            for (size, location, node, flags, status, text) in cases {
                assert_eq!(lf_alloc(context, size, location, node, flags, &mut buffer), status, "{text}");
                assert!(last_error().starts_with("lf_alloc: ") && last_error().contains(text), "{}", last_error());
                assert!(buffer.is_null(), "out is untouched on failure");
            }
            let freed = context;
            lf_context_free(context);
            assert_eq!(
                lf_alloc(freed, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, 0, &mut buffer),
                lf_status::LF_ERR_BAD_HANDLE
            );
            lf_context_free(ptr::null_mut());
        }
    }
}
