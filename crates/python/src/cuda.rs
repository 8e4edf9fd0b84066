//! The CUDA driver, for DLPack of GPU memory: lava-flow exports a GPU buffer (an opaque fd of
//! its Vulkan memory, the whole arena the buffer lies in), the driver imports the arena
//! (`cuImportExternalMemory`) on the device whose UUID the export names and maps it whole
//! (`cuExternalMemoryGetMappedBuffer`) in the device's primary context, the one PyTorch and
//! CuPy use; a buffer's CUDA address is the arena's base plus its offset. A channel's ready
//! semaphore is imported likewise (`cuImportExternalSemaphore`), so that a stream waits for a
//! GPU message's payload (`cuWaitExternalSemaphoresAsync`) or a producer's stream says when a
//! buffer it sends is written (`cuSignalExternalSemaphoresAsync`); events (`cuEventRecord`)
//! tell when a consumer's stream is done with a message. The driver is lava-flow's one binding
//! (the crate lava-flow-cuda, as the core's), opened at first use; without it (or under
//! `LF_DISABLE_CUDA=1`), DLPack of GPU memory says so.
//!
//! Imports of received arenas are made once per process and cached (`imported`, bookkept by
//! `import_cache`): per message there is only a lookup. An import is an `Arc` that the cache
//! and each DLPack tensor over it hold; the last one destroys it, after the device's work is
//! done (that wait happens only when an arena leaves the cache, never per message).
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lava_flow_cuda::sys::*;
use lava_flow_cuda::Driver;
use pyo3::exceptions::PyBufferError;
use pyo3::{PyErr, PyResult};

use crate::ffi;
use crate::import_cache::{ArenaKey, ImportCache};

pub type CuStream = CUstream;

/// `CU_EVENT_BLOCKING_SYNC`: a host waiting for the event sleeps instead of spinning.
const EVENT_BLOCKING_SYNC: std::ffi::c_uint = 0x1;
// No timing either, which costs a little per record.
const EVENT_FLAGS: std::ffi::c_uint = EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;

/// Arenas kept imported at most; each pins its GPU memory (64 MiB by default) while cached.
const CACHE_CAPACITY: usize = 16;
/// Idle events kept for reuse at most.
const EVENT_POOL: usize = 64;

/// Set once this module used the driver: from then on, releasing handles may call it.
static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The process's CUDA driver, loaded at the first use (`lava_flow_cuda::driver`, which
/// honours `LF_DISABLE_CUDA=1`).
fn api() -> PyResult<&'static Driver> {
    let d = lava_flow_cuda::driver();
    if d.is_ok() {
        USED.store(true, Ordering::Relaxed);
    }
    d.map_err(|e| {
        PyBufferError::new_err(format!(
            "DLPack of GPU memory imports it into CUDA, which is not available here ({e}); read it \
             with Buffer.read(), or copy it to host memory with Context.copy()"
        ))
    })
}

/// The driver, where something of CUDA was made already (handles to release need it): a
/// process that never used CUDA does not load it to free a channel.
fn loaded() -> Option<&'static Driver> {
    if USED.load(Ordering::Relaxed) {
        lava_flow_cuda::driver().ok()
    } else {
        None
    }
}

/// The driver for memory that PyTorch's allocator asks lava-flow for (`torch_pool`), or why
/// there is none, as text: those calls run without the GIL, so they make no Python error.
pub fn pool_driver() -> Result<&'static Driver, String> {
    let d = lava_flow_cuda::driver();
    if d.is_ok() {
        USED.store(true, Ordering::Relaxed);
    }
    d.map_err(|e| e.to_string())
}

/// How this module's calls fail: with a Python exception where Python called, with a message
/// where nothing of Python may be touched (PyTorch's allocator hooks: taking the GIL there
/// could wait for a thread that waits for PyTorch's allocator).
pub trait Failure: Sized {
    fn from_message(message: String) -> Self;
}

impl Failure for PyErr {
    fn from_message(message: String) -> Self {
        PyBufferError::new_err(message)
    }
}

impl Failure for String {
    fn from_message(message: String) -> Self {
        message
    }
}

/// A driver call's outcome as the caller's error.
fn check<E: Failure>(r: lava_flow_cuda::Result<()>) -> Result<(), E> {
    r.map_err(|e| E::from_message(e.to_string()))
}

/// A raw CUDA handle that crosses threads (the driver's handles are process-wide).
#[derive(Clone, Copy)]
struct Raw(*mut std::ffi::c_void);
// SAFETY: CUDA handles are usable from any thread.
unsafe impl Send for Raw {}

/// Each device's primary context, retained once for the process's life (as the runtime does).
static CONTEXTS: Mutex<Vec<(CUdevice, Raw)>> = Mutex::new(Vec::new());
/// Device UUIDs seen, and their CUDA ordinals.
static DEVICES: Mutex<Vec<([u8; 16], CUdevice)>> = Mutex::new(Vec::new());

