//! Opening liblava_flow.so, and the helpers every binding uses (timeouts, handles, strings).
// PyO3 0.22's generated method wrappers are unsafe fns with unsafe calls in them.
#![allow(unsafe_op_in_unsafe_fn)]
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use pyo3::exceptions::{PyImportError, PyValueError};
use pyo3::prelude::*;

use crate::ffi;

static LIB: OnceLock<Library> = OnceLock::new();

/// The C API, and where it was found.
pub struct Library {
    pub api: ffi::Lib,
    pub path: String,
}

/// The C functions. `load` runs at import, before any class can be used.
#[inline]
pub fn lib() -> &'static ffi::Lib {
    &LIB.get().expect("lava_flow._native is initialised at import").api
}

/// The SONAME of the library this module was built against (`liblava_flow.so.<ABI>`).
fn soname() -> String {
    let major = ffi::LAVA_FLOW_VERSION_MAJOR;
    let minor = ffi::LAVA_FLOW_VERSION_MINOR;
    if major == 0 {
        format!("liblava_flow.so.0.{minor}")
    } else {
        format!("liblava_flow.so.{major}")
    }
}

/// The directory this extension module lies in.
fn module_dir() -> Option<PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr reads the address of a function of this module and fills `info`.
    let found = unsafe { libc::dladdr(module_dir as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated path that lives as long as the module.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    PathBuf::from(path).parent().map(PathBuf::from)
}

/// Opens the library: the one already loaded in this process under its SONAME (by a C or C++
/// extension), else `LAVA_FLOW_LIBRARY` if set, else the wheel's `lava_flow/lib/<SONAME>`.
pub fn load(_py: Python<'_>) -> PyResult<()> {
    if LIB.get().is_some() {
        return Ok(());
    }
    let soname = soname();
    // SAFETY: RTLD_NOLOAD only looks the name up among the loaded objects (no initialisers run).
    let loaded = unsafe {
        libloading::os::unix::Library::open(Some(&soname), libc::RTLD_NOLOAD | libc::RTLD_NOW | libc::RTLD_GLOBAL)
    };
    let (library, path) = match loaded {
        Ok(l) => (l, format!("{soname} (already loaded in this process)")),
        Err(_) => {
            let path = match std::env::var_os("LAVA_FLOW_LIBRARY") {
                Some(p) => PathBuf::from(p),
                None => module_dir()
                    .ok_or_else(|| PyImportError::new_err("lava_flow: cannot find where the extension module lies"))?
                    .join("lib")
                    .join(&soname),
            };
            // SAFETY: loading lava-flow runs its initialisers, which have no preconditions.
            // RTLD_GLOBAL: a C or C++ extension loaded later, linked against the SONAME, reuses it.
            let l = unsafe { libloading::os::unix::Library::open(Some(&path), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
                .map_err(|e| {
                    PyImportError::new_err(format!(
                        "lava_flow: cannot load {}: {e}; reinstall the package (pip install), or set \
                         LAVA_FLOW_LIBRARY to a liblava_flow.so of version {}.{}",
                        path.display(),
                        ffi::LAVA_FLOW_VERSION_MAJOR,
                        ffi::LAVA_FLOW_VERSION_MINOR
                    ))
                })?;
            (l, path.display().to_string())
        }
    };
    // SAFETY: the library is lava-flow's (its SONAME or the packaged file); every symbol is
    // resolved with the signature the header gives it.
    let api = unsafe { ffi::Lib::from_library(library) }.map_err(|e| {
        PyImportError::new_err(format!(
            "lava_flow: {path} lacks a function of include/lava_flow.h ({e}): it is another version \
             of lava-flow than this module was built for"
        ))
    })?;
    // The version the library reports must be the header's major.minor.
    // SAFETY: lf_version returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(api.lf_version()) }.to_string_lossy().into_owned();
    let want = format!("{}.{}.", ffi::LAVA_FLOW_VERSION_MAJOR, ffi::LAVA_FLOW_VERSION_MINOR);
    if !version.starts_with(&want) {
        return Err(PyImportError::new_err(format!(
            "lava_flow: {path} is lava-flow {version}, this module was built for {want}x"
        )));
    }
    let _ = LIB.set(Library { api, path });
    Ok(())
}

/// A pointer that may cross threads (lava-flow's handles are checked on every call).
#[derive(Debug)]
pub struct Ptr<T>(pub *mut T);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}
// SAFETY: lava-flow handles are usable from any thread (each function documents its
// thread-safety; channels are used under their own lock, see channel/handle.rs).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

/// A `const char *` from lava-flow as a Python string (None for NULL).
pub fn string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: lava-flow's strings are NUL-terminated and valid for the call's documented span.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// A timeout in seconds (None: forever) as lava-flow's nanoseconds (negative: forever).
pub fn timeout_ns(timeout: Option<f64>) -> PyResult<i64> {
    match timeout {
        None => Ok(-1),
        Some(t) if t.is_nan() || t < 0.0 => Err(PyValueError::new_err(format!(
            "timeout {t} is not a number of seconds >= 0; pass None to wait forever"
        ))),
        Some(t) if t.is_infinite() || t * 1e9 >= i64::MAX as f64 => Ok(-1),
        Some(t) => Ok((t * 1e9) as i64),
    }
}

/// Converts a str argument to a C string, naming the argument when it holds a NUL.
pub fn cstring(what: &str, s: &str) -> PyResult<CString> {
    CString::new(s).map_err(|_| PyValueError::new_err(format!("{what} {s:?} contains a NUL character")))
}

/// The path of the library in use (`lava_flow.library_path()` answers with it).
#[pyfunction]
fn library_path() -> String {
    LIB.get().map(|l| l.path.clone()).unwrap_or_default()
}

/// The version of the library in use, "MAJOR.MINOR.PATCH".
#[pyfunction]
fn version() -> String {
    // SAFETY: static string.
    string(unsafe { lib().lf_version() }).unwrap_or_default()
}

/// Sets the level of lava-flow's log records on stderr (an `lava_flow.LogLevel` value).
#[pyfunction]
fn set_log_level(level: u32) -> PyResult<()> {
    // SAFETY: plain integer argument, checked by the library.
    crate::error::check(unsafe { lib().lf_set_log_level(level) })?;
    crate::log::set_level(level);
    Ok(())
}

/// The constants of include/lava_flow.h, for the enums of `lava_flow/__init__.py`.
fn constants(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($name:ident),* $(,)?) => { $( m.add(stringify!($name), ffi::$name as i64)?; )* };
    }
    add!(
        LF_MEMORY_CPU_STANDARD,
        LF_MEMORY_CPU_NUMA,
        LF_MEMORY_CPU_HUGEPAGE_2MB,
        LF_MEMORY_CPU_HUGEPAGE_1GB,
        LF_MEMORY_CPU_GPU_PINNED,
        LF_MEMORY_GPU_DEVICE_LOCAL,
        LF_MEMORY_GPU_HOST_VISIBLE,
        LF_ORIGIN_ALLOCATED,
        LF_ORIGIN_REGISTERED,
        LF_ORIGIN_IMPORTED,
        LF_REGISTRATION_VULKAN,
        LF_REGISTRATION_CUDA,
        LF_ROLE_PRODUCER,
        LF_ROLE_CONSUMER,
        LF_CHANNEL_PAIR,
        LF_CHANNEL_FAN_IN,
        LF_CHANNEL_FAN_OUT,
        LF_PEER_FREE,
        LF_PEER_ALIVE,
        LF_PEER_GONE,
        LF_WAIT_BUSY_POLL,
        LF_WAIT_SPIN_THEN_BLOCK,
        LF_WAIT_BLOCK,
        LF_MESSAGE_ZERO_COPY,
        LF_MESSAGE_GPU,
        LF_HUGEPAGE_STRICT,
        LF_HUGEPAGE_BEST_EFFORT,
        LF_GPU_AUTO,
        LF_GPU_REQUIRED,
        LF_GPU_DISABLED,
        LF_DEVICE_TYPE_OTHER,
        LF_DEVICE_TYPE_INTEGRATED_GPU,
        LF_DEVICE_TYPE_DISCRETE_GPU,
        LF_DEVICE_TYPE_VIRTUAL_GPU,
        LF_DEVICE_TYPE_CPU,
        LF_UNSET,
        LF_MPI_COMM_WORLD,
        LF_OK,
        LF_ERR_INVALID_ARGUMENT,
        LF_ERR_NULL_POINTER,
        LF_ERR_BAD_HANDLE,
        LF_ERR_CONFIG,
        LF_ERR_NOT_FOUND,
        LF_ERR_OUT_OF_MEMORY,
        LF_ERR_UNSUPPORTED,
        LF_ERR_PERMISSION_DENIED,
        LF_ERR_IO,
        LF_ERR_VULKAN,
        LF_ERR_WOULD_BLOCK,
        LF_ERR_TIMEOUT,
        LF_ERR_PEER_GONE,
        LF_ERR_CORRUPT,
        LF_ERR_INVALID_STATE,
        LF_ERR_INTERNAL,
        LF_LOG_OFF,
        LF_LOG_ERROR,
        LF_LOG_WARN,
        LF_LOG_INFO,
        LF_LOG_DEBUG,
        LF_LOG_TRACE,
        LF_SCOPE_LOCAL,
        LF_SCOPE_REMOTE,
    );
    m.add("SONAME", soname())?;
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    constants(m)?;
    m.add_function(wrap_pyfunction!(library_path, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(set_log_level, m)?)?;
    Ok(())
}

/// The name of an `LF_MEMORY_*` value, for reprs.
pub fn memory_name(location: u32) -> &'static str {
    match location {
        ffi::LF_MEMORY_CPU_STANDARD => "CPU_STANDARD",
        ffi::LF_MEMORY_CPU_NUMA => "CPU_NUMA",
        ffi::LF_MEMORY_CPU_HUGEPAGE_2MB => "CPU_HUGEPAGE_2MB",
        ffi::LF_MEMORY_CPU_HUGEPAGE_1GB => "CPU_HUGEPAGE_1GB",
        ffi::LF_MEMORY_CPU_GPU_PINNED => "CPU_GPU_PINNED",
        ffi::LF_MEMORY_GPU_DEVICE_LOCAL => "GPU_DEVICE_LOCAL",
        ffi::LF_MEMORY_GPU_HOST_VISIBLE => "GPU_HOST_VISIBLE",
        _ => "unknown memory",
    }
}

impl<T> Ptr<T> {
    /// The pointer (a method, so that closures capture the Send wrapper, not the raw field).
    #[inline]
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// Runs a C call that returns a handle through an out-parameter, with the GIL released.
pub fn out_handle<T>(py: Python<'_>, f: impl FnOnce(*mut *mut T) -> crate::ffi::lf_status + Send) -> PyResult<Ptr<T>> {
    let (status, out) = py.allow_threads(|| {
        let mut out = std::ptr::null_mut();
        let status = f(&mut out);
        (status, Ptr(out))
    });
    crate::error::check(status)?;
    Ok(out)
}
