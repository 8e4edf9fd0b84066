//! GPU memory through Vulkan (Layer 1): a device, pooled exportable arenas of DEVICE_LOCAL
//! and HOST_VISIBLE memory, export to and import from other processes, host transfers, and
//! GPU-pinned host memory.
//!
//! - [`VulkanDevice::open`] opens the device eagerly and reports it ([`DeviceInfo`]).
//! - [`GpuAllocator`] hands out [`GpuBuffer`]s of [`GpuMemoryKind::DeviceLocal`] or
//!   [`GpuMemoryKind::HostVisible`] memory from pooled exportable arenas (64 MiB by default;
//!   requests larger than a quarter of that get their own): one exported fd serves every buffer of an arena.
//!   (On Windows the exports are opaque NT handles, `VK_KHR_external_memory_win32`, and the
//!   semaphores' likewise; `fd` in the names below is then such a handle. CUDA does not import
//!   them there.)
//! - [`GpuBuffer::export`] gives a [`GpuExport`] (a validated `#[repr(C)]` [`GpuExportDesc`] and
//!   an owned fd); [`GpuImporter::import`] imports it on this process's own device, once per
//!   arena, refusing exports of another GPU or driver.
//! - [`GpuBuffer::write`], [`GpuBuffer::read`], [`GpuBuffer::map`], [`copy_buffer`] move data
//!   without Vulkan code; [`copy_buffer_waiting`] makes the GPU wait for
//!   [`TimelineSemaphore`] values first (timeline semaphores shared between processes as
//!   opaque fds where the driver can: [`probe_semaphore_sharing`]); [`import_host_memory`] and [`cuda_host_register`] pin host memory.
//!
//! Environment: `LF_VULKAN_DEVICE` = device index or deviceUUID picks the device when the
//! config does not (see [`GpuConfig`]); `LF_GPU_COPY` = `auto`, `engine`, `shader` or `cuda` says how
//! copies between GPU buffers are made (see [`CopyMethod`]). The loader's own variables apply too
//! (`VK_DRIVER_FILES`/`VK_ICD_FILENAMES` to name the driver, `VK_INSTANCE_LAYERS` for
//! validation).
//!
//! ```no_run
//! use lava_flow::memory::gpu::*;
//! let device = VulkanDevice::open(&GpuConfig::default())?;   // LF_VULKAN_DEVICE picks the GPU
//! let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default())?;
//! let buffer = allocator.allocate(1 << 20, GpuMemoryKind::DeviceLocal)?;
//! buffer.write(0, b"hello")?;
//! let export = buffer.export()?;          // send export.desc.to_bytes() + export.fd
//! // in the other process, on its own device:
//! let imported = GpuImporter::new(&device).import(export)?;
//! let mut out = [0u8; 5];
//! imported.read(0, &mut out)?;
//! # Ok::<(), lava_flow::Error>(())
//! ```

mod allocator;
mod arena;
mod copy_method;
mod cuda;
mod device;
mod export;
mod host_import;
mod import;
mod semaphore;
mod shader_copy;
mod transfer;

pub use allocator::{GpuAllocator, GpuAllocatorConfig, GpuBuffer, SPARE_EMPTY_ARENAS};
pub use arena::{ArenaId, GpuMemoryKind, HandleType};
pub use copy_method::{CopyMethod, GPU_COPY_ENV};
pub use cuda::{cuda_available, cuda_driver_version, cuda_host_register, CudaHostRegistration, DISABLE_CUDA_ENV};
pub(crate) use device::external;
pub use device::{
    describe_handle_types, describe_memory_flags, format_api_version, format_uuid, list_devices, DeviceInfo,
    DeviceSelector, DeviceType, ExternalMemorySupport, ExternalSemaphoreSupport, GpuConfig, MemoryHeapInfo,
    MemoryTypeInfo, VulkanDevice, DEVICE_ENV, FIX_HINT,
};
pub use export::{GpuExport, GpuExportDesc, GPU_EXPORT_DEDICATED, GPU_EXPORT_MAGIC, GPU_EXPORT_VERSION};
pub use host_import::{import_host_memory, HostMemoryImport};
pub use import::GpuImporter;
pub use semaphore::{probe_semaphore_sharing, TimelineSemaphore};
pub use transfer::{
    chosen_copy_method, copies_by_cuda, copy_buffer, copy_buffer_timed, copy_buffer_timed_with, copy_buffer_waiting,
    shader_copy_unavailable, CopyTiming, MappedRange, SHADER_COPY_MIN,
};
