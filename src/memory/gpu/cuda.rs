//! CUDA, where the process has it, with libcuda loaded at run time (`libloading`), so that
//! lava-flow builds and runs without CUDA and reports `Unsupported` where no NVIDIA driver is
//! installed:
//! - GPU-pinned host memory: `cuMemHostRegister` on a range of this process's memory;
//! - copies between GPU arenas by CUDA's copy path ([`CudaArena`], [`cuda_copy`]): the arena's
//!   exported fd imported into CUDA (`cuImportExternalMemory`) once, then `cuMemcpyDtoDAsync`
//!   on a stream of lava-flow's own in the device's primary context. A Vulkan submission and
//!   its fence cost as much as CUDA's whole copy up to a few MiB on NVIDIA's driver, so where
//!   the application already uses CUDA ([`cuda_in_use`]) lava-flow's copies go this way.
//!
//! `LF_DISABLE_CUDA=1` keeps lava-flow away from libcuda altogether (for processes where CUDA
//! must not be initialised, or tools such as valgrind that the driver confuses).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::error::{Error, Result};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuExtMem = *mut c_void;
type CuStream = *mut c_void;
/// `CUdeviceptr`: `unsigned long long` on every 64-bit platform.
type CuDevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CuResult = 712;
/// Pinned for every CUDA context, not just the primary context of one device.
const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;
/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD`.
const EXTERNAL_MEMORY_OPAQUE_FD: c_int = 1;
/// `CUDA_EXTERNAL_MEMORY_DEDICATED`.
const EXTERNAL_MEMORY_DEDICATED: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`: the stream does not wait for the legacy default stream.
const CU_STREAM_NON_BLOCKING: c_uint = 1;

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC` (cuda.h): the handle union is 16 bytes, of which an fd
/// takes the first 4.
#[repr(C)]
struct ExtMemHandleDesc {
    ty: c_int,
    handle: [u64; 2],
    size: u64,
    flags: c_uint,
    reserved: [c_uint; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC` (cuda.h).
#[repr(C)]
struct ExtMemBufferDesc {
    offset: u64,
    size: u64,
    flags: c_uint,
    reserved: [c_uint; 16],
}

type FnInit = unsafe extern "C" fn(c_uint) -> CuResult;
type FnIntOut = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnDeviceGet = unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult;
type FnDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], CuDevice) -> CuResult;
type FnPrimaryCtxRetain = unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult;
type FnPrimaryCtxRelease = unsafe extern "C" fn(CuDevice) -> CuResult;
type FnCtxPush = unsafe extern "C" fn(CuContext) -> CuResult;
type FnCtxPop = unsafe extern "C" fn(*mut CuContext) -> CuResult;
type FnHostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult;
type FnHostUnregister = unsafe extern "C" fn(*mut c_void) -> CuResult;
type FnGetErrorString = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type FnPrimaryCtxGetState = unsafe extern "C" fn(CuDevice, *mut c_uint, *mut c_int) -> CuResult;
type FnImportExternalMemory = unsafe extern "C" fn(*mut CuExtMem, *const ExtMemHandleDesc) -> CuResult;
type FnExternalMemoryGetMappedBuffer =
    unsafe extern "C" fn(*mut CuDevicePtr, CuExtMem, *const ExtMemBufferDesc) -> CuResult;
type FnDestroyExternalMemory = unsafe extern "C" fn(CuExtMem) -> CuResult;
type FnMemFree = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
type FnStreamCreate = unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult;
type FnStreamSynchronize = unsafe extern "C" fn(CuStream) -> CuResult;
type FnMemcpyDtoDAsync = unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult;

struct CudaDriver {
    version: c_int,
    device_get_count: FnIntOut,
    device_get: FnDeviceGet,
    device_get_uuid: FnDeviceGetUuid,
    primary_ctx_retain: FnPrimaryCtxRetain,
    primary_ctx_release: FnPrimaryCtxRelease,
    ctx_push: FnCtxPush,
    ctx_pop: FnCtxPop,
    host_register: FnHostRegister,
    host_unregister: FnHostUnregister,
    get_error_string: FnGetErrorString,
    primary_ctx_get_state: FnPrimaryCtxGetState,
    import_external_memory: FnImportExternalMemory,
    external_memory_get_mapped_buffer: FnExternalMemoryGetMappedBuffer,
    destroy_external_memory: FnDestroyExternalMemory,
    mem_free: FnMemFree,
    stream_create: FnStreamCreate,
    stream_synchronize: FnStreamSynchronize,
    memcpy_dtod_async: FnMemcpyDtoDAsync,
}

