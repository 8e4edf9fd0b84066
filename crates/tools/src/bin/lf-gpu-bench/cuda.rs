//! The CUDA driver API for the hardware baselines, loaded at run time (`dlopen` of
//! `libcuda.so.1`), so that the bench builds and runs without CUDA and says why the CUDA rows
//! are missing. Only what the bench needs: contexts, device and pinned host memory, the
//! synchronous copies, memory info and IPC handles.
//!
//! Signatures follow `cuda.h` (CUDA 12/13): `CUresult` is an `int`, `CUdevice` an `int`,
//! `CUdeviceptr` a 64-bit `unsigned long long`, sizes are `size_t`; the `_v2` symbols are the
//! ones `cuda.h` maps the plain names to. `LF_DISABLE_CUDA=1` keeps the bench away from libcuda
//! as it keeps the library away.
//!
//! Everything runs on the thread that called [`Cuda::open`] (the context is made current
//! there); the handles are neither `Send` nor `Sync`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use lava_flow::memory::gpu::{format_uuid, DISABLE_CUDA_ENV};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
/// `CUdeviceptr`: `unsigned long long` on every 64-bit platform.
type CuDevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, the flag `cudaIpcOpenMemHandle` passes.
const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `CU_IPC_HANDLE_SIZE`.
pub const IPC_HANDLE_SIZE: usize = 64;

/// `CUipcMemHandle`: `struct { char reserved[64]; }`, passed by value to
/// `cuIpcOpenMemHandle_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CuIpcMemHandle {
    reserved: [u8; IPC_HANDLE_SIZE],
}

type FnInit = unsafe extern "C" fn(flags: c_uint) -> CuResult;
type FnIntOut = unsafe extern "C" fn(value: *mut c_int) -> CuResult;
type FnDeviceGet = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> CuResult;
type FnDeviceGetUuid = unsafe extern "C" fn(uuid: *mut [u8; 16], device: CuDevice) -> CuResult;
type FnDeviceGetName = unsafe extern "C" fn(name: *mut c_char, len: c_int, device: CuDevice) -> CuResult;
type FnPrimaryCtxRetain = unsafe extern "C" fn(context: *mut CuContext, device: CuDevice) -> CuResult;
type FnPrimaryCtxRelease = unsafe extern "C" fn(device: CuDevice) -> CuResult;
type FnCtxSetCurrent = unsafe extern "C" fn(context: CuContext) -> CuResult;
type FnCtxSynchronize = unsafe extern "C" fn() -> CuResult;
type FnMemAlloc = unsafe extern "C" fn(ptr: *mut CuDevicePtr, bytes: usize) -> CuResult;
type FnMemFree = unsafe extern "C" fn(ptr: CuDevicePtr) -> CuResult;
type FnMemAllocHost = unsafe extern "C" fn(ptr: *mut *mut c_void, bytes: usize) -> CuResult;
type FnMemFreeHost = unsafe extern "C" fn(ptr: *mut c_void) -> CuResult;
type FnMemcpyDtoD = unsafe extern "C" fn(dst: CuDevicePtr, src: CuDevicePtr, bytes: usize) -> CuResult;
type FnMemcpyHtoD = unsafe extern "C" fn(dst: CuDevicePtr, src: *const c_void, bytes: usize) -> CuResult;
type FnMemcpyDtoH = unsafe extern "C" fn(dst: *mut c_void, src: CuDevicePtr, bytes: usize) -> CuResult;
type FnMemGetInfo = unsafe extern "C" fn(free: *mut usize, total: *mut usize) -> CuResult;
type FnIpcGetMemHandle = unsafe extern "C" fn(handle: *mut CuIpcMemHandle, ptr: CuDevicePtr) -> CuResult;
type FnIpcOpenMemHandle =
    unsafe extern "C" fn(ptr: *mut CuDevicePtr, handle: CuIpcMemHandle, flags: c_uint) -> CuResult;
type FnIpcCloseMemHandle = unsafe extern "C" fn(ptr: CuDevicePtr) -> CuResult;
type FnGetErrorText = unsafe extern "C" fn(error: CuResult, text: *mut *const c_char) -> CuResult;

