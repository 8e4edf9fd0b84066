//! `-d`: every Vulkan device the loader lists, each opened as lava-flow opens it (so its
//! report is what a context on it would see), with what the semaphore probe says.

use serde_json::{json, Value};

#[cfg(feature = "vulkan")]
pub fn view() -> (Value, String) {
    use lava_flow::memory::gpu::{
        describe_handle_types, format_uuid, list_devices, probe_semaphore_sharing, DeviceSelector,
        ExternalMemorySupport, GpuConfig, VulkanDevice, FIX_HINT,
    };

    fn external(s: &ExternalMemorySupport) -> Value {
        json!({
            "exportable": s.exportable,
            "importable": s.importable,
            "dedicated_only": s.dedicated_only,
            "compatible_handle_types": describe_handle_types(s.compatible_handle_types),
        })
    }

    let devices = match list_devices() {
        Ok(devices) => devices,
        Err(e) => {
            let text = format!("Vulkan devices: none. {e}\n  fix: {FIX_HINT}\n");
            return (json!({ "devices": [], "error": e.to_string(), "fix": FIX_HINT }), text);
        }
    };
    // The device a context opens with the default config (LF_VULKAN_DEVICE, else the first
    // discrete GPU, else the first device).
    let default = VulkanDevice::open(&GpuConfig::default());
    let default_uuid = default.as_ref().ok().map(VulkanDevice::device_uuid);
    let mut text = format!("Vulkan devices: {}\n", devices.len());
    if let Err(e) = &default {
        text.push_str(&format!("  a context with the default config opens none: {e}\n"));
    }
    drop(default);
    let mut list = Vec::new();
    for (index, name, kind, uuid) in devices {
        let chosen = default_uuid == Some(uuid);
        let mark = if chosen { "  (the device a context opens by default)\n" } else { "" };
        text.push('\n');
        match VulkanDevice::open(&GpuConfig::with_device(DeviceSelector::Index(index))) {
            Ok(device) => {
                let info = device.info();
                let semaphores = probe_semaphore_sharing(&device);
                text.push_str(&format!("{info}\n{mark}"));
                text.push_str(&format!(
                    "  timeline semaphores shared between processes: {}\n",
                    match &semaphores {
                        Ok(()) => "yes (export, import, signal and wait probed)".to_owned(),
                        Err(why) => format!("no: {why}"),
                    }
                ));
                let mut value = info.to_json();
                value["default"] = json!(chosen);
                value["external_memory"] =
                    json!({ "opaque_fd": external(&info.opaque_fd), "dma_buf": external(&info.dma_buf) });
                value["semaphore_sharing"] = json!({ "works": semaphores.is_ok(), "why_not": semaphores.err() });
                list.push(value);
            }
            Err(e) => {
                text.push_str(&format!(
                    "Vulkan device {index}: {name} ({}), deviceUUID {}\n{mark}  lava-flow cannot use it: {e}\n",
                    kind.as_str(),
                    format_uuid(&uuid)
                ));
                list.push(json!({
                    "index": index,
                    "name": name,
                    "device_type": kind.as_str(),
                    "device_uuid": format_uuid(&uuid),
                    "default": chosen,
                    "error": e.to_string(),
                }));
            }
        }
    }
    (json!({ "devices": list, "error": null }), text)
}

#[cfg(not(feature = "vulkan"))]
pub fn view() -> (Value, String) {
    let why = "this build has no GPU support: rebuild lava-flow with the cargo feature `vulkan` (on by default; cmake builds it)";
    (json!({ "devices": [], "error": why }), format!("Vulkan devices: none. {why}\n"))
}
