//! lava-flow's one binding of the CUDA driver API (`libcuda.so.1`), shared by the core, the
//! Python module and the benchmarks.
//!
//! - The driver is loaded at run time, once per process ([`driver`]): nothing of CUDA is
//!   needed to build, and a machine without the NVIDIA driver gets an [`Error`] value saying
//!   so. A function that an older driver lacks is an error of that call only
//!   ([`Error::SymbolMissing`]). Nothing here panics for a missing driver or symbol; that is
//!   why lava-flow does not use `cudarc`, whose dynamic loading panics when the library or a
//!   symbol is missing.
//! - `LF_DISABLE_CUDA=1` keeps the library from being loaded at all ([`Error::Disabled`]): for
//!   processes where CUDA must not be initialised, and tools such as valgrind that the driver
//!   confuses.
//! - Thin: [`sys`] has the types, constants and structs of `cuda.h`; [`Driver`] has one
//!   `unsafe fn` per driver function, returning `Result<()>` with the `CUresult`, its name and
//!   description and what was attempted; safe methods only where they are obviously sound
//!   (queries with out-values only, such as [`Driver::device_count`] and
//!   [`Driver::pointer_attributes`]).
//!
//! ```no_run
//! let driver = lava_flow_cuda::driver()?;
//! println!("CUDA {} with {} devices", driver.version(), driver.device_count()?);
//! # Ok::<(), lava_flow_cuda::Error>(())
//! ```

#![allow(non_camel_case_types)]

mod driver;
mod error;
pub mod sys;

use std::sync::OnceLock;

pub use driver::Driver;
pub use error::{Error, Result};

/// The environment variable that, set to 1, keeps lava-flow from loading the CUDA driver.
pub const DISABLE_CUDA_ENV: &str = "LF_DISABLE_CUDA";

/// The CUDA driver library's name (the soname the NVIDIA driver installs).
pub const LIBRARY: &str = "libcuda.so.1";

/// Whether `LF_DISABLE_CUDA=1` is set.
pub fn disabled() -> bool {
    std::env::var(DISABLE_CUDA_ENV).is_ok_and(|v| v == "1")
}

/// The process's CUDA driver: `libcuda.so.1` loaded and initialised at the first call, the
/// same driver (or the same error) for every later call. [`Error::Disabled`] under
/// `LF_DISABLE_CUDA=1`; [`Error::LibraryMissing`] without an NVIDIA driver; a `cuInit` failure
/// where no device is visible.
pub fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER
        .get_or_init(|| if disabled() { Err(Error::Disabled) } else { Driver::load(LIBRARY) })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether this process has the CUDA driver library loaded already (by the CUDA runtime,
/// PyTorch, CuPy or lava-flow): asking neither loads it nor runs anything of it. A process
/// without it has no CUDA memory.
pub fn is_loaded() -> bool {
    #[cfg(target_os = "linux")]
    {
        // glibc's and musl's RTLD_NOLOAD: look the library up among those loaded, load nothing.
        const RTLD_NOLOAD: std::ffi::c_int = 0x4;
        // SAFETY: with RTLD_NOLOAD nothing is loaded and no initialiser runs; the handle's
        // drop (dlclose) leaves the library loaded for its other users.
        let found = unsafe {
            libloading::os::unix::Library::open(Some(LIBRARY), RTLD_NOLOAD | libloading::os::unix::RTLD_LAZY)
        };
        found.is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    false
}
