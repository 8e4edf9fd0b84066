//! What lava-flow's GPU memory does with CUDA, where the process has it, through lava-flow's
//! binding of the driver API (`lava_flow_cuda`: libcuda loaded at run time), so that lava-flow
//! builds and runs without CUDA and reports `Unsupported` where no NVIDIA driver is installed:
//! - GPU-pinned host memory: `cuMemHostRegister` on a range of this process's memory;
//! - copies between GPU arenas by CUDA's copy path ([`CudaArena`], [`cuda_copy`]): the arena's
//!   exported fd imported into CUDA (`cuImportExternalMemory`) once, then `cuMemcpyDtoDAsync`
//!   on a stream of lava-flow's own in the device's primary context. A Vulkan submission and
//!   its fence cost as much as CUDA's whole copy up to a few MiB on NVIDIA's driver, so where
//!   the application already uses CUDA ([`cuda_in_use`]) lava-flow's copies go this way.
//!
//! `LF_DISABLE_CUDA=1` keeps lava-flow away from libcuda altogether (for processes where CUDA
//! must not be initialised, or tools such as valgrind that the driver confuses).

use std::ffi::c_void;
use std::fmt;

use lava_flow_cuda::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUexternalMemory, CUstream, CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
    CUDA_EXTERNAL_MEMORY_DEDICATED, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CU_MEMHOSTREGISTER_PORTABLE,
    CU_STREAM_NON_BLOCKING,
};
use lava_flow_cuda::Driver;
use parking_lot::Mutex;

use super::device::external;
use crate::error::{Error, Result};
use crate::os::OwnedHandle;

/// The environment variable that, set to 1, keeps lava-flow from loading libcuda.
pub const DISABLE_CUDA_ENV: &str = crate::env::DISABLE_CUDA.name;

// The binding reads the same variable.
const _: () = assert!(DISABLE_CUDA_ENV.len() == lava_flow_cuda::DISABLE_CUDA_ENV.len());

/// The process's CUDA driver, or why it is unavailable (logged once).
fn driver() -> Result<&'static Driver> {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    let loaded = lava_flow_cuda::driver();
    LOGGED.call_once(|| match &loaded {
        Ok(driver) => log::debug!("CUDA driver loaded (version {})", driver.version()),
        Err(why @ lava_flow_cuda::Error::Disabled) => log::debug!("{why}"),
        Err(why) => log::info!("CUDA is unavailable (no GPU-pinned memory, no copies by CUDA): {why}"),
    });
    Ok(loaded?)
}

/// Whether a CUDA driver with at least one device is present.
pub fn cuda_available() -> bool {
    cuda_driver_version().is_ok()
}

/// The CUDA driver's version (e.g. 13000 for 13.0), or why CUDA is unavailable.
pub fn cuda_driver_version() -> Result<i32> {
    driver().map(Driver::version)
}

/// The CUDA device whose UUID is `device_uuid` (NVIDIA reports the same UUID to Vulkan and
/// CUDA), or device 0 when `None`. `NotFound` names the devices there are.
fn device_by_uuid(driver: &Driver, device_uuid: Option<[u8; 16]>) -> Result<CUdevice> {
    let count = driver.device_count()?;
    if count == 0 {
        return Err(Error::Unsupported("the CUDA driver reports no device".into()));
    }
    let mut seen = Vec::new();
    for ordinal in 0..count {
        let device = driver.device(ordinal)?;
        let uuid = driver.device_uuid(device)?;
        seen.push(super::device::format_uuid(&uuid));
        if device_uuid.map_or(ordinal == 0, |want| want == uuid) {
            return Ok(device);
        }
    }
    Err(Error::NotFound(format!(
        "no CUDA device has UUID {}; CUDA devices: {}",
        super::device::format_uuid(&device_uuid.unwrap_or_default()),
        seen.join(", ")
    )))
}

/// Host memory pinned with `cuMemHostRegister`; unregistered on drop.
pub struct CudaHostRegistration {
    ptr: *mut c_void,
    len: usize,
    device: CUdevice,
    context: CUcontext,
}

// SAFETY: the raw pointers are an address of caller-owned memory and a CUDA context handle;
// the driver API accepts both from any thread.
unsafe impl Send for CudaHostRegistration {}
// SAFETY: &CudaHostRegistration only reads plain fields.
unsafe impl Sync for CudaHostRegistration {}

impl fmt::Debug for CudaHostRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHostRegistration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("cuda_device", &self.device)
            .finish()
    }
}

impl CudaHostRegistration {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CUDA device ordinal whose primary context registered the memory.
    pub fn cuda_device(&self) -> i32 {
        self.device
    }
}

