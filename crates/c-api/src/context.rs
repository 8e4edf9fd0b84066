//! `lf_context`: the per-process memory context and its settings (`lf_context_config`). The
//! functions that make buffers from it are in `alloc.rs`; its GPU settings and the report
//! type `lf_device_info` are in `device.rs`.
//!
//! Ownership: an `lf_context` is owned by its creator and released with `lf_context_free`.
//! It is thread-safe: any number of threads may allocate, register, import and look up
//! through one context at once. Buffers hold what they need, so they may outlive the context.

use std::ffi::{c_char, CStr, CString};

#[cfg(feature = "vulkan")]
use super::device::info_to_c;
use super::device::{gpu_settings_from_c, lf_device_info, GpuFields};
use super::status::lf_status;
use super::{boundary, boundary_void, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult};
use lava_flow::memory::{Context, ContextConfig, HugepagePolicy};

/// Opaque handle on a memory context.
#[allow(non_camel_case_types)]
pub struct lf_context {
    pub(crate) context: Context,
    /// `Context::gpu_unavailable_reason` as a C string, for `lf_context_gpu_unavailable_reason`.
    pub(crate) gpu_unavailable: Option<CString>,
}

/// Hugepage policies, for `lf_context_config.hugepage_policy` and for `lf_alloc`'s `flags`
/// (the same values in both places; 0 means the default there: strict for a context, the
/// context's policy for one allocation).
/// Fail when no huge pages are reserved, saying how to reserve them.
pub const LF_HUGEPAGE_STRICT: u32 = 1;
/// Fall back to ordinary memory (the buffer reports what it got, and why).
pub const LF_HUGEPAGE_BEST_EFFORT: u32 = 2;

/// Context settings. A zero-initialised struct (`lf_context_config c = {0};`) means the
/// defaults: strict hugepage policy, 2 MiB arenas, the GPU opened if there is one (CPU
/// fallback otherwise), the default device, 64 MiB GPU arenas.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct lf_context_config {
    /// LF_HUGEPAGE_STRICT or LF_HUGEPAGE_BEST_EFFORT; 0 for strict.
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
    /// Size of the pooled GPU arenas in bytes; 0 for 64 MiB. At most 2^40 (1 TiB) and the
    /// device's largest memory heap: larger is LF_ERR_INVALID_ARGUMENT at `lf_context_create`.
    pub gpu_arena_size: u64,
    /// Room for later settings; must be 0.
    pub reserved: [u64; 2],
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

fn policy(value: u32) -> FfiResult<HugepagePolicy> {
    match value {
        0 | LF_HUGEPAGE_STRICT => Ok(HugepagePolicy::Strict),
        LF_HUGEPAGE_BEST_EFFORT => Ok(HugepagePolicy::BestEffort),
        other => Err(invalid(format!(
            "hugepage_policy {other} is unknown; use 0 (the default, strict), LF_HUGEPAGE_STRICT (1) or \
             LF_HUGEPAGE_BEST_EFFORT (2)"
        ))),
    }
}

fn config_from_c(c: &lf_context_config) -> FfiResult<ContextConfig> {
    if c.reserved0 != 0 || c.reserved.iter().any(|&r| r != 0) {
        return Err(invalid("the reserved fields of lf_context_config must be 0".into()));
    }
    let mut config = ContextConfig::default();
    config.hugepage_policy = policy(c.hugepage_policy)?;
    if c.arena_size != 0 {
        config.arena_size = usize::try_from(c.arena_size)
            .map_err(|_| invalid(format!("arena_size {} does not fit in size_t", c.arena_size)))?;
    }
    let gpu = GpuFields {
        gpu_policy: c.gpu_policy,
        gpu_device_select: c.gpu_device_select,
        gpu_device_index: c.gpu_device_index,
        gpu_device_uuid: c.gpu_device_uuid,
        strict_gpu: c.strict_gpu,
        gpu_arena_size: c.gpu_arena_size,
    };
    gpu_settings_from_c(&gpu, &mut config)?;
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
        let gpu_unavailable =
            context.gpu_unavailable_reason().map(|r| CString::new(r.replace('\0', " ")).unwrap_or_default());
        write_out(out, new_handle(lf_context { context, gpu_unavailable })?);
        Ok(())
    })
}

