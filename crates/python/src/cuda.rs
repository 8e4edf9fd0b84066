//! The CUDA driver, for DLPack of GPU memory: lava-flow exports a GPU buffer (an opaque fd of
//! its Vulkan memory, the whole arena the buffer lies in), the driver imports the arena
//! (`cuImportExternalMemory`) on the device whose UUID the export names and maps it whole
//! (`cuExternalMemoryGetMappedBuffer`) in the device's primary context, the one PyTorch and
//! CuPy use; a buffer's CUDA address is the arena's base plus its offset. A channel's ready
//! semaphore is imported likewise (`cuImportExternalSemaphore`), so that a stream waits for a
//! GPU message's payload (`cuWaitExternalSemaphoresAsync`) or a producer's stream says when a
//! buffer it sends is written (`cuSignalExternalSemaphoresAsync`); events (`cuEventRecord`)
//! tell when a consumer's stream is done with a message. libcuda is opened at first use;
//! without it, DLPack of GPU memory says so.
//!
//! Imports of received arenas are made once per process and cached (`imported`, bookkept by
//! `import_cache`): per message there is only a lookup. An import is an `Arc` that the cache
//! and each DLPack tensor over it hold; the last one destroys it, after the device's work is
//! done (that wait happens only when an arena leaves the cache, never per message).
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::PyBufferError;
use pyo3::PyResult;

use crate::ffi;
use crate::import_cache::{ArenaKey, ImportCache};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuExtMem = *mut c_void;
type CuExtSem = *mut c_void;
type CuEvent = *mut c_void;
pub type CuStream = *mut c_void;

const EXTERNAL_MEMORY_OPAQUE_FD: c_int = 1;
const EXTERNAL_MEMORY_DEDICATED: c_uint = 1;
const EXTERNAL_SEMAPHORE_TIMELINE_FD: c_int = 9;
const ERROR_NOT_READY: CuResult = 600;
// A host waiting for it sleeps instead of spinning; no timing, which costs a little per record.
const EVENT_FLAGS: c_uint = 0x1 | 0x2;

/// Arenas kept imported at most; each pins its GPU memory (64 MiB by default) while cached.
const CACHE_CAPACITY: usize = 16;
/// Idle events kept for reuse at most.
const EVENT_POOL: usize = 64;

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

#[repr(C)]
struct SemSignalParams {
    fence_value: u64,
    nv_sci_sync: u64,
    keyed_mutex_key: u64,
    params_reserved: [c_uint; 12],
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
    signal_semaphores: unsafe extern "C" fn(*const CuExtSem, *const SemSignalParams, c_uint, CuStream) -> CuResult,
    destroy_semaphore: unsafe extern "C" fn(CuExtSem) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    event_query: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_synchronize: unsafe extern "C" fn(CuEvent) -> CuResult,
    event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
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
        signal_semaphores: sym!(b"cuSignalExternalSemaphoresAsync"),
        destroy_semaphore: sym!(b"cuDestroyExternalSemaphore"),
        event_create: sym!(b"cuEventCreate"),
        event_record: sym!(b"cuEventRecord"),
        event_query: sym!(b"cuEventQuery"),
        event_synchronize: sym!(b"cuEventSynchronize"),
        event_destroy: sym!(b"cuEventDestroy_v2"),
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

/// The driver, where something of CUDA was made already (handles to release need it).
fn loaded() -> Option<&'static Api> {
    API.get().and_then(|r| r.as_ref().ok())
}

/// A raw CUDA handle that crosses threads (the driver's handles are process-wide).
#[derive(Clone, Copy)]
struct Raw(*mut c_void);
// SAFETY: CUDA handles are usable from any thread.
unsafe impl Send for Raw {}

