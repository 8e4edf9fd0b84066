//! What a device is and offers, as [`VulkanDevice::open`](super::VulkanDevice::open) found
//! it: [`DeviceInfo`] and its parts, and the names of Vulkan's flags in its reports.

use std::fmt;

use ash::vk;

use super::external;
use crate::memory::gpu_settings::format_uuid;

/// The kind of a physical device, as Vulkan reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceType {
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    Cpu,
    Other,
}

impl DeviceType {
    pub(super) fn from_vk(t: vk::PhysicalDeviceType) -> Self {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceType::DiscreteGpu,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceType::IntegratedGpu,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceType::VirtualGpu,
            vk::PhysicalDeviceType::CPU => DeviceType::Cpu,
            _ => DeviceType::Other,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::DiscreteGpu => "discrete GPU",
            DeviceType::IntegratedGpu => "integrated GPU",
            DeviceType::VirtualGpu => "virtual GPU",
            DeviceType::Cpu => "CPU",
            DeviceType::Other => "other",
        }
    }
}

/// One memory heap of the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryHeapInfo {
    pub size: u64,
    pub device_local: bool,
}

/// One memory type of the device: its heap and `VkMemoryPropertyFlags` bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryTypeInfo {
    pub heap_index: u32,
    pub property_flags: u32,
}

/// What the external-memory queries said about buffers of one handle type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExternalMemorySupport {
    pub exportable: bool,
    pub importable: bool,
    /// The driver only exports whole dedicated allocations (no pooling in arenas then).
    pub dedicated_only: bool,
    /// `VkExternalMemoryHandleTypeFlags` that memory exported as this type can also be
    /// exported as (in the same allocation).
    pub compatible_handle_types: u32,
}

impl fmt::Display for ExternalMemorySupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.exportable, self.importable) {
            (true, true) => "exportable and importable",
            (true, false) => "exportable only",
            (false, true) => "importable only",
            (false, false) => return f.write_str("no"),
        })?;
        if self.dedicated_only {
            f.write_str(", dedicated allocations only")?;
        }
        write!(f, " (compatible handle types: {})", describe_handle_types(self.compatible_handle_types))
    }
}

/// `VkExternalMemoryHandleTypeFlags` bits as `OPAQUE_FD|DMA_BUF|...`.
pub fn describe_handle_types(flags: u32) -> String {
    use vk::ExternalMemoryHandleTypeFlags as T;
    let names = [
        (T::OPAQUE_FD, "OPAQUE_FD"),
        (T::OPAQUE_WIN32, "OPAQUE_WIN32"),
        (T::OPAQUE_WIN32_KMT, "OPAQUE_WIN32_KMT"),
        (T::D3D11_TEXTURE, "D3D11_TEXTURE"),
        (T::D3D11_TEXTURE_KMT, "D3D11_TEXTURE_KMT"),
        (T::D3D12_HEAP, "D3D12_HEAP"),
        (T::D3D12_RESOURCE, "D3D12_RESOURCE"),
        (T::DMA_BUF_EXT, "DMA_BUF"),
        (T::HOST_ALLOCATION_EXT, "HOST_ALLOCATION"),
        (T::HOST_MAPPED_FOREIGN_MEMORY_EXT, "HOST_MAPPED_FOREIGN_MEMORY"),
    ];
    let mut text: Vec<String> =
        names.iter().filter(|(b, _)| flags & b.as_raw() != 0).map(|(_, n)| (*n).to_owned()).collect();
    let rest = names.iter().fold(flags, |left, (b, _)| left & !b.as_raw());
    if rest != 0 {
        text.push(format!("{rest:#x}"));
    }
    if text.is_empty() {
        "none".into()
    } else {
        text.join("|")
    }
}

/// What the external-semaphore query said about timeline semaphores as opaque fds
/// (`vkGetPhysicalDeviceExternalSemaphoreProperties` with a chained timeline
/// `VkSemaphoreTypeCreateInfo`). Both false where the device does not offer
/// `VK_KHR_external_semaphore_fd` or timeline semaphores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExternalSemaphoreSupport {
    pub exportable: bool,
    pub importable: bool,
}

impl fmt::Display for ExternalSemaphoreSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.exportable, self.importable) {
            (true, true) => f.write_str("exportable and importable"),
            (true, false) => f.write_str("exportable only"),
            (false, true) => f.write_str("importable only"),
            (false, false) => f.write_str("no"),
        }
    }
}

/// What [`VulkanDevice::open`] found and chose.
///
/// [`VulkanDevice::open`]: super::VulkanDevice::open
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Position in the loader's enumeration.
    pub index: u32,
    pub name: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub device_type: DeviceType,
    /// `VkPhysicalDeviceProperties::apiVersion` (use [`format_api_version`]).
    pub api_version: u32,
    pub driver_version: u32,
    pub device_uuid: [u8; 16],
    pub driver_uuid: [u8; 16],
    /// From `VkPhysicalDeviceDriverProperties`; empty where the device predates it.
    pub driver_name: String,
    pub driver_info: String,
    pub memory_heaps: Vec<MemoryHeapInfo>,
    pub memory_types: Vec<MemoryTypeInfo>,
    pub enabled_extensions: Vec<String>,
    pub queue_family_index: u32,
    /// Nanoseconds per timestamp tick; `None` if the transfer queue has no timestamps.
    pub timestamp_period_ns: Option<f32>,
    /// For `VK_EXT_external_memory_host`: the alignment of imported host pointers and sizes.
    pub min_imported_host_pointer_alignment: Option<u64>,
    /// Buffer memory as the platform's opaque handle: an opaque fd, or on Windows an opaque
    /// NT handle (`OPAQUE_WIN32`).
    pub opaque_fd: ExternalMemorySupport,
    pub dma_buf: ExternalMemorySupport,
    /// Whether timeline semaphores were enabled (Vulkan 1.2 `timelineSemaphore`, or
    /// `VK_KHR_timeline_semaphore` on a 1.1 device).
    pub timeline_semaphores: bool,
    /// Whether timeline semaphores can be exported and imported as opaque fds (on Windows:
    /// opaque NT handles).
    pub semaphore_fd: ExternalSemaphoreSupport,
    /// Every device the loader enumerated: (index, name, type, deviceUUID).
    pub all_devices: Vec<(u32, String, DeviceType, [u8; 16])>,
}

