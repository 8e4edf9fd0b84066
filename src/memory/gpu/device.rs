//! Opening a Vulkan device: the loader, the physical device a process uses, a logical device
//! with the external-memory extensions, one queue for transfers, and a report of what was
//! found.
//!
//! Opening is eager (the seed's lesson 6.1): every configuration problem (no loader, no
//! device, wrong index, missing extension) shows up in [`VulkanDevice::open`], never in the
//! middle of a transfer. (The transfer queue's command pool and buffers are Vulkan objects,
//! not configuration: they are made at the device's first transfer.)

use std::any::Any;
use std::ffi::{c_char, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};

use ash::vk;
use parking_lot::Mutex;

use super::copy_method::{copy_method_from_env, CopyMethod};
use crate::error::{Error, Result};
pub use crate::memory::gpu_settings::{format_uuid, DeviceSelector};

/// The environment variable that picks the physical device when the config does not: a device
/// index (`0`, `1`, ...) or a deviceUUID in hex (32 digits, dashes allowed, as `vulkaninfo`
/// prints it).
pub const DEVICE_ENV: &str = crate::env::VULKAN_DEVICE.name;

/// How to get a Vulkan device, as the errors of a failed opening say it.
pub const FIX_HINT: &str = "install a Vulkan driver: your GPU vendor's driver (it ships the Vulkan \
    ICD), or mesa-vulkan-drivers for the CPU driver lavapipe; `vulkaninfo --summary` (package \
    vulkan-tools) shows what the loader finds";

/// How to open the GPU.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// The device to open. `None`: the one [`DEVICE_ENV`] names if `use_env` is set, else the
    /// first discrete GPU, else the first device.
    pub device: Option<DeviceSelector>,
    /// Whether [`DEVICE_ENV`] is consulted when `device` is `None` (default: yes).
    pub use_env: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig { device: None, use_env: true }
    }
}

