//! `lf_context`: the per-process memory context, and the functions that make buffers from it
//! (`lf_alloc`, `lf_alloc_auto`, `lf_register`).
//!
//! Ownership: an `lf_context` is owned by its creator and released with `lf_context_free`.
//! It is thread-safe: any number of threads may allocate, register, import and look up
//! through one context at once. Buffers hold what they need, so they may outlive the context.

use std::ffi::{c_void, CString};

use super::buffer::lf_buffer;
use super::device::gpu_settings_from_c;
use super::location::{lf_location, LF_UNSET};
use super::status::lf_status;
use super::{boundary, boundary_void, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult};
use crate::memory::{Context, ContextConfig, HugepagePolicy, MemoryLocation};

/// Opaque handle on a memory context.
#[allow(non_camel_case_types)]
pub struct lf_context {
    pub(crate) context: Context,
    /// `Context::gpu_unavailable_reason` as a C string, for `lf_context_gpu_unavailable_reason`.
    pub(crate) gpu_unavailable: Option<CString>,
}

/// `hugepage_policy`: fail when no huge pages are reserved, saying how to reserve them.
pub const LF_HUGEPAGE_STRICT: u32 = 0;
/// `hugepage_policy`: fall back to ordinary memory (the buffer reports what it got).
pub const LF_HUGEPAGE_BEST_EFFORT: u32 = 1;

/// `lf_alloc` flags: 0 uses the context's hugepage policy; these override it for one call.
pub const LF_ALLOC_HUGEPAGE_STRICT: u32 = 1;
pub const LF_ALLOC_HUGEPAGE_BEST_EFFORT: u32 = 2;

/// Context settings. A zero-initialised struct (`lf_context_config c = {0};`) means the
/// defaults: strict hugepage policy, 2 MiB arenas, the GPU opened if there is one (CPU
/// fallback otherwise), the default device, 64 MiB GPU arenas.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lf_context_config {
    /// LF_HUGEPAGE_STRICT or LF_HUGEPAGE_BEST_EFFORT.
    pub hugepage_policy: u32,
    /// LF_GPU_AUTO, LF_GPU_REQUIRED or LF_GPU_DISABLED.
    pub gpu_policy: u32,
    /// Pooled arena size in bytes, a power of two from 64 KiB to 1 GiB; 0 for 2 MiB.
    pub arena_size: u64,
    /// Which Vulkan device: LF_GPU_DEVICE_DEFAULT, LF_GPU_DEVICE_INDEX (`gpu_device_index`)
    /// or LF_GPU_DEVICE_UUID (`gpu_device_uuid`). A device that does not exist makes
    /// `lf_context_create` fail with LF_ERR_NOT_FOUND, listing the devices there are.
    pub gpu_device_select: u32,
    pub gpu_device_index: u32,
    pub gpu_device_uuid: [u8; 16],
    /// 1: a GPU location asked of a context without a device is LF_ERR_UNSUPPORTED instead
    /// of CPU memory that reports the fallback (`lf_buffer_fallback_reason`). 0 or 1.
    pub strict_gpu: u32,
    /// Must be 0.
    pub reserved0: u32,
    /// Size of the pooled GPU arenas in bytes; 0 for 64 MiB.
    pub gpu_arena_size: u64,
    /// Room for later settings; must be 0.
    pub reserved: [u64; 2],
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

fn policy(value: u32) -> FfiResult<HugepagePolicy> {
    match value {
        LF_HUGEPAGE_STRICT => Ok(HugepagePolicy::Strict),
        LF_HUGEPAGE_BEST_EFFORT => Ok(HugepagePolicy::BestEffort),
        other => Err(invalid(format!(
            "hugepage_policy {other} is unknown; use LF_HUGEPAGE_STRICT (0) or LF_HUGEPAGE_BEST_EFFORT (1)"
        ))),
    }
}