/// The driver's entry points.
struct Api {
    init: FnInit,
    driver_get_version: FnIntOut,
    device_get_count: FnIntOut,
    device_get: FnDeviceGet,
    device_get_uuid: FnDeviceGetUuid,
    device_get_name: FnDeviceGetName,
    primary_ctx_retain: FnPrimaryCtxRetain,
    primary_ctx_release: FnPrimaryCtxRelease,
    ctx_set_current: FnCtxSetCurrent,
    ctx_synchronize: FnCtxSynchronize,
    mem_alloc: FnMemAlloc,
    mem_free: FnMemFree,
    mem_alloc_host: FnMemAllocHost,
    mem_free_host: FnMemFreeHost,
    memcpy_dtod: FnMemcpyDtoD,
    memcpy_htod: FnMemcpyHtoD,
    memcpy_dtoh: FnMemcpyDtoH,
    mem_get_info: FnMemGetInfo,
    ipc_get_mem_handle: FnIpcGetMemHandle,
    ipc_open_mem_handle: FnIpcOpenMemHandle,
    ipc_close_mem_handle: FnIpcCloseMemHandle,
    get_error_string: FnGetErrorText,
    get_error_name: FnGetErrorText,
}

/// The text `dlerror` holds, if any.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays valid until the next
    // dl* call on this thread; it is copied at once.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        "no reason given".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    }
}

