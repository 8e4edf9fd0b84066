//! `Buffer` (lava-flow memory of any kind) and `Export` (a buffer on its way to another process).
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use std::ffi::c_int;
use std::os::fd::RawFd;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::channel::Message;
use crate::context::Context;
use crate::error::check;
use crate::ffi;
use crate::native::{lib, string, Ptr};
use crate::pybuf::{self, Borrowed};
use crate::shared::Shared;

/// Who releases the buffer's handle.
enum Owner {
    /// `lf_alloc`, `lf_alloc_auto`, `lf_import`: `lf_free`.
    Allocated,
    /// `lf_register` of a Python object's memory: `lf_deregister`, then the object's view.
    Registered { context: Py<Context>, memory: Option<Borrowed> },
    /// The GPU buffer of a received message, lent until the message is released.
    Lent { message: Py<Message> },
    /// Memory a `lava_flow.torch` pool gave PyTorch: freed once PyTorch freed it and no
    /// Buffer or send holds it.
    Pooled(std::sync::Arc<crate::torch_pool::PoolBuffer>),
}

/// Memory lava-flow allocated, imported or registered: CPU memory of every kind and GPU memory.
///
/// Host-addressable memory supports the buffer protocol (`memoryview(buf)` is writable, and
/// `numpy.asarray(buf)` a zero-copy array) and DLPack. `write`/`read` move data to and from
/// any kind, GPU memory the host cannot map included. `free()` (or the end of a `with` block)
/// releases it once no view of it is left; using it afterwards raises InvalidStateError.
#[pyclass(frozen, module = "lava_flow")]
pub struct Buffer {
    handle: Shared<ffi::lf_buffer>,
    owner: std::sync::Mutex<Option<Owner>>,
    size: usize,
    location: u32,
    host: Option<Ptr<u8>>,
    /// The buffer mapped into CUDA, made at the first DLPack of GPU memory.
    cuda: std::sync::Mutex<Option<crate::cuda::Mapping>>,
}

impl Buffer {
    /// Wraps a buffer handle the binding now owns.
    pub fn allocated(ptr: *mut ffi::lf_buffer) -> PyResult<Buffer> {
        Self::wrap(ptr, Owner::Allocated)
    }

    pub fn registered(ptr: *mut ffi::lf_buffer, context: Py<Context>, memory: Borrowed) -> PyResult<Buffer> {
        Self::wrap(ptr, Owner::Registered { context, memory: Some(memory) })
    }

    pub fn lent(ptr: *mut ffi::lf_buffer, message: Py<Message>) -> PyResult<Buffer> {
        Self::wrap(ptr, Owner::Lent { message })
    }

    pub fn pooled(buffer: std::sync::Arc<crate::torch_pool::PoolBuffer>) -> PyResult<Buffer> {
        Self::wrap(buffer.handle().get(), Owner::Pooled(buffer))
    }

    fn wrap(ptr: *mut ffi::lf_buffer, owner: Owner) -> PyResult<Buffer> {
        let api = lib();
        let (mut size, mut location, mut host) = (0usize, 0u32, std::ptr::null_mut());
        // SAFETY: `ptr` is a live buffer handle; the out-parameters are local.
        unsafe {
            check(api.lf_buffer_size(ptr, &mut size))?;
            check(api.lf_buffer_location(ptr, &mut location))?;
            // GPU memory the host cannot map has no address (LF_ERR_INVALID_STATE): not an error.
            // CUDA memory's address is a device pointer, never the host's to read.
            if location == ffi::LF_MEMORY_CUDA_DEVICE || api.lf_buffer_ptr(ptr, &mut host) != ffi::LF_OK {
                host = std::ptr::null_mut();
            }
        }
        let host = (!host.is_null()).then_some(Ptr(host.cast::<u8>()));
        Ok(Buffer {
            handle: Shared::new(ptr),
            owner: std::sync::Mutex::new(Some(owner)),
            size,
            location,
            host,
            cuda: std::sync::Mutex::new(None),
        })
    }

    /// Runs `f` on the live handle, counted as a use.
    pub fn with<R>(&self, f: impl FnOnce(Ptr<ffi::lf_buffer>) -> PyResult<R>) -> PyResult<R> {
        let h = self.handle.acquire("the buffer")?;
        let r = f(h);
        self.end_use();
        r
    }

    /// Counts a view (DLPack) of the buffer; refused once freed.
    pub fn begin_use(&self) -> PyResult<()> {
        self.handle.acquire("the buffer").map(|_| ())
    }

    pub fn end_use(&self) {
        if let Some(p) = self.handle.release() {
            self.dispose(p);
        }
    }

