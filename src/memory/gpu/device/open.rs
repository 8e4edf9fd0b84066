//! Choosing a device and opening it ([`VulkanDevice::open`]): its extensions, features and
//! queue family, and the report of what was found.

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;

use super::external::{self, MEMORY_EXTENSION as EXT_MEMORY, SEMAPHORE_EXTENSION as EXT_SEMAPHORE};
use super::handle::{DeviceShared, TimelineApi, VulkanDevice, LIFECYCLE};
use super::info::{
    format_api_version, DeviceInfo, DeviceType, ExternalMemorySupport, ExternalSemaphoreSupport, MemoryHeapInfo,
    MemoryTypeInfo,
};
use super::instance::{enumerate_candidates, process_instance};
use super::vk_error::vk_err;
use crate::error::{Error, Result};
use crate::memory::gpu::copy_method::{copy_method_from_env, CopyMethod};
use crate::memory::gpu_settings::{format_uuid, DeviceSelector};

/// The environment variable that picks the physical device when the config does not: a device
/// index (`0`, `1`, ...) or a deviceUUID in hex (32 digits, dashes allowed, as `vulkaninfo`
/// prints it).
pub const DEVICE_ENV: &str = crate::env::VULKAN_DEVICE.name;

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

const EXT_DMA_BUF: &CStr = ash::ext::external_memory_dma_buf::NAME;
const EXT_MEMORY_HOST: &CStr = ash::ext::external_memory_host::NAME;
const EXT_TIMELINE: &CStr = ash::khr::timeline_semaphore::NAME;

/// The usage of every buffer lava-flow creates. Exporter and importer must agree on it: the
/// memory requirements (type bits, alignment) of a buffer depend on its usage.
pub(crate) const BUFFER_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::STORAGE_BUFFER.as_raw(),
);

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

impl VulkanDevice {
    /// Opens the device `config` selects (see [`GpuConfig`]), eagerly.
    ///
    /// Errors: `Unsupported` without a loader, a device, Vulkan 1.1 or
    /// `VK_KHR_external_memory_fd` (`VK_KHR_external_memory_win32` on Windows; the message says
    /// what to install), and on macOS; `NotFound` for an index
    /// or UUID that matches no device, listing the devices there are; `InvalidArgument` for a
    /// malformed [`DEVICE_ENV`] or `LF_GPU_COPY` (see [`GPU_COPY_ENV`](crate::memory::gpu::GPU_COPY_ENV)).
    pub fn open(config: &GpuConfig) -> Result<Self> {
        crate::logging::init();
        if let Some(why) = crate::os::system::GPU_MEMORY_UNSHARED {
            return Err(Error::Unsupported(why.into()));
        }
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
        if !offers(EXT_MEMORY) {
            return Err(Error::Unsupported(format!(
                "Vulkan device {index} ({name}) does not offer {}, which sharing GPU memory \
                 between processes needs; update its driver or pick another device with {DEVICE_ENV}",
                EXT_MEMORY.to_string_lossy()
            )));
        }
        let mut enable: Vec<&CStr> = vec![EXT_MEMORY];
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
        let has_semaphore_export = offers(EXT_SEMAPHORE);
        if has_semaphore_export {
            enable.push(EXT_SEMAPHORE);
        }
        let semaphore_fd = if has_semaphore_export && timeline_semaphores {
            let mut kind = vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE);
            let query = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                .handle_type(external::SEMAPHORE_HANDLE)
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

        let support = |handle_type: vk::ExternalMemoryHandleTypeFlags| {
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
        let opaque_fd = support(external::MEMORY_HANDLE);
        let dma_buf = if has_dma_buf {
            support(vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT)
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
        let memory_export = external::MemoryApi::new(&instance, &device);
        let memory_host = has_host.then(|| ash::ext::external_memory_host::Device::new(&instance, &device));
        let semaphore_export = has_semaphore_export.then(|| external::SemaphoreApi::new(&instance, &device));
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
                memory_export,
                memory_host,
                semaphore_export,
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
}
