//! Opening a Vulkan device: the loader, the physical device a process uses, a logical device
//! with the external-memory extensions, one queue for transfers, and a report of what was
//! found.
//!
//! Opening is eager: every configuration problem (no loader, no device, wrong index, missing
//! extension) shows up in [`VulkanDevice::open`], never in the middle of a transfer. (The
//! transfer queue's command pool and buffers are Vulkan objects, not configuration: they are
//! made at the device's first transfer.)
//!
//! Its parts, each on the ones before: `info` (what a device is and offers: [`DeviceInfo`] and
//! its parts), `instance` (the Vulkan loader and the process's instance, the devices it
//! enumerates), `handle` (an open [`VulkanDevice`]: the state its objects share, its queue)
//! and `open` (choosing a device and opening it). `external` is the platform's way of sharing
//! memory and semaphores between processes (opaque fds on Linux, NT handles on Windows), which
//! `open` enables and the modules above call; `vk_error`, below them all, turns a failed
//! Vulkan call into the crate's error.

pub(crate) mod external;
mod handle;
mod info;
mod instance;
mod open;
mod vk_error;

pub use crate::memory::gpu_settings::{format_uuid, DeviceSelector};
pub use handle::VulkanDevice;
pub(crate) use handle::{DeviceState, TimelineApi};
pub use info::{
    describe_handle_types, describe_memory_flags, format_api_version, DeviceInfo, DeviceType, ExternalMemorySupport,
    ExternalSemaphoreSupport, MemoryHeapInfo, MemoryTypeInfo,
};
pub use instance::{list_devices, FIX_HINT};
pub(crate) use open::BUFFER_USAGE;
pub use open::{GpuConfig, DEVICE_ENV};
pub(crate) use vk_error::vk_err;