    /// Releases the handle, as its owner says (the last use of a closed buffer calls this).
    fn dispose(&self, p: Ptr<ffi::lf_buffer>) {
        // CUDA's work on the memory ends, and its mapping goes, before the memory does.
        drop(self.cuda.lock().unwrap_or_else(|e| e.into_inner()).take());
        let owner = self.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
        match owner {
            Some(Owner::Allocated) => {
                // SAFETY: the handle is ours and nothing uses it any more.
                unsafe { lib().lf_free(p.0) }
            }
            Some(Owner::Registered { context, memory }) => {
                // SAFETY: both handles are live; the registration is ours.
                let _ = unsafe { lib().lf_deregister(context.get().ptr().0, p.0) };
                drop(memory);
            }
            Some(Owner::Lent { message }) => message.get().end_export(),
            Some(Owner::Pooled(buffer)) => drop(buffer),
            None => {}
        }
    }

    /// The buffer's export; its fd is the caller's.
    pub fn export_record(&self) -> PyResult<ffi::lf_export> {
        self.with(|h| {
            let mut e = ffi::lf_export::default();
            // SAFETY: live handle, local out-parameter.
            check(unsafe { lib().lf_buffer_export(h.0, &mut e) })?;
            Ok(e)
        })
    }

    /// Runs `f` on the buffer's CUDA mapping, made at the first call (a received buffer's
    /// through the arena imports its channel shares).
    pub fn with_cuda<R>(&self, f: impl FnOnce(&mut crate::cuda::Mapping) -> PyResult<R>) -> PyResult<R> {
        let mut slot = self.cuda.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let received_on = match &*self.owner.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(Owner::Lent { message }) => Some(message.get().channel().get().id()),
                // The pool's import of the arena, which PyTorch's tensors use.
                Some(Owner::Pooled(buffer)) => {
                    *slot = Some(buffer.mapping());
                    return f(slot.as_mut().expect("made above"));
                }
                _ => None,
            };
            *slot = Some(crate::cuda::Mapping::import(&self.export_record()?, received_on)?);
        }
        f(slot.as_mut().expect("made above"))
    }

    /// The message that lends this buffer (a received GPU message's), if any.
    pub fn lent_by(&self, py: Python<'_>) -> Option<Py<Message>> {
        match &*self.owner.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Owner::Lent { message }) => Some(message.clone_ref(py)),
            _ => None,
        }
    }

    pub fn host(&self) -> Option<Ptr<u8>> {
        self.host
    }

    pub fn len(&self) -> usize {
        self.size
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self.location, ffi::LF_MEMORY_GPU_DEVICE_LOCAL | ffi::LF_MEMORY_GPU_HOST_VISIBLE)
    }

    pub fn handle_ptr(&self) -> PyResult<Ptr<ffi::lf_buffer>> {
        self.handle.peek().ok_or_else(|| crate::error::invalid_state("the buffer has been released"))
    }

    fn range(&self, offset: usize, len: usize) -> PyResult<()> {
        if offset.checked_add(len).map_or(true, |end| end > self.size) {
            return Err(PyValueError::new_err(format!(
                "offset {offset} + {len} bytes is outside the buffer of {} bytes",
                self.size
            )));
        }
        Ok(())
    }

    fn query_u32(&self, f: unsafe extern "C" fn(*const ffi::lf_buffer, *mut u32) -> ffi::lf_status) -> PyResult<u32> {
        self.with(|h| {
            let mut v = 0u32;
            // SAFETY: live handle, local out-parameter.
            check(unsafe { f(h.0, &mut v) })?;
            Ok(v)
        })
    }

    fn query_str(
        &self,
        f: unsafe extern "C" fn(*const ffi::lf_buffer, *mut *const std::ffi::c_char) -> ffi::lf_status,
    ) -> PyResult<Option<String>> {
        self.with(|h| {
            let mut s = std::ptr::null();
            // SAFETY: live handle; the string lives as long as the buffer, copied at once.
            check(unsafe { f(h.0, &mut s) })?;
            Ok(string(s))
        })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(p) = self.handle.close() {
            self.dispose(p);
        }
    }
}

