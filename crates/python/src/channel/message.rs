//! `Message`: a received message, a read-only view into the channel's shared memory, handed
//! back to the producer once released with no view of it left.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::handle::{Deferred, Msg};
use super::Channel;
use crate::buffer::Buffer;
use crate::cuda::{self, CuStream};
use crate::error::{check, invalid_state};
use crate::ffi;
use crate::native::lib;
use crate::pybuf;

impl Channel {
    /// `m` as a Python `Message`, counted among the channel's outstanding messages and loans.
    pub(super) fn message(slf: &Bound<'_, Self>, m: Msg) -> PyResult<Message> {
        slf.get().outstanding.fetch_add(1, Ordering::AcqRel);
        Ok(Message {
            channel: slf.clone().unbind(),
            msg: m,
            state: Mutex::new(MsgState {
                released: false,
                exports: 0,
                done: false,
                cuda: None,
                streams: Vec::new(),
                stream_device: 0,
            }),
        })
    }
}

struct MsgState {
    /// Released in Python: no new view may be made.
    released: bool,
    /// Views alive (buffer-protocol exports, DLPack tensors, lent GPU buffers).
    exports: usize,
    /// Handed back to lava-flow (`lf_release`).
    done: bool,
    /// A GPU message's buffer in CUDA, found at its first DLPack request.
    cuda: Option<CudaView>,
    /// The CUDA streams views of it were handed to (DLPack's `stream`): the release waits for
    /// the work queued there (see `gpu`).
    streams: Vec<usize>,
    /// The CUDA device of those streams.
    stream_device: i32,
}

/// Where a GPU message's bytes are in CUDA, with the arena's import they lie in.
#[derive(Clone)]
pub struct CudaView {
    pub import: Arc<cuda::Import>,
    pub address: u64,
    pub device: i32,
}

/// Where DLPack finds a GPU message: in CUDA, or (no CUDA here, as on lavapipe) at the host
/// address the buffer is mapped at.
pub enum GpuPlace {
    Cuda(CudaView),
    Host(*const u8),
}

/// A received message: a read-only zero-copy view into the channel's shared memory.
///
/// `memoryview(msg)`, `numpy.frombuffer(msg, dtype)` and `numpy.from_dlpack(msg)` read the
/// bytes where they lie. The message is handed back to the producer once it is released
/// (`release()`, the end of a `with` block, or garbage collection) and no view of it is left;
/// new views of a released message raise InvalidStateError.
#[pyclass(frozen, module = "lava_flow")]
pub struct Message {
    channel: Py<Channel>,
    msg: Msg,
    state: Mutex<MsgState>,
}

impl Message {
    fn lock(&self) -> MutexGuard<'_, MsgState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new view; refused once the message was released.
    pub fn begin_export(&self) -> PyResult<()> {
        let mut s = self.lock();
        if s.released {
            return Err(invalid_state(&format!(
                "message {} has been released: its memory belongs to the producer again",
                self.msg.0.sequence
            )));
        }
        s.exports += 1;
        Ok(())
    }

    /// Ends a view; the last view of a released message hands it back.
    pub fn end_export(&self) {
        let release = {
            let mut s = self.lock();
            s.exports -= 1;
            let last = s.released && s.exports == 0 && !s.done;
            s.done |= last;
            last
        };
        if release {
            Python::with_gil(|py| {
                if let Err(e) = self.hand_back(py) {
                    e.write_unraisable_bound(py, None);
                }
            });
        }
    }

    /// Gives the message back to lava-flow: after the work its views' streams queued so far
    /// (on the GPU, or after their events; see `gpu_release`).
    fn hand_back(&self, py: Python<'_>) -> PyResult<()> {
        let (streams, device) = {
            let mut s = self.lock();
            (std::mem::take(&mut s.streams), s.stream_device)
        };
        if self.is_gpu() {
            Channel::release_gpu(&self.channel, py, &self.msg, &streams, device)
        } else {
            self.channel.get().release_message(py, &self.msg)
        }
    }