fn load() -> Result<Api, String> {
    if std::env::var(DISABLE_CUDA_ENV).is_ok_and(|v| v == "1") {
        return Err(format!("CUDA is disabled by {DISABLE_CUDA_ENV}=1"));
    }
    // SAFETY: dlopen of the CUDA driver runs its initialisers, which are made to run in any
    // process; the handle is never closed (the driver does not support unloading).
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(format!("libcuda.so.1 could not be loaded (no NVIDIA driver here?): {}", dl_error()));
    }
    let symbol = |names: &[&str]| -> Result<*mut c_void, String> {
        for name in names {
            debug_assert!(name.ends_with('\0'));
            // SAFETY: lib is a live handle; name is NUL-terminated.
            let p = unsafe { libc::dlsym(lib, name.as_ptr().cast()) };
            if !p.is_null() {
                return Ok(p);
            }
        }
        Err(format!(
            "libcuda.so.1 has no {}: the NVIDIA driver is too old for this bench",
            names[0].trim_end_matches('\0')
        ))
    };
    macro_rules! load {
        ($ty:ty, $($name:literal),+) => {{
            let p = symbol(&[$(concat!($name, "\0")),+])?;
            // SAFETY: the symbol is the CUDA driver API function of that name, whose C
            // signature in cuda.h `$ty` spells out.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }};
    }
    Ok(Api {
        init: load!(FnInit, "cuInit"),
        driver_get_version: load!(FnIntOut, "cuDriverGetVersion"),
        device_get_count: load!(FnIntOut, "cuDeviceGetCount"),
        device_get: load!(FnDeviceGet, "cuDeviceGet"),
        device_get_uuid: load!(FnDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
        device_get_name: load!(FnDeviceGetName, "cuDeviceGetName"),
        primary_ctx_retain: load!(FnPrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
        primary_ctx_release: load!(FnPrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
        ctx_set_current: load!(FnCtxSetCurrent, "cuCtxSetCurrent"),
        ctx_synchronize: load!(FnCtxSynchronize, "cuCtxSynchronize"),
        mem_alloc: load!(FnMemAlloc, "cuMemAlloc_v2"),
        mem_free: load!(FnMemFree, "cuMemFree_v2"),
        mem_alloc_host: load!(FnMemAllocHost, "cuMemAllocHost_v2"),
        mem_free_host: load!(FnMemFreeHost, "cuMemFreeHost"),
        memcpy_dtod: load!(FnMemcpyDtoD, "cuMemcpyDtoD_v2"),
        memcpy_htod: load!(FnMemcpyHtoD, "cuMemcpyHtoD_v2"),
        memcpy_dtoh: load!(FnMemcpyDtoH, "cuMemcpyDtoH_v2"),
        mem_get_info: load!(FnMemGetInfo, "cuMemGetInfo_v2"),
        ipc_get_mem_handle: load!(FnIpcGetMemHandle, "cuIpcGetMemHandle"),
        ipc_open_mem_handle: load!(FnIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
        ipc_close_mem_handle: load!(FnIpcCloseMemHandle, "cuIpcCloseMemHandle"),
        get_error_string: load!(FnGetErrorText, "cuGetErrorString"),
        get_error_name: load!(FnGetErrorText, "cuGetErrorName"),
    })
}

/// `CUDA error 2 CUDA_ERROR_OUT_OF_MEMORY (out of memory)`.
fn describe(api: &Api, r: CuResult) -> String {
    let text = |f: FnGetErrorText| -> Option<String> {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the function writes a pointer to a static string, or leaves it NULL.
        let ok = unsafe { f(r, &mut p) } == CUDA_SUCCESS && !p.is_null();
        // SAFETY: a NUL-terminated static string from the driver.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    match (text(api.get_error_name), text(api.get_error_string)) {
        (Some(name), Some(string)) => format!("CUDA error {r} {name} ({string})"),
        (Some(name), None) => format!("CUDA error {r} {name}"),
        (None, Some(string)) => format!("CUDA error {r} ({string})"),
        (None, None) => format!("CUDA error {r}"),
    }
}

fn check(api: &Api, r: CuResult, what: impl FnOnce() -> String) -> Result<(), String> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{}: {}", what(), describe(api, r)))
    }
}

/// The CUDA device that is the Vulkan device in use, with its primary context current on
/// this thread.
pub struct Cuda {
    api: Api,
    device: CuDevice,
    _context: CuContext,
    pub ordinal: i32,
    pub name: String,
    /// `cuDriverGetVersion`, e.g. 13000 for 13.0.
    pub driver_version: i32,
}

impl Cuda {
    /// Loads the driver, initialises it, picks the CUDA device whose UUID is `uuid` (the
    /// Vulkan deviceUUID: NVIDIA reports the same UUID to both APIs) and makes its primary
    /// context current. The error says why CUDA is unavailable.
    pub fn open(uuid: &[u8; 16]) -> Result<Cuda, String> {
        let api = load()?;
        // SAFETY: cuInit takes flags, which must be 0.
        check(&api, unsafe { (api.init)(0) }, || {
            "cuInit (is an NVIDIA GPU visible to this process? see nvidia-smi, CUDA_VISIBLE_DEVICES)".into()
        })?;
        let mut version: c_int = 0;
        // SAFETY: version is a valid out-pointer.
        check(&api, unsafe { (api.driver_get_version)(&mut version) }, || "cuDriverGetVersion".into())?;
        let mut count: c_int = 0;
        // SAFETY: count is a valid out-pointer.
        check(&api, unsafe { (api.device_get_count)(&mut count) }, || "cuDeviceGetCount".into())?;
        let mut seen = Vec::new();
        for ordinal in 0..count {
            let mut device: CuDevice = 0;
            // SAFETY: device is a valid out-pointer; 0 <= ordinal < count.
            check(&api, unsafe { (api.device_get)(&mut device, ordinal) }, || format!("cuDeviceGet({ordinal})"))?;
            let mut found = [0u8; 16];
            // SAFETY: found is a valid CUuuid (16 bytes) out-pointer; device is a valid handle.
            check(&api, unsafe { (api.device_get_uuid)(&mut found, device) }, || {
                format!("cuDeviceGetUuid({ordinal})")
            })?;
            if &found != uuid {
                seen.push(format_uuid(&found));
                continue;
            }
            let mut name = [0 as c_char; 256];
            // SAFETY: name is writable for the length passed; the driver NUL-terminates it.
            let named = unsafe { (api.device_get_name)(name.as_mut_ptr(), name.len() as c_int, device) };
            let name = if named == CUDA_SUCCESS {
                // SAFETY: NUL-terminated by the driver within the buffer.
                unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
            } else {
                format!("(cuDeviceGetName: {})", describe(&api, named))
            };
            let mut context: CuContext = std::ptr::null_mut();
            // SAFETY: context is a valid out-pointer; device is a valid handle.
            check(&api, unsafe { (api.primary_ctx_retain)(&mut context, device) }, || {
                format!("cuDevicePrimaryCtxRetain({ordinal})")
            })?;
            // SAFETY: context was just retained and is live.
            let current = check(&api, unsafe { (api.ctx_set_current)(context) }, || "cuCtxSetCurrent".into());
            if let Err(e) = current {
                // SAFETY: balances the retain above.
                unsafe { (api.primary_ctx_release)(device) };
                return Err(e);
            }
            return Ok(Cuda { api, device, _context: context, ordinal, name, driver_version: version });
        }
        Err(format!(
            "no CUDA device has the Vulkan device's UUID {} (CUDA devices: {})",
            format_uuid(uuid),
            if seen.is_empty() { "none".into() } else { seen.join(", ") }
        ))
    }

    fn check(&self, r: CuResult, what: impl FnOnce() -> String) -> Result<(), String> {
        check(&self.api, r, what)
    }

    /// `cuCtxSynchronize`: waits for all work of the context.
    pub fn synchronize(&self) -> Result<(), String> {
        // SAFETY: no arguments; the context is current on this thread.
        self.check(unsafe { (self.api.ctx_synchronize)() }, || "cuCtxSynchronize".into())
    }

    /// `cuMemAlloc_v2` of `len` bytes.
    pub fn alloc(&self, len: usize) -> Result<DeviceMemory<'_>, String> {
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: ptr is a valid out-pointer.
        self.check(unsafe { (self.api.mem_alloc)(&mut ptr, len) }, || format!("cuMemAlloc({len} bytes)"))?;
        Ok(DeviceMemory { cuda: self, ptr, len })
    }

    /// `cuMemAllocHost_v2` of `len` bytes (page-locked, mapped for the device), filled with
    /// `fill` so that every page is touched before timing.
    pub fn alloc_host(&self, len: usize, fill: u8) -> Result<PinnedHost<'_>, String> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: ptr is a valid out-pointer.
        self.check(unsafe { (self.api.mem_alloc_host)(&mut ptr, len) }, || format!("cuMemAllocHost({len} bytes)"))?;
        // SAFETY: a fresh allocation of len writable bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), fill, len) };
        Ok(PinnedHost { cuda: self, ptr: ptr.cast(), len })
    }

    /// `cuMemcpyDtoD_v2` of `len` bytes, then `cuCtxSynchronize` (the copy is asynchronous
    /// to the host otherwise).
    pub fn copy_dtod(&self, dst: &DeviceMemory, src: &DeviceMemory, len: usize) -> Result<(), String> {
        assert!(len <= dst.len && len <= src.len, "copy of {len} bytes overruns a CUDA buffer");
        // SAFETY: both are live allocations of this context at least `len` bytes long.
        self.check(unsafe { (self.api.memcpy_dtod)(dst.ptr, src.ptr, len) }, || format!("cuMemcpyDtoD({len} bytes)"))?;
        self.synchronize()
    }

    /// `cuMemcpyHtoD_v2` from `src`, then `cuCtxSynchronize` (from pageable memory the call
    /// may return before the data has arrived).
    pub fn copy_htod(&self, dst: &DeviceMemory, src: &[u8]) -> Result<(), String> {
        assert!(src.len() <= dst.len, "copy of {} bytes overruns a CUDA buffer", src.len());
        // SAFETY: dst is a live allocation of at least src.len() bytes; src is readable for
        // its length and stays borrowed until the copy is done (synchronised below).
        let r = unsafe { (self.api.memcpy_htod)(dst.ptr, src.as_ptr().cast(), src.len()) };
        self.check(r, || format!("cuMemcpyHtoD({} bytes)", src.len()))?;
        self.synchronize()
    }

    /// `cuMemcpyDtoH_v2` into `dst` (synchronous), then `cuCtxSynchronize`.
    pub fn copy_dtoh(&self, dst: &mut [u8], src: &DeviceMemory) -> Result<(), String> {
        assert!(dst.len() <= src.len, "copy of {} bytes overruns a CUDA buffer", dst.len());
        // SAFETY: src is a live allocation of at least dst.len() bytes; dst is writable for
        // its length and exclusively borrowed until the copy is done.
        let r = unsafe { (self.api.memcpy_dtoh)(dst.as_mut_ptr().cast(), src.ptr, dst.len()) };
        self.check(r, || format!("cuMemcpyDtoH({} bytes)", dst.len()))?;
        self.synchronize()
    }

    /// `cuMemGetInfo_v2`: the device's free and total memory in bytes.
    pub fn mem_info(&self) -> Result<(u64, u64), String> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers.
        self.check(unsafe { (self.api.mem_get_info)(&mut free, &mut total) }, || "cuMemGetInfo".into())?;
        Ok((free as u64, total as u64))
    }

    /// `cuIpcGetMemHandle` of an allocation: the 64 bytes another process opens.
    pub fn ipc_handle(&self, memory: &DeviceMemory) -> Result<[u8; IPC_HANDLE_SIZE], String> {
        let mut handle = CuIpcMemHandle { reserved: [0; IPC_HANDLE_SIZE] };
        // SAFETY: handle is a valid out-pointer; memory is a live cuMemAlloc allocation.
        self.check(unsafe { (self.api.ipc_get_mem_handle)(&mut handle, memory.ptr) }, || "cuIpcGetMemHandle".into())?;
        Ok(handle.reserved)
    }

    /// `cuIpcOpenMemHandle_v2` (lazy peer access, as `cudaIpcOpenMemHandle`) of another
    /// process's handle; closed when the result drops.
    pub fn ipc_open(&self, handle: &[u8; IPC_HANDLE_SIZE]) -> Result<IpcMemory<'_>, String> {
        let mut ptr: CuDevicePtr = 0;
        let handle = CuIpcMemHandle { reserved: *handle };
        // SAFETY: ptr is a valid out-pointer; the handle is passed by value as cuda.h says.
        let r = unsafe { (self.api.ipc_open_mem_handle)(&mut ptr, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) };
        self.check(r, || "cuIpcOpenMemHandle".into())?;
        Ok(IpcMemory { cuda: self, ptr })
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: balances the retain of `open`; every allocation borrowed `self` and is gone.
        unsafe { (self.api.primary_ctx_release)(self.device) };
    }
}

