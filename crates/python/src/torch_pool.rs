//! lava-flow memory for PyTorch: the allocator behind `lava_flow.torch.mem_pool`.
//!
//! PyTorch's `CUDAPluggableAllocator` calls two C functions of a shared library, and
//! `torch.cuda.MemPool` makes a pool of it, so that tensors made under
//! `torch.cuda.use_mem_pool(pool)` take their memory from it. This extension module is that
//! library: it exports `lava_flow_torch_alloc` and `lava_flow_torch_free` (its own `.so`, the
//! module's `__file__`, so nothing else is installed).
//!
//! - alloc: a lava-flow GPU buffer (DEVICE_LOCAL Vulkan memory, which Vulkan, OpenCL, OpenGL
//!   and CUDA consumers can all open) from the `Context` bound to the CUDA device PyTorch asks
//!   for; the buffer's arena is imported into CUDA once (one import serves every buffer of the
//!   arena while any of them lives; the last one's free unmaps it, so that lava-flow can give
//!   the arena back), and PyTorch gets the CUDA address of the buffer's bytes, aligned to 512
//!   bytes (PyTorch cuts segments into blocks of multiples of 512; a buffer that lava-flow
//!   places less aligned is allocated again with room to align). A process-wide map from that
//!   address to the buffer keeps the buffer until PyTorch frees it. The imports are those of
//!   received arenas (`cuda::Import`, keyed by `ArenaKey`), but not in their cache: that one is
//!   bounded and let go of by channel, while a pool's import must live exactly as long as the
//!   buffers PyTorch holds in its arena.
//! - free: waits for the device's work (as `cudaFree` does: PyTorch may have work queued on
//!   the segment) and drops the buffer. A message that still refers to its bytes keeps the
//!   arena's memory alive (the channel's hold), but lava-flow may hand the range to a new
//!   buffer: `send_tensor` therefore keeps the tensor, and so PyTorch's segment, until the
//!   consumer released the message.
//!
//! The hooks never unwind into PyTorch and never touch Python (taking the GIL there could wait
//! for a thread that waits for PyTorch's allocator): a refusal returns NULL, which PyTorch
//! reports as out of memory, and its reason is logged (`log`) and kept for
//! `lava_flow.torch.last_error()`. PyTorch's hooks do not say which pool an allocation is
//! for, only the device: each CUDA device is bound to one Context (`bind`), and every pool of
//! that device allocates from it.
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use lava_flow_cuda::Driver;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffer::Buffer;
use crate::context::Context;
use crate::cuda::{self, Import};
use crate::error::make;
use crate::ffi;
use crate::import_cache::ArenaKey;
use crate::native::{lib, Ptr};
use crate::pool_map::AddressMap;

/// The alignment of the addresses handed to PyTorch (`cudaMalloc` gives at least 256; PyTorch
/// splits segments into blocks of multiples of 512).
const ALIGN: u64 = 512;

/// The names of the hooks, for `CUDAPluggableAllocator`.
const ALLOC_NAME: &str = "lava_flow_torch_alloc";
const FREE_NAME: &str = "lava_flow_torch_free";

/// The log records' target.
const TARGET: &str = "lava_flow::torch";

/// A CUDA device and the Context whose GPU it is.
struct Binding {
    device: i32,
    context: Py<Context>,
}

/// The Contexts that serve PyTorch's allocations, by CUDA device; kept for the process's life
/// (buffers outlive their Context, but a pool may allocate again at any time).
static BINDINGS: Mutex<Vec<Binding>> = Mutex::new(Vec::new());
/// The buffers handed to PyTorch, by the CUDA address it got.
static BUFFERS: Mutex<AddressMap<Arc<PoolBuffer>>> = Mutex::new(AddressMap::new());
/// The CUDA imports of the arenas that pool buffers lie in, alive while one of them is.
static ARENAS: Mutex<Vec<(ArenaKey, Weak<Import>)>> = Mutex::new(Vec::new());
/// Whether a pool ever allocated here: a process without one looks no tensor up.
static USED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A lava-flow GPU buffer handed to PyTorch.
pub struct PoolBuffer {
    handle: Ptr<ffi::lf_buffer>,
    /// The CUDA address of the buffer's first byte, and of the first byte PyTorch got.
    base: u64,
    address: u64,
    /// The bytes PyTorch asked for.
    size: u64,
    device: i32,
    /// Taken (unmapped) before the buffer is freed.
    import: Option<Arc<Import>>,
}

