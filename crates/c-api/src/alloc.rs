//! The functions that make buffers from an `lf_context` and find them again: `lf_alloc`,
//! `lf_alloc_auto`, `lf_register` / `lf_deregister` (user memory), `lf_buffer_find`.
//!
//! Every function here is thread-safe: any number of threads may allocate, register and look
//! up through one context at once. The buffers they return are the caller's (`lf_free`).

use std::ffi::c_void;

use super::abi::CEnum;
use super::buffer::lf_memory_kind;
use super::buffer::{lf_buffer, release};
use super::context::{hugepage_policy_from_c, lf_context};
use super::location::{lf_location, LF_UNSET};
use super::raw;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure};
use lava_flow::memory::MemoryLocation;

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

/// Allocates `size` bytes of shareable memory of kind `location`. `numa_node` picks the node
/// for LF_MEMORY_CPU_NUMA (LF_UNSET: the calling thread's node) and must be LF_UNSET
/// otherwise. `hugepage_policy`: LF_HUGEPAGE_DEFAULT (the context's policy), or
/// LF_HUGEPAGE_STRICT or LF_HUGEPAGE_BEST_EFFORT for this allocation. On success `*out`
/// receives a buffer to release with `lf_free`; ask it what it really got
/// (`lf_buffer_location`, `lf_buffer_page_size`, and `lf_buffer_fallback_reason` for why it
/// differs).
///
/// Errors: LF_ERR_INVALID_ARGUMENT (size 0, an unknown kind or policy, a node that does
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
    location: raw::lf_memory_kind,
    numa_node: i64,
    hugepage_policy: raw::lf_hugepage_policy,
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
        let kind = lf_memory_kind::from_c(location, "location")?;
        let location = MemoryLocation::from_code(kind.to_c(), node)?;
        let policy = hugepage_policy_from_c(hugepage_policy, "hugepage_policy")?
            .unwrap_or_else(|| context.config().hugepage_policy);
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
/// `lf_free`) before freeing the memory. A NULL `ptr` is LF_ERR_NULL_POINTER; 0 bytes,
/// overlapping a known buffer, or unmapped memory, LF_ERR_INVALID_ARGUMENT. Registered
/// buffers cannot be exported.
///
/// CUDA device memory (`cudaMalloc`, a CUDA memory pool, CUDA VMM, managed memory; a
/// PyTorch or CuPy tensor's data pointer) is recognised where the process uses CUDA: the
/// buffer is the whole CUDA allocation holding `[ptr, ptr + size)`, which must lie inside
/// one allocation (LF_ERR_INVALID_ARGUMENT otherwise), with location LF_MEMORY_CUDA_DEVICE,
/// origin LF_ORIGIN_CUDA and `lf_buffer_cuda_kind` saying which kind and device;
/// `lf_buffer_ptr` gives the allocation's device pointer and `lf_buffer_find` finds any
/// tensor in it. Each call returns a new handle; handles of one allocation share one
/// registration (and `lf_buffer_find` answers with the oldest live one); each is released
/// with `lf_deregister` (or `lf_free`), and the registration ends with the last. Memory
/// that CUDA freed and re-allocated at the same address is a new registration: the stale
/// one is no longer found (release its handles). The host cannot read or write CUDA memory
/// through lava-flow (`lf_buffer_read`/`lf_buffer_write`: LF_ERR_INVALID_STATE), and
/// `lf_buffer_export` refuses it (LF_ERR_UNSUPPORTED); `lf_send_buffer` sends it by
/// reference to a consumer on this host (a VMM registration is one piece, or the span of the
/// pieces mapped back to back that the range covers). Without a CUDA
/// driver in the process, memory that is not mapped host memory stays LF_ERR_INVALID_ARGUMENT,
/// and the message says no CUDA driver was found to recognise it.
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
        if ptr.is_null() {
            return Err(Failure::null("ptr"));
        }
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
        if !context.holds_registered(live) {
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
    use crate::buffer::{lf_buffer_location, lf_buffer_ptr, lf_free, lf_memory_kind};
    use crate::context::{lf_context_config, lf_context_create, lf_context_free, lf_hugepage_policy};
    use crate::tests::last_error;
    use std::ptr;

    #[test]
    fn allocate_find_and_free() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, 1000, lf_memory_kind::LF_MEMORY_CPU_NUMA as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            let mut location = 0;
            assert_eq!(lf_buffer_location(buffer, &mut location), lf_status::LF_OK);
            assert_eq!(location, lf_memory_kind::LF_MEMORY_CPU_NUMA as u32);
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
            assert_eq!(lf_register(context, ptr::null_mut(), 16, &mut twice), lf_status::LF_ERR_NULL_POINTER);
            assert!(last_error().contains("`ptr` is NULL"), "{}", last_error());
            assert_eq!(lf_register(ptr::null(), base, 16, &mut twice), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(lf_register(context, base, 0, &mut twice), lf_status::LF_ERR_INVALID_ARGUMENT);
            lf_context_free(context);
        }
    }

    /// Whether the kernel has a free 1 GiB huge page (then best-effort and strict agree, and
    /// the tests below cannot tell the policies apart).
    fn free_gigantic_pages() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    }

    /// Checks that `buffer` is CPU standard memory and says why, in words containing `why`
    /// that name the remedy-free reason (not the advice to use best-effort, taken already).
    unsafe fn assert_fell_back_with_reason(buffer: *mut lf_buffer, why: &str) {
        // SAFETY: `buffer` is a live buffer handle of the calling test; the reason lf_buffer_
        // fallback_reason gives is a NUL-terminated string that lives as long as the buffer.
        unsafe {
            let mut location = 0;
            assert_eq!(lf_buffer_location(buffer, &mut location), lf_status::LF_OK);
            assert_eq!(location, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32);
            let mut reason = ptr::null();
            assert_eq!(crate::buffer::lf_buffer_fallback_reason(buffer, &mut reason), lf_status::LF_OK);
            assert!(!reason.is_null(), "a buffer that is not where it was asked to be says why");
            let reason = std::ffi::CStr::from_ptr(reason).to_string_lossy();
            assert!(reason.contains(why) && reason.contains("CPU standard memory"), "{reason}");
            assert!(!reason.contains("choose the best-effort"), "{reason}");
        }
    }

    #[test]
    fn auto_staging_memory_for_a_remote_peer_says_why_it_is_not_huge() {
        // More 2 MiB pages than the kernel has free, so that the best-effort choice falls back.
        let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let size = (free + 1) * (2 << 20);
        unsafe {
            let config = lf_context_config {
                gpu_policy: crate::context::lf_gpu_policy::LF_GPU_DISABLED as u32,
                ..Default::default()
            };
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_OK);
            let (mut mine, mut peer) = (ptr::null_mut(), ptr::null_mut());
            let host = |name: &str| std::ffi::CString::new(name).unwrap();
            assert_eq!(
                crate::location::lf_location_new(host("node-a").as_ptr(), 0, LF_UNSET, &mut mine),
                lf_status::LF_OK
            );
            assert_eq!(
                crate::location::lf_location_new(host("node-b").as_ptr(), 0, LF_UNSET, &mut peer),
                lf_status::LF_OK
            );
            let mut buffer = ptr::null_mut();
            match lf_alloc_auto(context, size, mine, peer, &mut buffer) {
                lf_status::LF_OK => {
                    assert_fell_back_with_reason(buffer, "CPU memory on 2 MiB huge pages was asked for")
                }
                lf_status::LF_ERR_OUT_OF_MEMORY => println!("skipped: {size} bytes are more than this host can give"),
                other => panic!("{other}: {}", last_error()),
            }
            lf_free(buffer);
            crate::location::lf_location_free(mine);
            crate::location::lf_location_free(peer);
            lf_context_free(context);
        }
    }

    #[test]
    fn hugepage_policies_mean_the_same_in_the_config_and_in_flags() {
        if free_gigantic_pages() {
            println!("skipped: this host has free 1 GiB huge pages, so strict and best-effort both succeed");
            return;
        }
        unsafe {
            let mut context = ptr::null_mut();
            let config = lf_context_config {
                gpu_policy: crate::context::lf_gpu_policy::LF_GPU_DISABLED as u32,
                ..Default::default()
            };
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_OK);
            let huge = crate::buffer::lf_memory_kind::LF_MEMORY_CPU_HUGEPAGE_1GB as u32;
            let mut buffer = ptr::null_mut();
            // The context's policy constant, passed as a flag: best-effort, not strict.
            assert_eq!(
                lf_alloc(context, 64, huge, LF_UNSET, lf_hugepage_policy::LF_HUGEPAGE_BEST_EFFORT as u32, &mut buffer),
                lf_status::LF_OK,
                "{}",
                last_error()
            );
            assert_fell_back_with_reason(
                buffer,
                "CPU memory on 1 GiB huge pages was asked for with the best-effort hugepage policy",
            );
            lf_free(buffer);
            assert_ne!(
                lf_alloc(context, 64, huge, LF_UNSET, lf_hugepage_policy::LF_HUGEPAGE_STRICT as u32, &mut buffer),
                lf_status::LF_OK
            );
            // The message speaks to C users too: no Rust item names.
            assert!(!last_error().contains("::") && !last_error().contains("Policy"), "{}", last_error());
            assert_ne!(
                lf_alloc(context, 64, huge, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK,
                "0: the context's, strict"
            );
            lf_context_free(context);

            // The flag constant, set as the context's policy: best-effort too.
            let config =
                lf_context_config { hugepage_policy: lf_hugepage_policy::LF_HUGEPAGE_BEST_EFFORT as u32, ..config };
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_OK, "{}", last_error());
            assert_eq!(lf_alloc(context, 64, huge, LF_UNSET, 0, &mut buffer), lf_status::LF_OK, "{}", last_error());
            assert_fell_back_with_reason(buffer, "best-effort hugepage policy");
            lf_free(buffer);
            assert_ne!(
                lf_alloc(context, 64, huge, LF_UNSET, lf_hugepage_policy::LF_HUGEPAGE_STRICT as u32, &mut buffer),
                lf_status::LF_OK
            );
            lf_context_free(context);
        }
    }

    #[test]
    fn bad_input_gives_status_and_message() {
        unsafe {
            let mut context = ptr::null_mut();
            // Strict, without a GPU: GPU locations are refused, saying why.
            let strict = lf_context_config {
                gpu_policy: crate::context::lf_gpu_policy::LF_GPU_DISABLED as u32,
                strict_gpu: 1,
                ..Default::default()
            };
            assert_eq!(lf_context_create(&strict, &mut context), lf_status::LF_OK);

            let mut buffer = ptr::null_mut();
            let cases: [(usize, u32, i64, u32, lf_status, &str); 6] = [
                (
                    0,
                    lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_INVALID_ARGUMENT,
                    "size 0",
                ),
                (
                    usize::MAX,
                    lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_OUT_OF_MEMORY,
                    "more than this host",
                ),
                (
                    64,
                    4242,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_INVALID_ARGUMENT,
                    "location is 4242, not an lf_memory_kind: use LF_MEMORY_CPU_STANDARD (1), LF_MEMORY_CPU_NUMA (2)",
                ),
                (
                    64,
                    lf_memory_kind::LF_MEMORY_CPU_NUMA as u32,
                    999,
                    0,
                    lf_status::LF_ERR_INVALID_ARGUMENT,
                    "NUMA node 999 does not exist",
                ),
                (
                    64,
                    lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32,
                    LF_UNSET,
                    8,
                    lf_status::LF_ERR_INVALID_ARGUMENT,
                    "hugepage_policy is 8, not an lf_hugepage_policy",
                ),
                (
                    64,
                    crate::buffer::lf_memory_kind::LF_MEMORY_GPU_DEVICE_LOCAL as u32,
                    LF_UNSET,
                    0,
                    lf_status::LF_ERR_UNSUPPORTED,
                    "strict_gpu forbids the CPU fallback: the context's GPU policy disables the GPU",
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
                lf_alloc(freed, 64, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_ERR_BAD_HANDLE
            );
            lf_context_free(ptr::null_mut());
        }
    }
}
