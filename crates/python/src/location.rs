//! `Location` (where a process runs), `scope`, and `Mpi` (lava-flow's MPI world).
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use pyo3::prelude::*;

use crate::error::check;
use crate::ffi;
use crate::native::{cstring, lib, out_handle, string, Ptr};

/// Where a process runs: hostname, host identity, NUMA node, GPU index.
///
/// `Location.detect()`, `Location(hostname, node_id=None, device_id=None)`,
/// `Location.from_config(path, process_name)` (the format of docs/locations.md).
#[pyclass(frozen, module = "lava_flow")]
pub struct Location {
    ptr: Ptr<ffi::lf_location>,
}

impl Location {
    pub fn ptr(&self) -> Ptr<ffi::lf_location> {
        self.ptr
    }

    fn from_out(ptr: Ptr<ffi::lf_location>) -> Location {
        Location { ptr }
    }

    fn int(
        &self,
        f: unsafe extern "C" fn(*const ffi::lf_location, *mut i64) -> ffi::lf_status,
    ) -> PyResult<Option<i64>> {
        let mut v = 0i64;
        // SAFETY: live location, local out-parameter.
        check(unsafe { f(self.ptr.0, &mut v) })?;
        Ok((v >= 0).then_some(v))
    }
}

impl Drop for Location {
    fn drop(&mut self) {
        // SAFETY: ours, freed once.
        unsafe { lib().lf_location_free(self.ptr.0) }
    }
}

fn unset(v: Option<i64>) -> i64 {
    v.unwrap_or(ffi::LF_UNSET as i64)
}

#[pymethods]
impl Location {
    #[new]
    #[pyo3(signature = (hostname, node_id = None, device_id = None))]
    fn new(py: Python<'_>, hostname: &str, node_id: Option<i64>, device_id: Option<i64>) -> PyResult<Location> {
        let h = cstring("hostname", hostname)?;
        let (n, d) = (unset(node_id), unset(device_id));
        // SAFETY: NUL-terminated string, local out-parameter.
        out_handle(py, |out| unsafe { lib().lf_location_new(h.as_ptr(), n, d, out) }).map(Location::from_out)
    }

    /// This process's location (hostname, host identity, the NUMA node it runs on).
    #[staticmethod]
    pub fn detect(py: Python<'_>) -> PyResult<Location> {
        // SAFETY: local out-parameter.
        out_handle(py, |out| unsafe { lib().lf_location_detect(out) }).map(Location::from_out)
    }

    /// The location of `process_name` in the JSON process configuration at `path`.
    #[staticmethod]
    fn from_config(py: Python<'_>, path: std::path::PathBuf, process_name: &str) -> PyResult<Location> {
        let p = cstring("path", &path.to_string_lossy())?;
        let n = cstring("process_name", process_name)?;
        // SAFETY: NUL-terminated strings, local out-parameter.
        out_handle(py, |out| unsafe { lib().lf_location_from_config(p.as_ptr(), n.as_ptr(), out) })
            .map(Location::from_out)
    }

    #[getter]
    fn hostname(&self) -> PyResult<String> {
        let mut s = std::ptr::null();
        // SAFETY: live location; string copied at once.
        check(unsafe { lib().lf_location_hostname(self.ptr.0, &mut s) })?;
        Ok(string(s).unwrap_or_default())
    }

    /// The host identity (boot id and namespaces, or LF_HOST_ID), None when built by hand.
    #[getter]
    fn host_id(&self) -> PyResult<Option<String>> {
        let mut s = std::ptr::null();
        // SAFETY: live location; string copied at once.
        check(unsafe { lib().lf_location_host_id(self.ptr.0, &mut s) })?;
        Ok(string(s))
    }

    #[getter]
    fn node_id(&self) -> PyResult<Option<i64>> {
        self.int(lib().lf_location_node_id)
    }

    #[getter]
    fn device_id(&self) -> PyResult<Option<i64>> {
        self.int(lib().lf_location_device_id)
    }

    /// "local" (same host) or "remote" between this location and `peer`.
    fn scope(&self, peer: &Location) -> PyResult<&'static str> {
        let mut s: ffi::lf_scope = 0;
        // SAFETY: live locations, local out-parameter.
        check(unsafe { lib().lf_scope_detect(self.ptr.0, peer.ptr.0, &mut s) })?;
        Ok(if s == ffi::LF_SCOPE_LOCAL { "local" } else { "remote" })
    }

    /// The `lf_location *` handle as an int, for C and C++ extensions in this process.
    #[getter]
    fn handle(&self) -> usize {
        self.ptr.0 as usize
    }

    fn __repr__(&self) -> PyResult<String> {
        Ok(format!(
            "<lava_flow.Location {} node {:?} device {:?}>",
            self.hostname()?,
            self.node_id()?,
            self.device_id()?
        ))
    }
}

