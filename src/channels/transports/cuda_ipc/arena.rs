//! lava-flow's own GPU buffers over the CUDA IPC route, for a consumer whose GPU is another
//! than the producer's (on the same GPU, vulkan_ipc takes them first): the producer exports
//! each buffer's Vulkan arena once per channel as an opaque fd, needing no CUDA itself; the
//! consumer imports it into CUDA (`cuImportExternalMemory`, `cuExternalMemoryGetMappedBuffer`)
//! in the primary context of the producer's GPU, and lets the GPU it uses reach that memory
//! in place (`cuCtxEnablePeerAccess` from its primary context, where that context is active:
//! a context is never made on a GPU the application does not use), so that its kernels read
//! the bytes over NVLink and its copies go GPU to GPU.
//!
//! The consumer takes the GPU buffers of a device only where its work reaches them in place:
//! where it uses that very GPU, or uses no GPU at all (it then works in the producer's GPU's
//! context), or every GPU it uses has a peer path to it (`cuDeviceCanAccessPeer`). It says so
//! in its answer, before it knows the producer; elsewhere the producer stages GPU buffers
//! through host memory, and both reports say why. The driver's side of the import and of peer
//! access is in `cuda` (`ArenaImport`, `enable_peer_access`).

use super::format_uuid;
use super::wire::{Section, ANSWER_ARENAS};

/// The producer's device whose GPU buffers it offers.
#[derive(Clone)]
pub(crate) struct ArenaDevice {
    /// Its UUID, which names it to the consumer's CUDA (NVIDIA reports one UUID to both APIs).
    pub(crate) uuid: [u8; 16],
    name: String,
    #[cfg(feature = "vulkan")]
    pub(crate) device: crate::memory::gpu::VulkanDevice,
}

impl ArenaDevice {
    /// The device of `context`, where its memory can be exported as opaque fds.
    #[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
    pub(crate) fn of(context: &crate::memory::Context) -> Option<ArenaDevice> {
        #[cfg(feature = "vulkan")]
        {
            let device = context.gpu_device()?;
            let info = device.info();
            if !info.opaque_fd.exportable {
                return None;
            }
            // The test hooks' consumer pretends to have one CUDA device: this one.
            #[cfg(feature = "test-hooks")]
            let uuid = if super::fake() { super::fake::UUID } else { info.device_uuid };
            #[cfg(not(feature = "test-hooks"))]
            let uuid = info.device_uuid;
            Some(ArenaDevice { uuid, name: info.name.clone(), device: device.clone() })
        }
        #[cfg(not(feature = "vulkan"))]
        None
    }

    /// The producer's report of GPU buffers sent this way.
    pub(crate) fn report(&self) -> String {
        format!(
            "GPU buffers: cuda_ipc, by reference on {} {} (the producer's GPU; each arena exported once per channel as \
             an fd, which the consumer imports into CUDA there and reaches with peer access from the GPU it uses); \
             host-side synchronisation (buffers are complete when sent); messages are CUDA memory \
             (lf_message_cuda_ptr)",
            self.name,
            format_uuid(&self.uuid)
        )
    }
}

/// Whether the consumer that answered `answer` takes GPU buffers of device `uuid`, or why not.
pub(crate) fn takes(answer: &Section, uuid: &[u8; 16]) -> std::result::Result<(), String> {
    let Some(at) = answer.devices.iter().position(|d| d == uuid) else {
        return Err(format!(
            "the consumer cannot open memory of the producer's GPU {} (it opens CUDA memory on {}); make that GPU \
             visible to it (CUDA_VISIBLE_DEVICES)",
            format_uuid(uuid),
            super::format_uuids(&answer.devices)
        ));
    };
    if answer.flags & ANSWER_ARENAS == 0 {
        return Err("the consumer takes no GPU buffers by cuda_ipc (it runs an older lava-flow)".into());
    }
    if at >= 32 || answer.arenas & (1 << at) == 0 {
        return Err(format!(
            "the GPU the consumer uses has no peer path to the producer's GPU {} (cuDeviceCanAccessPeer), so its work \
             could not read the buffers in place",
            format_uuid(uuid)
        ));
    }
    Ok(())
}

/// The GPU buffers a consumer that uses devices `used` (ordinals) takes, as the answer's mask
/// over `count` devices: `peer_path(a, b)` says whether device a's work reaches b's memory.
pub(crate) fn mask(count: usize, used: &[i32], peer_path: impl Fn(i32, i32) -> bool) -> u32 {
    (0..count.min(32) as i32)
        .filter(|&d| used.iter().all(|&u| u == d || peer_path(u, d)))
        .fold(0, |mask, d| mask | 1 << d)
}