// SAFETY: lava-flow's buffer handles and CUDA's imports are usable from any thread.
unsafe impl Send for PoolBuffer {}
// SAFETY: as above; nothing in it changes after it is made.
unsafe impl Sync for PoolBuffer {}

impl PoolBuffer {
    pub fn handle(&self) -> Ptr<ffi::lf_buffer> {
        self.handle
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// Whether `len` bytes at `offset` in the buffer lie in what PyTorch got.
    pub fn holds(&self, offset: u64, len: u64) -> bool {
        let start = self.address - self.base;
        offset >= start && offset.checked_add(len).is_some_and(|end| end <= start + self.size)
    }

    /// The CUDA address of the buffer's first byte, and the import it lies in.
    pub fn mapping(&self) -> cuda::Mapping {
        cuda::Mapping::shared(self.import.clone().expect("taken only when dropped"), self.base)
    }

    /// Allocates `len` bytes of GPU memory from `ctx` on CUDA device `device`, mapped into CUDA;
    /// `pad` leaves room to align the address PyTorch gets.
    fn new(api: &Driver, ctx: Ptr<ffi::lf_context>, device: i32, size: u64, pad: bool) -> Result<PoolBuffer, String> {
        let len = if pad { size + ALIGN } else { size };
        let mut h = std::ptr::null_mut();
        // SAFETY: a live context (its Binding holds it), a local out-parameter.
        let s = unsafe {
            lib().lf_alloc(ctx.get(), len as usize, ffi::LF_MEMORY_GPU_DEVICE_LOCAL, ffi::LF_UNSET as i64, 0, &mut h)
        };
        if s != ffi::LF_OK {
            return Err(format!("lava-flow could not allocate {len} bytes of GPU memory: {}", status_text(s)));
        }
        // Freed by its Drop from here on, whatever fails.
        let mut b = PoolBuffer { handle: Ptr(h), base: 0, address: 0, size, device, import: None };
        let mut location = 0u32;
        // SAFETY: a live buffer handle, a local out-parameter.
        let s = unsafe { lib().lf_buffer_location(h, &mut location) };
        if s != ffi::LF_OK || location != ffi::LF_MEMORY_GPU_DEVICE_LOCAL {
            let mut why = std::ptr::null();
            // SAFETY: as above; the string is copied at once.
            unsafe { lib().lf_buffer_fallback_reason(h, &mut why) };
            return Err(format!(
                "lava-flow gave {} instead of GPU memory ({}); a pool needs the Context's GPU: make it \
                 with Context(gpu=\"required\", strict_gpu=True) to see why it is short",
                crate::native::memory_name(location),
                crate::native::string(why).unwrap_or_else(|| "no reason given".into())
            ));
        }
        let mut e = ffi::lf_export::default();
        // SAFETY: a live buffer handle, a local out-parameter; no descriptor is made.
        let s = unsafe { lib().lf_buffer_describe(h, &mut e) };
        if s != ffi::LF_OK {
            return Err(format!("lava-flow cannot describe the GPU buffer: {}", status_text(s)));
        }
        let import = arena_import(api, h, &e)?;
        if import.device != device {
            return Err(format!(
                "the Context bound to CUDA device {device} allocated memory on CUDA device {}",
                import.device
            ));
        }
        b.base = import.address::<String>(&e)?;
        b.address = if pad { b.base.next_multiple_of(ALIGN) } else { b.base };
        b.import = Some(import);
        Ok(b)
    }
}

impl Drop for PoolBuffer {
    fn drop(&mut self) {
        // CUDA's mapping goes before the memory does (the last buffer of an arena unmaps it).
        drop(self.import.take());
        // SAFETY: the handle is this buffer's own, and nothing uses it any more.
        unsafe { lib().lf_free(self.handle.get()) };
    }
}

/// The CUDA import of the arena of buffer `h` (described by `e`), made at its first buffer.
fn arena_import(api: &Driver, h: *mut ffi::lf_buffer, e: &ffi::lf_export) -> Result<Arc<Import>, String> {
    let key = ArenaKey { pid: e.exporter_pid, token: e.exporter_token, arena: e.arena_id, size: e.arena_size };
    // Held while importing: two threads allocating in one arena import it once.
    let mut arenas = lock(&ARENAS);
    arenas.retain(|(_, w)| w.strong_count() > 0);
    if let Some(i) = arenas.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
        return Ok(i);
    }
    let mut x = ffi::lf_export::default();
    // SAFETY: a live buffer handle, a local out-parameter; the fd goes to the import.
    let s = unsafe { lib().lf_buffer_export(h, &mut x) };
    if s != ffi::LF_OK {
        return Err(format!("lava-flow cannot export the GPU buffer's arena to CUDA: {}", status_text(s)));
    }
    let import = Arc::new(Import::new::<String>(api, &x)?);
    arenas.push((key, Arc::downgrade(&import)));
    Ok(import)
}