/// Gives freed GPU memory back to the driver now: every pooled GPU arena that no buffer uses,
/// the one empty spare per memory kind that the context keeps for the next allocations too.
/// `*given_back` (if not NULL) receives how many bytes that was (0 without a GPU). Without this
/// call, a freed buffer that leaves its pooled arena empty gives that arena back unless it is
/// the spare, and a buffer of its own arena (over a quarter of `gpu_arena_size`) gives its
/// memory back when freed. Memory a channel still holds for a message is given back when the
/// message is released.
///
/// # Safety
/// `context` must be NULL or a pointer from lava-flow; `given_back` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_context_trim(context: *const lf_context, given_back: *mut u64) -> lf_status {
    boundary("lf_context_trim", || {
        let context = &handle_ref(context, "context")?.context;
        let bytes = context.trim();
        if !given_back.is_null() {
            write_out(given_back, bytes);
        }
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

/// What the context's GPU is: `*out` receives the report of the Vulkan device
/// `lf_context_create` opened. LF_ERR_UNSUPPORTED when the context has none (no loader,
/// driver or device under LF_GPU_AUTO, or LF_GPU_DISABLED): the message says why, as
/// `lf_context_gpu_unavailable_reason` does. Thread-safe.
///
/// # Safety
/// `context` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_context_device_info(context: *const lf_context, out: *mut lf_device_info) -> lf_status {
    boundary("lf_context_device_info", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        #[cfg(feature = "vulkan")]
        if let Some(info) = context.device_info() {
            write_out(out, info_to_c(info));
            return Ok(());
        }
        let _ = out;
        Err(Failure {
            status: lf_status::LF_ERR_UNSUPPORTED,
            message: format!(
                "this context has no Vulkan device: {}",
                context.gpu_unavailable_reason().unwrap_or("unknown reason")
            ),
        })
    })
}

/// Why the context has no Vulkan device: `*out` receives NULL when it has one, else the
/// reason (the Vulkan loader's or driver's word, or the policy that disabled the GPU), a
/// string owned by the context and valid until `lf_context_free`. Thread-safe.
///
/// # Safety
/// As `lf_context_device_info`.
#[no_mangle]
pub unsafe extern "C" fn lf_context_gpu_unavailable_reason(
    context: *const lf_context,
    out: *mut *const c_char,
) -> lf_status {
    boundary("lf_context_gpu_unavailable_reason", || {
        let out = out_ptr(out, "out")?;
        let context = handle_ref(context, "context")?;
        write_out(out, context.gpu_unavailable.as_deref().map_or(std::ptr::null(), CStr::as_ptr));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{LF_GPU_DEVICE_INDEX, LF_GPU_DEVICE_UUID, LF_GPU_DISABLED};
    use crate::tests::last_error;
    use std::ptr;

    #[test]
    fn bad_config_gives_status_and_message() {
        let cases: [(lf_context_config, lf_status, &str); 10] = [
            (
                lf_context_config { hugepage_policy: 7, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "hugepage_policy 7",
            ),
            (
                lf_context_config { arena_size: 3000, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "arena size 3000",
            ),
            (lf_context_config { reserved0: 1, ..Default::default() }, lf_status::LF_ERR_INVALID_ARGUMENT, "reserved"),
            (
                lf_context_config { gpu_policy: 9, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_policy 9",
            ),
            (
                lf_context_config { gpu_device_select: 5, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_device_select 5",
            ),
            (
                lf_context_config { strict_gpu: 2, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "strict_gpu 2",
            ),
            // Absurd GPU arenas are refused here, not by every GPU allocation later.
            (
                lf_context_config { gpu_arena_size: 1 << 63, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_arena_size 9223372036854775808",
            ),
            (
                lf_context_config { gpu_arena_size: u64::MAX, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_arena_size 18446744073709551615",
            ),
            // Device selection is checked even where the GPU turns out to be missing.
            (
                lf_context_config {
                    gpu_device_select: LF_GPU_DEVICE_INDEX,
                    gpu_device_index: 4000,
                    ..Default::default()
                },
                lf_status::LF_ERR_NOT_FOUND,
                "Vulkan device index 4000",
            ),
            (
                lf_context_config {
                    gpu_device_select: LF_GPU_DEVICE_UUID,
                    gpu_device_uuid: [0xee; 16],
                    ..Default::default()
                },
                lf_status::LF_ERR_NOT_FOUND,
                "eeeeeeee-eeee-eeee-eeee-eeeeeeeeeeee",
            ),
        ];
        let vulkan =
            lava_flow::memory::Context::new(ContextConfig::default()).unwrap().gpu_unavailable_reason().is_none();
        for (config, status, text) in cases {
            let mut context = ptr::null_mut();
            // SAFETY: the config is readable; out is writable.
            let got = unsafe { lf_context_create(&config, &mut context) };
            if status == lf_status::LF_ERR_NOT_FOUND && !vulkan {
                // Without a loader or driver there is no device list to look the selector up in.
                unsafe { lf_context_free(context) };
                continue;
            }
            assert_eq!(got, status, "{text}");
            assert!(last_error().starts_with("lf_context_create: ") && last_error().contains(text), "{}", last_error());
            assert!(context.is_null(), "out is untouched on failure");
        }
        let disabled = lf_context_config { gpu_policy: LF_GPU_DISABLED, ..Default::default() };
        // SAFETY: as above.
        unsafe {
            assert_eq!(lf_context_create(ptr::null(), ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&disabled, &mut context), lf_status::LF_OK);
            lf_context_free(context);
            lf_context_free(context); // a second free is ignored
            lf_context_free(ptr::null_mut());
        }
    }
}
