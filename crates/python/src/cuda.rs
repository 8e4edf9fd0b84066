//! GPU memory into CUDA, for DLPack: lava-flow exports a GPU buffer (an opaque fd of its Vulkan
//! memory), the CUDA driver imports it (`cuImportExternalMemory`) on the device whose UUID the
//! export names, and maps the buffer's range (`cuExternalMemoryGetMappedBuffer`) in the
//! device's primary context, the one PyTorch and CuPy use. A channel's ready semaphore is
//! imported likewise (`cuImportExternalSemaphore`), so that a consumer's stream waits for a GPU
//! message's payload (`cuWaitExternalSemaphoresAsync`). libcuda is opened at first use; without
//! it, DLPack of GPU memory says so.
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use pyo3::exceptions::PyBufferError;
use pyo3::PyResult;

use crate::ffi;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuExtMem = *mut c_void;
type CuExtSem = *mut c_void;
pub type CuStream = *mut c_void;

const EXTERNAL_MEMORY_OPAQUE_FD: c_int = 1;
const EXTERNAL_MEMORY_DEDICATED: c_uint = 1;
const EXTERNAL_SEMAPHORE_TIMELINE_FD: c_int = 9;

#[repr(C)]
struct MemHandleDesc {
    ty: c_int,
    handle: [u64; 2],
    size: u64,
    flags: c_uint,
    reserved: [c_uint; 16],
}

#[repr(C)]
struct MemBufferDesc {
    offset: u64,
    size: u64,
    flags: c_uint,
    reserved: [c_uint; 16],
}

#[repr(C)]
struct SemHandleDesc {
    ty: c_int,
    handle: [u64; 2],
    flags: c_uint,
    reserved: [c_uint; 16],
}

#[repr(C)]
struct SemWaitParams {
    fence_value: u64,
    nv_sci_sync: u64,
    keyed_mutex_key: u64,
    keyed_mutex_timeout_ms: c_uint,
    _keyed_mutex_padding: c_uint,
    params_reserved: [c_uint; 10],
    flags: c_uint,
    reserved: [c_uint; 16],
}

struct Api {
    _lib: libloading::Library,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    ctx_synchronize: unsafe extern "C" fn() -> CuResult,
    import_memory: unsafe extern "C" fn(*mut CuExtMem, *const MemHandleDesc) -> CuResult,
    mapped_buffer: unsafe extern "C" fn(*mut u64, CuExtMem, *const MemBufferDesc) -> CuResult,
    destroy_memory: unsafe extern "C" fn(CuExtMem) -> CuResult,
    mem_free: unsafe extern "C" fn(u64) -> CuResult,
    import_semaphore: unsafe extern "C" fn(*mut CuExtSem, *const SemHandleDesc) -> CuResult,
    wait_semaphores: unsafe extern "C" fn(*const CuExtSem, *const SemWaitParams, c_uint, CuStream) -> CuResult,
    destroy_semaphore: unsafe extern "C" fn(CuExtSem) -> CuResult,
}

// SAFETY: the driver API is thread-safe; the struct holds function pointers and the library.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn load() -> Result<Api, String> {
    // SAFETY: loading the CUDA driver runs its initialisers, which have no preconditions.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| format!("libcuda.so.1: {e}"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has the driver API's signature for this name (cuda.h).
            *unsafe { lib.get($name) }
                .map_err(|e| format!("libcuda.so.1 lacks {}: {e}", String::from_utf8_lossy($name)))?
        };
    }
    let init: unsafe extern "C" fn(c_uint) -> CuResult = sym!(b"cuInit");
    let api = Api {
        get_error_string: sym!(b"cuGetErrorString"),
        device_get_count: sym!(b"cuDeviceGetCount"),
        device_get: sym!(b"cuDeviceGet"),
        device_get_uuid: sym!(b"cuDeviceGetUuid_v2"),
        primary_ctx_retain: sym!(b"cuDevicePrimaryCtxRetain"),
        ctx_push: sym!(b"cuCtxPushCurrent_v2"),
        ctx_pop: sym!(b"cuCtxPopCurrent_v2"),
        ctx_synchronize: sym!(b"cuCtxSynchronize"),
        import_memory: sym!(b"cuImportExternalMemory"),
        mapped_buffer: sym!(b"cuExternalMemoryGetMappedBuffer"),
        destroy_memory: sym!(b"cuDestroyExternalMemory"),
        mem_free: sym!(b"cuMemFree_v2"),
        import_semaphore: sym!(b"cuImportExternalSemaphore"),
        wait_semaphores: sym!(b"cuWaitExternalSemaphoresAsync"),
        destroy_semaphore: sym!(b"cuDestroyExternalSemaphore"),
        _lib: lib,
    };
    // SAFETY: cuInit with flags 0.
    let r = unsafe { init(0) };
    if r != 0 {
        return Err(format!("cuInit failed: {}", api.error(r)));
    }
    Ok(api)
}