/// A failed call's status and lava-flow's message, read on the calling thread without Python.
fn status_text(status: ffi::lf_status) -> String {
    // SAFETY: static or thread-local NUL-terminated strings, copied at once.
    let (name, message) = unsafe {
        (
            CStr::from_ptr(lib().lf_status_str(status)).to_string_lossy().into_owned(),
            CStr::from_ptr(lib().lf_last_error_message()).to_string_lossy().into_owned(),
        )
    };
    if message.is_empty() {
        name
    } else {
        message
    }
}

/// The Context bound to CUDA device `device`.
fn context_for(device: i32) -> Result<Ptr<ffi::lf_context>, String> {
    let bindings = lock(&BINDINGS);
    if let Some(b) = bindings.iter().find(|b| b.device == device) {
        // A frozen, Sync pyclass: its fields are reachable without the GIL.
        return Ok(b.context.get().ptr());
    }
    let served: Vec<String> = bindings.iter().map(|b| b.device.to_string()).collect();
    Err(if served.is_empty() {
        format!(
            "PyTorch asked lava-flow's allocator for memory on CUDA device {device}, but no \
             lava_flow.torch.mem_pool was made in this process; make one (lava_flow.torch.mem_pool({device})) \
             and allocate under it"
        )
    } else {
        format!(
            "PyTorch asked lava-flow's allocator for memory on CUDA device {device}, but its pools serve \
             CUDA device(s) {} only: a pool allocates on the GPU of its Context; make a pool for device \
             {device} (lava_flow.torch.mem_pool({device})) and use it there",
            served.join(", ")
        )
    })
}

fn allocate(size: isize, device: c_int) -> Result<u64, String> {
    let size = u64::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| format!("PyTorch asked lava-flow's allocator for {size} bytes; it allocates at least one"))?;
    let ctx = context_for(device)?;
    let api = cuda::pool_driver().map_err(|e| format!("lava-flow's pool maps its memory into CUDA: {e}"))?;
    let mut buffer = PoolBuffer::new(api, ctx, device, size, false)?;
    if buffer.address % ALIGN != 0 {
        // Made before the first goes, so that lava-flow does not hand back the same place.
        let padded = PoolBuffer::new(api, ctx, device, size, true)?;
        buffer = padded;
    }
    let address = buffer.address;
    lock(&BUFFERS).insert(address, size, Arc::new(buffer)).map_err(|_| {
        format!("lava-flow's pool handed out CUDA address {address:#x} twice; this is a bug in lava-flow")
    })?;
    USED.store(true, Ordering::Relaxed);
    Ok(address)
}