impl DeviceInfo {
    /// Whether `name` (e.g. `"VK_EXT_external_memory_host"`) was enabled on the device.
    pub fn has_extension(&self, name: &str) -> bool {
        self.enabled_extensions.iter().any(|e| e == name)
    }

    /// A JSON object with the same content as the `Display` report.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "index": self.index,
            "name": self.name,
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "device_type": self.device_type.as_str(),
            "api_version": format_api_version(self.api_version),
            "device_uuid": format_uuid(&self.device_uuid),
            "driver_uuid": format_uuid(&self.driver_uuid),
            "driver_name": self.driver_name,
            "driver_info": self.driver_info,
            "memory_heaps": self.memory_heaps.iter().map(|h| serde_json::json!({
                "size": h.size, "device_local": h.device_local })).collect::<Vec<_>>(),
            "memory_types": self.memory_types.iter().map(|t| serde_json::json!({
                "heap_index": t.heap_index,
                "flags": describe_memory_flags(t.property_flags) })).collect::<Vec<_>>(),
            "enabled_extensions": self.enabled_extensions,
            "queue_family_index": self.queue_family_index,
            "timestamp_period_ns": self.timestamp_period_ns,
            "opaque_fd": format!("{:?}", self.opaque_fd),
            "dma_buf": format!("{:?}", self.dma_buf),
            "timeline_semaphores": self.timeline_semaphores,
            "semaphore_fd": serde_json::json!({
                "exportable": self.semaphore_fd.exportable,
                "importable": self.semaphore_fd.importable }),
        })
    }
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Vulkan device {}: {} ({}, vendor 0x{:04x} device 0x{:04x}, Vulkan {})",
            self.index,
            self.name,
            self.device_type.as_str(),
            self.vendor_id,
            self.device_id,
            format_api_version(self.api_version)
        )?;
        writeln!(f, "  driver: {} {}", self.driver_name, self.driver_info)?;
        writeln!(f, "  deviceUUID {}", format_uuid(&self.device_uuid))?;
        writeln!(f, "  driverUUID {}", format_uuid(&self.driver_uuid))?;
        for (i, heap) in self.memory_heaps.iter().enumerate() {
            writeln!(
                f,
                "  heap {i}: {:.2} GiB{}",
                heap.size as f64 / (1u64 << 30) as f64,
                if heap.device_local { " DEVICE_LOCAL" } else { "" }
            )?;
        }
        for (i, t) in self.memory_types.iter().enumerate() {
            writeln!(f, "  type {i}: heap {} {}", t.heap_index, describe_memory_flags(t.property_flags))?;
        }
        writeln!(f, "  extensions: {}", self.enabled_extensions.join(", "))?;
        writeln!(f, "  external memory as {}: {}", external::HANDLE_NAME, self.opaque_fd)?;
        writeln!(f, "  external memory as dma-buf: {}", self.dma_buf)?;
        writeln!(
            f,
            "  timeline semaphores: {}; as {}s: {}",
            if self.timeline_semaphores { "yes" } else { "no" },
            external::HANDLE_NAME,
            self.semaphore_fd
        )?;
        write!(f, "  transfer queue family {}", self.queue_family_index)
    }
}

/// `a.b.c` from a packed Vulkan version.
pub fn format_api_version(v: u32) -> String {
    format!("{}.{}.{}", vk::api_version_major(v), vk::api_version_minor(v), vk::api_version_patch(v))
}

/// `VkMemoryPropertyFlags` bits as `DEVICE_LOCAL|HOST_VISIBLE|...`.
pub fn describe_memory_flags(flags: u32) -> String {
    const NAMES: [(u32, &str); 6] = [
        (0x1, "DEVICE_LOCAL"),
        (0x2, "HOST_VISIBLE"),
        (0x4, "HOST_COHERENT"),
        (0x8, "HOST_CACHED"),
        (0x10, "LAZILY_ALLOCATED"),
        (0x20, "PROTECTED"),
    ];
    let names: Vec<&str> = NAMES.iter().filter(|(b, _)| flags & b != 0).map(|(_, n)| *n).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join("|")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_flags_read_as_names() {
        assert_eq!(describe_memory_flags(0x7), "DEVICE_LOCAL|HOST_VISIBLE|HOST_COHERENT");
        assert_eq!(describe_memory_flags(0), "none");
        assert_eq!(describe_handle_types(0x201), "OPAQUE_FD|DMA_BUF");
        assert_eq!(describe_handle_types(0), "none");
        assert_eq!(describe_handle_types(1 << 30), "0x40000000");
        let both = ExternalMemorySupport {
            exportable: true,
            importable: true,
            dedicated_only: false,
            compatible_handle_types: 1,
        };
        assert_eq!(both.to_string(), "exportable and importable (compatible handle types: OPAQUE_FD)");
        assert_eq!(ExternalMemorySupport::default().to_string(), "no");
    }
}
