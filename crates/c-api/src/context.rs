//! `lf_context`: the per-process memory context and its settings (`lf_context_config`). The
//! functions that make buffers from it are in `alloc.rs`; its GPU report is in `device.rs`.
//!
//! Ownership: an `lf_context` is owned by its creator and released with `lf_context_free`.
//! It is thread-safe: any number of threads may allocate, register, import and look up
//! through one context at once. Buffers hold what they need, so they may outlive the context.

use std::ffi::CString;

use super::abi::{c_enum, read_struct, write_struct, CEnum, GrowableStruct};
use super::raw;
use super::status::lf_status;
use super::{boundary, boundary_void, free_handle, handle_ref, new_handle, out_ptr, write_out, Failure, FfiResult};
use lava_flow::memory::{Context, ContextConfig, DeviceSelector, GpuPolicy, HugepagePolicy};

/// Opaque handle on a memory context.
#[allow(non_camel_case_types)]
pub struct lf_context {
    pub(crate) context: Context,
    /// `Context::gpu_unavailable_reason` as a C string, for `lf_context_gpu_unavailable_reason`.
    pub(crate) gpu_unavailable: Option<CString>,
}

/// What to do when huge pages are asked for and the kernel has none to give:
/// `lf_context_config.hugepage_policy` for a context, and `lf_alloc`'s `hugepage_policy`
/// for one allocation.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_hugepage_policy {
    /// The default: strict for a context; the context's policy for one allocation.
    LF_HUGEPAGE_DEFAULT = 0,
    /// Fail when no huge pages are reserved, saying how to reserve them.
    LF_HUGEPAGE_STRICT = 1,
    /// Fall back to ordinary memory (the buffer reports what it got, and why).
    LF_HUGEPAGE_BEST_EFFORT = 2,
}
c_enum!(lf_hugepage_policy: LF_HUGEPAGE_DEFAULT, LF_HUGEPAGE_STRICT, LF_HUGEPAGE_BEST_EFFORT);

/// Whether `lf_context_create` opens a GPU (`lf_context_config.gpu_policy`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_gpu_policy {
    /// Open Vulkan at `lf_context_create`; without a loader or device go on without a GPU
    /// (GPU allocations fall back to CPU memory, visibly) and record why. The default.
    LF_GPU_AUTO = 0,
    /// `lf_context_create` fails with the Vulkan error when it cannot open the GPU.
    LF_GPU_REQUIRED = 1,
    /// Touch no GPU API (no Vulkan device, no CUDA registration).
    LF_GPU_DISABLED = 2,
}
c_enum!(lf_gpu_policy: LF_GPU_AUTO, LF_GPU_REQUIRED, LF_GPU_DISABLED);

/// Which Vulkan device a context opens (`lf_context_config.gpu_device_select`).
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_gpu_device_select {
    /// The device `LF_VULKAN_DEVICE` names, else the first discrete GPU, else the first
    /// device. The default.
    LF_GPU_DEVICE_DEFAULT = 0,
    /// The device at `gpu_device_index` in the loader's order.
    LF_GPU_DEVICE_INDEX = 1,
    /// The device whose deviceUUID is `gpu_device_uuid`.
    LF_GPU_DEVICE_UUID = 2,
}
c_enum!(lf_gpu_device_select: LF_GPU_DEVICE_DEFAULT, LF_GPU_DEVICE_INDEX, LF_GPU_DEVICE_UUID);

