//! `lava_flow._native`: the Python binding of lava-flow, a PyO3 module over the C ABI.
//!
//! The module does not contain lava-flow: it opens `liblava_flow.so` at import (the copy the
//! wheel ships beside it, or the one the process has loaded already, found by its SONAME) and
//! calls the C functions through pointers generated from `include/lava_flow.h`. So a process
//! that imports `lava_flow` and loads a C or C++ extension linked against `liblava_flow.so`
//! has one library, one handle table: handles pass between them (`.handle`).
#![deny(unsafe_op_in_unsafe_fn)]
// PyO3 0.22's #[pymethods] expansion converts each PyErr into itself.
#![allow(clippy::useless_conversion)]

mod buffer;
mod channel;
mod context;
mod cuda;
mod cuda_array;
mod dlpack;
mod error;
mod import_cache;
mod location;
mod log;
mod native;
mod pool_map;
mod pybuf;
mod shared;
mod torch_pool;

#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, unsafe_op_in_unsafe_fn, clippy::all)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/lava_flow.rs"));
}

use pyo3::prelude::*;

/// The CUDA imports of GPU arenas in this process, for tests and diagnostics: (arenas imported
/// so far, imports alive, received arenas in the cache). One import serves every message in a
/// received arena, and every buffer of a `lava_flow.torch` pool in one of this process's own;
/// the DLPack of a Buffer of this process's own imports its arena for that Buffer.
#[pyfunction]
fn _cuda_imports() -> (u64, u64, usize) {
    cuda::import_counts()
}

/// This process's releases of GPU messages so far: (at once, because their streams were done;
/// deferred until their streams' events were done; on the GPU, signalling the producer's
/// released semaphore on the consumer's stream).
#[pyfunction]
fn _gpu_releases() -> (u64, u64, u64) {
    channel::release_counts()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_cuda_imports, m)?)?;
    m.add_function(wrap_pyfunction!(_gpu_releases, m)?)?;
    native::load(m.py())?;
    error::register(m)?;
    native::register(m)?;
    context::register(m)?;
    buffer::register(m)?;
    location::register(m)?;
    channel::register(m)?;
    torch_pool::register(m)?;
    Ok(())
}