    /// Where the GPU message's bytes are for DLPack: its arena's CUDA import (made at the
    /// first message in that arena, then looked up) and the buffer's offset in it.
    pub fn gpu_place(slf: &Bound<'_, Self>) -> PyResult<GpuPlace> {
        let this = slf.get();
        if let Some(v) = this.lock().cuda.clone() {
            return Ok(GpuPlace::Cuda(v));
        }
        let channel = this.channel.get();
        // The arena is described first (no descriptor made): an arena imported before is only
        // looked up; its export (a driver call, and a descriptor to close) is made once.
        let export = |describe: bool| {
            channel.quick(slf.py(), |ch| {
                let mut b: *const ffi::lf_buffer = std::ptr::null();
                let mut e = ffi::lf_export::default();
                // SAFETY: live channel, a held message, local out-parameters; the lent buffer
                // is valid until the message's release.
                unsafe {
                    check(lib().lf_message_buffer(ch.0, &this.msg.0, &mut b))?;
                    check(if describe {
                        lib().lf_buffer_describe(b, &mut e)
                    } else {
                        lib().lf_buffer_export(b, &mut e)
                    })?;
                }
                Ok(e)
            })
        };
        let described = export(true)?;
        if let Some(import) = cuda::cached(&described, channel.id) {
            let v = CudaView { address: import.address::<PyErr>(&described)?, device: import.device, import };
            this.lock().cuda = Some(v.clone());
            return Ok(GpuPlace::Cuda(v));
        }
        let e = export(false)?;
        match cuda::imported(&e, channel.id) {
            Ok(import) => {
                let v = CudaView { address: import.address::<PyErr>(&e)?, device: import.device, import };
                this.lock().cuda = Some(v.clone());
                Ok(GpuPlace::Cuda(v))
            }
            // No CUDA here (lavapipe): the host address, where the host maps the memory.
            Err(err) => match this.host_address(slf.py())? {
                Some(host) => Ok(GpuPlace::Host(host)),
                None => Err(err),
            },
        }
    }

    /// The host address of the GPU message's bytes, where the host maps its memory.
    fn host_address(&self, py: Python<'_>) -> PyResult<Option<*const u8>> {
        self.channel.get().quick(py, |ch| {
            let mut b: *const ffi::lf_buffer = std::ptr::null();
            let mut host = std::ptr::null_mut();
            // SAFETY: live channel, a held message, local out-parameters.
            unsafe {
                check(lib().lf_message_buffer(ch.0, &self.msg.0, &mut b))?;
                // GPU memory the host cannot map has no address: not an error.
                if lib().lf_buffer_ptr(b, &mut host) != ffi::LF_OK {
                    return Ok(None);
                }
            }
            Ok((!host.is_null()).then_some(host.cast::<u8>().cast_const()))
        })
    }

    /// A view of the message will be used on `stream`: the stream waits for the payload (the
    /// producer's ready semaphore), and the release for the stream's work.
    pub fn use_on_stream(slf: &Bound<'_, Self>, device: i32, stream: CuStream) -> PyResult<()> {
        let this = slf.get();
        let ready = this.msg.0.ready_value;
        if ready > 0 {
            let sem = this.channel.get().ready_semaphore_for(slf.py(), this.msg.0.producer, device)?;
            sem.wait(ready, stream)?;
        }
        let mut s = this.lock();
        if !s.streams.contains(&(stream as usize)) {
            s.streams.push(stream as usize);
        }
        s.stream_device = device;
        Ok(())
    }

    pub fn data(&self) -> (*const u8, usize) {
        (self.msg.0.data.cast(), self.msg.0.len)
    }

    pub fn is_gpu(&self) -> bool {
        self.msg.0.flags & ffi::LF_MESSAGE_GPU != 0
    }

    /// CUDA memory of the producer's (a tensor it sent with `send_tensor`), opened here.
    pub fn is_cuda(&self) -> bool {
        self.msg.0.flags & ffi::LF_MESSAGE_CUDA != 0
    }

    /// A CUDA message's address in this process and its device's ordinal.
    pub fn cuda_place(&self, py: Python<'_>) -> PyResult<(u64, i32)> {
        self.channel.get().quick(py, |ch| {
            let (mut ptr, mut device) = (0u64, 0);
            // SAFETY: live channel, a held message, local out-parameters.
            check(unsafe { lib().lf_message_cuda_ptr(ch.0, &self.msg.0, &mut ptr, &mut device) })?;
            Ok((ptr, device))
        })
    }

    pub fn ready_value(&self) -> u64 {
        self.msg.0.ready_value
    }

    /// The slot of the producer that sent the message, whose ready semaphore its ready value
    /// counts on.
    pub fn producer_slot(&self) -> u32 {
        self.msg.0.producer
    }

    pub fn channel(&self) -> &Py<Channel> {
        &self.channel
    }

    /// The GPU buffer the message carries (lent: valid while the message is held).
    pub fn gpu_buffer<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Buffer>> {
        let this = slf.get();
        if !this.is_gpu() {
            return Err(invalid_state("this message carries no GPU buffer (its flags lack LF_MESSAGE_GPU)"));
        }
        this.begin_export()?;
        let r = this.channel.get().quick(slf.py(), |ch| {
            let mut b: *const ffi::lf_buffer = std::ptr::null();
            // SAFETY: live channel, a held message, local out-parameter.
            check(unsafe { lib().lf_message_buffer(ch.0, &this.msg.0, &mut b) })?;
            Bound::new(slf.py(), Buffer::lent(b.cast_mut(), slf.clone().unbind())?)
        });
        if r.is_err() {
            this.end_export();
        }
        r
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if !s.done {
            s.done = true;
            if self.msg.0.flags & ffi::LF_MESSAGE_GPU != 0 {
                // SAFETY: a pyclass is dropped by its tp_dealloc, which CPython runs with the GIL
                // held, also while the interpreter shuts down (when with_gil would refuse).
                let py = unsafe { Python::assume_gil_acquired() };
                Channel::release_gpu_in_finalizer(&self.channel, py, self.msg, &s.streams, s.stream_device);
            } else {
                self.channel.get().run_or_defer(Deferred::Release(self.msg));
            }
        }
    }
}