fn release(ptr: *mut c_void) -> Result<(), String> {
    let taken = lock(&BUFFERS).remove(ptr as u64).ok_or_else(|| {
        format!(
            "PyTorch freed CUDA address {:#x}, which lava-flow's pool did not allocate (or freed already)",
            ptr as u64
        )
    })?;
    // As cudaFree: work still queued on the memory ends before lava-flow may reuse it.
    cuda::synchronize(taken.device);
    // The last reference (a Buffer from buffer_of or a send may hold it longer) frees it.
    drop(taken);
    Ok(())
}

/// Logs a refusal and keeps it for `last_error`.
fn refuse(why: String) {
    crate::log::warn(TARGET, &why);
    *lock(&LAST_ERROR) = Some(why);
}

/// PyTorch's allocation hook: `size` bytes on CUDA device `device` (the stream is PyTorch's
/// business: the memory is ready when this returns). NULL when refused (PyTorch raises
/// out-of-memory); the reason is logged.
#[no_mangle]
pub extern "C" fn lava_flow_torch_alloc(size: isize, device: c_int, _stream: *mut c_void) -> *mut c_void {
    match catch_unwind(AssertUnwindSafe(|| allocate(size, device))) {
        Ok(Ok(address)) => {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            address as usize as *mut c_void
        }
        Ok(Err(why)) => {
            refuse(why);
            std::ptr::null_mut()
        }
        Err(_) => {
            refuse(format!("lava-flow's allocator failed unexpectedly allocating {size} bytes (see the panic above)"));
            std::ptr::null_mut()
        }
    }
}

/// PyTorch's free hook: `ptr` is an address `lava_flow_torch_alloc` returned.
#[no_mangle]
pub extern "C" fn lava_flow_torch_free(ptr: *mut c_void, _size: isize, _device: c_int, _stream: *mut c_void) {
    match catch_unwind(AssertUnwindSafe(|| release(ptr))) {
        Ok(Ok(())) => {
            FREES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Err(why)) => refuse(why),
        Err(_) => refuse(format!("lava-flow's allocator failed unexpectedly freeing {ptr:?} (see the panic above)")),
    }
}

/// The pool buffer that holds CUDA address `address` and the offset of `address` in it, where
/// one does. A lookup only in a process that allocated from a pool.
pub fn find(address: u64) -> Option<(Arc<PoolBuffer>, u64)> {
    if !USED.load(Ordering::Relaxed) {
        return None;
    }
    let buffers = lock(&BUFFERS);
    let (b, offset) = buffers.find(address)?;
    Some((b.clone(), b.address - b.base + offset))
}

/// The 16-byte UUID of CUDA device `device`, or why there is none.
fn cuda_uuid(device: i32) -> PyResult<[u8; 16]> {
    let api = cuda::pool_driver().map_err(|e| {
        make(
            ffi::LF_ERR_UNSUPPORTED,
            "LF_ERR_UNSUPPORTED",
            &format!("lava_flow.torch maps lava-flow memory into CUDA, which is not available here: {e}"),
        )
    })?;
    let count = api.device_count().unwrap_or(0);
    if device < 0 || device >= count {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "there is no CUDA device {device}: CUDA sees {count} device(s) (numbered from 0; see CUDA_VISIBLE_DEVICES)"
        )));
    }
    let d = api.device(device).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    api.device_uuid(d).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

fn hex(uuid: &[u8]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The UUID of CUDA device `device` (16 bytes), for `Context(gpu_device=...)`.
#[pyfunction]
fn _cuda_device_uuid<'py>(py: Python<'py>, device: i32) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new_bound(py, &cuda_uuid(device)?))
}

