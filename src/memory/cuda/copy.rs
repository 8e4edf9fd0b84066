//! Copies out of CUDA memory the application allocated, for a carrier that stages it through
//! host memory to a consumer that cannot open it (on another host).

use lava_flow_cuda::sys::CUcontext;
use lava_flow_cuda::Driver;

use super::CudaPointer;
use crate::error::{Error, Result};

/// Copies `out.len()` bytes from `offset` of `pointer`'s allocation into `out`, in the
/// allocation's own context (its device's primary context where it names none: VMM memory),
/// returning once the bytes are in `out`. A synchronous copy: it also waits for the work the
/// application queued on the legacy default stream, and none on other streams (the caller's
/// work on the memory must be done, as for any send of CUDA memory).
pub(crate) fn copy_to_host(pointer: &CudaPointer, offset: usize, out: &mut [u8]) -> Result<()> {
    let at = pointer.base.checked_add(offset as u64).filter(|at| pointer.holds(*at, out.len()));
    let Some(at) = at else {
        return Err(Error::invalid(format!(
            "{} bytes at offset {offset} do not lie in a CUDA allocation of {} bytes",
            out.len(),
            pointer.size
        )));
    };
    let driver = lava_flow_cuda::driver()?;
    in_context(driver, pointer, || {
        // SAFETY: `out` is `out.len()` writable bytes; `[at, at + len)` lies in the live
        // allocation (checked above, the caller's registration keeps it), current in this
        // context.
        unsafe { driver.memcpy_dtoh(out.as_mut_ptr().cast(), at, out.len()) }
            .map_err(|e| e.context(format!("cuMemcpyDtoH of {} bytes at {at:#x}", out.len())).into())
    })
}

/// Runs `f` with `pointer`'s allocation's context current on this thread (pushed, then popped).
fn in_context<T>(driver: &'static Driver, pointer: &CudaPointer, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let mut primary = None;
    let context = if pointer.context != 0 {
        pointer.context as CUcontext
    } else {
        let device = driver.device(pointer.device_ordinal)?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a device the driver just gave; released below.
        unsafe { driver.device_primary_ctx_retain(&mut context, device) }?;
        primary = Some(device);
        context
    };
    // SAFETY: the allocation's context, alive while the allocation is (the caller's
    // registration of live memory), or the primary context retained above.
    let pushed = unsafe { driver.ctx_push_current(context) };
    let out = match pushed {
        Ok(()) => {
            let out = f();
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed above; a valid out-pointer.
            let _ = unsafe { driver.ctx_pop_current(&mut popped) };
            out
        }
        Err(e) => Err(e.into()),
    };
    if let Some(device) = primary {
        // SAFETY: releases the retain above, once.
        let _ = unsafe { driver.device_primary_ctx_release(device) };
    }
    out
}
