//! The Vulkan loader and the process's one instance, and the physical devices it enumerates.

use std::sync::OnceLock;

use ash::vk;

use super::info::{format_api_version, DeviceType};
use super::vk_error::vk_err;
use crate::error::{Error, Result};

/// How to get a Vulkan device, as the errors of a failed opening say it.
pub const FIX_HINT: &str = "install a Vulkan driver: your GPU vendor's driver (it ships the Vulkan \
    ICD), or mesa-vulkan-drivers for the CPU driver lavapipe; `vulkaninfo --summary` (package \
    vulkan-tools) shows what the loader finds";

/// The Vulkan loader and one instance, made once per process and never destroyed: all of a
/// process's contexts open their devices on it. A driver unloaded, or an instance destroyed,
/// while another thread is inside the driver crashes that thread (seen with NVIDIA's driver:
/// heap corruption and calls into unloaded code in a process opening and closing contexts in
/// two threads); one instance for the process's life avoids both, and costs one instance.
pub(super) fn process_instance() -> Result<(ash::Entry, ash::Instance, u32)> {
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

pub(super) struct Candidate {
    pub(super) physical: vk::PhysicalDevice,
    pub(super) properties: vk::PhysicalDeviceProperties,
    pub(super) uuid: [u8; 16],
}

/// Every physical device of `instance`, with (index, name, type, deviceUUID) for reports.
#[allow(clippy::type_complexity)]
pub(super) fn enumerate_candidates(
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
///
/// [`DeviceSelector::Index`]: super::DeviceSelector::Index
/// [`VulkanDevice::open`]: super::VulkanDevice::open
#[allow(clippy::type_complexity)]
pub fn list_devices() -> Result<Vec<(u32, String, DeviceType, [u8; 16])>> {
    let (_entry, instance, _api) = process_instance()?;
    Ok(enumerate_candidates(&instance)?.1)
}
