//! The GPU of an `lf_context`: `lf_device_info`, the report of what `lf_context_create`
//! opened, or why nothing. (The settings that choose it are `lf_context_config`'s GPU fields,
//! in the context's module.)
//!
//! The device is opened eagerly by `lf_context_create` and lives as long as the context.
//! Reading its report is thread-safe.

use std::ffi::{c_char, CStr};

#[cfg(feature = "vulkan")]
use super::abi::write_struct;
use super::abi::{output_struct_size, GrowableStruct};
use super::context::lf_context;
use super::raw;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure};

/// What kind of device a GPU is (`lf_device_info.device_type`): the values of
/// `VkPhysicalDeviceType`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_device_type {
    LF_DEVICE_TYPE_OTHER = 0,
    LF_DEVICE_TYPE_INTEGRATED_GPU = 1,
    LF_DEVICE_TYPE_DISCRETE_GPU = 2,
    LF_DEVICE_TYPE_VIRTUAL_GPU = 3,
    LF_DEVICE_TYPE_CPU = 4,
}

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
/// Set `struct_size` before asking for it
/// (`lf_device_info info = {.struct_size = sizeof info};`); the library fills that many
/// bytes, zeros where it has nothing.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lf_device_info {
    /// `sizeof(lf_device_info)`, set by the caller. See "Growable structs" at the top of this
    /// header.
    pub struct_size: u32,
    /// Position in the loader's enumeration (`vulkaninfo --summary`).
    pub index: u32,
    pub device_type: raw::lf_device_type,
    pub vendor_id: u32,
    pub device_id: u32,
    /// Packed Vulkan versions (`VK_API_VERSION_MAJOR(v)` ...).
    pub api_version: u32,
    pub driver_version: u32,
    /// `LF_DEVICE_*` feature bits.
    pub features: u32,
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
}

impl Default for lf_device_info {
    fn default() -> Self {
        lf_device_info {
            struct_size: std::mem::size_of::<Self>() as u32,
            index: 0,
            device_type: 0,
            vendor_id: 0,
            device_id: 0,
            api_version: 0,
            driver_version: 0,
            features: 0,
            device_uuid: [0; 16],
            driver_uuid: [0; 16],
            name: [0; 256],
            driver_name: [0; 256],
            driver_info: [0; 256],
            heap_count: 0,
            memory_type_count: 0,
            heap_sizes: [0; 16],
            heap_flags: [0; 16],
            memory_type_flags: [0; 32],
            memory_type_heaps: [0; 32],
        }
    }
}

// SAFETY: repr(C), starts with the u32 size, integers and arrays of them only.
unsafe impl GrowableStruct for lf_device_info {
    const NAME: &'static str = "lf_device_info";
    const SIZES: &'static [usize] = &[1288];
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
fn info_to_c(info: &lava_flow::memory::gpu::DeviceInfo) -> lf_device_info {
    use lava_flow::memory::gpu::DeviceType;
    let device_type = match info.device_type {
        DeviceType::IntegratedGpu => lf_device_type::LF_DEVICE_TYPE_INTEGRATED_GPU,
        DeviceType::DiscreteGpu => lf_device_type::LF_DEVICE_TYPE_DISCRETE_GPU,
        DeviceType::VirtualGpu => lf_device_type::LF_DEVICE_TYPE_VIRTUAL_GPU,
        DeviceType::Cpu => lf_device_type::LF_DEVICE_TYPE_CPU,
        DeviceType::Other => lf_device_type::LF_DEVICE_TYPE_OTHER,
    };
    let mut out = lf_device_info {
        index: info.index,
        device_type: device_type as u32,
        vendor_id: info.vendor_id,
        device_id: info.device_id,
        api_version: info.api_version,
        driver_version: info.driver_version,
        device_uuid: info.device_uuid,
        driver_uuid: info.driver_uuid,
        ..lf_device_info::default()
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

/// What the context's GPU is: `*out` receives the report of the Vulkan device
/// `lf_context_create` opened, as far as its `struct_size` (set by the caller) says; a size
/// that is not one of the struct's is LF_ERR_INVALID_ARGUMENT. LF_ERR_UNSUPPORTED when the
/// context has none (no loader, driver or device under LF_GPU_AUTO, or LF_GPU_DISABLED): the
/// message says why, as `lf_context_gpu_unavailable_reason` does. Thread-safe.
///
/// # Safety
/// `context` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable for its
/// `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn lf_context_device_info(context: *const lf_context, out: *mut lf_device_info) -> lf_status {
    boundary("lf_context_device_info", || {
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        // SAFETY: the caller promises a writable struct with its size set.
        let size = unsafe { output_struct_size(out) }?;
        #[cfg(feature = "vulkan")]
        if let Some(info) = context.device_info() {
            // SAFETY: the caller promises `struct_size` writable bytes at `out`.
            return unsafe { write_struct(out, size, info_to_c(info)) };
        }
        let _ = (out, size);
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
    use crate::alloc::lf_alloc;
    use crate::buffer::{lf_free, lf_memory_kind};
    use crate::context::{lf_context_config, lf_context_create, lf_context_free, lf_gpu_policy};
    use crate::location::LF_UNSET;
    use crate::tests::last_error;
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
            let mut info = lf_device_info::default();
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
            assert_eq!(
                lf_alloc(context, 64, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            assert_eq!(lf_context_device_info(buffer.cast(), &mut info), lf_status::LF_ERR_BAD_HANDLE);
            assert!(last_error().contains("lf_buffer handle, not an lf_context"), "{}", last_error());
            assert_eq!(lf_context_gpu_unavailable_reason(buffer.cast(), &mut reason), lf_status::LF_ERR_BAD_HANDLE);
            lf_free(buffer);
            lf_context_free(context);

            let disabled =
                lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
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