/// lava-flow's MPI world: `Mpi(comm=None, process_name=None)` joins it (collective).
///
/// `comm` is an mpi4py communicator (its `py2f()` is taken), a Fortran handle (int,
/// `MPI_Comm_c2f`), or None for MPI_COMM_WORLD. Needs a library built with the `mpi` feature.
#[pyclass(frozen, module = "lava_flow")]
pub struct Mpi {
    ptr: Ptr<ffi::lf_mpi>,
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // SAFETY: ours, freed once.
        unsafe { lib().lf_mpi_free(self.ptr.0) }
    }
}

impl Mpi {
    fn i32(&self, f: unsafe extern "C" fn(*const ffi::lf_mpi, *mut i32) -> ffi::lf_status) -> PyResult<i32> {
        let mut v = 0i32;
        // SAFETY: live handle, local out-parameter.
        check(unsafe { f(self.ptr.0, &mut v) })?;
        Ok(v)
    }
}

#[pymethods]
impl Mpi {
    #[new]
    #[pyo3(signature = (comm = None, process_name = None))]
    fn new(py: Python<'_>, comm: Option<&Bound<'_, PyAny>>, process_name: Option<&str>) -> PyResult<Mpi> {
        let comm: i64 = match comm {
            None => ffi::LF_MPI_COMM_WORLD,
            Some(c) => match c.extract::<i64>() {
                Ok(f) => f,
                Err(_) => c.call_method0("py2f")?.extract()?,
            },
        };
        let name = process_name.map(|n| cstring("process_name", n)).transpose()?;
        let name_ptr = Ptr(name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()).cast_mut());
        // SAFETY: NULL or a NUL-terminated string alive for the call; local out-parameter.
        out_handle(py, |out| unsafe { lib().lf_mpi_join(comm, name_ptr.get(), out) }).map(|ptr| Mpi { ptr })
    }

    #[getter]
    fn size(&self) -> PyResult<i32> {
        self.i32(lib().lf_mpi_size)
    }

    #[getter]
    fn rank(&self) -> PyResult<i32> {
        self.i32(lib().lf_mpi_rank)
    }

    #[getter]
    fn tag_ub(&self) -> PyResult<i32> {
        self.i32(lib().lf_mpi_tag_ub)
    }

    /// The MPI thread support level (0 single .. 3 multiple).
    #[getter]
    fn thread_level(&self) -> PyResult<u32> {
        let mut v: ffi::lf_mpi_thread_support = 0;
        // SAFETY: live handle, local out-parameter.
        check(unsafe { lib().lf_mpi_thread_level(self.ptr.0, &mut v) })?;
        Ok(v)
    }

    /// Whether lava-flow initialised MPI (and finalizes it).
    #[getter]
    fn initialized_mpi(&self) -> PyResult<bool> {
        let mut v = false;
        // SAFETY: live handle, local out-parameter.
        check(unsafe { lib().lf_mpi_initialized_mpi(self.ptr.0, &mut v) })?;
        Ok(v)
    }

    /// The Location of the process of `rank`.
    fn location(&self, py: Python<'_>, rank: i32) -> PyResult<Location> {
        let m = self.ptr;
        // SAFETY: live handle, local out-parameter.
        out_handle(py, |out| unsafe { lib().lf_mpi_location(m.get(), rank, out) }).map(Location::from_out)
    }

    fn process_name(&self, rank: i32) -> PyResult<String> {
        let mut s = std::ptr::null();
        // SAFETY: live handle; string copied at once.
        check(unsafe { lib().lf_mpi_process_name(self.ptr.0, rank, &mut s) })?;
        Ok(string(s).unwrap_or_default())
    }

    fn rank_of(&self, process_name: &str) -> PyResult<i32> {
        let n = cstring("process_name", process_name)?;
        let mut v = 0i32;
        // SAFETY: live handle, NUL-terminated string, local out-parameter.
        check(unsafe { lib().lf_mpi_rank_of(self.ptr.0, n.as_ptr(), &mut v) })?;
        Ok(v)
    }

    /// Where MPI's shared-memory split disagrees with the host identities ("" when they agree).
    fn topology_report(&self) -> PyResult<String> {
        let mut s = std::ptr::null();
        // SAFETY: live handle; string copied at once.
        check(unsafe { lib().lf_mpi_topology_report(self.ptr.0, &mut s) })?;
        Ok(string(s).unwrap_or_default())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Location>()?;
    m.add_class::<Mpi>()?;
    Ok(())
}
