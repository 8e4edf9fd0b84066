//! Timeline semaphores: a 64-bit counter the host and the GPU signal and wait on, shared
//! between processes as an opaque fd (`VK_KHR_external_semaphore_fd`), on Windows as an
//! opaque NT handle (`VK_KHR_external_semaphore_win32`).
//!
//! A producer signals value `n` when the data of its `n`-th send is in place; the consumer's
//! GPU work waits for `n` ([`super::copy_buffer_waiting`]) or its host does
//! ([`TimelineSemaphore::wait`]). Not every driver exports timeline semaphores (lavapipe does
//! not): [`probe_semaphore_sharing`] says whether the whole round trip works, and why not.

use std::fmt;
use std::time::Duration;

use ash::vk;

use super::device::{external, vk_err, TimelineApi, VulkanDevice};
use crate::error::{Error, Result};
use crate::os::OwnedHandle;

/// A timeline semaphore of one device. `Send + Sync` (Vulkan semaphores may be signalled,
/// waited on and read from any thread); destroys its `VkSemaphore` on drop.
pub struct TimelineSemaphore {
    device: VulkanDevice,
    semaphore: vk::Semaphore,
    /// Created exportable. (Imported semaphores are not exported again: whether a driver
    /// allows it depends on `exportFromImportedHandleTypes`; export the original instead.)
    shareable: bool,
}

impl fmt::Debug for TimelineSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimelineSemaphore")
            .field("device", &self.device)
            .field("semaphore", &self.semaphore)
            .field("shareable", &self.shareable)
            .finish()
    }
}

/// The device's name and driver, for messages.
fn describe(device: &VulkanDevice) -> String {
    let info = device.info();
    if info.driver_name.is_empty() {
        format!("Vulkan device {} ({})", info.index, info.name)
    } else {
        format!("Vulkan device {} ({}, driver {})", info.index, info.name, info.driver_name)
    }
}

fn no_timeline(device: &VulkanDevice) -> Error {
    Error::Unsupported(format!(
        "{} has no timeline semaphores (Vulkan 1.2, or VK_KHR_timeline_semaphore); update its driver",
        describe(device)
    ))
}

impl TimelineSemaphore {
    fn create(device: &VulkanDevice, initial: u64, export: bool) -> Result<Self> {
        if device.shared.timeline.is_none() {
            return Err(no_timeline(device));
        }
        let mut kind =
            vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE).initial_value(initial);
        let mut export_info = vk::ExportSemaphoreCreateInfo::default().handle_types(external::SEMAPHORE_HANDLE);
        let mut info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
        if export {
            info = info.push_next(&mut export_info);
        }
        // SAFETY: the create info chain is live for the call; timeline semaphores were
        // enabled on the device (checked above), and export only where the caller checked
        // the device can export them.
        let semaphore = unsafe { device.shared.device.create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore (timeline)"))?;
        Ok(TimelineSemaphore { device: device.clone(), semaphore, shareable: export })
    }

    /// A timeline semaphore of this process only, starting at `initial`.
    pub fn new(device: &VulkanDevice, initial: u64) -> Result<Self> {
        Self::create(device, initial, false)
    }

    /// A timeline semaphore starting at `initial` that can be exported as an opaque fd (on
    /// Windows an opaque NT handle: [`TimelineSemaphore::export_fd`]). `Unsupported`, saying why,
    /// where the device cannot export timeline semaphores so.
    pub fn new_exportable(device: &VulkanDevice, initial: u64) -> Result<Self> {
        if device.shared.timeline.is_none() {
            return Err(no_timeline(device));
        }
        if device.shared.semaphore_export.is_none() {
            return Err(Error::Unsupported(format!(
                "{} does not offer {}, so its semaphores cannot be shared with other processes",
                describe(device),
                external::SEMAPHORE_EXTENSION.to_string_lossy()
            )));
        }
        if !device.info().semaphore_fd.exportable {
            return Err(Error::Unsupported(format!(
                "timeline semaphores cannot be exported as {}s on {}",
                external::HANDLE_NAME,
                describe(device)
            )));
        }
        Self::create(device, initial, true)
    }

    /// Imports a timeline semaphore another process (or this one) exported with
    /// [`TimelineSemaphore::export_fd`]. The handle is consumed: an fd is owned by Vulkan on
    /// success and closed on every error; an NT handle is closed once the import is done.
    pub fn import(device: &VulkanDevice, fd: OwnedHandle) -> Result<Self> {
        let Some(api) = &device.shared.semaphore_export else {
            return Err(Error::Unsupported(format!(
                "{} does not offer {}, so it cannot import semaphores of other processes",
                describe(device),
                external::SEMAPHORE_EXTENSION.to_string_lossy()
            )));
        };
        if !device.info().semaphore_fd.importable {
            return Err(Error::Unsupported(format!(
                "timeline semaphores cannot be imported from {}s on {}",
                external::HANDLE_NAME,
                describe(device)
            )));
        }
        // Dropping `semaphore` on an error below destroys it; the handle is dealt with by the
        // import.
        let semaphore = Self::create(device, 0, false)?;
        // SAFETY: the semaphore is live, a timeline semaphore of this device, and unused.
        unsafe { external::import_semaphore(api, semaphore.semaphore, fd) }?;
        Ok(semaphore)
    }

