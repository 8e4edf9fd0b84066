//! DLPack (`__dlpack__`, `__dlpack_device__`) for messages and buffers: a capsule over the
//! very bytes, holding the message or buffer alive (as a counted view) until the consumer
//! (numpy, PyTorch, CuPy, JAX) deletes the tensor. A GPU message's capsule also holds its
//! arena's CUDA import, so that a tensor outliving its channel still points at mapped memory;
//! its `stream` waits for the payload and orders the message's release (see `channel::gpu`).
use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::buffer::Buffer;
use crate::channel::{GpuPlace, Message};

const KDL_CPU: i32 = 1;
const KDL_UINT: u8 = 1;
const FLAG_READ_ONLY: u64 = 1;
const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What a tensor keeps alive, counted as a view of it.
enum Holder {
    Message(Py<Message>),
    /// A GPU message in CUDA: the mapping of its arena stays while the tensor does, even
    /// after the message went back and its channel closed (reading it then is the user's bug,
    /// but not a crash).
    GpuMessage(Py<Message>, #[allow(dead_code)] std::sync::Arc<crate::cuda::Import>),
    Buffer(Py<Buffer>),
}

impl Drop for Holder {
    fn drop(&mut self) {
        match self {
            Holder::Message(m) | Holder::GpuMessage(m, _) => m.get().end_export(),
            Holder::Buffer(b) => b.get().end_use(),
        }
    }
}

/// A managed tensor and what it needs, in one allocation (`manager_ctx` points to it; the
/// tensor is the first field, at the same address).
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    shape: [i64; 1],
    strides: [i64; 1],
    _holder: Holder,
}

#[repr(C)]
struct Versioned {
    managed: DLManagedTensorVersioned,
    shape: [i64; 1],
    strides: [i64; 1],
    _holder: Holder,
}

unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    // SAFETY: `t` is the `managed` field of a leaked Box<Legacy> (first field, same address),
    // deleted once by the DLPack contract.
    let b = unsafe { Box::from_raw((*t).manager_ctx.cast::<Legacy>()) };
    drop_with_gil(b);
}

unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    // SAFETY: as delete_legacy, for Versioned.
    let b = unsafe { Box::from_raw((*t).manager_ctx.cast::<Versioned>()) };
    drop_with_gil(b);
}

/// Drops a tensor's holder, which gives back a reference: with the GIL (the consumer may
/// delete from any thread). A tensor deleted while the interpreter shuts down (a framework's
/// tensor collected in `Py_FinalizeEx`) is left as it is: no Python call can run any more, and
/// the process is ending.
fn drop_with_gil<T>(holder: Box<T>) {
    // SAFETY: Py_IsInitialized may be called at any time, with or without the GIL.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        std::mem::forget(holder);
        return;
    }
    Python::with_gil(|_| drop(holder));
}

/// A capsule nobody consumed (its name unchanged) deletes its tensor.
unsafe extern "C" fn capsule_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule it destroys; the name check tells whether a
    // consumer took the tensor (it renames the capsule "used_dltensor").
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()).cast::<DLManagedTensor>();
            if let Some(d) = (*t).deleter {
                d(t);
            }
        }
    }
}

unsafe extern "C" fn capsule_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as capsule_legacy.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
            if let Some(d) = (*t).deleter {
                d(t);
            }
        }
    }
}

fn tensor(data: *const u8, device: DLDevice, shape: *mut i64, strides: *mut i64) -> DLTensor {
    DLTensor {
        data: data.cast_mut().cast(),
        device,
        ndim: 1,
        dtype: DLDataType { code: KDL_UINT, bits: 8, lanes: 1 },
        shape,
        strides,
        byte_offset: 0,
    }
}

