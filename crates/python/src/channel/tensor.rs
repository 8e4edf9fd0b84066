//! CUDA tensors the application allocated (PyTorch, CuPy), sent by reference: each send
//! registers the allocation that holds the tensor (lava-flow registers each allocation once
//! and shares it between registrations), sends its bytes through the channel's CUDA route and
//! keeps the tensor, and so its memory, from the framework's allocator until the consumer
//! released the message: PyTorch's caching allocator would otherwise hand the memory to another
//! tensor while the consumer reads it.
//!
//! A tensor that work on a stream still writes goes stream-ordered where the channel shares a
//! ready semaphore with its consumer on the tensor's GPU (both contexts open that GPU with
//! Vulkan, which shares timeline semaphores): the semaphore, imported into CUDA once per
//! channel, is signalled on the stream after that work, and the message names the value; the
//! consumer's stream waits for it (`__dlpack__(stream=)`). Nothing waits on the host. Elsewhere
//! the stream is synchronised on the host before the send.
//!
//! A tensor in memory of a `lava_flow.torch` pool is lava-flow's own GPU buffer: it goes as
//! that buffer's region (`send_buffer`'s route, so that any consumer gets an ordinary GPU
//! message), ordered on its stream the same way and kept until released the same way.
use std::collections::VecDeque;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::Channel;
use crate::context::Context;
use crate::cuda::{CuStream, Semaphore};
use crate::cuda_array::{cuda_array, CudaArray};
use crate::error::{check, invalid_state};
use crate::ffi;
use crate::native::{lib, Ptr};
use crate::torch_pool::PoolBuffer;

/// A tensor sent and not yet released by the consumer: the object, and what lava-flow sent.
pub(super) struct InFlight {
    sequence: u64,
    _tensor: PyObject,
    memory: Memory,
}

/// What a tensor's bytes were sent as.
enum Memory {
    /// Memory of the application's allocator, registered for the send.
    Registered(Ptr<ffi::lf_buffer>),
    /// A lava-flow buffer of a `lava_flow.torch` pool: an ordinary GPU buffer.
    Pooled(Arc<PoolBuffer>),
}

impl Memory {
    fn release(self, context: &Context) {
        match self {
            Memory::Registered(registration) => deregister(context, registration),
            Memory::Pooled(buffer) => drop(buffer),
        }
    }
}

/// The tensors a producer sent, in order.
#[derive(Default)]
pub(super) struct Sent(VecDeque<InFlight>);

impl Sent {
    /// Lets go of every tensor below `completed` (the consumer released them).
    pub(super) fn retire(&mut self, context: &Context, completed: u64) {
        while self.0.front().is_some_and(|t| t.sequence < completed) {
            let t = self.0.pop_front().expect("checked");
            t.memory.release(context);
        }
    }

    /// Lets go of every tensor (the channel is closed: nothing more completes).
    pub(super) fn clear(&mut self, context: &Context) {
        for t in self.0.drain(..) {
            t.memory.release(context);
        }
    }
}

fn deregister(context: &Context, registration: Ptr<ffi::lf_buffer>) {
    // SAFETY: a registration of this context that only this list holds.
    let _ = unsafe { lib().lf_deregister(context.ptr().get(), registration.get()) };
}

/// Waits until the work on `stream` (a `__cuda_array_interface__` stream: 1 the legacy default
/// stream, 2 the per-thread one, else a `CUstream`) is done: a send without a ready value hands
/// the bytes over as they are when sent.
fn synchronise(stream: isize) -> PyResult<()> {
    let driver =
        lava_flow_cuda::driver().map_err(|e| invalid_state(&format!("synchronising the tensor's stream: {e}")))?;
    // SAFETY: a stream handle the array's framework gave; CUDA checks it.
    unsafe { driver.stream_synchronize(stream as usize as lava_flow_cuda::sys::CUstream) }
        .map_err(|e| invalid_state(&format!("synchronising the tensor's stream: {e}")))
}

