//! `Context`: a process's memory context (allocation of every kind, import, copies, the GPU).
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffer::{Buffer, Export};
use crate::error::check;
use crate::ffi;
use crate::location::Location;
use crate::native::{lib, out_handle, string, Ptr};
use crate::pybuf::Borrowed;

/// The context settings with every field at its default, from the library (so that a field
/// it adds gets its default).
fn default_config() -> PyResult<ffi::lf_context_config> {
    #[allow(unused_mut)]
    let mut c = ffi::lf_context_config::default();
    #[cfg(lf_struct_size)]
    // SAFETY: writable local of the size given.
    check(unsafe { lib().lf_context_config_init(&mut c, std::mem::size_of_val(&c)) })?;
    Ok(c)
}

fn policy(what: &str, value: &str, names: &[(&str, u32)]) -> PyResult<u32> {
    names.iter().find(|(n, _)| *n == value).map(|(_, v)| *v).ok_or_else(|| {
        let known: Vec<_> = names.iter().map(|(n, _)| format!("{n:?}")).collect();
        PyValueError::new_err(format!("{what} {value:?} is not one of {}", known.join(", ")))
    })
}

/// A memory context: one per process, shared between threads.
///
/// `Context(gpu="auto", hugepage="strict", arena_size=0, gpu_device=None, strict_gpu=False,
/// gpu_arena_size=0)`: `gpu` is "auto" (the GPU if there is one), "required" or "disabled";
/// `hugepage` "strict" or "best_effort"; `gpu_device` None (the default device), a device
/// index, or a 16-byte device UUID; sizes in bytes, 0 for the defaults.
#[pyclass(frozen, module = "lava_flow")]
pub struct Context {
    ptr: Ptr<ffi::lf_context>,
}

impl Context {
    pub fn ptr(&self) -> Ptr<ffi::lf_context> {
        self.ptr
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is ours; buffers and channels made from it do not need it.
        unsafe { lib().lf_context_free(self.ptr.0) }
    }
}

#[pymethods]
impl Context {
    #[new]
    #[pyo3(signature = (*, gpu = "auto", hugepage = "strict", arena_size = 0, gpu_device = None, strict_gpu = false, gpu_arena_size = 0))]
    fn new(
        py: Python<'_>,
        gpu: &str,
        hugepage: &str,
        arena_size: u64,
        gpu_device: Option<&Bound<'_, PyAny>>,
        strict_gpu: bool,
        gpu_arena_size: u64,
    ) -> PyResult<Context> {
        let mut c = default_config()?;
        c.gpu_policy = policy(
            "gpu",
            gpu,
            &[("auto", ffi::LF_GPU_AUTO), ("required", ffi::LF_GPU_REQUIRED), ("disabled", ffi::LF_GPU_DISABLED)],
        )?;
        c.hugepage_policy = policy(
            "hugepage",
            hugepage,
            &[("strict", ffi::LF_HUGEPAGE_STRICT), ("best_effort", ffi::LF_HUGEPAGE_BEST_EFFORT)],
        )?;
        c.arena_size = arena_size;
        c.gpu_arena_size = gpu_arena_size;
        c.strict_gpu = strict_gpu as u32;
        if let Some(d) = gpu_device {
            if let Ok(index) = d.extract::<u32>() {
                c.gpu_device_select = ffi::LF_GPU_DEVICE_INDEX;
                c.gpu_device_index = index;
            } else if let Ok(uuid) = d.extract::<Vec<u8>>() {
                c.gpu_device_select = ffi::LF_GPU_DEVICE_UUID;
                c.gpu_device_uuid = uuid.try_into().map_err(|u: Vec<u8>| {
                    PyValueError::new_err(format!("gpu_device UUID has {} bytes, not 16", u.len()))
                })?;
            } else {
                return Err(PyValueError::new_err(
                    "gpu_device is None, a device index (int) or a 16-byte UUID (bytes)",
                ));
            }
        }
        // SAFETY: a valid config and a local out-parameter.
        let out = out_handle(py, |out| unsafe { lib().lf_context_create(&c, out) })?;
        Ok(Context { ptr: out })
    }

    /// Allocates `size` bytes of `memory` (a `lava_flow.Memory` kind; CPU standard by default).
    /// `numa_node`: the node for `Memory.CPU_NUMA` (None: the calling thread's). `hugepage`:
    /// None (the context's policy), "strict" or "best_effort".
    #[pyo3(signature = (size, memory = ffi::LF_MEMORY_CPU_STANDARD, *, numa_node = None, hugepage = None))]
    fn alloc(
        &self,
        py: Python<'_>,
        size: usize,
        memory: u32,
        numa_node: Option<i64>,
        hugepage: Option<&str>,
    ) -> PyResult<Buffer> {
        let flags = match hugepage {
            None => 0,
            Some(h) => policy(
                "hugepage",
                h,
                &[("strict", ffi::LF_HUGEPAGE_STRICT), ("best_effort", ffi::LF_HUGEPAGE_BEST_EFFORT)],
            )?,
        };
        let node = numa_node.unwrap_or(ffi::LF_UNSET as i64);
        let ctx = self.ptr;
        // SAFETY: live context, local out-parameter.
        let out = out_handle(py, |out| unsafe { lib().lf_alloc(ctx.get(), size, memory, node, flags, out) })?;
        Buffer::allocated(out.0)
    }