// SAFETY: plain function pointers into a library that stays loaded for the process's life;
// the CUDA driver API is thread-safe.
unsafe impl Send for CudaDriver {}
// SAFETY: see Send.
unsafe impl Sync for CudaDriver {}

fn driver() -> Result<&'static CudaDriver> {
    static DRIVER: OnceLock<std::result::Result<CudaDriver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let loaded = load();
            match &loaded {
                Ok(driver) => log::debug!("CUDA driver loaded (version {})", driver.version),
                Err(why) if std::env::var(DISABLE_CUDA_ENV).is_ok_and(|v| v == "1") => log::debug!("{why}"),
                Err(why) => log::info!("CUDA is unavailable (no GPU-pinned memory, no copies by CUDA): {why}"),
            }
            loaded
        })
        .as_ref()
        .map_err(|e| Error::Unsupported(e.clone()))
}

/// The environment variable that, set to 1, keeps lava-flow from loading libcuda.
pub const DISABLE_CUDA_ENV: &str = crate::env::DISABLE_CUDA.name;

fn load() -> std::result::Result<CudaDriver, String> {
    if std::env::var(DISABLE_CUDA_ENV).is_ok_and(|v| v == "1") {
        return Err(format!("CUDA is disabled by {DISABLE_CUDA_ENV}=1"));
    }
    // SAFETY: loading the CUDA driver library runs its initialisers, which are designed to run
    // in any process; it is never unloaded (CUDA does not support unloading): leaked below.
    let lib = match unsafe { libloading::Library::new("libcuda.so.1") } {
        Ok(lib) => &*Box::leak(Box::new(lib)),
        Err(e) => {
            return Err(format!("the CUDA driver library libcuda.so.1 could not be loaded ({e}): no NVIDIA driver?"))
        }
    };
    macro_rules! load {
        ($ty:ty, $($name:literal),+) => {{
            let names: &[&str] = &[$($name),+];
            // SAFETY: each name is the CUDA driver API function whose C signature $ty spells
            // out; the library stays loaded for the process's life, so the pointer stays valid.
            names
                .iter()
                .find_map(|name| unsafe { lib.get::<$ty>(name.as_bytes()) }.ok().map(|f| *f))
                .ok_or_else(|| format!("libcuda.so.1 lacks {}; the NVIDIA driver is too old", names[0]))?
        }};
    }
    let init = load!(FnInit, "cuInit");
    let driver_version = load!(FnIntOut, "cuDriverGetVersion");
    let driver = CudaDriver {
        version: 0,
        device_get_count: load!(FnIntOut, "cuDeviceGetCount"),
        device_get: load!(FnDeviceGet, "cuDeviceGet"),
        device_get_uuid: load!(FnDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
        primary_ctx_retain: load!(FnPrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        primary_ctx_release: load!(FnPrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
        ctx_push: load!(FnCtxPush, "cuCtxPushCurrent_v2", "cuCtxPushCurrent"),
        ctx_pop: load!(FnCtxPop, "cuCtxPopCurrent_v2", "cuCtxPopCurrent"),
        host_register: load!(FnHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister"),
        host_unregister: load!(FnHostUnregister, "cuMemHostUnregister"),
        get_error_string: load!(FnGetErrorString, "cuGetErrorString"),
        primary_ctx_get_state: load!(FnPrimaryCtxGetState, "cuDevicePrimaryCtxGetState"),
        import_external_memory: load!(FnImportExternalMemory, "cuImportExternalMemory"),
        external_memory_get_mapped_buffer: load!(FnExternalMemoryGetMappedBuffer, "cuExternalMemoryGetMappedBuffer"),
        destroy_external_memory: load!(FnDestroyExternalMemory, "cuDestroyExternalMemory"),
        mem_free: load!(FnMemFree, "cuMemFree_v2"),
        stream_create: load!(FnStreamCreate, "cuStreamCreate"),
        stream_synchronize: load!(FnStreamSynchronize, "cuStreamSynchronize"),
        memcpy_dtod_async: load!(FnMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    };
    // SAFETY: plain CUDA driver calls with valid out-pointers.
    unsafe {
        let r = init(0);
        if r != CUDA_SUCCESS {
            return Err(format!(
                "cuInit failed: {} (is an NVIDIA GPU visible to this process? check nvidia-smi and CUDA_VISIBLE_DEVICES)",
                describe(&driver, r)
            ));
        }
        let mut version = 0;
        driver_version(&mut version);
        Ok(CudaDriver { version, ..driver })
    }
}

fn describe(driver: &CudaDriver, r: CuResult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it NULL).
    let ok = unsafe { (driver.get_error_string)(r, &mut text) } == CUDA_SUCCESS && !text.is_null();
    if ok {
        // SAFETY: a NUL-terminated static string from the driver.
        format!("CUDA error {r} ({})", unsafe { CStr::from_ptr(text) }.to_string_lossy())
    } else {
        format!("CUDA error {r}")
    }
}

fn check(driver: &CudaDriver, r: CuResult, what: impl FnOnce() -> String) -> Result<()> {
    let message = || format!("{}: {}", what(), describe(driver, r));
    match r {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_INVALID_VALUE => Err(Error::InvalidArgument(message())),
        CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory(message())),
        CUDA_ERROR_NO_DEVICE => Err(Error::Unsupported(message())),
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => Err(Error::InvalidState(message())),
        _ => Err(Error::InvalidState(message())),
    }
}

/// Whether a CUDA driver with at least one device is present.
pub fn cuda_available() -> bool {
    cuda_driver_version().is_ok()
}

/// The CUDA driver's version (e.g. 13000 for 13.0), or why CUDA is unavailable.
pub fn cuda_driver_version() -> Result<i32> {
    driver().map(|d| d.version)
}

/// The CUDA device whose UUID is `device_uuid` (NVIDIA reports the same UUID to Vulkan and
/// CUDA), or device 0 when `None`. `NotFound` names the devices there are.
fn device_by_uuid(driver: &CudaDriver, device_uuid: Option<[u8; 16]>) -> Result<CuDevice> {
    let mut count = 0;
    // SAFETY: plain CUDA driver calls with valid out-pointers.
    unsafe {
        check(driver, (driver.device_get_count)(&mut count), || "cuDeviceGetCount".into())?;
        if count == 0 {
            return Err(Error::Unsupported("the CUDA driver reports no device".into()));
        }
        let mut seen = Vec::new();
        for ordinal in 0..count {
            let mut device = 0;
            check(driver, (driver.device_get)(&mut device, ordinal), || format!("cuDeviceGet({ordinal})"))?;
            let mut uuid = [0u8; 16];
            check(driver, (driver.device_get_uuid)(&mut uuid, device), || format!("cuDeviceGetUuid({ordinal})"))?;
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
}

/// Host memory pinned with `cuMemHostRegister`; unregistered on drop.
pub struct CudaHostRegistration {
    ptr: *mut c_void,
    len: usize,
    device: CuDevice,
    context: CuContext,
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
    // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
    // the unsafe operations below rely on.
    unsafe {
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
        let mut context: CuContext = std::ptr::null_mut();
        check(driver, (driver.primary_ctx_retain)(&mut context, device), || "cuDevicePrimaryCtxRetain".into())?;
        let pushed = check(driver, (driver.ctx_push)(context), || "cuCtxPushCurrent".into());
        let registered = pushed.and_then(|()| {
            let r = (driver.host_register)(ptr.cast(), len, CU_MEMHOSTREGISTER_PORTABLE);
            let mut popped = std::ptr::null_mut();
            (driver.ctx_pop)(&mut popped);
            check(driver, r, || format!("cuMemHostRegister({ptr:p}, {len} bytes)"))
        });
        if let Err(e) = registered {
            (driver.primary_ctx_release)(device);
            return Err(e);
        }
        Ok(CudaHostRegistration { ptr: ptr.cast(), len, device, context })
    }
}

impl Drop for CudaHostRegistration {
    fn drop(&mut self) {
        let Ok(driver) = driver() else { return };
        // SAFETY: the registration was made in this context, which we retained; the memory is
        // still mapped (the caller's contract).
        unsafe {
            if (driver.ctx_push)(self.context) == CUDA_SUCCESS {
                (driver.host_unregister)(self.ptr);
                let mut popped = std::ptr::null_mut();
                (driver.ctx_pop)(&mut popped);
            }
            (driver.primary_ctx_release)(self.device);
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
    // SAFETY: RTLD_NOLOAD only looks the library up among those already loaded (running no
    // initialiser); the handle is closed on drop, which leaves the library loaded for its
    // other users.
    let loaded =
        unsafe { libloading::os::unix::Library::open(Some("libcuda.so.1"), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if loaded.is_err() {
        return false;
    }
    let Ok(driver) = driver() else { return false };
    let Ok(device) = device_by_uuid(driver, Some(device_uuid)) else { return false };
    let (mut flags, mut active) = (0, 0);
    // SAFETY: a plain query with valid out-pointers.
    let r = unsafe { (driver.primary_ctx_get_state)(device, &mut flags, &mut active) };
    let in_use = r == CUDA_SUCCESS && active != 0;
    if in_use {
        IN_USE.lock().push(device_uuid);
    }
    in_use
}

/// Runs `f` with the primary context `context` current on this thread.
///
/// # Safety
/// `context` is a primary context this process retains.
unsafe fn in_context<R>(driver: &CudaDriver, context: CuContext, f: impl FnOnce() -> Result<R>) -> Result<R> {
    // SAFETY: the caller's contract: a live, retained context.
    unsafe {
        check(driver, (driver.ctx_push)(context), || "cuCtxPushCurrent".into())?;
        let result = f();
        let mut popped = std::ptr::null_mut();
        (driver.ctx_pop)(&mut popped);
        result
    }
}

/// A GPU arena's memory imported into CUDA, mapped whole in the primary context of the CUDA
/// device that is the arena's Vulkan device; unmapped, and the context released, on drop.
pub(crate) struct CudaArena {
    device: CuDevice,
    context: CuContext,
    memory: CuExtMem,
    address: CuDevicePtr,
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
    /// case.
    pub(crate) fn import(fd: OwnedFd, size: u64, dedicated: bool, device_uuid: [u8; 16]) -> Result<CudaArena> {
        let driver = driver()?;
        let device = device_by_uuid(driver, Some(device_uuid))?;
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: a plain call with a valid out-pointer; released below or by the drop.
        check(driver, unsafe { (driver.primary_ctx_retain)(&mut context, device) }, || {
            "cuDevicePrimaryCtxRetain".into()
        })?;
        // SAFETY: the context was just retained.
        let imported = unsafe {
            in_context(driver, context, || {
                let desc = ExtMemHandleDesc {
                    ty: EXTERNAL_MEMORY_OPAQUE_FD,
                    handle: [fd.as_raw_fd() as u32 as u64, 0],
                    size,
                    flags: if dedicated { EXTERNAL_MEMORY_DEDICATED } else { 0 },
                    reserved: [0; 16],
                };
                let mut memory: CuExtMem = std::ptr::null_mut();
                check(driver, (driver.import_external_memory)(&mut memory, &desc), || {
                    format!("cuImportExternalMemory of a {size}-byte Vulkan arena")
                })?;
                // On success CUDA owns the fd.
                let _ = fd.into_raw_fd();
                let buffer = ExtMemBufferDesc { offset: 0, size, flags: 0, reserved: [0; 16] };
                let mut address = 0;
                let mapped =
                    check(driver, (driver.external_memory_get_mapped_buffer)(&mut address, memory, &buffer), || {
                        format!("cuExternalMemoryGetMappedBuffer of a {size}-byte Vulkan arena")
                    });
                if let Err(e) = mapped {
                    (driver.destroy_external_memory)(memory);
                    return Err(e);
                }
                Ok((memory, address))
            })
        };
        match imported {
            Ok((memory, address)) => Ok(CudaArena { device, context, memory, address, size }),
            Err(e) => {
                // SAFETY: retained above, and nothing was made in it.
                unsafe { (driver.primary_ctx_release)(device) };
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
                (driver.mem_free)(self.address);
                (driver.destroy_external_memory)(self.memory);
                Ok(())
            });
            (driver.primary_ctx_release)(self.device);
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
unsafe fn copy_stream(driver: &CudaDriver, device: CuDevice) -> Result<CuStream> {
    static STREAMS: Mutex<Vec<(CuDevice, usize)>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock();
    if let Some(&(_, stream)) = streams.iter().find(|(d, _)| *d == device) {
        return Ok(stream as CuStream);
    }
    let mut context: CuContext = std::ptr::null_mut();
    // SAFETY: plain calls with valid out-pointers; the context is current (the caller's
    // contract), and this retain of it is never released.
    unsafe {
        check(driver, (driver.primary_ctx_retain)(&mut context, device), || "cuDevicePrimaryCtxRetain".into())?;
        let mut stream: CuStream = std::ptr::null_mut();
        let made =
            check(driver, (driver.stream_create)(&mut stream, CU_STREAM_NON_BLOCKING), || "cuStreamCreate".into());
        if let Err(e) = made {
            (driver.primary_ctx_release)(device);
            return Err(e);
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
            check(
                driver,
                (driver.memcpy_dtod_async)(dst.address + dst_offset, src.address + src_offset, len as usize, stream),
                || format!("cuMemcpyDtoDAsync of {len} bytes"),
            )?;
            check(driver, (driver.stream_synchronize)(stream), || "cuStreamSynchronize after a copy".into())
        })
    }
}