/// Each device's primary context, retained once for the process's life (as the runtime does).
static CONTEXTS: Mutex<Vec<(CuDevice, Raw)>> = Mutex::new(Vec::new());
/// Device UUIDs seen, and their CUDA ordinals.
static DEVICES: Mutex<Vec<([u8; 16], CuDevice)>> = Mutex::new(Vec::new());

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

    fn primary_context(&self, device: CuDevice) -> PyResult<CuContext> {
        let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, c)) = contexts.iter().find(|(d, _)| *d == device) {
            return Ok(c.0);
        }
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: out-parameter; retained once, kept for the process's life.
        self.check("cuDevicePrimaryCtxRetain", unsafe { (self.primary_ctx_retain)(&mut ctx, device) })?;
        contexts.push((device, Raw(ctx)));
        Ok(ctx)
    }

    /// Runs `f` with the device's primary context current.
    fn in_context<R>(&self, device: CuDevice, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
        let ctx = self.primary_context(device)?;
        // SAFETY: a live (retained) context.
        self.check("cuCtxPushCurrent", unsafe { (self.ctx_push)(ctx) })?;
        let r = f();
        let mut popped: CuContext = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        unsafe { (self.ctx_pop)(&mut popped) };
        r
    }

    /// Waits for all of the device's work (before destroying what that work may use).
    fn synchronize(&self, device: CuDevice) {
        let _ = self.in_context(device, || {
            // SAFETY: the pushed context.
            unsafe { (self.ctx_synchronize)() };
            Ok(())
        });
    }

    /// The CUDA device whose UUID is `uuid` (Vulkan's deviceUUID equals CUDA's on NVIDIA).
    fn device(&self, uuid: &[u8; 16]) -> PyResult<CuDevice> {
        let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, d)) = devices.iter().find(|(u, _)| u == uuid) {
            return Ok(d);
        }
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
                devices.push((u, dev));
                return Ok(dev);
            }
        }
        Err(PyBufferError::new_err(format!(
            "no CUDA device has the UUID of the GPU this memory is on ({}); CUDA sees {n} device(s): \
             make that GPU visible to this process (CUDA_VISIBLE_DEVICES), or read the memory with \
             Buffer.read()",
            uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )))
    }
}

/// Waits for all of `device`'s work (where no stream can be waited for instead).
pub fn synchronize(device: i32) {
    if let Some(api) = loaded() {
        api.synchronize(device);
    }
}

/// The CUDA device ordinal of the GPU whose (Vulkan) device UUID is `uuid`.
pub fn device_of(uuid: &[u8; 16]) -> PyResult<i32> {
    api()?.device(uuid)
}

/// Closes an export's fd that CUDA did not take.
fn close(fd: c_int) {
    // SAFETY: the fd is the caller's, closed once.
    unsafe { libc::close(fd) };
}

/// A lava-flow arena imported into CUDA and mapped whole.
pub struct Import {
    pub base: u64,
    pub size: u64,
    pub device: i32,
    memory: Raw,
}

static IMPORTS_MADE: AtomicU64 = AtomicU64::new(0);
static IMPORTS_ALIVE: AtomicU64 = AtomicU64::new(0);
static IMPORTS: Mutex<ImportCache<Import>> = Mutex::new(ImportCache::new(CACHE_CAPACITY));

impl Import {
    /// Imports the arena of export `e` (its fd taken in every case) on its device.
    fn new(api: &Api, e: &ffi::lf_export) -> PyResult<Import> {
        let device = match api.device(&e.device_uuid) {
            Ok(d) => d,
            Err(err) => {
                close(e.fd);
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
                close(e.fd);
                return api.check("cuImportExternalMemory", r).map(|_| unreachable!());
            }
            let buf = MemBufferDesc { offset: 0, size: e.arena_size, flags: 0, reserved: [0; 16] };
            let mut base = 0u64;
            // SAFETY: a live external memory object and a valid descriptor.
            let r = unsafe { (api.mapped_buffer)(&mut base, memory, &buf) };
            if r != 0 {
                // SAFETY: destroys what was imported above.
                unsafe { (api.destroy_memory)(memory) };
                return api.check("cuExternalMemoryGetMappedBuffer", r).map(|_| unreachable!());
            }
            IMPORTS_MADE.fetch_add(1, Ordering::Relaxed);
            IMPORTS_ALIVE.fetch_add(1, Ordering::Relaxed);
            Ok(Import { base, size: e.arena_size, device, memory: Raw(memory) })
        })
    }

    /// The CUDA address of the export's range in this arena.
    pub fn address(&self, e: &ffi::lf_export) -> PyResult<u64> {
        match e.offset.checked_add(e.size) {
            Some(end) if end <= self.size => Ok(self.base + e.offset),
            _ => Err(PyBufferError::new_err(format!(
                "lava-flow exported {} bytes at offset {} of an arena of {} bytes: a damaged export",
                e.size, e.offset, self.size
            ))),
        }
    }
}

