//! Moving data in and out of an `lf_buffer` without touching its memory directly: the way to
//! GPU memory the host cannot map (staged through the GPU), and a uniform way to every other
//! kind. Each call returns when the data is in place.
//!
//! Thread-safety: calls on different byte ranges may run from several threads at once;
//! ordering accesses to the same bytes (from threads, the GPU or other processes) is the
//! caller's business, as for any shared memory.

use std::ffi::c_void;

use super::buffer::lf_buffer;
use super::context::lf_context;
use super::status::lf_status;
use super::{boundary, handle_ref, Failure, FfiResult};

/// Borrows `size` bytes of caller memory at `ptr` (which may be NULL only when `size` is 0).
fn caller_bytes<'a>(ptr: *const c_void, size: usize, arg: &str) -> FfiResult<&'a [u8]> {
    if size == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Failure::null(arg));
    }
    // SAFETY: non-NULL; the C caller promises `size` readable bytes that outlive the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast(), size) })
}

/// Copies `size` bytes from `data` into the buffer at `offset`: a memcpy for memory the host
/// maps, a staging copy through the GPU for GPU memory it cannot. A range outside the buffer
/// is LF_ERR_INVALID_ARGUMENT, naming both.
///
/// # Safety
/// `buffer` must be NULL or a pointer obtained from lava-flow; `data` NULL (only with `size`
/// 0) or `size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_write(
    buffer: *const lf_buffer,
    offset: usize,
    data: *const c_void,
    size: usize,
) -> lf_status {
    boundary("lf_buffer_write", || {
        let buffer = &handle_ref(buffer, "buffer")?.buffer;
        buffer.write_at(offset, caller_bytes(data, size, "data")?)?;
        Ok(())
    })
}

/// Copies `size` bytes of the buffer at `offset` into `out` (staged for GPU memory the host
/// cannot map, as `lf_buffer_write`).
///
/// # Safety
/// `buffer` as `lf_buffer_write`; `out` NULL (only with `size` 0) or `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_read(buffer: *const lf_buffer, offset: usize, out: *mut c_void, size: usize) -> lf_status {
    boundary("lf_buffer_read", || {
        let buffer = &handle_ref(buffer, "buffer")?.buffer;
        let out: &mut [u8] = if size == 0 {
            &mut []
        } else if out.is_null() {
            return Err(Failure::null("out"));
        } else {
            // SAFETY: non-NULL; the caller promises `size` writable bytes for the call.
            unsafe { std::slice::from_raw_parts_mut(out.cast(), size) }
        };
        buffer.read_at(offset, out)?;
        Ok(())
    })
}

/// Copies `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`, whatever memory
/// each is: on the GPU when both are memory of the context's Vulkan device (GPU buffers, and
/// GPU-pinned buffers imported into it), else through the host. Overlapping ranges of one
/// GPU allocation are refused; on the host they are copied as `memmove` does.
///
/// # Safety
/// `context`, `dst` and `src` must be NULL or pointers obtained from lava-flow.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_copy(
    context: *const lf_context,
    dst: *const lf_buffer,
    dst_offset: usize,
    src: *const lf_buffer,
    src_offset: usize,
    size: usize,
) -> lf_status {
    boundary("lf_buffer_copy", || {
        let context = &handle_ref(context, "context")?.context;
        let dst = &handle_ref(dst, "dst")?.buffer;
        let src = &handle_ref(src, "src")?.buffer;
        context.copy(dst, dst_offset, src, src_offset, size)?;
        Ok(())
    })
}