impl GpuConfig {
    /// A config that opens exactly this device, whatever the environment says.
    pub fn with_device(device: DeviceSelector) -> Self {
        GpuConfig { device: Some(device), use_env: false }
    }
}

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
    fn from_vk(t: vk::PhysicalDeviceType) -> Self {
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
    pub opaque_fd: ExternalMemorySupport,
    pub dma_buf: ExternalMemorySupport,
    /// Whether timeline semaphores were enabled (Vulkan 1.2 `timelineSemaphore`, or
    /// `VK_KHR_timeline_semaphore` on a 1.1 device).
    pub timeline_semaphores: bool,
    /// Whether timeline semaphores can be exported and imported as opaque fds.
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
        writeln!(f, "  external memory as opaque fd: {}", self.opaque_fd)?;
        writeln!(f, "  external memory as dma-buf: {}", self.dma_buf)?;
        writeln!(
            f,
            "  timeline semaphores: {}; as opaque fds: {}",
            if self.timeline_semaphores { "yes" } else { "no" },
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

const EXT_MEMORY_FD: &CStr = ash::khr::external_memory_fd::NAME;
const EXT_DMA_BUF: &CStr = ash::ext::external_memory_dma_buf::NAME;
const EXT_MEMORY_HOST: &CStr = ash::ext::external_memory_host::NAME;
const EXT_SEMAPHORE_FD: &CStr = ash::khr::external_semaphore_fd::NAME;
const EXT_TIMELINE: &CStr = ash::khr::timeline_semaphore::NAME;

/// The usage of every buffer lava-flow creates. Exporter and importer must agree on it: the
/// memory requirements (type bits, alignment) of a buffer depend on its usage.
pub(crate) const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::STORAGE_BUFFER.as_raw(),
);

/// How timeline semaphores are reached on a device.
pub(crate) enum TimelineApi {
    /// Vulkan 1.2 core entry points (`ash::Device`).
    Core,
    /// `VK_KHR_timeline_semaphore` on a Vulkan 1.1 device.
    Khr(ash::khr::timeline_semaphore::Device),
}

/// The state every GPU object of one device shares; dropped (device destroyed) after the last
/// buffer, arena and handle.
pub(crate) struct DeviceShared {
    // Field order matters only for documentation: Drop below destroys explicitly.
    pub(crate) _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    pub(crate) physical: vk::PhysicalDevice,
    pub(crate) device: ash::Device,
    pub(crate) memory_fd: ash::khr::external_memory_fd::Device,
    pub(crate) memory_host: Option<ash::ext::external_memory_host::Device>,
    /// `VK_KHR_external_semaphore_fd`, where the device offers it.
    pub(crate) semaphore_fd: Option<ash::khr::external_semaphore_fd::Device>,
    /// Timeline semaphores, where enabled.
    pub(crate) timeline: Option<TimelineApi>,
    pub(crate) memory_properties: vk::PhysicalDeviceMemoryProperties,
    pub(crate) info: DeviceInfo,
    /// The one queue, of family `info.queue_family_index`: submissions ([`VulkanDevice::queue_submit`])
    /// and [`VulkanDevice::wait_idle`] hold its lock.
    queue: Mutex<vk::Queue>,
    /// Whether the queue runs compute shaders.
    pub(crate) queue_compute: bool,
    /// How `CopyMethod::Auto` copies are made: what `LF_GPU_COPY` said at opening.
    pub(crate) copy_method: CopyMethod,
    /// The state the modules above keep on this device, one of each type ([`VulkanDevice::state`]).
    states: Mutex<Vec<Arc<dyn DeviceState>>>,
}

/// State that a module above the device keeps per device (the transfer queue's command
/// buffers and staging, the import cache): made on first use by [`VulkanDevice::state`] and
/// destroyed before the device. The device knows its states only through this trait.
pub(crate) trait DeviceState: Any + Send + Sync {
    /// Destroys the Vulkan objects the state made on `device`.
    ///
    /// # Safety
    /// Called once, as the device is destroyed: the device is idle and nothing uses the
    /// state again.
    unsafe fn destroy(&self, _device: &ash::Device) {}

    /// The state as `Any`, to find it again by its type.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// The Vulkan loader and one instance, made once per process and never destroyed: all of a
/// process's contexts open their devices on it. A driver unloaded, or an instance destroyed,
/// while another thread is inside the driver crashes that thread (seen with NVIDIA's driver:
/// heap corruption and calls into unloaded code in a process opening and closing contexts in
/// two threads); one instance for the process's life avoids both, and costs one instance.
fn process_instance() -> Result<(ash::Entry, ash::Instance, u32)> {
    /// A failure, kept to be told again: Unsupported (no loader, driver or device) or a
    /// Vulkan error.
    type Kept = std::result::Result<(ash::Entry, ash::Instance, u32), (bool, String)>;
    static INSTANCE: OnceLock<Kept> = OnceLock::new();
    let kept = INSTANCE.get_or_init(|| {
        create_instance().map_err(|e| match e {
            Error::Unsupported(m) => (true, m),
            other => (false, other.to_string()),
        })
    });
    match kept {
        Ok(instance) => Ok(instance.clone()),
        Err((true, m)) => Err(Error::Unsupported(m.clone())),
        Err((false, m)) => Err(Error::Vulkan(m.clone())),
    }
}

fn create_instance() -> Result<(ash::Entry, ash::Instance, u32)> {
    // SAFETY: loading libvulkan runs its initialisers; the loader is designed for that, and
    // the process-wide instance keeps the library loaded for the rest of the process.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| {
        Error::Unsupported(format!(
            "no Vulkan loader (libvulkan.so.1) could be loaded ({e}); install libvulkan1 and {FIX_HINT}"
        ))
    })?;
    // SAFETY: a plain query on a loaded entry.
    let instance_version = unsafe { entry.try_enumerate_instance_version() }
        .map_err(vk_err("vkEnumerateInstanceVersion"))?
        .unwrap_or(vk::API_VERSION_1_0);
    if instance_version < vk::API_VERSION_1_1 {
        return Err(Error::Unsupported(format!(
            "the Vulkan loader offers API {}, lava-flow needs 1.1 or newer; update libvulkan1",
            format_api_version(instance_version)
        )));
    }
    let api = instance_version.min(vk::API_VERSION_1_3);
    // (No c"" literals: they need Rust 1.77 and the crate supports 1.75.)
    let name = c"lava-flow";
    let app = vk::ApplicationInfo::default().application_name(name).engine_name(name).api_version(api);
    let create = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: create info and the strings it points to outlive the call.
    let instance = unsafe { entry.create_instance(&create, None) }.map_err(|r| {
        if r == vk::Result::ERROR_INCOMPATIBLE_DRIVER {
            Error::Unsupported(format!("vkCreateInstance: no Vulkan driver (ICD) found; {FIX_HINT}"))
        } else {
            vk_err("vkCreateInstance")(r)
        }
    })?;
    Ok((entry, instance, api))
}