// SAFETY: CUDA handles are process-wide and usable from any thread.
unsafe impl Sync for Import {}

impl Drop for Import {
    fn drop(&mut self) {
        let Some(api) = loaded() else { return };
        // Work queued on the memory (by a tensor that is gone now) ends first; this happens when
        // an arena leaves the cache and no tensor holds it, not per message.
        api.synchronize(self.device);
        let _ = api.in_context(self.device, || {
            // SAFETY: each handle is released once; nothing uses them any more.
            unsafe {
                (api.mem_free)(self.base);
                (api.destroy_memory)(self.memory.0);
            }
            Ok(())
        });
        IMPORTS_ALIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

fn key(e: &ffi::lf_export) -> ArenaKey {
    ArenaKey { pid: e.exporter_pid, token: e.exporter_token, arena: e.arena_id, size: e.arena_size }
}

/// The cached CUDA import of the arena of `e` (received on channel `channel`), made at its
/// first message. `e.fd` is taken in every case.
pub fn imported(e: &ffi::lf_export, channel: u64) -> PyResult<Arc<Import>> {
    let api = match api() {
        Ok(a) => a,
        Err(err) => {
            close(e.fd);
            return Err(err);
        }
    };
    let k = key(e);
    let mut cache = IMPORTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = cache.get(&k, channel) {
        drop(cache);
        close(e.fd);
        return Ok(i);
    }
    let i = Arc::new(Import::new(api, e)?);
    let gone = cache.insert(k, channel, i.clone());
    drop(cache);
    drop(gone);
    Ok(i)
}

/// Channel `channel` is freed: the arenas only it used leave the cache (destroyed once no
/// tensor holds them).
pub fn forget_channel(channel: u64) {
    if loaded().is_none() {
        return;
    }
    let gone = IMPORTS.lock().unwrap_or_else(|e| e.into_inner()).forget_channel(channel);
    drop(gone);
}

/// (arenas imported so far, imports alive, arenas cached): for tests and diagnostics.
pub fn import_counts() -> (u64, u64, usize) {
    let cached = IMPORTS.lock().unwrap_or_else(|e| e.into_inner()).len();
    (IMPORTS_MADE.load(Ordering::Relaxed), IMPORTS_ALIVE.load(Ordering::Relaxed), cached)
}

/// A lava-flow buffer of this process mapped into CUDA (for `Buffer`'s DLPack), or a received
/// one through the cache.
pub struct Mapping {
    pub address: u64,
    pub device: i32,
    _import: Arc<Import>,
}

impl Mapping {
    /// Maps the export's buffer: through the cache when it came on channel `received_on`, else
    /// an import of its own (this process's buffer, unmapped when the Buffer goes). The fd is
    /// taken in every case.
    pub fn import(e: &ffi::lf_export, received_on: Option<u64>) -> PyResult<Mapping> {
        let import = match received_on {
            Some(channel) => imported(e, channel)?,
            None => match api() {
                Ok(api) => Arc::new(Import::new(api, e)?),
                Err(err) => {
                    close(e.fd);
                    return Err(err);
                }
            },
        };
        Ok(Mapping { address: import.address(e)?, device: import.device, _import: import })
    }
}

/// A timeline semaphore of lava-flow's imported into CUDA.
pub struct Semaphore {
    sem: Raw,
    device: i32,
}

// SAFETY: as Import.
unsafe impl Sync for Semaphore {}

impl Semaphore {
    /// Imports the timeline semaphore `fd` (taken in every case) on `device`.
    pub fn import(fd: c_int, device: i32) -> PyResult<Semaphore> {
        let api = match api() {
            Ok(a) => a,
            Err(err) => {
                close(fd);
                return Err(err);
            }
        };
        api.in_context(device, || {
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
                close(fd);
                return api.check("cuImportExternalSemaphore", r).map(|_| unreachable!());
            }
            Ok(Semaphore { sem: Raw(sem), device })
        })
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// Makes `stream`'s later work wait until the semaphore reaches `value`.
    pub fn wait(&self, value: u64, stream: CuStream) -> PyResult<()> {
        let api = api()?;
        api.in_context(self.device, || {
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
            api.check("cuWaitExternalSemaphoresAsync", unsafe {
                (api.wait_semaphores)(&self.sem.0, &params, 1, stream)
            })
        })
    }

    /// Sets the semaphore to `value` once `stream`'s earlier work is done.
    pub fn signal(&self, value: u64, stream: CuStream) -> PyResult<()> {
        let api = api()?;
        api.in_context(self.device, || {
            let params = SemSignalParams {
                fence_value: value,
                nv_sci_sync: 0,
                keyed_mutex_key: 0,
                params_reserved: [0; 12],
                flags: 0,
                reserved: [0; 16],
            };
            // SAFETY: a live semaphore, valid parameters, the caller's stream.
            api.check("cuSignalExternalSemaphoresAsync", unsafe {
                (api.signal_semaphores)(&self.sem.0, &params, 1, stream)
            })
        })
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        let Some(api) = loaded() else { return };
        // Waits and signals queued on it end first (a producer change or a channel's end).
        api.synchronize(self.device);
        // SAFETY: released once; nothing uses it any more.
        unsafe { (api.destroy_semaphore)(self.sem.0) };
    }
}

/// Idle events, by device, for reuse (creating one per release would cost more than recording).
static EVENTS: Mutex<Vec<(i32, Raw)>> = Mutex::new(Vec::new());

/// A point in a stream: done once the stream's work before it is.
pub struct Event {
    event: Raw,
    device: i32,
}

// SAFETY: as Import.
unsafe impl Sync for Event {}

impl Event {
    /// Records an event after the work queued on `stream` (of `device`) so far.
    pub fn record(device: i32, stream: CuStream) -> PyResult<Event> {
        let api = api()?;
        let pooled = {
            let mut pool = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
            pool.iter().position(|(d, _)| *d == device).map(|i| pool.swap_remove(i).1)
        };
        api.in_context(device, || {
            let event = match pooled {
                Some(e) => e,
                None => {
                    let mut e: CuEvent = std::ptr::null_mut();
                    // SAFETY: out-parameter, in the device's context.
                    api.check("cuEventCreate", unsafe { (api.event_create)(&mut e, EVENT_FLAGS) })?;
                    Raw(e)
                }
            };
            let ev = Event { event, device };
            // SAFETY: a live event and the caller's stream, in the same context.
            api.check("cuEventRecord", unsafe { (api.event_record)(ev.event.0, stream) })?;
            Ok(ev)
        })
    }

    /// True once the work before the event is done. A failing query (the context is broken)
    /// counts as done: nothing more will run there, and the producer must not wait forever.
    pub fn done(&self) -> bool {
        let Some(api) = loaded() else { return true };
        // SAFETY: a live event.
        let r = unsafe { (api.event_query)(self.event.0) };
        r != ERROR_NOT_READY
    }

    /// Waits (sleeping) until the work before the event is done.
    pub fn wait(&self) {
        if let Some(api) = loaded() {
            // SAFETY: a live event.
            unsafe { (api.event_synchronize)(self.event.0) };
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut pool = EVENTS.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < EVENT_POOL {
            // Re-recording an event replaces what it waited for: reuse needs no reset.
            pool.push((self.device, self.event));
        } else if let Some(api) = loaded() {
            drop(pool);
            // SAFETY: released once; nobody holds it any more.
            unsafe { (api.event_destroy)(self.event.0) };
        }
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