fn config_from_c(c: &lf_context_config) -> FfiResult<ContextConfig> {
    if c.reserved0 != 0 || c.reserved.iter().any(|&r| r != 0) {
        return Err(invalid("the reserved fields of lf_context_config must be 0".into()));
    }
    let mut config = ContextConfig { hugepage_policy: policy(c.hugepage_policy)?, ..ContextConfig::default() };
    if c.arena_size != 0 {
        config.arena_size = usize::try_from(c.arena_size)
            .map_err(|_| invalid(format!("arena_size {} does not fit in size_t", c.arena_size)))?;
    }
    gpu_settings_from_c(c, &mut config)?;
    Ok(config)
}

/// Creates a memory context. `config` may be NULL for the defaults. Create one per process
/// and share it between threads. On success `*out` receives the context, to release with
/// `lf_context_free`.
///
/// The GPU is opened here, eagerly (`gpu_policy`): `lf_context_device_info` reports it, or
/// `lf_context_gpu_unavailable_reason` says why there is none. Errors: LF_ERR_INVALID_ARGUMENT
/// for unknown values; LF_ERR_NOT_FOUND for a device index or UUID that matches no device;
/// under LF_GPU_REQUIRED, LF_ERR_UNSUPPORTED or LF_ERR_VULKAN when Vulkan cannot be opened.
///
/// # Safety
/// `config` must be NULL or point to a readable `lf_context_config`; `out` NULL (rejected)
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_context_create(config: *const lf_context_config, out: *mut *mut lf_context) -> lf_status {
    boundary("lf_context_create", || {
        let out = out_ptr(out, "out")?;
        // SAFETY: the caller promises config is NULL or readable.
        let config = match unsafe { config.as_ref() } {
            Some(c) => config_from_c(c)?,
            None => ContextConfig::default(),
        };
        let context = Context::new(config)?;
        let gpu_unavailable = context.gpu_unavailable_reason().map(|r| CString::new(r.replace('\0', " ")).unwrap_or_default());
        write_out(out, new_handle(lf_context { context, gpu_unavailable }));
        Ok(())
    })
}

/// Releases a context. NULL is ignored, as is (with a note in `lf_last_error_message()`) a
/// pointer that is not a live context. Buffers made from it stay valid until freed.
///
/// # Safety
/// `context` must not be in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn lf_context_free(context: *mut lf_context) {
    boundary_void("lf_context_free", || free_handle(context, "context"));
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
        write_out(out, lf_buffer::into_handle(buffer));
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
        write_out(out, lf_buffer::into_handle(context.allocate_auto(size, mine, peer)?));
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
        write_out(out, lf_buffer::into_handle(buffer));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::buffer::{
        lf_buffer_find, lf_buffer_location, lf_buffer_ptr, lf_free, LF_MEMORY_CPU_NUMA, LF_MEMORY_CPU_STANDARD,
    };
    use crate::ffi::status::lf_last_error_message;
    use std::ffi::CStr;
    use std::ptr;

    fn last_error() -> String {
        // SAFETY: lf_last_error_message returns a valid thread-local C string.
        unsafe { CStr::from_ptr(lf_last_error_message()) }.to_string_lossy().into_owned()
    }

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
            assert_eq!(crate::ffi::buffer::lf_deregister(context, buffer), lf_status::LF_OK);
            assert_eq!(lf_register(context, ptr::null_mut(), 16, &mut twice), lf_status::LF_ERR_INVALID_ARGUMENT);
            lf_context_free(context);
        }
    }

    #[test]
    fn bad_input_gives_status_and_message() {
        unsafe {
            let mut config = lf_context_config { hugepage_policy: 7, ..Default::default() };
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("hugepage_policy 7"), "{}", last_error());
            config = lf_context_config { arena_size: 3000, ..Default::default() };
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_ERR_INVALID_ARGUMENT);
            assert_eq!(lf_context_create(ptr::null(), ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
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
