//! lava-flow's failures as Python exceptions carrying the status and the library's message.
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use std::ffi::CStr;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::ffi;
use crate::native::lib;

// (PyO3 0.22's macro tests a `gil-refs` feature this crate does not have.)
#[allow(unexpected_cfgs)]
mod exceptions {
    use super::*;
    create_exception!(lava_flow, LavaFlowError, PyException, "A lava-flow call failed: `status` (an int, `lava_flow.Status`), `status_name` and `message` (what went wrong and how to fix it).");
    create_exception!(
        lava_flow,
        WouldBlockError,
        LavaFlowError,
        "LF_ERR_WOULD_BLOCK: the channel is full (send) or empty (receive) now."
    );
    create_exception!(lava_flow, TimeoutError, LavaFlowError, "LF_ERR_TIMEOUT: a blocking call ran out of time.");
    create_exception!(
        lava_flow,
        PeerGoneError,
        LavaFlowError,
        "LF_ERR_PEER_GONE: the process at the other end has gone; on a fan-in consumer, `producer` is the slot of the producer that ended (None elsewhere)."
    );
    create_exception!(
        lava_flow,
        InvalidStateError,
        LavaFlowError,
        "LF_ERR_INVALID_STATE: the object is closed, released or busy."
    );
}
pub use exceptions::*;

/// `Ok` for LF_OK, else the exception for `status` with the calling thread's last message.
#[inline]
pub fn check(status: ffi::lf_status) -> PyResult<()> {
    if status == ffi::LF_OK {
        Ok(())
    } else {
        Err(error(status))
    }
}

/// The exception for a failed call; read on the thread that made the call.
#[cold]
pub fn error(status: ffi::lf_status) -> PyErr {
    // SAFETY: both return static or thread-local NUL-terminated strings, copied at once.
    let (name, message) = unsafe {
        (
            CStr::from_ptr(lib().lf_status_str(status)).to_string_lossy().into_owned(),
            CStr::from_ptr(lib().lf_last_error_message()).to_string_lossy().into_owned(),
        )
    };
    let name = name.split(':').next().unwrap_or_default().to_owned();
    let message = if message.is_empty() { name.clone() } else { message };
    make(status, &name, &message)
}

/// An exception of this module's hierarchy for a problem the binding finds itself.
pub fn make(status: ffi::lf_status, name: &str, message: &str) -> PyErr {
    let err = match status {
        ffi::LF_ERR_WOULD_BLOCK => WouldBlockError::new_err(message.to_owned()),
        ffi::LF_ERR_TIMEOUT => TimeoutError::new_err(message.to_owned()),
        ffi::LF_ERR_PEER_GONE => PeerGoneError::new_err(message.to_owned()),
        ffi::LF_ERR_INVALID_STATE => InvalidStateError::new_err(message.to_owned()),
        _ => LavaFlowError::new_err(message.to_owned()),
    };
    Python::with_gil(|py| {
        let value = err.value_bound(py);
        let _ = value.setattr("status", status);
        let _ = value.setattr("status_name", name);
        let _ = value.setattr("message", message);
    });
    err
}

/// LF_ERR_INVALID_STATE raised by the binding (a released message, a freed buffer, ...).
pub fn invalid_state(message: &str) -> PyErr {
    make(ffi::LF_ERR_INVALID_STATE, "LF_ERR_INVALID_STATE", message)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("LavaFlowError", py.get_type_bound::<LavaFlowError>())?;
    m.add("WouldBlockError", py.get_type_bound::<WouldBlockError>())?;
    m.add("TimeoutError", py.get_type_bound::<TimeoutError>())?;
    let gone = py.get_type_bound::<PeerGoneError>();
    // A fan-in consumer's PeerGoneError names the slot whose producer ended; None elsewhere.
    gone.setattr("producer", py.None())?;
    m.add("PeerGoneError", gone)?;
    m.add("InvalidStateError", py.get_type_bound::<InvalidStateError>())?;
    Ok(())
}