/// Binds CUDA device `device` to `context`, whose GPU it must be: PyTorch's allocations on
/// that device under a lava-flow pool come from it. Binding a device again to the same
/// Context does nothing; to another, is refused.
#[pyfunction]
fn _torch_pool_bind(context: &Bound<'_, Context>, device: i32) -> PyResult<()> {
    let cuda = cuda_uuid(device)?;
    let mut info = ffi::lf_device_info::default();
    #[cfg(lf_struct_size)]
    {
        info.struct_size = std::mem::size_of_val(&info) as u32;
    }
    // SAFETY: live context, local out-parameter.
    if unsafe { lib().lf_context_device_info(context.get().ptr().get(), &mut info) } != ffi::LF_OK {
        let mut why = std::ptr::null();
        // SAFETY: live context; the string lives as long as it, copied at once.
        unsafe { lib().lf_context_gpu_unavailable_reason(context.get().ptr().get(), &mut why) };
        return Err(make(
            ffi::LF_ERR_UNSUPPORTED,
            "LF_ERR_UNSUPPORTED",
            &format!(
                "the Context has no GPU ({}), so it cannot allocate GPU memory for PyTorch; make it with \
                 Context(gpu=\"required\"), or pass no context to lava_flow.torch.mem_pool",
                crate::native::string(why).unwrap_or_else(|| "no reason given".into())
            ),
        ));
    }
    if info.device_uuid != cuda {
        return Err(make(
            ffi::LF_ERR_INVALID_ARGUMENT,
            "LF_ERR_INVALID_ARGUMENT",
            &format!(
                "the Context's GPU (UUID {}) is not CUDA device {device} (UUID {}): a pool gives PyTorch memory \
                 of the GPU it allocates on; make the Context on that device \
                 (Context(gpu_device=lava_flow.torch.device_uuid({device}))), or pass no context",
                hex(&info.device_uuid),
                hex(&cuda)
            ),
        ));
    }
    let mut bindings = lock(&BINDINGS);
    match bindings.iter().find(|b| b.device == device) {
        Some(b) if b.context.get().ptr().get() == context.get().ptr().get() => Ok(()),
        Some(_) => Err(crate::error::invalid_state(&format!(
            "CUDA device {device} already has a lava-flow pool over another Context: PyTorch's allocator \
             does not say which pool an allocation is for, only its device, so every pool of a device \
             allocates from one Context; pass that one (lava_flow.torch.mem_pool({device}, context=...)), \
             or lava_flow.torch.context({device}) to find it"
        ))),
        None => {
            bindings.push(Binding { device, context: context.clone().unbind() });
            Ok(())
        }
    }
}

/// The Context bound to CUDA device `device`, or None.
#[pyfunction]
fn _torch_pool_context(py: Python<'_>, device: i32) -> Option<Py<Context>> {
    lock(&BINDINGS).iter().find(|b| b.device == device).map(|b| b.context.clone_ref(py))
}

/// The lava-flow Buffer that holds CUDA address `address` (a tensor's `data_ptr()`) and the
/// offset of the address in it; None where a pool did not allocate it.
#[pyfunction]
fn _torch_buffer_of(address: u64) -> PyResult<Option<(Buffer, u64)>> {
    let Some((b, offset)) = find(address) else { return Ok(None) };
    Ok(Some((Buffer::pooled(b)?, offset)))
}

/// What the pools hold now and did so far: buffers (live), bytes (live), arenas (imported into
/// CUDA now), allocs and frees (so far).
#[pyfunction]
fn _torch_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (buffers, bytes) = {
        let b = lock(&BUFFERS);
        (b.len(), b.bytes())
    };
    let arenas = lock(&ARENAS).iter().filter(|(_, w)| w.strong_count() > 0).count();
    let d = PyDict::new_bound(py);
    d.set_item("buffers", buffers)?;
    d.set_item("bytes", bytes)?;
    d.set_item("arenas", arenas)?;
    d.set_item("allocs", ALLOCS.load(Ordering::Relaxed))?;
    d.set_item("frees", FREES.load(Ordering::Relaxed))?;
    Ok(d)
}

/// Why lava-flow's allocator last refused PyTorch (None if it never did); `clear` forgets it.
#[pyfunction]
#[pyo3(signature = (clear = false))]
fn _torch_pool_last_error(clear: bool) -> Option<String> {
    let mut last = lock(&LAST_ERROR);
    if clear {
        last.take()
    } else {
        last.clone()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("_TORCH_ALLOC", ALLOC_NAME)?;
    m.add("_TORCH_FREE", FREE_NAME)?;
    m.add_function(wrap_pyfunction!(_cuda_device_uuid, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_pool_bind, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_pool_context, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_buffer_of, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_torch_pool_last_error, m)?)?;
    Ok(())
}
