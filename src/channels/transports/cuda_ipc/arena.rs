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
//! through host memory, and both reports say why.

use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd};
use std::sync::Arc;

use lava_flow_cuda::sys::{
    CUdeviceptr, CUexternalMemory, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
    CUDA_EXTERNAL_MEMORY_DEDICATED, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
};

use super::cuda::{cuda_error, Mapping, PrimaryContext};
use super::format_uuid;
use super::wire::{Announce, Section, ANSWER_ARENAS, MEMORY_ARENA_DEDICATED};
use crate::error::{Error, Result};

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

/// A GPU buffer's arena imported into CUDA: unmapped and destroyed on drop.
pub(super) struct ArenaImport {
    context: Arc<PrimaryContext>,
    memory: CUexternalMemory,
    address: CUdeviceptr,
}

// SAFETY: CUDA handles are process-wide and usable from any thread; the fields are only read.
unsafe impl Send for ArenaImport {}
// SAFETY: as above.
unsafe impl Sync for ArenaImport {}

impl Mapping for ArenaImport {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.context.ordinal()
    }
}

impl Drop for ArenaImport {
    fn drop(&mut self) {
        let (address, memory) = (self.address, self.memory);
        let freed = self.context.with(|driver| {
            // SAFETY: the mapping made by `open`, freed once; no message points into it any more.
            unsafe { driver.mem_free(address) }.map_err(cuda_error)?;
            // SAFETY: the import made by `open`, destroyed once, after its mapping.
            unsafe { driver.destroy_external_memory(memory) }.map_err(cuda_error)
        });
        if let Err(e) = freed {
            log::warn!("unmapping the producer's GPU buffer arena imported at {address:#x}: {e}");
        }
    }
}

/// Imports the arena `allocation` announces (its opaque fd `fd`, which stays the caller's) in
/// `context`, the primary context of the device that holds it, mapped whole.
pub(super) fn open(
    context: Arc<PrimaryContext>,
    allocation: &Announce,
    fd: BorrowedFd<'_>,
) -> Result<Box<dyn Mapping>> {
    let size = allocation.size;
    // CUDA takes the fd it imports; the slot keeps its own, to import again after the cache
    // closed this import.
    let fd = fd.try_clone_to_owned().map_err(|e| Error::os("duplicating a GPU buffer arena's fd", e))?;
    let desc = CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
        type_: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
        handle: [fd.as_raw_fd() as u32 as u64, 0],
        size,
        flags: if allocation.memory == MEMORY_ARENA_DEDICATED { CUDA_EXTERNAL_MEMORY_DEDICATED } else { 0 },
        reserved: [0; 16],
    };
    let (memory, address) = context.with(|driver| {
        let mut memory: CUexternalMemory = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the descriptor is filled as cuda.h says, with a live fd.
        unsafe { driver.import_external_memory(&mut memory, &desc) }.map_err(|e| {
            cuda_error(e.context(format!(
                "cuImportExternalMemory of a {size}-byte Vulkan arena (the producer's and this process's NVIDIA \
                 drivers must be the same)"
            )))
        })?;
        // On success CUDA owns the fd.
        let _ = fd.into_raw_fd();
        let buffer = CUDA_EXTERNAL_MEMORY_BUFFER_DESC { offset: 0, size, flags: 0, reserved: [0; 16] };
        let mut address: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the import just made, mapped whole.
        if let Err(e) = unsafe { driver.external_memory_get_mapped_buffer(&mut address, memory, &buffer) } {
            // SAFETY: the import just made, destroyed once.
            let _ = unsafe { driver.destroy_external_memory(memory) };
            return Err(cuda_error(
                e.context(format!("cuExternalMemoryGetMappedBuffer of a {size}-byte Vulkan arena")),
            ));
        }
        Ok((memory, address))
    })?;
    Ok(Box::new(ArenaImport { context, memory, address }))
}

/// This process's ordinal of the CUDA device whose context is current on this thread, where
/// the process has loaded CUDA and made one current (asking loads nothing and makes nothing).
pub(super) fn current_device() -> Option<i32> {
    if !lava_flow_cuda::is_loaded() || lava_flow_cuda::disabled() {
        return None;
    }
    let driver = lava_flow_cuda::driver().ok()?;
    let mut context = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.ctx_get_current(&mut context) }.ok()?;
    if context.is_null() {
        return None;
    }
    let mut device = 0;
    // SAFETY: a valid out-pointer; a context is current.
    unsafe { driver.ctx_get_device(&mut device) }.ok()?;
    Some(device)
}

/// Whether device `device`'s work reaches memory of device `peer` directly.
pub(super) fn peer_path(device: i32, peer: i32) -> bool {
    let Ok(driver) = lava_flow_cuda::driver() else { return false };
    let (Ok(a), Ok(b)) = (driver.device(device), driver.device(peer)) else { return false };
    let mut can = 0;
    // SAFETY: a valid out-pointer; devices the driver gave.
    unsafe { driver.device_can_access_peer(&mut can, a, b) }.is_ok() && can != 0
}

/// Lets `from`, the primary context of a device this process uses, reach memory of `to`'s
/// context. `Ok(false)` where `from` is not active: the application does not use that GPU
/// through CUDA, and no context is made for it.
pub(super) fn enable_peer_access(from: &PrimaryContext, to: &PrimaryContext) -> Result<bool> {
    from.with(|driver| {
        // SAFETY: `to` is a context this process retains; flags must be 0.
        match unsafe { driver.ctx_enable_peer_access(to.raw(), 0) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) => Ok(true),
            Err(e) => Err(cuda_error(e.context(format!(
                "cuCtxEnablePeerAccess from CUDA device {} to device {}",
                from.ordinal(),
                to.ordinal()
            )))),
        }
    })
}

/// Whether the primary context of device `ordinal` is active (the application uses the GPU
/// through CUDA).
pub(super) fn primary_active(ordinal: i32) -> bool {
    let Ok(driver) = lava_flow_cuda::driver() else { return false };
    driver.device(ordinal).and_then(|d| driver.primary_context_active(d)).unwrap_or(false)
}