/// Says which device was opened and why, and what it lacks that lava-flow would use.
fn log_opened(info: &DeviceInfo, chosen_by: &str) {
    let why = if !chosen_by.is_empty() {
        format!("chosen by {chosen_by}")
    } else if info.device_type == DeviceType::DiscreteGpu {
        format!("the first discrete GPU; set {DEVICE_ENV} to choose another")
    } else {
        format!("the first device, as there is no discrete GPU; set {DEVICE_ENV} to choose another")
    };
    log::info!(
        "opened Vulkan device {} ({}, {}, driver {} {}, Vulkan {}): {why}",
        info.index,
        info.name,
        info.device_type.as_str(),
        info.driver_name,
        info.driver_info,
        format_api_version(info.api_version)
    );
    if info.min_imported_host_pointer_alignment.is_none() {
        log::info!(
            "Vulkan device {} ({}) does not offer VK_EXT_external_memory_host: GPU-pinned memory is not imported into \
             it, so copies between it and GPU memory are staged through the host; update the driver to copy by DMA",
            info.index,
            info.name
        );
    }
}

/// Held while a device is created or destroyed, so that drivers see one at a time.
static LIFECYCLE: Mutex<()> = Mutex::new(());

impl Drop for DeviceShared {
    fn drop(&mut self) {
        let _lifecycle = LIFECYCLE.lock();
        // SAFETY: this is the last reference to the device: every arena and buffer holds a
        // VulkanDevice clone, so none is alive. Waiting for idle first means no command still
        // uses the objects destroyed here.
        unsafe {
            let _ = self.device.device_wait_idle();
            for state in self.states.get_mut().drain(..) {
                state.destroy(&self.device);
            }
            self.device.destroy_device(None);
            // The instance is the process's (see `process_instance`).
        }
    }
}

/// An open Vulkan device. Cheap to clone (shared handle); `Send + Sync`: the queue is behind a
/// mutex, everything else is immutable after opening.
#[derive(Clone)]
pub struct VulkanDevice {
    pub(crate) shared: Arc<DeviceShared>,
}

impl fmt::Debug for VulkanDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanDevice")
            .field("name", &self.shared.info.name)
            .field("device_uuid", &format_uuid(&self.shared.info.device_uuid))
            .finish()
    }
}

struct Candidate {
    physical: vk::PhysicalDevice,
    properties: vk::PhysicalDeviceProperties,
    uuid: [u8; 16],
}

pub(crate) fn vk_err(what: &str) -> impl Fn(vk::Result) -> Error + '_ {
    move |r| match r {
        vk::Result::ERROR_OUT_OF_HOST_MEMORY | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => {
            Error::OutOfMemory(format!("{what}: {r}"))
        }
        _ => Error::Vulkan(format!("{what}: {r}")),
    }
}

/// Every physical device of `instance`, with (index, name, type, deviceUUID) for reports.
#[allow(clippy::type_complexity)]
fn enumerate_candidates(
    instance: &ash::Instance,
) -> Result<(Vec<Candidate>, Vec<(u32, String, DeviceType, [u8; 16])>)> {
    // SAFETY: instance is a live instance for all the queries below.
    let physicals = unsafe { instance.enumerate_physical_devices() }.map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    if physicals.is_empty() {
        return Err(Error::Unsupported(format!("the Vulkan loader found no device; {FIX_HINT}")));
    }
    let mut candidates = Vec::with_capacity(physicals.len());
    for &physical in &physicals {
        let mut id = vk::PhysicalDeviceIDProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
        // SAFETY: physical comes from this instance; props2's chain is live.
        unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
        let properties = props2.properties;
        candidates.push(Candidate { physical, properties, uuid: id.device_uuid });
    }
    let all_devices = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as u32,
                c.properties.device_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                DeviceType::from_vk(c.properties.device_type),
                c.uuid,
            )
        })
        .collect();
    Ok((candidates, all_devices))
}

