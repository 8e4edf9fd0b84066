//! An open device ([`VulkanDevice`]): the state every object of the device shares, its one
//! queue, the state the modules above keep on it, and its destruction.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;

use super::external;
use super::info::DeviceInfo;
use super::vk_error::vk_err;
use crate::error::Result;
use crate::memory::gpu::copy_method::CopyMethod;
use crate::memory::gpu_settings::format_uuid;

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
    /// The platform's external-memory extension (`VK_KHR_external_memory_fd`,
    /// `VK_KHR_external_memory_win32`).
    pub(crate) memory_export: external::MemoryApi,
    pub(crate) memory_host: Option<ash::ext::external_memory_host::Device>,
    /// The platform's external-semaphore extension (`VK_KHR_external_semaphore_fd`,
    /// `VK_KHR_external_semaphore_win32`), where the device offers it.
    pub(crate) semaphore_export: Option<external::SemaphoreApi>,
    /// Timeline semaphores, where enabled.
    pub(crate) timeline: Option<TimelineApi>,
    pub(crate) memory_properties: vk::PhysicalDeviceMemoryProperties,
    pub(crate) info: DeviceInfo,
    /// The one queue, of family `info.queue_family_index`: submissions ([`VulkanDevice::queue_submit`])
    /// and [`VulkanDevice::wait_idle`] hold its lock.
    pub(super) queue: Mutex<vk::Queue>,
    /// Whether the queue runs compute shaders.
    pub(crate) queue_compute: bool,
    /// How `CopyMethod::Auto` copies are made: what `LF_GPU_COPY` said at opening.
    pub(crate) copy_method: CopyMethod,
    /// The state the modules above keep on this device, one of each type ([`VulkanDevice::state`]).
    pub(super) states: Mutex<Vec<Arc<dyn DeviceState>>>,
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

/// Held while a device is created or destroyed, so that drivers see one at a time.
pub(super) static LIFECYCLE: Mutex<()> = Mutex::new(());

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

impl VulkanDevice {
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

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn device_is_send_and_sync() {
        assert_send_sync::<VulkanDevice>();
    }
}