/// A `cuMemAlloc` allocation, freed on drop.
pub struct DeviceMemory<'a> {
    cuda: &'a Cuda,
    ptr: CuDevicePtr,
    len: usize,
}

impl Drop for DeviceMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: a live allocation of this context, freed once; copies are synchronous.
        let r = unsafe { (self.cuda.api.mem_free)(self.ptr) };
        if let Err(e) = self.cuda.check(r, || "cuMemFree".into()) {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}

/// A `cuMemAllocHost` allocation, freed on drop.
pub struct PinnedHost<'a> {
    cuda: &'a Cuda,
    ptr: *mut u8,
    len: usize,
}

impl PinnedHost<'_> {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes, written only through &mut self (copies
        // into it borrow it mutably and are synchronous).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of len bytes, borrowed exclusively through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedHost<'_> {
    fn drop(&mut self) {
        // SAFETY: a live cuMemAllocHost allocation, freed once; no copy is in flight.
        let r = unsafe { (self.cuda.api.mem_free_host)(self.ptr.cast()) };
        if let Err(e) = self.cuda.check(r, || "cuMemFreeHost".into()) {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}

/// Memory of another process opened with `cuIpcOpenMemHandle`, closed on drop.
pub struct IpcMemory<'a> {
    cuda: &'a Cuda,
    ptr: CuDevicePtr,
}

impl Drop for IpcMemory<'_> {
    fn drop(&mut self) {
        // SAFETY: a pointer cuIpcOpenMemHandle returned, closed once.
        let r = unsafe { (self.cuda.api.ipc_close_mem_handle)(self.ptr) };
        if let Err(e) = self.cuda.check(r, || "cuIpcCloseMemHandle".into()) {
            eprintln!("lf-gpu-bench: {e}");
        }
    }
}