fn primary_context<E: Failure>(api: &Driver, device: CUdevice) -> Result<CUcontext, E> {
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, c)) = contexts.iter().find(|(d, _)| *d == device) {
        return Ok(c.0);
    }
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameter; retained once, kept for the process's life.
    check(unsafe { api.device_primary_ctx_retain(&mut ctx, device) })?;
    contexts.push((device, Raw(ctx)));
    Ok(ctx)
}

/// Runs `f` with the device's primary context current.
fn in_context<R, E: Failure>(api: &Driver, device: CUdevice, f: impl FnOnce() -> Result<R, E>) -> Result<R, E> {
    let ctx = primary_context(api, device)?;
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameter. PyTorch and CuPy keep the primary context current on their
    // threads: then there is nothing to push (this runs on every GPU message's release).
    if unsafe { api.ctx_get_current(&mut current) }.is_ok() && current == ctx {
        return f();
    }
    // SAFETY: a live (retained) context.
    check(unsafe { api.ctx_push_current(ctx) })?;
    let r = f();
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops what was pushed above.
    let _ = unsafe { api.ctx_pop_current(&mut popped) };
    r
}

/// Waits for all of the device's work (before destroying what that work may use).
fn synchronize_with(api: &Driver, device: CUdevice) {
    let _ = in_context(api, device, || -> Result<(), String> {
        // SAFETY: the pushed context.
        let _ = unsafe { api.ctx_synchronize() };
        Ok(())
    });
}

/// The CUDA device whose UUID is `uuid` (Vulkan's deviceUUID equals CUDA's on NVIDIA).
fn device_with_uuid<E: Failure>(api: &Driver, uuid: &[u8; 16]) -> Result<CUdevice, E> {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, d)) = devices.iter().find(|(u, _)| u == uuid) {
        return Ok(d);
    }
    let n = api.device_count().map_err(|e| E::from_message(e.to_string()))?;
    for i in 0..n {
        let dev = api.device(i).map_err(|e| E::from_message(e.to_string()))?;
        let u = api.device_uuid(dev).map_err(|e| E::from_message(e.to_string()))?;
        if &u == uuid {
            devices.push((u, dev));
            return Ok(dev);
        }
    }
    Err(E::from_message(format!(
        "no CUDA device has the UUID of the GPU this memory is on ({}); CUDA sees {n} device(s): \
         make that GPU visible to this process (CUDA_VISIBLE_DEVICES), or read the memory with \
         Buffer.read()",
        uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )))
}

/// Whether every stream of `streams` (of `device`) has done all the work queued on it: then a
/// message used only on them can be released at once, without an event recorded and queried.
/// A failing query counts as busy (the caller then records events, which report a broken
/// context as done).
pub fn streams_idle(device: i32, streams: &[usize]) -> bool {
    let Some(api) = loaded() else { return false };
    in_context(api, device, || {
        // SAFETY: streams the DLPack consumer named on this device, in its context.
        Ok::<_, String>(streams.iter().all(|&s| unsafe { api.stream_query(s as CuStream) }.is_ok()))
    })
    .unwrap_or(false)
}

/// Waits for all of `device`'s work (where no stream can be waited for instead).
pub fn synchronize(device: i32) {
    if let Some(api) = loaded() {
        synchronize_with(api, device);
    }
}