#[pymethods]
impl Buffer {
    /// The size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    fn __len__(&self) -> usize {
        self.size
    }

    /// The memory kind obtained (`lava_flow.Memory`): fallbacks show here.
    #[getter]
    fn location(&self) -> u32 {
        self.location
    }

    /// True for GPU memory (`Memory.GPU_DEVICE_LOCAL`, `Memory.GPU_HOST_VISIBLE`).
    #[getter(is_gpu)]
    fn py_is_gpu(&self) -> bool {
        self.is_gpu()
    }

    /// The host address of the first byte, or None for GPU memory the host cannot map.
    #[getter]
    fn address(&self) -> Option<usize> {
        self.host.map(|p| p.0 as usize)
    }

    /// How the buffer came to be (`lava_flow.Origin`).
    #[getter]
    fn origin(&self) -> PyResult<u32> {
        self.query_u32(lib().lf_buffer_origin)
    }

    /// The page size backing the memory, in bytes.
    #[getter]
    fn page_size(&self) -> PyResult<usize> {
        self.with(|h| {
            let mut v = 0usize;
            // SAFETY: live handle, local out-parameter.
            check(unsafe { lib().lf_buffer_page_size(h.0, &mut v) })?;
            Ok(v)
        })
    }

    /// The NUMA node of `Memory.CPU_NUMA` memory, else None.
    #[getter]
    fn numa_node(&self) -> PyResult<Option<i64>> {
        self.with(|h| {
            let mut v = 0i64;
            // SAFETY: live handle, local out-parameter.
            check(unsafe { lib().lf_buffer_numa_node(h.0, &mut v) })?;
            Ok((v >= 0).then_some(v))
        })
    }

    /// Why the buffer is not the memory kind asked for, or None.
    #[getter]
    fn fallback_reason(&self) -> PyResult<Option<String>> {
        self.query_str(lib().lf_buffer_fallback_reason)
    }

    /// `Registration` flags of GPU-pinned memory (Vulkan, CUDA).
    #[getter]
    fn registrations(&self) -> PyResult<u32> {
        self.query_u32(lib().lf_buffer_registrations)
    }

    /// Why GPU-pinned memory lacks a registration, or None.
    #[getter]
    fn registration_failures(&self) -> PyResult<Option<String>> {
        self.query_str(lib().lf_buffer_registration_failures)
    }

    /// The buffer's device address in CUDA (GPU memory; imported into CUDA at first use).
    #[getter]
    fn cuda_address(&self) -> PyResult<u64> {
        self.with_cuda(|m| Ok(m.address))
    }

    /// The `lf_buffer *` handle as an int, for C and C++ extensions in this process.
    #[getter]
    fn handle(&self) -> PyResult<usize> {
        Ok(self.handle_ptr()?.0 as usize)
    }

    /// Copies the bytes of `data` (any buffer-protocol object) into the buffer at `offset`.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: usize) -> PyResult<()> {
        let src = Borrowed::new(data, false)?;
        self.range(offset, src.len())?;
        self.with(|h| {
            let (p, n) = (Ptr(src.ptr()), src.len());
            // SAFETY: live handle; `src` stays borrowed for the call.
            check(py.allow_threads(|| unsafe { lib().lf_buffer_write(h.get(), offset, p.get().cast(), n) }))
        })
    }

    /// Copies `size` bytes (default: to the end) from `offset` into new `bytes`.
    #[pyo3(signature = (size = None, offset = 0))]
    fn read<'py>(&self, py: Python<'py>, size: Option<usize>, offset: usize) -> PyResult<Bound<'py, PyBytes>> {
        let size = size.unwrap_or(self.size.saturating_sub(offset));
        self.range(offset, size)?;
        self.with(|h| {
            PyBytes::new_bound_with(py, size, |out| {
                let p = Ptr(out.as_mut_ptr());
                // SAFETY: live handle; `out` is `size` writable bytes.
                check(py.allow_threads(|| unsafe { lib().lf_buffer_read(h.get(), offset, p.get().cast(), size) }))
            })
        })
    }

    /// Copies `len(out)` bytes from `offset` into `out` (a writable buffer-protocol object).
    #[pyo3(signature = (out, offset = 0))]
    fn read_into(&self, py: Python<'_>, out: &Bound<'_, PyAny>, offset: usize) -> PyResult<()> {
        let dst = Borrowed::new(out, true)?;
        self.range(offset, dst.len())?;
        self.with(|h| {
            let (p, n) = (Ptr(dst.ptr()), dst.len());
            // SAFETY: live handle; `dst` is borrowed writable for the call.
            check(py.allow_threads(|| unsafe { lib().lf_buffer_read(h.get(), offset, p.get().cast(), n) }))
        })
    }

    /// Exports the buffer for another process on this host (`Export.send` carries it).
    fn export(&self) -> PyResult<Export> {
        self.export_record().map(Export::new)
    }

    /// Releases the buffer now, or once the last view of it is gone.
    fn free(&self) {
        if let Some(p) = self.handle.close() {
            self.dispose(p);
        }
    }

    /// True once `free()` was called.
    #[getter]
    fn freed(&self) -> bool {
        self.handle.is_closed()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.free();
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let Some(host) = this.host else {
            return Err(PyBufferError::new_err(
                "this GPU buffer has no host address: use read()/write(), or DLPack (__dlpack__) on a CUDA device",
            ));
        };
        this.handle.acquire("the buffer")?;
        // SAFETY: the memory stays valid while the export is counted (released in __releasebuffer__).
        let r = unsafe { pybuf::fill(slf.as_ptr(), view, flags, host.0, this.size, false) };
        if r.is_err() {
            this.end_use();
        }
        r
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.end_use();
    }

    /// DLPack: a uint8 tensor of the buffer's bytes (CPU memory; GPU memory through CUDA).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        crate::dlpack::buffer_capsule(slf, stream, max_version, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        crate::dlpack::buffer_device(self)
    }

    fn __repr__(&self) -> String {
        format!(
            "<lava_flow.Buffer {} bytes, {}{}>",
            self.size,
            crate::native::memory_name(self.location),
            if self.handle.is_closed() { ", freed" } else { "" }
        )
    }
}