/// Every device the Vulkan loader enumerates: (index, name, type, deviceUUID), in the order
/// that device indices (`LF_VULKAN_DEVICE`, [`DeviceSelector::Index`]) count. Opens no device,
/// so it lists devices that [`VulkanDevice::open`] would refuse too. Errors: `Unsupported`
/// without a loader, a driver or a device (the message says what to install).
#[allow(clippy::type_complexity)]
pub fn list_devices() -> Result<Vec<(u32, String, DeviceType, [u8; 16])>> {
    let (_entry, instance, _api) = process_instance()?;
    Ok(enumerate_candidates(&instance)?.1)
}

impl VulkanDevice {
    /// Opens the device `config` selects (see [`GpuConfig`]), eagerly.
    ///
    /// Errors: `Unsupported` without a loader, a device, Vulkan 1.1 or
    /// `VK_KHR_external_memory_fd` (the message says what to install); `NotFound` for an index
    /// or UUID that matches no device, listing the devices there are; `InvalidArgument` for a
    /// malformed [`DEVICE_ENV`] or `LF_GPU_COPY` (see [`super::GPU_COPY_ENV`]).
    pub fn open(config: &GpuConfig) -> Result<Self> {
        crate::logging::init();
        let chosen_by = match (&config.device, config.use_env) {
            (Some(_), _) => "the configuration's device selection".to_owned(),
            (None, true) => std::env::var(DEVICE_ENV)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map_or_else(String::new, |v| format!("{DEVICE_ENV}={v}")),
            (None, false) => String::new(),
        };
        let selector = match (&config.device, config.use_env) {
            (Some(s), _) => Some(s.clone()),
            (None, true) => match std::env::var(DEVICE_ENV) {
                Ok(v) if !v.trim().is_empty() => Some(v.parse::<DeviceSelector>().map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::invalid(format!("{DEVICE_ENV}={v:?}: {m}")),
                    other => other,
                })?),
                _ => None,
            },
            (None, false) => None,
        };
        let copy_method = copy_method_from_env()?;
        let from_env = config.device.is_none() && selector.is_some();

        let (entry, instance, api) = process_instance()?;
        let device = {
            let _lifecycle = LIFECYCLE.lock();
            Self::open_on(entry, instance, api, selector, copy_method).map_err(|e| match e {
                // Say where the selector came from: the environment outlives the command line.
                Error::NotFound(m) if from_env => Error::NotFound(format!(
                    "{DEVICE_ENV}={:?} names no device: {m}; set it to one of them, or unset it",
                    std::env::var(DEVICE_ENV).unwrap_or_default()
                )),
                other => other,
            })?
        };
        log_opened(device.info(), &chosen_by);
        Ok(device)
    }

    fn open_on(
        entry: ash::Entry,
        instance: ash::Instance,
        instance_api: u32,
        selector: Option<DeviceSelector>,
        copy_method: CopyMethod,
    ) -> Result<Self> {
        let (candidates, all_devices) = enumerate_candidates(&instance)?;
        let listing = || {
            all_devices
                .iter()
                .map(|(i, n, t, u)| format!("{i}: {n} ({}, deviceUUID {})", t.as_str(), format_uuid(u)))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let index = match &selector {
            Some(DeviceSelector::Index(i)) => {
                if (*i as usize) >= candidates.len() {
                    return Err(Error::NotFound(format!(
                        "Vulkan device index {i}: there are {} device(s): {}",
                        candidates.len(),
                        listing()
                    )));
                }
                *i as usize
            }
            Some(DeviceSelector::Uuid(u)) => candidates.iter().position(|c| c.uuid == *u).ok_or_else(|| {
                Error::NotFound(format!(
                    "no Vulkan device has deviceUUID {}; the devices are: {}",
                    format_uuid(u),
                    listing()
                ))
            })?,
            None => candidates
                .iter()
                .position(|c| c.properties.device_type == vk::PhysicalDeviceType::DISCRETE_GPU)
                .unwrap_or(0),
        };
        let chosen = &candidates[index];
        let name = all_devices[index].1.clone();
        if chosen.properties.api_version < vk::API_VERSION_1_1 {
            return Err(Error::Unsupported(format!(
                "Vulkan device {index} ({name}) offers API {}, lava-flow needs 1.1; update its driver",
                format_api_version(chosen.properties.api_version)
            )));
        }
        let physical = chosen.physical;

        // SAFETY: physical is a device of this instance.
        let offered = unsafe { instance.enumerate_device_extension_properties(physical) }
            .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
        let offers = |ext: &CStr| offered.iter().any(|p| p.extension_name_as_c_str() == Ok(ext));
        if !offers(EXT_MEMORY_FD) {
            return Err(Error::Unsupported(format!(
                "Vulkan device {index} ({name}) does not offer VK_KHR_external_memory_fd, which \
                 sharing GPU memory between processes needs; update its driver or pick another \
                 device with {DEVICE_ENV}"
            )));
        }
        let mut enable: Vec<&CStr> = vec![EXT_MEMORY_FD];
        for ext in [EXT_DMA_BUF, EXT_MEMORY_HOST] {
            if offers(ext) {
                enable.push(ext);
            }
        }
        let has_host = enable.contains(&EXT_MEMORY_HOST);
        let has_dma_buf = enable.contains(&EXT_DMA_BUF);
        // The version the device is used at: the lower of the instance's and the device's.
        let device_api = instance_api.min(chosen.properties.api_version);
        let core_12 = device_api >= vk::API_VERSION_1_2;

        // Timeline semaphores: Vulkan 1.2 core, or VK_KHR_timeline_semaphore on 1.1; the
        // feature is queried before it is enabled.
        let timeline_ext = !core_12 && offers(EXT_TIMELINE);
        let timeline_semaphores = if core_12 || timeline_ext {
            let mut timeline = vk::PhysicalDeviceTimelineSemaphoreFeatures::default();
            let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut timeline);
            // SAFETY: the chained struct is known to the device (1.2 core or the extension it
            // offers); both outlive the call.
            unsafe { instance.get_physical_device_features2(physical, &mut features2) };
            timeline.timeline_semaphore == vk::TRUE
        } else {
            false
        };
        if timeline_semaphores && timeline_ext {
            enable.push(EXT_TIMELINE);
        }
        let has_semaphore_fd = offers(EXT_SEMAPHORE_FD);
        if has_semaphore_fd {
            enable.push(EXT_SEMAPHORE_FD);
        }
        let semaphore_fd = if has_semaphore_fd && timeline_semaphores {
            let mut kind = vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE);
            let query = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD)
                .push_next(&mut kind);
            let mut out = vk::ExternalSemaphoreProperties::default();
            // SAFETY: plain query (Vulkan 1.1 core); the chain is live for the call.
            unsafe { instance.get_physical_device_external_semaphore_properties(physical, &query, &mut out) };
            let f = out.external_semaphore_features;
            ExternalSemaphoreSupport {
                exportable: f.contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE),
                importable: f.contains(vk::ExternalSemaphoreFeatureFlags::IMPORTABLE),
            }
        } else {
            ExternalSemaphoreSupport::default()
        };

        // Driver name/info and the host-pointer alignment, where the device has them.
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut host_props = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
        let mut id = vk::PhysicalDeviceIDProperties::default();
        let has_driver_props =
            chosen.properties.api_version >= vk::API_VERSION_1_2 || offers(ash::khr::driver_properties::NAME);
        {
            let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut id);
            if has_driver_props {
                props2 = props2.push_next(&mut driver);
            }
            if has_host {
                props2 = props2.push_next(&mut host_props);
            }
            // SAFETY: every struct in the chain is live and of a type the device supports.
            unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
        }
        let (driver_name, driver_info) = if has_driver_props {
            (
                driver.driver_name_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
                driver.driver_info_as_c_str().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            )
        } else {
            (String::new(), String::new())
        };

        // SAFETY: plain queries on a live physical device.
        let memory_properties = unsafe { instance.get_physical_device_memory_properties(physical) };
        // SAFETY: as above.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        // A graphics/compute family first: on discrete GPUs its copies use the shader cores and
        // reach the device's full bandwidth; a transfer-only family is the fallback.
        let family = families
            .iter()
            .position(|f| {
                f.queue_count > 0 && f.queue_flags.intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE)
            })
            .or_else(|| {
                families.iter().position(|f| f.queue_count > 0 && f.queue_flags.contains(vk::QueueFlags::TRANSFER))
            })
            .ok_or_else(|| Error::Unsupported(format!("Vulkan device {index} ({name}) has no queue that can copy")))?
            as u32;
        let timestamp_period_ns = (families[family as usize].timestamp_valid_bits > 0
            && chosen.properties.limits.timestamp_period > 0.0)
            .then_some(chosen.properties.limits.timestamp_period);

        let external = |handle_type: vk::ExternalMemoryHandleTypeFlags| {
            let query = vk::PhysicalDeviceExternalBufferInfo::default().usage(BUFFER_USAGE).handle_type(handle_type);
            let mut out = vk::ExternalBufferProperties::default();
            // SAFETY: plain query; Vulkan 1.1 core.
            unsafe { instance.get_physical_device_external_buffer_properties(physical, &query, &mut out) };
            let f = out.external_memory_properties.external_memory_features;
            ExternalMemorySupport {
                exportable: f.contains(vk::ExternalMemoryFeatureFlags::EXPORTABLE),
                importable: f.contains(vk::ExternalMemoryFeatureFlags::IMPORTABLE),
                dedicated_only: f.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY),
                compatible_handle_types: out.external_memory_properties.compatible_handle_types.as_raw(),
            }
        };
        let opaque_fd = external(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        let dma_buf = if has_dma_buf {
            external(vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT)
        } else {
            ExternalMemorySupport::default()
        };

        let priorities = [1.0f32];
        let queue_info =
            [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities)];
        let names: Vec<*const c_char> = enable.iter().map(|e| e.as_ptr()).collect();
        let mut timeline_feature = vk::PhysicalDeviceTimelineSemaphoreFeatures::default().timeline_semaphore(true);
        let mut create =
            vk::DeviceCreateInfo::default().queue_create_infos(&queue_info).enabled_extension_names(&names);
        if timeline_semaphores {
            create = create.push_next(&mut timeline_feature);
        }
        // SAFETY: the create info and everything it points to outlive the call.
        let device = unsafe { instance.create_device(physical, &create, None) }
            .map_err(vk_err(&format!("vkCreateDevice on device {index} ({name})")))?;
        // SAFETY: the queue family and index were requested at creation.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let compute = families[family as usize].queue_flags.contains(vk::QueueFlags::COMPUTE);
        let memory_fd = ash::khr::external_memory_fd::Device::new(&instance, &device);
        let memory_host = has_host.then(|| ash::ext::external_memory_host::Device::new(&instance, &device));
        let semaphore_fd_api =
            has_semaphore_fd.then(|| ash::khr::external_semaphore_fd::Device::new(&instance, &device));
        let timeline = match (timeline_semaphores, core_12) {
            (false, _) => None,
            (true, true) => Some(TimelineApi::Core),
            (true, false) => Some(TimelineApi::Khr(ash::khr::timeline_semaphore::Device::new(&instance, &device))),
        };

        let props = &chosen.properties;
        let info = DeviceInfo {
            index: index as u32,
            name,
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            device_type: DeviceType::from_vk(props.device_type),
            api_version: props.api_version,
            driver_version: props.driver_version,
            device_uuid: id.device_uuid,
            driver_uuid: id.driver_uuid,
            driver_name,
            driver_info,
            memory_heaps: memory_properties
                .memory_heaps_as_slice()
                .iter()
                .map(|h| MemoryHeapInfo {
                    size: h.size,
                    device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
                })
                .collect(),
            memory_types: memory_properties
                .memory_types_as_slice()
                .iter()
                .map(|t| MemoryTypeInfo { heap_index: t.heap_index, property_flags: t.property_flags.as_raw() })
                .collect(),
            enabled_extensions: enable.iter().map(|e| e.to_string_lossy().into_owned()).collect(),
            queue_family_index: family,
            timestamp_period_ns,
            min_imported_host_pointer_alignment: has_host.then_some(host_props.min_imported_host_pointer_alignment),
            opaque_fd,
            dma_buf,
            timeline_semaphores,
            semaphore_fd,
            all_devices,
        };
        Ok(VulkanDevice {
            shared: Arc::new(DeviceShared {
                _entry: entry,
                instance,
                physical,
                device,
                memory_fd,
                memory_host,
                semaphore_fd: semaphore_fd_api,
                timeline,
                memory_properties,
                info,
                queue: Mutex::new(queue),
                queue_compute: compute,
                copy_method,
                states: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The state of type `T` that a module above keeps on this device: the one made by the
    /// first call, by `make` (an error of `make` is returned, and the next call tries again).
    pub(crate) fn state<T: DeviceState>(&self, make: impl FnOnce(&VulkanDevice) -> Result<T>) -> Result<Arc<T>> {
        let mut states = self.shared.states.lock();
        if let Some(found) = states.iter().find_map(|state| Arc::clone(state).into_any().downcast::<T>().ok()) {
            return Ok(found);
        }
        let state = Arc::new(make(self)?);
        states.push(Arc::clone(&state) as Arc<dyn DeviceState>);
        Ok(state)
    }

    /// What was found and enabled.
    pub fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    pub fn device_uuid(&self) -> [u8; 16] {
        self.shared.info.device_uuid
    }

    pub fn driver_uuid(&self) -> [u8; 16] {
        self.shared.info.driver_uuid
    }

    /// Whether two handles are the same open device (not merely the same physical GPU).
    pub fn same_device(&self, other: &VulkanDevice) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The ash device, for callers that record their own Vulkan commands on memory from this
    /// crate. Objects made with it must be destroyed before the last `VulkanDevice` clone.
    pub fn ash_device(&self) -> &ash::Device {
        &self.shared.device
    }

    pub fn ash_instance(&self) -> &ash::Instance {
        &self.shared.instance
    }

    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.shared.physical
    }

    /// Waits until the device has finished all submitted work.
    pub fn wait_idle(&self) -> Result<()> {
        let _queue = self.shared.queue.lock();
        // SAFETY: the queue mutex is held, so no submission races with the wait.
        unsafe { self.shared.device.device_wait_idle() }.map_err(vk_err("vkDeviceWaitIdle"))
    }

    /// Submits `submits` to the device's queue, signalling `fence`.
    ///
    /// # Safety
    /// As `vkQueueSubmit`: the command buffers, semaphores and fence are valid objects of this
    /// device, in the states the specification requires.
    pub(crate) unsafe fn queue_submit(&self, submits: &[vk::SubmitInfo<'_>], fence: vk::Fence) -> Result<()> {
        let queue = self.shared.queue.lock();
        // SAFETY: the queue's lock is held (its external synchronisation); the caller vouches
        // for the rest.
        unsafe { self.shared.device.queue_submit(*queue, submits, fence) }.map_err(vk_err("vkQueueSubmit"))
    }

    pub(crate) fn memory_type_flags(&self, index: u32) -> Option<vk::MemoryPropertyFlags> {
        self.shared.memory_properties.memory_types_as_slice().get(index as usize).map(|t| t.property_flags)
    }

    pub(crate) fn memory_type_count(&self) -> u32 {
        self.shared.memory_properties.memory_type_count
    }

    /// The memory type among `allowed_bits` that has all of `required` and, in order of
    /// preference, the `preferred` sets of flags (each tried with and without `avoid`).
    pub(crate) fn find_memory_type(
        &self,
        allowed_bits: u32,
        required: vk::MemoryPropertyFlags,
        preferred: &[vk::MemoryPropertyFlags],
        avoid: vk::MemoryPropertyFlags,
    ) -> Option<u32> {
        let types = self.shared.memory_properties.memory_types_as_slice();
        let pick = |want: vk::MemoryPropertyFlags, avoid: vk::MemoryPropertyFlags| {
            (0..types.len() as u32).find(|&i| {
                let f = types[i as usize].property_flags;
                allowed_bits & (1 << i) != 0 && f.contains(required | want) && !f.intersects(avoid)
            })
        };
        preferred
            .iter()
            .chain(std::iter::once(&vk::MemoryPropertyFlags::empty()))
            .find_map(|&want| pick(want, avoid))
            .or_else(|| {
                preferred
                    .iter()
                    .chain(std::iter::once(&vk::MemoryPropertyFlags::empty()))
                    .find_map(|&want| pick(want, vk::MemoryPropertyFlags::empty()))
            })
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

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn device_is_send_and_sync() {
        assert_send_sync::<VulkanDevice>();
    }
}