/// Pins `[ptr, ptr + len)` for CUDA (portable: usable from every context) on the CUDA device
/// whose UUID is `device_uuid` (pass `VulkanDevice::device_uuid()` to match the Vulkan device
/// in use), or on device 0 when `None`.
///
/// Errors: `Unsupported` without a CUDA driver or device; `NotFound` when no CUDA device has
/// that UUID; `InvalidState` when the range is already registered.
///
/// # Safety
/// The range must be mapped memory of this process that stays mapped until the registration
/// is dropped.
pub unsafe fn cuda_host_register(
    ptr: *mut u8,
    len: usize,
    device_uuid: Option<[u8; 16]>,
) -> Result<CudaHostRegistration> {
    let driver = driver().map_err(|e| match e {
        Error::Unsupported(why) => {
            Error::Unsupported(format!("{why} (to pin host memory without CUDA, use VK_EXT_external_memory_host)"))
        }
        e => e,
    })?;
    if ptr.is_null() || len == 0 {
        return Err(Error::invalid("cuMemHostRegister needs a non-NULL pointer and a non-zero length"));
    }
    let device = device_by_uuid(driver, device_uuid)?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; released below on failure, or by the drop.
    unsafe { driver.device_primary_ctx_retain(&mut context, device) }?;
    // SAFETY: the context was just retained; the range is mapped memory of this process (the
    // caller's contract).
    let registered = unsafe {
        in_context(driver, context, || {
            Ok(driver
                .mem_host_register(ptr.cast(), len, CU_MEMHOSTREGISTER_PORTABLE)
                .map_err(|e| e.context(format!("cuMemHostRegister({ptr:p}, {len} bytes)")))?)
        })
    };
    if let Err(e) = registered {
        // SAFETY: balances the retain above; nothing was made in the context.
        let _ = unsafe { driver.device_primary_ctx_release(device) };
        return Err(e);
    }
    Ok(CudaHostRegistration { ptr: ptr.cast(), len, device, context })
}

impl Drop for CudaHostRegistration {
    fn drop(&mut self) {
        let Ok(driver) = driver() else { return };
        // SAFETY: the registration was made in this context, which we retained; the memory is
        // still mapped (the caller's contract).
        unsafe {
            let _ = in_context(driver, self.context, || Ok(driver.mem_host_unregister(self.ptr)?));
            let _ = driver.device_primary_ctx_release(self.device);
        }
    }
}

/// Whether this process already uses CUDA on the device whose UUID is `device_uuid`: libcuda
/// is loaded and that device's primary context (the one the CUDA runtime, PyTorch and CuPy
/// use) is active. Asking neither loads libcuda nor makes a context, which would cost the
/// application hundreds of MiB of GPU memory and a good part of a second. A device once seen
/// in use is remembered: lava-flow's imports retain its context from then on.
pub(crate) fn cuda_in_use(device_uuid: [u8; 16]) -> bool {
    static IN_USE: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());
    if IN_USE.lock().contains(&device_uuid) {
        return true;
    }
    if !lava_flow_cuda::is_loaded() {
        return false;
    }
    let Ok(driver) = driver() else { return false };
    let Ok(device) = device_by_uuid(driver, Some(device_uuid)) else { return false };
    let in_use = driver.primary_context_active(device).unwrap_or(false);
    if in_use {
        IN_USE.lock().push(device_uuid);
    }
    in_use
}

/// Runs `f` with the primary context `context` current on this thread.
///
/// # Safety
/// `context` is a primary context this process retains.
unsafe fn in_context<R>(driver: &Driver, context: CUcontext, f: impl FnOnce() -> Result<R>) -> Result<R> {
    // SAFETY: the caller's contract: a live, retained context.
    unsafe { driver.ctx_push_current(context) }?;
    let result = f();
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; popped is a valid out-pointer.
    let _ = unsafe { driver.ctx_pop_current(&mut popped) };
    result
}

/// A GPU arena's memory imported into CUDA, mapped whole in the primary context of the CUDA
/// device that is the arena's Vulkan device; unmapped, and the context released, on drop.
pub(crate) struct CudaArena {
    device: CUdevice,
    context: CUcontext,
    memory: CUexternalMemory,
    address: CUdeviceptr,
    size: u64,
}

// SAFETY: CUDA handles are process-wide and usable from any thread; the fields are plain
// values, only read after construction.
unsafe impl Send for CudaArena {}
// SAFETY: see Send.
unsafe impl Sync for CudaArena {}

impl fmt::Debug for CudaArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaArena").field("cuda_device", &self.device).field("size", &self.size).finish()
    }
}