fn api() -> PyResult<&'static Api> {
    API.get_or_init(load).as_ref().map_err(|e| {
        PyBufferError::new_err(format!(
            "DLPack of GPU memory imports it into CUDA, which is not available here ({e}); read it \
             with Buffer.read(), or copy it to host memory with Context.copy()"
        ))
    })
}

impl Api {
    fn error(&self, r: CuResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: writes a static string or leaves NULL.
        unsafe { (self.get_error_string)(r, &mut s) };
        if s.is_null() {
            format!("CUDA error {r}")
        } else {
            // SAFETY: a static NUL-terminated string.
            format!("{} ({r})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
        }
    }

    fn check(&self, what: &str, r: CuResult) -> PyResult<()> {
        if r == 0 {
            Ok(())
        } else {
            Err(PyBufferError::new_err(format!("{what} failed: {}", self.error(r))))
        }
    }

    /// Runs `f` with the device's primary context current.
    fn in_context<R>(&self, device: CuDevice, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: out-parameter; the primary context is retained for the process's life (as
        // the runtime API does).
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.primary_ctx_retain)(&mut ctx, device) })?;
        // SAFETY: a live context.
        self.check("cuCtxPushCurrent", unsafe { (self.ctx_push)(ctx) })?;
        let r = f();
        let mut popped: CuContext = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        unsafe { (self.ctx_pop)(&mut popped) };
        r
    }

    /// The CUDA device whose UUID is `uuid` (Vulkan's deviceUUID equals CUDA's on NVIDIA).
    fn device(&self, uuid: &[u8; 16]) -> PyResult<CuDevice> {
        let mut n = 0;
        // SAFETY: out-parameter.
        self.check("cuDeviceGetCount", unsafe { (self.device_get_count)(&mut n) })?;
        for i in 0..n {
            let (mut dev, mut u) = (0, [0u8; 16]);
            // SAFETY: out-parameters.
            self.check("cuDeviceGet", unsafe { (self.device_get)(&mut dev, i) })?;
            // SAFETY: out-parameters.
            self.check("cuDeviceGetUuid", unsafe { (self.device_get_uuid)(&mut u, dev) })?;
            if &u == uuid {
                return Ok(dev);
            }
        }
        Err(PyBufferError::new_err(format!(
            "no CUDA device has the UUID of the GPU this memory is on ({}); CUDA sees {n} device(s)",
            uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )))
    }
}

/// The CUDA device ordinal of the GPU whose (Vulkan) device UUID is `uuid`.
pub fn device_of(uuid: &[u8; 16]) -> PyResult<i32> {
    api()?.device(uuid)
}

/// A GPU buffer mapped into CUDA: its device address, and the semaphores imported for waits
/// on it. Dropping it waits for the device's work, then unmaps.
pub struct Mapping {
    pub address: u64,
    pub device: i32,
    memory: CuExtMem,
    semaphores: Vec<CuExtSem>,
}