/// Context settings. Start from `lf_context_config_init` (or a struct of zeros,
/// `lf_context_config c = {0};`: the same defaults) and change what you need: 0 in a field
/// means its default. The defaults: strict hugepage policy, 2 MiB arenas, the GPU opened if
/// there is one (CPU fallback otherwise), the default device, 64 MiB GPU arenas.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_context_config {
    /// `sizeof(lf_context_config)`, set by `lf_context_config_init`; 0 only in a struct of
    /// zeros. See "Growable structs" at the top of this header.
    pub struct_size: u32,
    /// LF_HUGEPAGE_DEFAULT (strict), LF_HUGEPAGE_STRICT or LF_HUGEPAGE_BEST_EFFORT.
    pub hugepage_policy: raw::lf_hugepage_policy,
    /// Pooled arena size in bytes, a power of two from 64 KiB to 1 GiB; 0 for 2 MiB.
    pub arena_size: u64,
    /// Whether to open the GPU; LF_GPU_AUTO by default.
    pub gpu_policy: raw::lf_gpu_policy,
    /// Which Vulkan device: LF_GPU_DEVICE_DEFAULT, LF_GPU_DEVICE_INDEX (`gpu_device_index`)
    /// or LF_GPU_DEVICE_UUID (`gpu_device_uuid`). A device that does not exist makes
    /// `lf_context_create` fail with LF_ERR_NOT_FOUND, listing the devices there are.
    pub gpu_device_select: raw::lf_gpu_device_select,
    pub gpu_device_index: u32,
    /// 1: a GPU location asked of a context without a device is LF_ERR_UNSUPPORTED instead
    /// of CPU memory that reports the fallback (`lf_buffer_fallback_reason`). 0 or 1.
    pub strict_gpu: u32,
    pub gpu_device_uuid: [u8; 16],
    /// Size of the pooled GPU arenas in bytes; 0 for 64 MiB. At most 2^40 (1 TiB) and the
    /// device's largest memory heap: larger is LF_ERR_INVALID_ARGUMENT at `lf_context_create`.
    pub gpu_arena_size: u64,
}

/// The defaults, with `struct_size` set.
impl Default for lf_context_config {
    fn default() -> Self {
        lf_context_config {
            struct_size: std::mem::size_of::<Self>() as u32,
            hugepage_policy: 0,
            arena_size: 0,
            gpu_policy: 0,
            gpu_device_select: 0,
            gpu_device_index: 0,
            strict_gpu: 0,
            gpu_device_uuid: [0; 16],
            gpu_arena_size: 0,
        }
    }
}

