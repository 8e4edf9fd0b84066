//! The buffer protocol both ways: reading any Python buffer (bytes, bytearray, memoryview,
//! numpy arrays, ...) and exporting lava-flow memory as one.
use std::ffi::c_int;
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A contiguous view of a Python object's memory, released on drop (with the GIL).
pub struct Borrowed {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the view is only read through its pointer and length while the owner holds it, and
// released with the GIL held (`Drop` takes it).
unsafe impl Send for Borrowed {}

impl Borrowed {
    /// Borrows `obj`'s bytes, C-contiguous; `writable` asks for a writable view.
    pub fn new(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = ffi::PyBUF_C_CONTIGUOUS | if writable { ffi::PyBUF_WRITABLE } else { 0 };
        // SAFETY: `view` is writable storage for a Py_buffer; the GIL is held (`obj` is bound).
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Borrowed { view })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.view.buf.cast()
    }

    pub fn len(&self) -> usize {
        self.view.len as usize
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
        Python::with_gil(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Fills `view` for a `__getbuffer__` over `len` bytes at `ptr`, owned by `owner`.
///
/// # Safety
/// `view` must be the Py_buffer CPython passed; `ptr` valid for `len` bytes while `owner`
/// keeps the export counted.
pub unsafe fn fill(
    owner: *mut ffi::PyObject,
    view: *mut ffi::Py_buffer,
    flags: c_int,
    ptr: *const u8,
    len: usize,
    readonly: bool,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no Py_buffer to fill"));
    }
    // An empty message may have no address; CPython wants one all the same.
    let ptr = if ptr.is_null() { NonNull::<u8>::dangling().as_ptr().cast_const() } else { ptr };
    // SAFETY: CPython's helper fills the view and takes a reference on `owner`.
    let rc =
        unsafe { ffi::PyBuffer_FillInfo(view, owner, ptr as *mut _, len as ffi::Py_ssize_t, readonly as c_int, flags) };
    if rc != 0 {
        return Err(Python::with_gil(PyErr::fetch));
    }
    Ok(())
}