#[pymethods]
impl Message {
    fn __len__(&self) -> usize {
        self.msg.0.len
    }

    /// The message's sequence number (0, 1, 2, ... per producer).
    #[getter]
    fn sequence(&self) -> u64 {
        self.msg.0.sequence
    }

    /// The slot of the fan-in producer that sent the message (0 on a pair channel); see
    /// `Channel.peers()`. Sequence numbers count per producer.
    #[getter]
    fn producer(&self) -> u32 {
        self.msg.0.producer
    }

    /// `MessageFlags` bits: ZERO_COPY (the bytes lie in the producer's buffer), GPU.
    #[getter]
    fn flags(&self) -> u32 {
        self.msg.0.flags
    }

    /// True when the message is a view of the producer's own buffer (a buffer send).
    #[getter]
    fn zero_copy(&self) -> bool {
        self.msg.0.flags & ffi::LF_MESSAGE_ZERO_COPY != 0
    }

    /// True when the message carries a GPU buffer (`buffer`, DLPack on CUDA).
    #[getter(is_gpu)]
    fn py_is_gpu(&self) -> bool {
        self.is_gpu()
    }

    /// True when the message is a CUDA tensor of the producer's (`send_tensor`), opened in this
    /// process: `torch.from_dlpack(msg)` or `cupy.from_dlpack(msg)` view its bytes on the GPU,
    /// and `cuda_ptr` gives its address. Finish the GPU work that reads it before the release.
    #[getter(is_cuda)]
    fn py_is_cuda(&self) -> bool {
        self.is_cuda()
    }

    /// A CUDA message's (address, device ordinal) in this process, valid until the release.
    #[getter]
    fn cuda_ptr(slf: &Bound<'_, Self>) -> PyResult<(u64, i32)> {
        slf.get().cuda_place(slf.py())
    }

    /// For GPU and CUDA messages: the ready semaphore value at which the payload is in place
    /// (0: now); `__dlpack__(stream=)` makes the stream wait for it.
    #[getter(ready_value)]
    fn py_ready_value(&self) -> u64 {
        self.msg.0.ready_value
    }

    /// The address of the first byte in this process (None for a GPU message's device memory).
    #[getter]
    fn address(&self) -> Option<usize> {
        (!self.msg.0.data.is_null()).then_some(self.msg.0.data as usize)
    }

    /// The GPU buffer of a GPU message (a lava-flow Buffer lent while the message is held).
    #[getter]
    fn buffer<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Buffer>> {
        Message::gpu_buffer(slf)
    }

    /// A copy of the bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.begin_export()?;
        let (p, n) = self.data();
        let out = if p.is_null() {
            Err(PyBufferError::new_err("this GPU message has no host bytes: read its buffer"))
        } else {
            // SAFETY: the message's bytes are mapped while the export is counted.
            Ok(PyBytes::new_bound(py, unsafe { std::slice::from_raw_parts(p, n) }))
        };
        self.end_export();
        out
    }

    /// Hands the message back to the producer (at once, or when its last view is gone).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let (now, cuda) = {
            let mut s = self.lock();
            let now = !s.released && s.exports == 0 && !s.done;
            s.released = true;
            s.done |= now;
            // No new view can be made: only the tensors alive keep the arena's import (each
            // holds it), so that a released message still bound to a name does not.
            (now, s.cuda.take())
        };
        // Outside the lock: the last reference destroys the import, which waits for the GPU.
        drop(cuda);
        if now {
            self.hand_back(py)?;
        }
        Ok(())
    }

    /// True once `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        self.lock().released
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        let (p, n) = this.data();
        if p.is_null() && n > 0 {
            return Err(PyBufferError::new_err(
                "this GPU message has no host bytes: use its buffer, or DLPack on a CUDA device",
            ));
        }
        this.begin_export()?;
        // SAFETY: the bytes stay mapped and unreleased while the export is counted.
        let r = unsafe { pybuf::fill(slf.as_ptr(), view, flags, p, n, true) };
        if r.is_err() {
            this.end_export();
        }
        r
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.end_export();
    }

    /// DLPack: a read-only uint8 tensor of the bytes (CPU), or of the GPU buffer through CUDA;
    /// `stream` (CUDA) waits for the payload on that stream.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        crate::dlpack::message_capsule(slf, stream, max_version, dl_device, copy)
    }

    fn __dlpack_device__(slf: &Bound<'_, Self>) -> PyResult<(i32, i32)> {
        crate::dlpack::message_device(slf)
    }

    fn __repr__(&self) -> String {
        format!(
            "<lava_flow.Message {} bytes, sequence {}{}>",
            self.msg.0.len,
            self.msg.0.sequence,
            if self.is_gpu() { ", GPU" } else { "" }
        )
    }
}