/// A buffer exported for another process on this host: `send(socket)` carries it over a
/// connected Unix stream socket, `Export.recv(socket)` receives it, `Context.import_export`
/// maps the same memory. Owns its file descriptor until imported or closed.
#[pyclass(frozen, module = "lava_flow")]
pub struct Export {
    inner: std::sync::Mutex<ffi::lf_export>,
}

impl Export {
    pub fn new(e: ffi::lf_export) -> Export {
        Export { inner: std::sync::Mutex::new(e) }
    }

    /// The export for `lf_import`, its fd handed over (lf_import takes it in every case).
    pub fn take(&self) -> PyResult<ffi::lf_export> {
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if e.fd < 0 {
            return Err(crate::error::invalid_state("this export was imported or closed already"));
        }
        let out = *e;
        e.fd = -1;
        Ok(out)
    }

    fn get(&self) -> ffi::lf_export {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.close();
    }
}

fn socket_fd(sock: &Bound<'_, PyAny>) -> PyResult<RawFd> {
    if let Ok(fd) = sock.extract::<RawFd>() {
        return Ok(fd);
    }
    sock.call_method0("fileno")?.extract()
}

#[pymethods]
impl Export {
    /// Sends the export over a connected Unix stream socket (a socket object or an fd).
    fn send(&self, py: Python<'_>, socket: &Bound<'_, PyAny>) -> PyResult<()> {
        let fd = socket_fd(socket)?;
        let e = self.get();
        if e.fd < 0 {
            return Err(crate::error::invalid_state("this export was imported or closed already"));
        }
        // SAFETY: `e` is a readable export; the fd stays ours.
        check(py.allow_threads(|| unsafe { lib().lf_export_send(fd, &e) }))
    }

    /// Receives one export sent with `Export.send` (validated by lava-flow).
    #[staticmethod]
    fn recv(py: Python<'_>, socket: &Bound<'_, PyAny>) -> PyResult<Export> {
        let fd = socket_fd(socket)?;
        let mut e = ffi::lf_export::default();
        // SAFETY: local out-parameter.
        check(py.allow_threads(|| unsafe { lib().lf_export_recv(fd, &mut e) }))?;
        Ok(Export::new(e))
    }

    /// The file descriptor of the memory (-1 once imported or closed).
    #[getter]
    fn fd(&self) -> i32 {
        self.get().fd
    }

    #[getter]
    fn location(&self) -> u32 {
        self.get().location
    }

    #[getter]
    fn size(&self) -> u64 {
        self.get().size
    }

    #[getter]
    fn offset(&self) -> u64 {
        self.get().offset
    }

    #[getter]
    fn arena_size(&self) -> u64 {
        self.get().arena_size
    }

    #[getter]
    fn exporter_pid(&self) -> u32 {
        self.get().exporter_pid
    }

    /// The exporting GPU's UUID (CUDA's device UUID on NVIDIA); zeros for CPU memory.
    #[getter]
    fn device_uuid<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new_bound(py, &self.get().device_uuid)
    }

    /// Closes the file descriptor (an export not imported).
    fn close(&self) {
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if e.fd >= 0 {
            // SAFETY: the fd is ours and closed once.
            unsafe { libc::close(e.fd) };
            e.fd = -1;
        }
    }

    fn __repr__(&self) -> String {
        let e = self.get();
        format!("<lava_flow.Export {} bytes of {}, fd {}>", e.size, crate::native::memory_name(e.location), e.fd)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Buffer>()?;
    m.add_class::<Export>()?;
    Ok(())
}