    /// Allocates where lava-flow's policy puts buffers from `mine` to `peer` (Locations).
    fn alloc_auto(&self, py: Python<'_>, size: usize, mine: &Location, peer: &Location) -> PyResult<Buffer> {
        let (ctx, a, b) = (self.ptr, mine.ptr(), peer.ptr());
        // SAFETY: live handles, local out-parameter.
        let out = out_handle(py, |out| unsafe { lib().lf_alloc_auto(ctx.get(), size, a.get(), b.get(), out) })?;
        Buffer::allocated(out.0)
    }

    /// Registers the memory of a writable buffer-protocol object (kept alive and borrowed
    /// until the Buffer is freed). Registered memory cannot be exported or sent by reference.
    fn register(slf: &Bound<'_, Self>, obj: &Bound<'_, PyAny>) -> PyResult<Buffer> {
        let memory = Borrowed::new(obj, true)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: the memory stays borrowed (valid) until deregistered in Buffer's release.
        check(unsafe { lib().lf_register(slf.get().ptr.0, memory.ptr().cast(), memory.len(), &mut out) })?;
        Buffer::registered(out, slf.clone().unbind(), memory)
    }

    /// Imports an export (from `Export.recv`) into this context: a Buffer over the very same
    /// memory. The export's fd is taken.
    fn import_export(&self, py: Python<'_>, export: &Export) -> PyResult<Buffer> {
        let e = export.take()?;
        let ctx = self.ptr;
        // SAFETY: live context, readable export, local out-parameter.
        let out = out_handle(py, |out| unsafe { lib().lf_import(ctx.get(), &e, out) })?;
        Buffer::allocated(out.0)
    }

    /// Copies `size` bytes from `src` at `src_offset` to `dst` at `dst_offset` (on the GPU
    /// when both are GPU memory of this context's device).
    #[pyo3(signature = (dst, src, size = None, *, dst_offset = 0, src_offset = 0))]
    fn copy(
        &self,
        py: Python<'_>,
        dst: &Buffer,
        src: &Buffer,
        size: Option<usize>,
        dst_offset: usize,
        src_offset: usize,
    ) -> PyResult<()> {
        let size = size.unwrap_or_else(|| src.len().saturating_sub(src_offset));
        let ctx = self.ptr;
        dst.with(|d| {
            src.with(|s| {
                // SAFETY: live handles for the call.
                check(py.allow_threads(|| unsafe {
                    lib().lf_buffer_copy(ctx.get(), d.get(), dst_offset, s.get(), src_offset, size)
                }))
            })
        })
    }

    /// Gives pooled GPU memory no buffer uses back to the driver; returns how many bytes.
    fn trim(&self) -> PyResult<u64> {
        let mut n = 0u64;
        // SAFETY: live context, local out-parameter.
        check(unsafe { lib().lf_context_trim(self.ptr.0, &mut n) })?;
        Ok(n)
    }

    /// Why the context has no GPU, or None when it has one.
    #[getter]
    fn gpu_unavailable_reason(&self) -> PyResult<Option<String>> {
        let mut s = std::ptr::null();
        // SAFETY: live context; the string lives as long as it, copied at once.
        check(unsafe { lib().lf_context_gpu_unavailable_reason(self.ptr.0, &mut s) })?;
        Ok(string(s))
    }

    /// The GPU the context opened, as a dict (name, uuid, device_type, heaps, ...); raises
    /// LavaFlowError (LF_ERR_UNSUPPORTED) when it has none.
    fn device_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut d = ffi::lf_device_info::default();
        #[cfg(lf_struct_size)]
        {
            d.struct_size = std::mem::size_of_val(&d) as u32;
        }
        // SAFETY: live context, local out-parameter.
        check(unsafe { lib().lf_context_device_info(self.ptr.0, &mut d) })?;
        let text = |chars: &[std::ffi::c_char]| -> String {
            let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let out = PyDict::new_bound(py);
        out.set_item("index", d.index)?;
        out.set_item("device_type", d.device_type)?;
        out.set_item("vendor_id", d.vendor_id)?;
        out.set_item("device_id", d.device_id)?;
        out.set_item("api_version", d.api_version)?;
        out.set_item("driver_version", d.driver_version)?;
        out.set_item("device_uuid", PyBytes::new_bound(py, &d.device_uuid))?;
        out.set_item("driver_uuid", PyBytes::new_bound(py, &d.driver_uuid))?;
        out.set_item("name", text(&d.name))?;
        out.set_item("driver_name", text(&d.driver_name))?;
        out.set_item("driver_info", text(&d.driver_info))?;
        let heaps = (d.heap_count as usize).min(d.heap_sizes.len());
        out.set_item("heap_sizes", d.heap_sizes[..heaps].to_vec())?;
        out.set_item("heap_flags", d.heap_flags[..heaps].to_vec())?;
        let types = (d.memory_type_count as usize).min(d.memory_type_flags.len());
        out.set_item("memory_type_flags", d.memory_type_flags[..types].to_vec())?;
        out.set_item("memory_type_heaps", d.memory_type_heaps[..types].to_vec())?;
        out.set_item("features", d.features)?;
        Ok(out)
    }

    /// The `lf_context *` handle as an int, for C and C++ extensions in this process.
    #[getter]
    fn handle(&self) -> usize {
        self.ptr.0 as usize
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Context>()
}