/// Makes the capsule: versioned (DLPack 1.x, with the read-only flag) when the consumer asks
/// for it through `max_version`, else the unversioned form older consumers take.
fn capsule(
    py: Python<'_>,
    holder: Holder,
    data: *const u8,
    len: usize,
    device: DLDevice,
    readonly: bool,
    max_version: Option<(u32, u32)>,
) -> PyResult<PyObject> {
    let data = if data.is_null() { std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const() } else { data };
    let raw = if max_version.is_some_and(|(major, _)| major >= 1) {
        let b = Box::into_raw(Box::new(Versioned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if readonly { FLAG_READ_ONLY } else { 0 },
                dl_tensor: tensor(data, device, std::ptr::null_mut(), std::ptr::null_mut()),
            },
            shape: [len as i64],
            strides: [1],
            _holder: holder,
        }));
        // SAFETY: `b` is a live allocation; its fields point into itself (it never moves).
        unsafe {
            (*b).managed.manager_ctx = b.cast();
            (*b).managed.dl_tensor.shape = (*b).shape.as_mut_ptr();
            (*b).managed.dl_tensor.strides = (*b).strides.as_mut_ptr();
            ffi::PyCapsule_New(b.cast(), VERSIONED.as_ptr(), Some(capsule_versioned))
        }
    } else {
        let b = Box::into_raw(Box::new(Legacy {
            managed: DLManagedTensor {
                dl_tensor: tensor(data, device, std::ptr::null_mut(), std::ptr::null_mut()),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape: [len as i64],
            strides: [1],
            _holder: holder,
        }));
        // SAFETY: as above.
        unsafe {
            (*b).managed.manager_ctx = b.cast();
            (*b).managed.dl_tensor.shape = (*b).shape.as_mut_ptr();
            (*b).managed.dl_tensor.strides = (*b).strides.as_mut_ptr();
            ffi::PyCapsule_New(b.cast(), LEGACY.as_ptr(), Some(capsule_legacy))
        }
    };
    if raw.is_null() {
        // The capsule was not made: nothing else owns the tensor (leaked rather than risk a
        // double free; this happens only when Python is out of memory).
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference from PyCapsule_New.
    Ok(unsafe { PyObject::from_owned_ptr(py, raw) })
}

fn check_request(
    device: DLDevice,
    stream: Option<&Bound<'_, PyAny>>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<()> {
    if copy == Some(true) {
        return Err(PyBufferError::new_err("lava-flow exports views only (copy=True): copy the array you get instead"));
    }
    if let Some((t, id)) = dl_device {
        if (t, id) != (device.device_type, device.device_id) {
            return Err(PyBufferError::new_err(format!(
                "the memory is on DLPack device ({}, {}), not ({t}, {id}); lava-flow does not copy",
                device.device_type, device.device_id
            )));
        }
    }
    if device.device_type == KDL_CPU && stream.is_some_and(|s| !s.is_none()) {
        return Err(PyValueError::new_err("stream must be None for CPU memory"));
    }
    Ok(())
}

const CPU: DLDevice = DLDevice { device_type: KDL_CPU, device_id: 0 };
const KDL_CUDA: i32 = 2;

/// Where DLPack finds a buffer: GPU memory through CUDA (its host mapping where CUDA is
/// missing, as on lavapipe), host memory on the CPU.
fn buffer_place(b: &Buffer) -> PyResult<(DLDevice, *const u8)> {
    if b.is_gpu() {
        match b.with_cuda(|m| Ok((m.device, m.address))) {
            Ok((device, address)) => {
                return Ok((DLDevice { device_type: KDL_CUDA, device_id: device }, address as usize as *const u8))
            }
            Err(e) if b.host().is_none() => return Err(e),
            Err(_) => {}
        }
    }
    match b.host() {
        Some(h) => Ok((CPU, h.0.cast_const())),
        None => Err(PyBufferError::new_err("this buffer has no host address and is not GPU memory")),
    }
}

fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<isize>> {
    match stream {
        Some(s) if !s.is_none() => Ok(Some(s.extract()?)),
        _ => Ok(None),
    }
}

pub fn message_device(slf: &Bound<'_, Message>) -> PyResult<(i32, i32)> {
    if slf.get().is_cuda() {
        return Ok((KDL_CUDA, slf.get().cuda_place(slf.py())?.1));
    }
    if slf.get().is_gpu() {
        // Found once per message (the arena's import once per process), reused by __dlpack__.
        return Ok(match Message::gpu_place(slf)? {
            GpuPlace::Cuda(v) => (KDL_CUDA, v.device),
            GpuPlace::Host(_) => (CPU.device_type, CPU.device_id),
        });
    }
    Ok((CPU.device_type, CPU.device_id))
}

pub fn message_capsule(
    slf: &Bound<'_, Message>,
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<PyObject> {
    let m = slf.get();
    if m.is_cuda() {
        // The producer's tensor, opened here. Sent stream-ordered (a ready value), the
        // consumer's stream waits on the GPU for the producer's signal of the channel's ready
        // semaphore (imported into CUDA once per channel and producer); else it is complete.
        let (address, device) = m.cuda_place(slf.py())?;
        let device = DLDevice { device_type: KDL_CUDA, device_id: device };
        check_request(device, None, dl_device, copy)?;
        let ready = m.ready_value();
        if ready > 0 {
            if let Some(s) = crate::cuda::stream(stream_arg(stream)?) {
                let sem = m.channel().get().ready_semaphore_for(slf.py(), m.producer_slot(), device.device_id)?;
                sem.wait(ready, s)?;
            }
        }
        m.begin_export()?;
        let (data, len) = (address as usize as *const u8, m.data().1);
        return capsule(slf.py(), Holder::Message(slf.clone().unbind()), data, len, device, false, max_version);
    }
    if m.is_gpu() {
        let len = m.data().1;
        return match Message::gpu_place(slf)? {
            GpuPlace::Cuda(v) => {
                // The bytes where they lie in the arena's import; the consumer's stream waits for
                // the payload, and the release for the stream.
                let device = DLDevice { device_type: KDL_CUDA, device_id: v.device };
                check_request(device, None, dl_device, copy)?;
                let s = crate::cuda::stream(stream_arg(stream)?);
                m.begin_export()?;
                if let Some(s) = s {
                    if let Err(e) = Message::use_on_stream(slf, v.device, s) {
                        m.end_export();
                        return Err(e);
                    }
                }
                let data = v.address as usize as *const u8;
                capsule(
                    slf.py(),
                    Holder::GpuMessage(slf.clone().unbind(), v.import),
                    data,
                    len,
                    device,
                    true,
                    max_version,
                )
            }
            GpuPlace::Host(p) => {
                check_request(CPU, stream, dl_device, copy)?;
                m.begin_export()?;
                capsule(slf.py(), Holder::Message(slf.clone().unbind()), p, len, CPU, true, max_version)
            }
        };
    }
    check_request(CPU, stream, dl_device, copy)?;
    m.begin_export()?;
    let (p, n) = m.data();
    capsule(slf.py(), Holder::Message(slf.clone().unbind()), p, n, CPU, true, max_version)
}

pub fn buffer_device(b: &Buffer) -> PyResult<(i32, i32)> {
    let (d, _) = buffer_place(b)?;
    Ok((d.device_type, d.device_id))
}

pub fn buffer_capsule(
    slf: &Bound<'_, Buffer>,
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<PyObject> {
    let b = slf.get();
    let (device, data) = buffer_place(b)?;
    // lava-flow's own writes and copies are complete when they return: no stream to order,
    // but for a GPU message's buffer, whose payload and release are ordered as the message's.
    check_request(device, if device.device_type == KDL_CUDA { None } else { stream }, dl_device, copy)?;
    if device.device_type == KDL_CUDA {
        if let (Some(m), Some(s)) = (b.lent_by(slf.py()), crate::cuda::stream(stream_arg(stream)?)) {
            Message::use_on_stream(m.bind(slf.py()), device.device_id, s)?;
        }
    }
    b.begin_use()?;
    capsule(slf.py(), Holder::Buffer(slf.clone().unbind()), data, b.len(), device, false, max_version)
}