// SAFETY: CUDA handles are process-wide and usable from any thread.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Imports the export into CUDA (the export's fd is taken in every case).
    pub fn import(e: &ffi::lf_export) -> PyResult<Mapping> {
        let api = match api() {
            Ok(a) => a,
            Err(err) => {
                // SAFETY: the fd is ours.
                unsafe { libc::close(e.fd) };
                return Err(err);
            }
        };
        let device = match api.device(&e.device_uuid) {
            Ok(d) => d,
            Err(err) => {
                // SAFETY: the fd is ours.
                unsafe { libc::close(e.fd) };
                return Err(err);
            }
        };
        api.in_context(device, || {
            let desc = MemHandleDesc {
                ty: EXTERNAL_MEMORY_OPAQUE_FD,
                handle: [e.fd as u32 as u64, 0],
                size: e.arena_size,
                flags: if e.gpu_flags & ffi::LF_EXPORT_GPU_DEDICATED != 0 { EXTERNAL_MEMORY_DEDICATED } else { 0 },
                reserved: [0; 16],
            };
            let mut memory: CuExtMem = std::ptr::null_mut();
            // SAFETY: a valid descriptor; on success CUDA owns the fd.
            let r = unsafe { (api.import_memory)(&mut memory, &desc) };
            if r != 0 {
                // SAFETY: the import failed, so the fd is still ours.
                unsafe { libc::close(e.fd) };
                return api.check("cuImportExternalMemory", r).map(|_| unreachable!());
            }
            let buf = MemBufferDesc { offset: e.offset, size: e.size, flags: 0, reserved: [0; 16] };
            let mut address = 0u64;
            // SAFETY: a live external memory object and a valid descriptor.
            let r = unsafe { (api.mapped_buffer)(&mut address, memory, &buf) };
            if r != 0 {
                // SAFETY: destroys what was imported above.
                unsafe { (api.destroy_memory)(memory) };
                return api.check("cuExternalMemoryGetMappedBuffer", r).map(|_| unreachable!());
            }
            Ok(Mapping { address, device, memory, semaphores: Vec::new() })
        })
    }

    /// Makes `stream` wait until the timeline semaphore `fd` (taken) reaches `value`.
    pub fn wait_on_stream(&mut self, fd: c_int, value: u64, stream: CuStream) -> PyResult<()> {
        let api = api()?;
        api.in_context(self.device, || {
            let desc = SemHandleDesc {
                ty: EXTERNAL_SEMAPHORE_TIMELINE_FD,
                handle: [fd as u32 as u64, 0],
                flags: 0,
                reserved: [0; 16],
            };
            let mut sem: CuExtSem = std::ptr::null_mut();
            // SAFETY: a valid descriptor; on success CUDA owns the fd.
            let r = unsafe { (api.import_semaphore)(&mut sem, &desc) };
            if r != 0 {
                // SAFETY: the import failed, so the fd is still ours.
                unsafe { libc::close(fd) };
                return api.check("cuImportExternalSemaphore", r);
            }
            // Kept until the mapping goes, after the device's work is done.
            self.semaphores.push(sem);
            let params = SemWaitParams {
                fence_value: value,
                nv_sci_sync: 0,
                keyed_mutex_key: 0,
                keyed_mutex_timeout_ms: 0,
                _keyed_mutex_padding: 0,
                params_reserved: [0; 10],
                flags: 0,
                reserved: [0; 16],
            };
            // SAFETY: a live semaphore, valid parameters, the caller's stream.
            api.check("cuWaitExternalSemaphoresAsync", unsafe { (api.wait_semaphores)(&sem, &params, 1, stream) })
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let Ok(api) = api() else { return };
        let _ = api.in_context(self.device, || {
            // SAFETY: the work that may read the memory or wait on the semaphores ends first;
            // then each handle is released once.
            unsafe {
                (api.ctx_synchronize)();
                for s in self.semaphores.drain(..) {
                    (api.destroy_semaphore)(s);
                }
                (api.mem_free)(self.address);
                (api.destroy_memory)(self.memory);
            }
            Ok(())
        });
    }
}

/// The CUDA stream a DLPack consumer names: None and 1 the legacy default stream, 2 the
/// per-thread default stream, -1 none (no wait), else a `cudaStream_t` as an int.
pub fn stream(stream: Option<isize>) -> Option<CuStream> {
    match stream {
        None | Some(1) => Some(1 as CuStream),
        Some(-1) => None,
        Some(s) => Some(s as CuStream),
    }
}
