//! CUDA arrays of other frameworks as lava-flow sees them: the `__cuda_array_interface__` that
//! PyTorch's CUDA tensors, CuPy's arrays and Numba's device arrays expose (its data pointer,
//! shape, element type, strides and stream), read without importing any of them.
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// A C-contiguous CUDA array's bytes, and the stream its producer's work on them is ordered on
/// (`None`: the array says its data is ready).
pub struct CudaArray {
    pub ptr: u64,
    pub len: usize,
    pub stream: Option<isize>,
}

/// The C-contiguous bytes of `obj`'s `__cuda_array_interface__`, or why they cannot be sent:
/// `None` when `obj` has no such interface (it is not a CUDA array).
pub fn cuda_array(obj: &Bound<'_, PyAny>) -> PyResult<Option<CudaArray>> {
    let Ok(cai) = obj.getattr("__cuda_array_interface__") else { return Ok(None) };
    let cai = cai.downcast::<PyDict>().map_err(|_| PyTypeError::new_err("__cuda_array_interface__ is not a dict"))?;
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(key)?.ok_or_else(|| PyTypeError::new_err(format!("__cuda_array_interface__ has no {key:?}")))
    };
    let data = item("data")?;
    let data = data
        .downcast::<PyTuple>()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__['data'] is not a tuple"))?;
    let ptr: u64 = data.get_item(0)?.extract()?;
    let shape: Vec<usize> = item("shape")?.extract()?;
    let typestr: String = item("typestr")?.extract()?;
    let itemsize: usize = typestr.get(2..).and_then(|n| n.parse().ok()).filter(|&n| n > 0).ok_or_else(|| {
        PyValueError::new_err(format!("__cuda_array_interface__ typestr {typestr:?} has no item size"))
    })?;
    let elements: usize = shape.iter().product();
    let len = elements * itemsize;
    let strides = cai.get_item("strides")?.filter(|s| !s.is_none());
    if let Some(strides) = strides {
        let strides: Vec<isize> = strides.extract()?;
        if elements > 1 && !c_contiguous(&shape, &strides, itemsize) {
            return Err(PyValueError::new_err(
                "the CUDA array is not C-contiguous: lava-flow sends contiguous bytes by reference; send \
                 tensor.contiguous() (a copy, made by you) instead",
            ));
        }
    }
    let stream = match cai.get_item("stream")? {
        Some(s) if !s.is_none() => Some(s.extract::<isize>()?),
        _ => None,
    };
    Ok(Some(CudaArray { ptr, len, stream }))
}

/// Whether `strides` (bytes) are those of a C-contiguous array of `shape` (dimensions of one
/// element may have any stride).
fn c_contiguous(shape: &[usize], strides: &[isize], itemsize: usize) -> bool {
    let mut expected = itemsize as isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected *= n as isize;
    }
    shape.len() == strides.len()
}

#[cfg(test)]
mod tests {
    use super::c_contiguous;

    #[test]
    fn contiguity_follows_the_shape() {
        assert!(c_contiguous(&[2, 3], &[12, 4], 4));
        assert!(!c_contiguous(&[2, 3], &[4, 8], 4), "Fortran order");
        assert!(c_contiguous(&[1, 3], &[999, 4], 4), "a dimension of one may have any stride");
        assert!(!c_contiguous(&[4], &[8], 4), "every other element");
    }
}