    /// A new handle for the semaphore (an opaque fd; on Windows an opaque NT handle; each call
    /// gives another one), to send to another process, which imports it with
    /// [`TimelineSemaphore::import`].
    pub fn export_fd(&self) -> Result<OwnedHandle> {
        let Some(api) = &self.device.shared.semaphore_export else {
            return Err(Error::Unsupported(format!(
                "{} does not offer {}",
                describe(&self.device),
                external::SEMAPHORE_EXTENSION.to_string_lossy()
            )));
        };
        if !self.shareable {
            return Err(Error::InvalidState(
                "this timeline semaphore is not exportable (created for this process only, or \
                 imported); share the exporter's own semaphore, created exportable"
                    .into(),
            ));
        }
        // SAFETY: the semaphore is live and was created exportable as the platform's handle.
        unsafe { external::export_semaphore(api, self.semaphore) }
    }

    /// Sets the counter to `value` from the host (it must be larger than the current value).
    pub fn signal(&self, value: u64) -> Result<()> {
        let info = vk::SemaphoreSignalInfo::default().semaphore(self.semaphore).value(value);
        let what = format!("vkSignalSemaphore({value})");
        match self.api() {
            // SAFETY: the semaphore is a live timeline semaphore of this device; the entry
            // point matches how timeline semaphores were enabled.
            TimelineApi::Core => unsafe { self.device.shared.device.signal_semaphore(&info) },
            // SAFETY: as above.
            TimelineApi::Khr(khr) => unsafe { khr.signal_semaphore(&info) },
        }
        .map_err(vk_err(&what))
    }

    /// Waits on the host until the counter reaches `value`: `Ok(true)` when it did, `Ok(false)`
    /// when `timeout` passed first.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<bool> {
        let semaphores = [self.semaphore];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default().semaphores(&semaphores).values(&values);
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let result = match self.api() {
            // SAFETY: the semaphore is a live timeline semaphore of this device; the arrays
            // the wait info points to outlive the call.
            TimelineApi::Core => unsafe { self.device.shared.device.wait_semaphores(&info, nanos) },
            // SAFETY: as above.
            TimelineApi::Khr(khr) => unsafe { khr.wait_semaphores(&info, nanos) },
        };
        match result {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(r) => Err(vk_err(&format!("vkWaitSemaphores(value {value})"))(r)),
        }
    }

    /// The counter's current value.
    pub fn value(&self) -> Result<u64> {
        let result = match self.api() {
            // SAFETY: the semaphore is a live timeline semaphore of this device.
            TimelineApi::Core => unsafe { self.device.shared.device.get_semaphore_counter_value(self.semaphore) },
            // SAFETY: as above.
            TimelineApi::Khr(khr) => unsafe { khr.get_semaphore_counter_value(self.semaphore) },
        };
        result.map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    pub fn device(&self) -> &VulkanDevice {
        &self.device
    }

    /// Whether [`TimelineSemaphore::export_fd`] can work (created exportable, not imported).
    pub fn is_exportable(&self) -> bool {
        self.shareable
    }

    pub(crate) fn raw(&self) -> vk::Semaphore {
        self.semaphore
    }

    fn api(&self) -> &TimelineApi {
        self.device
            .shared
            .timeline
            .as_ref()
            .expect("a TimelineSemaphore exists only where timeline semaphores are enabled")
    }
}

impl Drop for TimelineSemaphore {
    fn drop(&mut self) {
        // SAFETY: no submission that waits on the semaphore is pending: every submit of this
        // crate waits for its fence before returning, and the semaphore is ours alone.
        unsafe { self.device.shared.device.destroy_semaphore(self.semaphore, None) };
    }
}

/// Probes what sharing timeline semaphores between processes needs, as Monado does: create an
/// exportable timeline semaphore, export it, import the fd again on the same device, signal
/// one and wait on the other (1 s). `Ok(())` when the whole round trip works, else the first
/// step that failed, and why.
pub fn probe_semaphore_sharing(device: &VulkanDevice) -> std::result::Result<(), String> {
    let info = device.info();
    let name = describe(device);
    if !info.timeline_semaphores {
        return Err(format!("{name} has no timeline semaphores (Vulkan 1.2, or VK_KHR_timeline_semaphore)"));
    }
    let handles = external::HANDLE_NAME;
    if device.shared.semaphore_export.is_none() {
        return Err(format!("{} is not offered by {name}", external::SEMAPHORE_EXTENSION.to_string_lossy()));
    }
    if !info.semaphore_fd.exportable {
        return Err(format!("timeline semaphores cannot be exported as {handles}s on {name}"));
    }
    if !info.semaphore_fd.importable {
        return Err(format!("timeline semaphores cannot be imported from {handles}s on {name}"));
    }
    let exported = TimelineSemaphore::new_exportable(device, 0)
        .map_err(|e| format!("creating an exportable timeline semaphore on {name} failed: {e}"))?;
    let fd = exported.export_fd().map_err(|e| format!("exporting a timeline semaphore on {name} failed: {e}"))?;
    let imported = TimelineSemaphore::import(device, fd)
        .map_err(|e| format!("importing a timeline semaphore's {handles} on {name} failed: {e}"))?;
    exported.signal(1).map_err(|e| format!("signalling an exported timeline semaphore on {name} failed: {e}"))?;
    match imported.wait(1, Duration::from_secs(1)) {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "a timeline semaphore imported on {name} did not see the value its exporter signalled (waited 1 s)"
            ))
        }
        Err(e) => return Err(format!("waiting on an imported timeline semaphore on {name} failed: {e}")),
    }
    imported.signal(2).map_err(|e| format!("signalling an imported timeline semaphore on {name} failed: {e}"))?;
    match exported.value() {
        Ok(2) => Ok(()),
        Ok(v) => Err(format!("a timeline semaphore exported on {name} reads {v} after its importer signalled 2")),
        Err(e) => Err(format!("reading a timeline semaphore on {name} failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn semaphores_are_send_and_sync() {
        assert_send_sync::<TimelineSemaphore>();
    }
}