impl CudaArena {
    /// Imports `fd`, an opaque-fd export of an arena of `size` bytes (`dedicated`: a dedicated
    /// allocation), on the CUDA device whose UUID is `device_uuid`. The fd is taken in every
    /// case. `Unsupported` on Windows, where this is not built.
    pub(crate) fn import(fd: OwnedHandle, size: u64, dedicated: bool, device_uuid: [u8; 16]) -> Result<CudaArena> {
        let (handle_type, handle) = external::cuda_memory_handle(&fd)?;
        let driver = driver()?;
        let device = device_by_uuid(driver, Some(device_uuid))?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; released below or by the drop.
        unsafe { driver.device_primary_ctx_retain(&mut context, device) }?;
        // SAFETY: the context was just retained; the descriptors are filled as cuda.h says.
        let imported = unsafe {
            in_context(driver, context, || {
                let desc = CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
                    type_: handle_type,
                    handle,
                    size,
                    flags: if dedicated { CUDA_EXTERNAL_MEMORY_DEDICATED } else { 0 },
                    reserved: [0; 16],
                };
                let mut memory: CUexternalMemory = std::ptr::null_mut();
                driver
                    .import_external_memory(&mut memory, &desc)
                    .map_err(|e| e.context(format!("cuImportExternalMemory of a {size}-byte Vulkan arena")))?;
                external::given_to_cuda(fd);
                let buffer = CUDA_EXTERNAL_MEMORY_BUFFER_DESC { offset: 0, size, flags: 0, reserved: [0; 16] };
                let mut address = 0;
                if let Err(e) = driver.external_memory_get_mapped_buffer(&mut address, memory, &buffer) {
                    let _ = driver.destroy_external_memory(memory);
                    return Err(e
                        .context(format!("cuExternalMemoryGetMappedBuffer of a {size}-byte Vulkan arena"))
                        .into());
                }
                Ok((memory, address))
            })
        };
        match imported {
            Ok((memory, address)) => Ok(CudaArena { device, context, memory, address, size }),
            Err(e) => {
                // SAFETY: retained above, and nothing was made in it.
                let _ = unsafe { driver.device_primary_ctx_release(device) };
                Err(e)
            }
        }
    }
}

impl Drop for CudaArena {
    fn drop(&mut self) {
        let Ok(driver) = driver() else { return };
        // SAFETY: the mapping and the import were made in this retained context; no copy uses
        // them any more (copies wait for their stream before returning).
        unsafe {
            let _ = in_context(driver, self.context, || {
                let _ = driver.mem_free(self.address);
                let _ = driver.destroy_external_memory(self.memory);
                Ok(())
            });
            let _ = driver.device_primary_ctx_release(self.device);
        }
    }
}

/// lava-flow's own stream on `device` (made at its first copy, kept for the process's life):
/// non-blocking, so that its copies neither wait for nor hold up the application's work on
/// the legacy default stream. Making it retains the device's primary context for good: a
/// stream lives in its context, which the driver destroys when its last retain is released
/// (as the last arena imported into it goes), and a stream kept past that is a stale handle.
///
/// # Safety
/// The device's primary context is current on this thread.
unsafe fn copy_stream(driver: &Driver, device: CUdevice) -> Result<CUstream> {
    static STREAMS: Mutex<Vec<(CUdevice, usize)>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock();
    if let Some(&(_, stream)) = streams.iter().find(|(d, _)| *d == device) {
        return Ok(stream as CUstream);
    }
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: plain calls with valid out-pointers; the context is current (the caller's
    // contract), and this retain of it is never released.
    unsafe {
        driver.device_primary_ctx_retain(&mut context, device)?;
        let mut stream: CUstream = std::ptr::null_mut();
        if let Err(e) = driver.stream_create(&mut stream, CU_STREAM_NON_BLOCKING) {
            let _ = driver.device_primary_ctx_release(device);
            return Err(e.into());
        }
        streams.push((device, stream as usize));
        Ok(stream)
    }
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` (offsets into the
/// arenas, checked by the caller to lie inside them) by CUDA, and waits for the copy.
pub(crate) fn cuda_copy(src: &CudaArena, src_offset: u64, dst: &CudaArena, dst_offset: u64, len: u64) -> Result<()> {
    let driver = driver()?;
    if src.device != dst.device {
        return Err(Error::invalid(format!(
            "a CUDA copy between arenas of CUDA devices {} and {}; copy within one device",
            src.device, dst.device
        )));
    }
    assert!(
        src_offset.checked_add(len).is_some_and(|end| end <= src.size)
            && dst_offset.checked_add(len).is_some_and(|end| end <= dst.size),
        "CUDA copy ranges outside their arenas"
    );
    // SAFETY: the context is retained by `src`; the addresses and length lie inside the two
    // mapped arenas (asserted above), which stay mapped until the copy has been waited for.
    unsafe {
        in_context(driver, src.context, || {
            let stream = copy_stream(driver, src.device)?;
            driver
                .memcpy_dtod_async(dst.address + dst_offset, src.address + src_offset, len as usize, stream)
                .map_err(|e| e.context(format!("cuMemcpyDtoDAsync of {len} bytes")))?;
            Ok(driver.stream_synchronize(stream).map_err(|e| e.context("cuStreamSynchronize after a copy"))?)
        })
    }
}
