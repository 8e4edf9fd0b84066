//! GPU-pinned host memory through CUDA: `cuMemHostRegister` on a range of this process's
//! memory, with libcuda loaded at run time (`libloading`), so that lava-flow builds and runs
//! without CUDA and reports `Unsupported` where no NVIDIA driver is installed.
//!
//! `LF_DISABLE_CUDA=1` keeps lava-flow away from libcuda altogether (for processes where CUDA
//! must not be initialised, or tools such as valgrind that the driver confuses).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
const CUDA_ERROR_NO_DEVICE: CuResult = 100;
const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CuResult = 712;
/// Pinned for every CUDA context, not just the primary context of one device.
const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x01;

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
                Err(why) => log::info!("CUDA cannot register GPU-pinned memory: {why}"),
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
            return Err(format!(
                "the CUDA driver library libcuda.so.1 could not be loaded ({e}): no NVIDIA driver? \
                 CUDA pinning is unavailable, use VK_EXT_external_memory_host instead"
            ))
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
        let driver = driver()?;
        if ptr.is_null() || len == 0 {
            return Err(Error::invalid("cuMemHostRegister needs a non-NULL pointer and a non-zero length"));
        }
        let mut count = 0;
        check(driver, (driver.device_get_count)(&mut count), || "cuDeviceGetCount".into())?;
        if count == 0 {
            return Err(Error::Unsupported("the CUDA driver reports no device".into()));
        }
        let mut chosen = None;
        let mut seen = Vec::new();
        for ordinal in 0..count {
            let mut device = 0;
            check(driver, (driver.device_get)(&mut device, ordinal), || format!("cuDeviceGet({ordinal})"))?;
            let mut uuid = [0u8; 16];
            check(driver, (driver.device_get_uuid)(&mut uuid, device), || format!("cuDeviceGetUuid({ordinal})"))?;
            seen.push(super::device::format_uuid(&uuid));
            if device_uuid.map_or(ordinal == 0, |want| want == uuid) {
                chosen = Some(device);
                break;
            }
        }
        let device = chosen.ok_or_else(|| {
            Error::NotFound(format!(
                "no CUDA device has UUID {}; CUDA devices: {}",
                super::device::format_uuid(&device_uuid.unwrap_or_default()),
                seen.join(", ")
            ))
        })?;
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