/// The CUDA device ordinal of the memory at `ptr`.
fn tensor_device(ptr: u64) -> Result<i32, String> {
    let driver = lava_flow_cuda::driver().map_err(|e| e.to_string())?;
    let mut ordinal: std::ffi::c_int = -1;
    // SAFETY: an out-pointer for the attribute's int; CUDA checks the pointer.
    unsafe {
        driver.pointer_get_attribute(
            (&mut ordinal as *mut std::ffi::c_int).cast(),
            lava_flow_cuda::sys::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    }
    .map_err(|e| e.to_string())?;
    Ok(ordinal)
}

impl Channel {
    /// Sends `array` (anything with `__cuda_array_interface__`) by reference; see `send_tensor`.
    pub(super) fn send_cuda_array(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        stream: Option<isize>,
    ) -> PyResult<u64> {
        let Some(a) = cuda_array(array)? else {
            return Err(PyTypeError::new_err(
                "send_tensor takes a CUDA array (an object with __cuda_array_interface__: a torch CUDA tensor, \
                 a CuPy array); send host bytes with send()",
            ));
        };
        if a.len == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("a message needs at least one byte"));
        }
        if let Some((buffer, offset)) = crate::torch_pool::find(a.ptr) {
            return self.send_pool_tensor(py, array, &a, buffer, offset, timeout, stream);
        }
        // Stream-ordered where the channel shares a ready semaphore on the tensor's GPU, else
        // synchronised here.
        let ordered = self.tensor_order(py, stream.or(a.stream), || tensor_device(a.ptr))?;
        let context = self.context.get();
        let mut registration = std::ptr::null_mut();
        // SAFETY: a live context; the tensor (kept below until completion) keeps its memory.
        check(unsafe { lib().lf_register(context.ptr().get(), a.ptr as usize as *mut _, a.len, &mut registration) })?;
        let registration = Ptr(registration);
        let mut base = std::ptr::null_mut();
        // SAFETY: a live buffer handle, local out-parameter.
        if let Err(e) = check(unsafe { lib().lf_buffer_ptr(registration.get(), &mut base) }) {
            deregister(context, registration);
            return Err(e);
        }
        let offset = (a.ptr - base as usize as u64) as usize;
        let sent = self.send_ordered(py, "send_tensor", registration, offset, a.len, timeout, None, ordered.as_ref());
        match sent {
            Ok(sequence) => {
                let mut list = self.sent.lock().unwrap_or_else(|e| e.into_inner());
                list.0.push_back(InFlight {
                    sequence,
                    _tensor: array.clone().unbind(),
                    memory: Memory::Registered(registration),
                });
                Ok(sequence)
            }
            Err(e) => {
                deregister(context, registration);
                Err(e)
            }
        }
    }

    /// How a tensor's send waits for the work on `stream` (of the tensor's CUDA device,
    /// `device` finds it): stream-ordered where the channel shares a ready semaphore on that
    /// GPU, else synchronised here (None).
    fn tensor_order(
        &self,
        py: Python<'_>,
        stream: Option<isize>,
        device: impl FnOnce() -> Result<i32, String>,
    ) -> PyResult<Option<(Arc<Semaphore>, Ptr<std::ffi::c_void>)>> {
        let Some(s) = stream else { return Ok(None) };
        match device().and_then(|device| self.tensor_semaphore(py, device)) {
            Ok(sem) => Ok(Some((sem, Ptr(s as usize as CuStream)))),
            Err(_) => {
                py.allow_threads(|| synchronise(s))?;
                Ok(None)
            }
        }
    }

    /// Sends a tensor that a `lava_flow.torch` pool allocated: the region of its lava-flow
    /// buffer, as `send_buffer` sends GPU buffers (the consumer gets an ordinary GPU message),
    /// ordered on the stream as other tensors are. The tensor is kept until the consumer
    /// released the message: PyTorch would otherwise hand its block to another tensor, and a
    /// freed segment's range to lava-flow's next buffer.
    #[allow(clippy::too_many_arguments)]
    fn send_pool_tensor(
        &self,
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        a: &CudaArray,
        buffer: Arc<PoolBuffer>,
        offset: u64,
        timeout: Option<f64>,
        stream: Option<isize>,
    ) -> PyResult<u64> {
        if !buffer.holds(offset, a.len as u64) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "the tensor's {} bytes run past the end of the lava-flow pool memory they start in; send \
                 tensor.contiguous() (a copy, made by you) instead",
                a.len
            )));
        }
        let device = buffer.device();
        let ordered = self.tensor_order(py, stream.or(a.stream), || Ok(device))?;
        let sequence = self.send_ordered(
            py,
            "send_tensor",
            buffer.handle(),
            offset as usize,
            a.len,
            timeout,
            None,
            ordered.as_ref(),
        )?;
        self.note_gpu_sent(sequence, || Ok(device));
        let mut list = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        list.0.push_back(InFlight { sequence, _tensor: array.clone().unbind(), memory: Memory::Pooled(buffer) });
        Ok(sequence)
    }

    /// Lets go of the tensors the consumer released (below `completed`).
    pub(super) fn retire_tensors(&self, completed: u64) {
        let mut list = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        if !list.0.is_empty() {
            list.retire(self.context.get(), completed);
        }
    }
}