/// The CUDA device ordinal of the GPU whose (Vulkan) device UUID is `uuid`.
pub fn device_of(uuid: &[u8; 16]) -> PyResult<i32> {
    device_with_uuid(api()?, uuid)
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
    pub fn new<E: Failure>(api: &Driver, e: &ffi::lf_export) -> Result<Import, E> {
        let device = match device_with_uuid(api, &e.device_uuid) {
            Ok(d) => d,
            Err(err) => {
                close(e.fd);
                return Err(err);
            }
        };
        in_context(api, device, || {
            let desc = CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
                type_: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
                handle: [e.fd as u32 as u64, 0],
                size: e.arena_size,
                flags: if e.gpu_flags & ffi::LF_EXPORT_GPU_DEDICATED != 0 { CUDA_EXTERNAL_MEMORY_DEDICATED } else { 0 },
                reserved: [0; 16],
            };
            let mut memory: CUexternalMemory = std::ptr::null_mut();
            // SAFETY: a valid descriptor; on success CUDA owns the fd.
            if let Err(err) = check(unsafe { api.import_external_memory(&mut memory, &desc) }) {
                close(e.fd);
                return Err(err);
            }
            let buf = CUDA_EXTERNAL_MEMORY_BUFFER_DESC { offset: 0, size: e.arena_size, flags: 0, reserved: [0; 16] };
            let mut base = 0u64;
            // SAFETY: a live external memory object and a valid descriptor.
            if let Err(err) = check(unsafe { api.external_memory_get_mapped_buffer(&mut base, memory, &buf) }) {
                // SAFETY: destroys what was imported above.
                let _ = unsafe { api.destroy_external_memory(memory) };
                return Err(err);
            }
            IMPORTS_MADE.fetch_add(1, Ordering::Relaxed);
            IMPORTS_ALIVE.fetch_add(1, Ordering::Relaxed);
            Ok(Import { base, size: e.arena_size, device, memory: Raw(memory) })
        })
    }

    /// The CUDA address of the export's range in this arena.
    pub fn address<E: Failure>(&self, e: &ffi::lf_export) -> Result<u64, E> {
        match e.offset.checked_add(e.size) {
            Some(end) if end <= self.size => Ok(self.base + e.offset),
            _ => Err(E::from_message(format!(
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
        synchronize_with(api, self.device);
        let _ = in_context(api, self.device, || -> Result<(), String> {
            // SAFETY: each handle is released once; nothing uses them any more.
            unsafe {
                let _ = api.mem_free(self.base);
                let _ = api.destroy_external_memory(self.memory.0);
            }
            Ok(())
        });
        IMPORTS_ALIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

fn key(e: &ffi::lf_export) -> ArenaKey {
    ArenaKey { pid: e.exporter_pid, token: e.exporter_token, arena: e.arena_id, size: e.arena_size }
}

/// The CUDA import of the arena `e` describes, where one was made before (`e` from
/// `lf_buffer_describe`: no descriptor), noting that channel `channel` uses it.
pub fn cached(e: &ffi::lf_export, channel: u64) -> Option<Arc<Import>> {
    loaded()?;
    IMPORTS.lock().unwrap_or_else(|e| e.into_inner()).get(&key(e), channel)
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
    let i = Arc::new(Import::new::<PyErr>(api, e)?);
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
                Ok(api) => Arc::new(Import::new::<PyErr>(api, e)?),
                Err(err) => {
                    close(e.fd);
                    return Err(err);
                }
            },
        };
        Ok(Mapping { address: import.address::<PyErr>(e)?, device: import.device, _import: import })
    }

    /// The mapping of a buffer at `address` in `import`, an arena this process imported for
    /// its own use (a `lava_flow.torch` pool's).
    pub fn shared(import: Arc<Import>, address: u64) -> Mapping {
        Mapping { address, device: import.device, _import: import }
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
        in_context(api, device, || {
            let desc = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
                type_: CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
                handle: [fd as u32 as u64, 0],
                flags: 0,
                reserved: [0; 16],
            };
            let mut sem: CUexternalSemaphore = std::ptr::null_mut();
            // SAFETY: a valid descriptor; on success CUDA owns the fd.
            if let Err(err) = check(unsafe { api.import_external_semaphore(&mut sem, &desc) }) {
                close(fd);
                return Err(err);
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
        in_context(api, self.device, || {
            let params = CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS { fence_value: value, ..Default::default() };
            // SAFETY: a live semaphore, valid parameters, the caller's stream.
            check(unsafe { api.wait_external_semaphores_async(&self.sem.0, &params, 1, stream) })
        })
    }

    /// Sets the semaphore to `value` once `stream`'s earlier work is done.
    pub fn signal(&self, value: u64, stream: CuStream) -> PyResult<()> {
        let api = api()?;
        in_context(api, self.device, || {
            let params = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS { fence_value: value, ..Default::default() };
            // SAFETY: a live semaphore, valid parameters, the caller's stream.
            check(unsafe { api.signal_external_semaphores_async(&self.sem.0, &params, 1, stream) })
        })
    }
}

impl Drop for Semaphore {
    fn drop(&mut self) {
        let Some(api) = loaded() else { return };
        // Waits and signals queued on it end first (a producer change or a channel's end).
        synchronize_with(api, self.device);
        // SAFETY: released once; nothing uses it any more.
        let _ = unsafe { api.destroy_external_semaphore(self.sem.0) };
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
        in_context(api, device, || {
            let event = match pooled {
                Some(e) => e,
                None => {
                    let mut e: CUevent = std::ptr::null_mut();
                    // SAFETY: out-parameter, in the device's context.
                    check::<PyErr>(unsafe { api.event_create(&mut e, EVENT_FLAGS) })?;
                    Raw(e)
                }
            };
            let ev = Event { event, device };
            // SAFETY: a live event and the caller's stream, in the same context.
            check::<PyErr>(unsafe { api.event_record(ev.event.0, stream) })?;
            Ok(ev)
        })
    }

    /// True once the work before the event is done. A failing query (the context is broken)
    /// counts as done: nothing more will run there, and the producer must not wait forever.
    pub fn done(&self) -> bool {
        let Some(api) = loaded() else { return true };
        // SAFETY: a live event.
        let r = unsafe { api.event_query(self.event.0) };
        r.err().and_then(|e| e.code()) != Some(CUDA_ERROR_NOT_READY)
    }

    /// Waits (sleeping) until the work before the event is done.
    pub fn wait(&self) {
        if let Some(api) = loaded() {
            // SAFETY: a live event.
            let _ = unsafe { api.event_synchronize(self.event.0) };
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
            let _ = unsafe { api.event_destroy(self.event.0) };
        }
    }
}

/// The CUDA stream a DLPack consumer names: None and 1 the legacy default stream, 2 the
/// per-thread default stream, -1 none (no wait), else a `cudaStream_t` as an int.
pub fn stream(stream: Option<isize>) -> Option<CuStream> {
    match stream {
        None | Some(1) => Some(CU_STREAM_LEGACY),
        Some(-1) => None,
        Some(s) => Some(s as CuStream),
    }
}
