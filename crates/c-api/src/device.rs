//! The GPU of an `lf_context`: the settings that choose it (`lf_context_config`'s GPU fields)
//! and `lf_device_info`, the report of what `lf_context_create` opened
//! (`lf_context_device_info`, with `lf_context_gpu_unavailable_reason` in `context.rs`).
//!
//! The device is opened eagerly by `lf_context_create` and lives as long as the context.
//! Reading its report is thread-safe.

use std::ffi::c_char;

use super::status::lf_status;
use super::{Failure, FfiResult};
use lava_flow::memory::{ContextConfig, DeviceSelector, GpuPolicy};

/// `gpu_policy`: open Vulkan at `lf_context_create`; without a loader or device go on
/// without a GPU (GPU allocations fall back to CPU memory, visibly) and record why.
pub const LF_GPU_AUTO: u32 = 0;
/// `gpu_policy`: `lf_context_create` fails with the Vulkan error when it cannot open the GPU.
pub const LF_GPU_REQUIRED: u32 = 1;
/// `gpu_policy`: touch no GPU API (no Vulkan device, no CUDA registration).
pub const LF_GPU_DISABLED: u32 = 2;

/// `gpu_device_select`: the device `LF_VULKAN_DEVICE` names, else the first discrete GPU,
/// else the first device.
pub const LF_GPU_DEVICE_DEFAULT: u32 = 0;
/// `gpu_device_select`: the device at `gpu_device_index` in the loader's order.
pub const LF_GPU_DEVICE_INDEX: u32 = 1;
/// `gpu_device_select`: the device whose deviceUUID is `gpu_device_uuid`.
pub const LF_GPU_DEVICE_UUID: u32 = 2;

/// `lf_device_info.device_type`: the values of `VkPhysicalDeviceType`.
pub const LF_DEVICE_TYPE_OTHER: u32 = 0;
pub const LF_DEVICE_TYPE_INTEGRATED_GPU: u32 = 1;
pub const LF_DEVICE_TYPE_DISCRETE_GPU: u32 = 2;
pub const LF_DEVICE_TYPE_VIRTUAL_GPU: u32 = 3;
pub const LF_DEVICE_TYPE_CPU: u32 = 4;

/// `lf_device_info.features` bits.
pub const LF_DEVICE_EXPORT_OPAQUE_FD: u32 = 1;
pub const LF_DEVICE_IMPORT_OPAQUE_FD: u32 = 2;
pub const LF_DEVICE_EXPORT_DMA_BUF: u32 = 4;
/// `VK_EXT_external_memory_host`: GPU-pinned buffers are imported into the device.
pub const LF_DEVICE_HOST_POINTER_IMPORT: u32 = 8;

/// The lengths of `lf_device_info`'s arrays (Vulkan's own maxima for heaps and types).
pub const LF_DEVICE_STRING_SIZE: u32 = 256;
pub const LF_DEVICE_MAX_HEAPS: u32 = 16;
pub const LF_DEVICE_MAX_MEMORY_TYPES: u32 = 32;

/// What `lf_context_create` opened: plain data, strings NUL-terminated (truncated to fit).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_device_info {
    /// Position in the loader's enumeration (`vulkaninfo --summary`).
    pub index: u32,
    /// An `LF_DEVICE_TYPE_*` value.
    pub device_type: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    /// Packed Vulkan versions (`VK_API_VERSION_MAJOR(v)` ...).
    pub api_version: u32,
    pub driver_version: u32,
    /// deviceUUID: equal to CUDA's device UUID on NVIDIA, and what exports carry.
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
    pub name: [c_char; 256],
    /// From `VkPhysicalDeviceDriverProperties`; empty where the driver predates it.
    pub driver_name: [c_char; 256],
    pub driver_info: [c_char; 256],
    pub heap_count: u32,
    pub memory_type_count: u32,
    /// Heap sizes in bytes, and their `VkMemoryHeapFlags` (1: DEVICE_LOCAL).
    pub heap_sizes: [u64; 16],
    pub heap_flags: [u32; 16],
    /// Each memory type's `VkMemoryPropertyFlags` and heap index.
    pub memory_type_flags: [u32; 32],
    pub memory_type_heaps: [u32; 32],
    /// `LF_DEVICE_*` feature bits.
    pub features: u32,
    pub reserved: u32,
}

fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

/// The GPU fields of an `lf_context_config`, as `lf_context_create` received them.
pub(crate) struct GpuFields {
    pub gpu_policy: u32,
    pub gpu_device_select: u32,
    pub gpu_device_index: u32,
    pub gpu_device_uuid: [u8; 16],
    pub strict_gpu: u32,
    pub gpu_arena_size: u64,
}

/// Applies the GPU fields of a C config to `config`, checking each.
pub(crate) fn gpu_settings_from_c(c: &GpuFields, config: &mut ContextConfig) -> FfiResult<()> {
    config.gpu = match c.gpu_policy {
        LF_GPU_AUTO => GpuPolicy::Auto,
        LF_GPU_REQUIRED => GpuPolicy::Required,
        LF_GPU_DISABLED => GpuPolicy::Disabled,
        other => {
            return Err(invalid(format!(
                "gpu_policy {other} is unknown; use LF_GPU_AUTO (0), LF_GPU_REQUIRED (1) or LF_GPU_DISABLED (2)"
            )))
        }
    };
    config.gpu_device = match c.gpu_device_select {
        LF_GPU_DEVICE_DEFAULT => None,
        LF_GPU_DEVICE_INDEX => Some(DeviceSelector::Index(c.gpu_device_index)),
        LF_GPU_DEVICE_UUID => Some(DeviceSelector::Uuid(c.gpu_device_uuid)),
        other => {
            return Err(invalid(format!(
                "gpu_device_select {other} is unknown; use LF_GPU_DEVICE_DEFAULT (0), LF_GPU_DEVICE_INDEX (1) \
                 or LF_GPU_DEVICE_UUID (2)"
            )))
        }
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

/// Copies `text` into a fixed C string field, truncated to leave room for the NUL.
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
fn put_str(field: &mut [c_char], text: &str) {
    let bytes = &text.as_bytes()[..text.len().min(field.len() - 1)];
    for (slot, &byte) in field.iter_mut().zip(bytes) {
        *slot = byte as c_char;
    }
    field[bytes.len()] = 0;
}

#[cfg(feature = "vulkan")]
pub(crate) fn info_to_c(info: &lava_flow::memory::gpu::DeviceInfo) -> lf_device_info {
    use lava_flow::memory::gpu::DeviceType;
    let mut out = lf_device_info {
        index: info.index,
        device_type: match info.device_type {
            DeviceType::IntegratedGpu => LF_DEVICE_TYPE_INTEGRATED_GPU,
            DeviceType::DiscreteGpu => LF_DEVICE_TYPE_DISCRETE_GPU,
            DeviceType::VirtualGpu => LF_DEVICE_TYPE_VIRTUAL_GPU,
            DeviceType::Cpu => LF_DEVICE_TYPE_CPU,
            DeviceType::Other => LF_DEVICE_TYPE_OTHER,
        },
        vendor_id: info.vendor_id,
        device_id: info.device_id,
        api_version: info.api_version,
        driver_version: info.driver_version,
        device_uuid: info.device_uuid,
        driver_uuid: info.driver_uuid,
        name: [0; 256],
        driver_name: [0; 256],
        driver_info: [0; 256],
        heap_count: 0,
        memory_type_count: 0,
        heap_sizes: [0; 16],
        heap_flags: [0; 16],
        memory_type_flags: [0; 32],
        memory_type_heaps: [0; 32],
        features: 0,
        reserved: 0,
    };
    put_str(&mut out.name, &info.name);
    put_str(&mut out.driver_name, &info.driver_name);
    put_str(&mut out.driver_info, &info.driver_info);
    for (i, heap) in info.memory_heaps.iter().take(16).enumerate() {
        out.heap_sizes[i] = heap.size;
        out.heap_flags[i] = u32::from(heap.device_local);
        out.heap_count += 1;
    }
    for (i, memory_type) in info.memory_types.iter().take(32).enumerate() {
        out.memory_type_flags[i] = memory_type.property_flags;
        out.memory_type_heaps[i] = memory_type.heap_index;
        out.memory_type_count += 1;
    }
    let features = [
        (info.opaque_fd.exportable, LF_DEVICE_EXPORT_OPAQUE_FD),
        (info.opaque_fd.importable, LF_DEVICE_IMPORT_OPAQUE_FD),
        (info.dma_buf.exportable, LF_DEVICE_EXPORT_DMA_BUF),
        (info.min_imported_host_pointer_alignment.is_some(), LF_DEVICE_HOST_POINTER_IMPORT),
    ];
    out.features = features.iter().filter(|(has, _)| *has).fold(0, |bits, (_, bit)| bits | bit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::lf_alloc;
    use crate::buffer::{lf_free, LF_MEMORY_CPU_STANDARD};
    use crate::context::{
        lf_context_config, lf_context_create, lf_context_device_info, lf_context_free,
        lf_context_gpu_unavailable_reason,
    };
    use crate::location::LF_UNSET;
    use crate::tests::last_error;
    use std::ffi::CStr;
    use std::ptr;

    fn c_text(field: &[c_char]) -> String {
        // SAFETY: put_str always leaves a NUL inside the field.
        unsafe { CStr::from_ptr(field.as_ptr()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn the_device_is_reported_or_why_there_is_none() {
        // SAFETY (whole test): every out-pointer is writable; handles come from lava-flow.
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut reason = ptr::null();
            assert_eq!(lf_context_gpu_unavailable_reason(context, &mut reason), lf_status::LF_OK);
            let mut info: lf_device_info = std::mem::zeroed();
            let status = lf_context_device_info(context, &mut info);
            if reason.is_null() {
                assert_eq!(status, lf_status::LF_OK);
                #[cfg(feature = "vulkan")]
                {
                    let rust = crate::handle_ref(context, "context").ok().unwrap().context.device_info().unwrap();
                    assert_eq!(c_text(&info.name), rust.name);
                    assert_eq!((info.device_uuid, info.driver_uuid), (rust.device_uuid, rust.driver_uuid));
                }
                assert!(info.heap_count >= 1 && info.heap_sizes[0] > 0 && info.memory_type_count >= 1);
                assert_ne!(info.features & LF_DEVICE_EXPORT_OPAQUE_FD, 0);
            } else {
                assert_eq!(status, lf_status::LF_ERR_UNSUPPORTED);
                assert!(last_error().contains(CStr::from_ptr(reason).to_str().unwrap()), "{}", last_error());
            }
            // Bad input: NULL out, NULL and foreign handles.
            assert_eq!(lf_context_device_info(context, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(lf_context_device_info(ptr::null(), &mut info), lf_status::LF_ERR_NULL_POINTER);
            let mut buffer = ptr::null_mut();
            assert_eq!(lf_alloc(context, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, 0, &mut buffer), lf_status::LF_OK);
            assert_eq!(lf_context_device_info(buffer.cast(), &mut info), lf_status::LF_ERR_BAD_HANDLE);
            assert!(last_error().contains("lf_buffer handle, not an lf_context"), "{}", last_error());
            assert_eq!(lf_context_gpu_unavailable_reason(buffer.cast(), &mut reason), lf_status::LF_ERR_BAD_HANDLE);
            lf_free(buffer);
            lf_context_free(context);

            let disabled = lf_context_config { gpu_policy: LF_GPU_DISABLED, ..Default::default() };
            assert_eq!(lf_context_create(&disabled, &mut context), lf_status::LF_OK);
            assert_eq!(lf_context_gpu_unavailable_reason(context, &mut reason), lf_status::LF_OK);
            assert!(CStr::from_ptr(reason).to_str().unwrap().contains("disables the GPU"));
            assert_eq!(lf_context_device_info(context, &mut info), lf_status::LF_ERR_UNSUPPORTED);
            assert!(
                last_error().contains("no Vulkan device: the context's GPU policy disables the GPU"),
                "{}",
                last_error()
            );
            lf_context_free(context);
        }
    }

    #[test]
    fn strings_are_truncated_to_fit() {
        let mut field = [1 as c_char; 8];
        put_str(&mut field, "a long device name");
        assert_eq!(c_text(&field), "a long ");
        put_str(&mut field, "ok");
        assert_eq!(c_text(&field), "ok");
    }
}