// SAFETY: repr(C), starts with the u32 size, integers only.
unsafe impl GrowableStruct for lf_context_config {
    const NAME: &'static str = "lf_context_config";
    const SIZES: &'static [usize] = &[56];
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

/// The policy `value` names, `None` for LF_HUGEPAGE_DEFAULT. `what` names the argument.
pub(crate) fn hugepage_policy_from_c(value: raw::lf_hugepage_policy, what: &str) -> FfiResult<Option<HugepagePolicy>> {
    Ok(match lf_hugepage_policy::from_c(value, what)? {
        lf_hugepage_policy::LF_HUGEPAGE_DEFAULT => None,
        lf_hugepage_policy::LF_HUGEPAGE_STRICT => Some(HugepagePolicy::Strict),
        lf_hugepage_policy::LF_HUGEPAGE_BEST_EFFORT => Some(HugepagePolicy::BestEffort),
    })
}

/// Applies the GPU fields of a C config to `config`, checking each.
pub(crate) fn gpu_settings_from_c(c: &lf_context_config, config: &mut ContextConfig) -> FfiResult<()> {
    config.gpu = match lf_gpu_policy::from_c(c.gpu_policy, "gpu_policy")? {
        lf_gpu_policy::LF_GPU_AUTO => GpuPolicy::Auto,
        lf_gpu_policy::LF_GPU_REQUIRED => GpuPolicy::Required,
        lf_gpu_policy::LF_GPU_DISABLED => GpuPolicy::Disabled,
    };
    config.gpu_device = match lf_gpu_device_select::from_c(c.gpu_device_select, "gpu_device_select")? {
        lf_gpu_device_select::LF_GPU_DEVICE_DEFAULT => None,
        lf_gpu_device_select::LF_GPU_DEVICE_INDEX => Some(DeviceSelector::Index(c.gpu_device_index)),
        lf_gpu_device_select::LF_GPU_DEVICE_UUID => Some(DeviceSelector::Uuid(c.gpu_device_uuid)),
    };
    config.strict_gpu = match c.strict_gpu {
        0 => false,
        1 => true,
        other => return Err(invalid(format!("strict_gpu {other} must be 0 or 1"))),
    };
    if c.gpu_arena_size != 0 {
        config.gpu_arena_size = c.gpu_arena_size;
    }
    Ok(())
}

fn config_from_c(c: &lf_context_config) -> FfiResult<ContextConfig> {
    let mut config = ContextConfig::default();
    config.hugepage_policy =
        hugepage_policy_from_c(c.hugepage_policy, "hugepage_policy")?.unwrap_or(HugepagePolicy::Strict);
    if c.arena_size != 0 {
        config.arena_size = usize::try_from(c.arena_size)
            .map_err(|_| invalid(format!("arena_size {} does not fit in size_t", c.arena_size)))?;
    }
    gpu_settings_from_c(c, &mut config)?;
    Ok(config)
}

/// Fills `*config` with the defaults (zeros: each field's default) and sets its `struct_size`
/// to `struct_size`, which is `sizeof(lf_context_config)` as the caller's header has it:
/// `lf_context_config_init(&config, sizeof config)`. Sizes as for `struct_size`
/// (LF_ERR_INVALID_ARGUMENT for one that is not a size of the struct).
///
/// # Safety
/// `config` must be NULL (rejected) or writable for `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn lf_context_config_init(config: *mut lf_context_config, struct_size: usize) -> lf_status {
    boundary("lf_context_config_init", || {
        let config = out_ptr(config, "config")?;
        // SAFETY: the caller promises `struct_size` writable bytes.
        unsafe { write_struct(config, struct_size, lf_context_config::default()) }
    })
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
/// MPI: in a library built with MPI (LAVA_FLOW_FEATURE_MPI), a process started by an MPI
/// launcher (mpirun, mpiexec, srun: one of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK, PMI_SIZE,
/// MPI_LOCALNRANKS, MV2_COMM_WORLD_SIZE is set) joins MPI_COMM_WORLD here, last, as
/// `lf_mpi_join(LF_MPI_COMM_WORLD, NULL, ...)` would, unless the environment has LF_MPI=off.
/// The join is collective: every rank must create a context (the first; later contexts share
/// the join), and may then give channels locations read from a config file, which reach peers
/// on other hosts through it. MPI the application initialised is joined as it is; MPI that
/// lava-flow initialised is finalized when the last context (and `lf_mpi`) is freed. A later
/// `lf_mpi_join(LF_MPI_COMM_WORLD, ...)` returns this same join.
///
/// # Safety
/// `config` must be NULL or point to a readable `lf_context_config` of its `struct_size`
/// bytes; `out` NULL (rejected) or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_context_create(config: *const lf_context_config, out: *mut *mut lf_context) -> lf_status {
    boundary("lf_context_create", || {
        let out = out_ptr(out, "out")?;
        let config = if config.is_null() {
            ContextConfig::default()
        } else {
            // SAFETY: the caller promises a readable struct of its struct_size bytes.
            config_from_c(&unsafe { read_struct(config, true) }?)?
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
/// `*given_back` (if not NULL) receives how many bytes went back (0 without a GPU). Without this
/// call, a freed buffer that leaves its pooled arena empty gives that arena back unless it is
/// the spare, and a buffer of its own arena (over a quarter of `gpu_arena_size`) gives its
/// memory back when freed. Memory a channel still holds for a message goes back when the
/// consumer releases the message, when the consumer dies, or with the channel
/// (`lf_channel_free`), and is not counted in `*given_back`.
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

#[cfg(test)]
mod tests {
    use super::*;
    use super::{lf_gpu_device_select, lf_gpu_policy};
    use crate::tests::last_error;
    use std::ptr;

    #[test]
    fn bad_config_gives_status_and_message() {
        let cases: [(lf_context_config, lf_status, &str); 9] = [
            (
                lf_context_config { hugepage_policy: 7, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "hugepage_policy is 7, not an lf_hugepage_policy: use LF_HUGEPAGE_DEFAULT (0), LF_HUGEPAGE_STRICT (1) or LF_HUGEPAGE_BEST_EFFORT (2)",
            ),
            (
                lf_context_config { arena_size: 3000, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "arena size 3000",
            ),
            (
                lf_context_config { gpu_policy: 9, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_policy is 9, not an lf_gpu_policy",
            ),
            (
                lf_context_config { gpu_device_select: 5, ..Default::default() },
                lf_status::LF_ERR_INVALID_ARGUMENT,
                "gpu_device_select is 5, not an lf_gpu_device_select",
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
                    gpu_device_select: lf_gpu_device_select::LF_GPU_DEVICE_INDEX as u32,
                    gpu_device_index: 4000,
                    ..Default::default()
                },
                lf_status::LF_ERR_NOT_FOUND,
                "Vulkan device index 4000",
            ),
            (
                lf_context_config {
                    gpu_device_select: lf_gpu_device_select::LF_GPU_DEVICE_UUID as u32,
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
        let disabled = lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
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
