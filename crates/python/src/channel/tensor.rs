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
use std::collections::VecDeque;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::Channel;
use crate::context::Context;
use crate::cuda::CuStream;
use crate::cuda_array::cuda_array;
use crate::error::{check, invalid_state};
use crate::ffi;
use crate::native::{lib, Ptr};

/// A tensor sent and not yet released by the consumer: the object, and its registration.
pub(super) struct InFlight {
    sequence: u64,
    _tensor: PyObject,
    registration: Ptr<ffi::lf_buffer>,
}

/// The tensors a producer sent, in order.
#[derive(Default)]
pub(super) struct Sent(VecDeque<InFlight>);

impl Sent {
    /// Lets go of every tensor below `completed` (the consumer released them).
    pub(super) fn retire(&mut self, context: &Context, completed: u64) {
        while self.0.front().is_some_and(|t| t.sequence < completed) {
            let t = self.0.pop_front().expect("checked");
            deregister(context, t.registration);
        }
    }

    /// Lets go of every tensor (the channel is closed: nothing more completes).
    pub(super) fn clear(&mut self, context: &Context) {
        for t in self.0.drain(..) {
            deregister(context, t.registration);
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
        // Stream-ordered where the channel shares a ready semaphore on the tensor's GPU, else
        // synchronised here.
        let ordered = match stream.or(a.stream) {
            None => None,
            Some(s) => match tensor_device(a.ptr).and_then(|device| self.tensor_semaphore(py, device)) {
                Ok(sem) => Some((sem, Ptr(s as usize as CuStream))),
                Err(_) => {
                    py.allow_threads(|| synchronise(s))?;
                    None
                }
            },
        };
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
                list.0.push_back(InFlight { sequence, _tensor: array.clone().unbind(), registration });
                Ok(sequence)
            }
            Err(e) => {
                deregister(context, registration);
                Err(e)
            }
        }
    }

    /// Lets go of the tensors the consumer released (below `completed`).
    pub(super) fn retire_tensors(&self, completed: u64) {
        let mut list = self.sent.lock().unwrap_or_else(|e| e.into_inner());
        if !list.0.is_empty() {
            list.retire(self.context.get(), completed);
        }
    }
}
