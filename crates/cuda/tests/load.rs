//! The driver's absence is an error value, never a panic: a missing library, a library without
//! the driver's functions, and `LF_DISABLE_CUDA=1`. These run everywhere (CI has no CUDA); on a
//! host with the NVIDIA driver, `driver()` must load it.

use std::process::Command;

use lava_flow_cuda::{driver, Driver, Error, DISABLE_CUDA_ENV};

#[test]
fn a_missing_library_is_an_error_naming_it_and_the_fix() {
    let err = Driver::load("/nonexistent/libcuda.so.1").unwrap_err();
    assert!(matches!(&err, Error::LibraryMissing { library, .. } if library == "/nonexistent/libcuda.so.1"), "{err:?}");
    assert!(err.is_unavailable() && err.code().is_none());
    let text = err.to_string();
    assert!(text.contains("no CUDA driver was found") && text.contains("install the NVIDIA driver"), "{text}");
}

#[test]
fn a_library_without_the_driver_functions_is_an_error_naming_the_function() {
    // The C library is loaded in every process and has no CUDA function.
    let err = Driver::load("libc.so.6").unwrap_err();
    assert!(matches!(err, Error::SymbolMissing { symbol: "cuGetErrorName", .. }), "{err:?}");
    assert!(err.to_string().contains("has no cuGetErrorName"), "{err}");
}

#[test]
fn a_failed_call_says_what_was_attempted_and_the_code() {
    let err = Error::Call {
        what: "cuMemAlloc_v2".into(),
        code: 2,
        name: Some("CUDA_ERROR_OUT_OF_MEMORY"),
        description: None,
    }
    .context("cuMemAlloc of 4096 bytes");
    assert_eq!(err.code(), Some(2));
    assert!(!err.is_unavailable());
    assert_eq!(err.to_string(), "cuMemAlloc of 4096 bytes: CUDA error 2 CUDA_ERROR_OUT_OF_MEMORY");
}

/// Run in a child with `LF_DISABLE_CUDA=1` by the test below (skipped otherwise).
#[test]
fn child_disabled_driver() {
    if std::env::var(DISABLE_CUDA_ENV).as_deref() != Ok("1") {
        return;
    }
    let before = lava_flow_cuda::is_loaded();
    assert_eq!(driver().unwrap_err(), Error::Disabled);
    assert_eq!(driver().unwrap_err(), Error::Disabled, "the answer is kept");
    assert_eq!(lava_flow_cuda::is_loaded(), before, "LF_DISABLE_CUDA=1 must load nothing");
    assert!(Error::Disabled.to_string().contains("LF_DISABLE_CUDA=1"));
}

#[test]
fn disabled_by_the_environment() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_disabled_driver", "--nocapture", "--test-threads=1"])
        .env(DISABLE_CUDA_ENV, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// Where libcuda exists, `driver()` loads it or says why not; where it does not, the error is
/// a missing library. Never a panic.
#[test]
fn the_process_driver_loads_or_says_why_not() {
    if std::env::var(DISABLE_CUDA_ENV).as_deref() == Ok("1") {
        return;
    }
    match driver() {
        Ok(driver) => {
            assert!(driver.version() >= 11000, "driver version {}", driver.version());
            assert!(lava_flow_cuda::is_loaded());
            println!("CUDA driver {} with {} devices", driver.version(), driver.device_count().unwrap());
        }
        Err(e) => println!("skipped: no CUDA driver ({e})"),
    }
}
