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
/// maps or may write directly (device-local memory behind a resizable BAR), else pinned
/// staging buffers and a GPU copy; large copies on several threads (`LF_COPY_THREADS`). For
/// the bus's full speed, copy from GPU-pinned memory with `lf_buffer_copy`. A range outside
/// the buffer is LF_ERR_INVALID_ARGUMENT, naming both.
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
pub unsafe extern "C" fn lf_buffer_read(
    buffer: *const lf_buffer,
    offset: usize,
    out: *mut c_void,
    size: usize,
) -> lf_status {
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
/// On a GPU, copies of 1 MiB and more between GPU memory are made by a compute shader (near
/// the memory's bandwidth); smaller ones, those to or from host memory, those whose offsets
/// are not congruent mod 4, and all on CPU devices (lavapipe) by the copy engine
/// (`vkCmdCopyBuffer`). Where the process already uses CUDA on the GPU, copies between GPU
/// memory that wait on no GPU message go through CUDA instead (`cuMemcpyDtoDAsync`, the
/// memory imported into CUDA once per allocation): faster at every size on NVIDIA's driver.
/// The environment variable `LF_GPU_COPY` (`auto`, `engine`, `shader` or `cuda`, read when
/// the context opens its device) forces one method.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::lf_alloc;
    use crate::buffer::*;
    use crate::context::lf_gpu_policy;
    use crate::context::{lf_context_config, lf_context_create, lf_context_free};
    use crate::location::LF_UNSET;
    use crate::tests::last_error;
    use std::ffi::CStr;
    use std::ptr;

    unsafe fn alloc(context: *const lf_context, size: usize, location: u32) -> *mut lf_buffer {
        // SAFETY: `context` is a live context handle of the calling test; `buffer` is a valid
        // out-pointer.
        unsafe {
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, size, location, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK,
                "{}",
                last_error()
            );
            buffer
        }
    }

    unsafe fn has_gpu(context: *const lf_context) -> bool {
        crate::handle_ref(context, "context").ok().unwrap().context.gpu_unavailable_reason().is_none()
    }

    #[test]
    fn write_read_and_copy_every_kind_of_memory() {
        // SAFETY (whole test): every data pointer covers the size passed with it.
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let gpu = has_gpu(context);
            let cpu = alloc(context, 20000, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32);
            let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
            for location in
                [lf_memory_kind::LF_MEMORY_GPU_DEVICE_LOCAL as u32, lf_memory_kind::LF_MEMORY_GPU_HOST_VISIBLE as u32]
            {
                let buffer = alloc(context, 10000, location);
                let (mut got, mut reason) = (0, ptr::null());
                assert_eq!(lf_buffer_location(buffer, &mut got), lf_status::LF_OK);
                assert_eq!(lf_buffer_fallback_reason(buffer, &mut reason), lf_status::LF_OK);
                assert_eq!((got == location, reason.is_null()), (gpu, gpu), "the location it really got, and why");
                assert_eq!(lf_buffer_write(buffer, 100, data.as_ptr().cast(), data.len()), lf_status::LF_OK);
                let mut out = vec![0u8; data.len()];
                assert_eq!(lf_buffer_read(buffer, 100, out.as_mut_ptr().cast(), out.len()), lf_status::LF_OK);
                assert_eq!(out, data);
                assert_eq!(lf_buffer_copy(context, cpu, 7, buffer, 100, data.len()), lf_status::LF_OK);
                let mut base = ptr::null_mut();
                assert_eq!(lf_buffer_ptr(cpu, &mut base), lf_status::LF_OK);
                assert_eq!(std::slice::from_raw_parts(base.cast::<u8>().add(7), data.len()), &data[..]);

                // Wrong sizes and offsets, NULL data, foreign handles.
                assert_eq!(
                    lf_buffer_write(buffer, 9000, data.as_ptr().cast(), 5000),
                    lf_status::LF_ERR_INVALID_ARGUMENT
                );
                assert!(last_error().contains("outside buffer"), "{}", last_error());
                assert_eq!(
                    lf_buffer_read(buffer, usize::MAX, out.as_mut_ptr().cast(), 1),
                    lf_status::LF_ERR_INVALID_ARGUMENT
                );
                assert_eq!(lf_buffer_write(buffer, 0, ptr::null(), 10), lf_status::LF_ERR_NULL_POINTER);
                assert_eq!(lf_buffer_write(buffer, 0, ptr::null(), 0), lf_status::LF_OK);
                assert_eq!(lf_buffer_read(buffer, 0, ptr::null_mut(), 3), lf_status::LF_ERR_NULL_POINTER);
                assert_eq!(lf_buffer_copy(context, buffer, 0, cpu, 0, 20000), lf_status::LF_ERR_INVALID_ARGUMENT);
                assert_eq!(lf_buffer_write(context.cast(), 0, data.as_ptr().cast(), 1), lf_status::LF_ERR_BAD_HANDLE);
                assert_eq!(lf_buffer_copy(buffer.cast(), cpu, 0, buffer, 0, 1), lf_status::LF_ERR_BAD_HANDLE);
                let overlap = lf_buffer_copy(context, buffer, 0, buffer, 10, 100);
                // On the GPU an overlapping copy is refused; on the host it is a memmove.
                assert_eq!(overlap, if gpu { lf_status::LF_ERR_INVALID_ARGUMENT } else { lf_status::LF_OK });
                lf_free(buffer);
            }
            // GPU-pinned memory: registered with what is there, and says why not with the rest.
            let pinned = alloc(context, 4096, lf_memory_kind::LF_MEMORY_CPU_GPU_PINNED as u32);
            let (mut flags, mut failures) = (99u32, ptr::null());
            assert_eq!(lf_buffer_registrations(pinned, &mut flags), lf_status::LF_OK);
            assert_eq!(lf_buffer_registration_failures(pinned, &mut failures), lf_status::LF_OK);
            let rust = &crate::handle_ref(pinned, "pinned").ok().unwrap().buffer;
            assert_eq!(flags, rust.registrations().iter().fold(0, |bits, r| bits | r.flag()));
            assert_eq!(failures.is_null(), rust.registration_failures().is_empty());
            if flags & lf_registration::LF_REGISTRATION_CUDA as u32 == 0 {
                assert!(CStr::from_ptr(failures).to_str().unwrap().contains("CUDA"));
            }
            assert_eq!(lf_buffer_registrations(pinned, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            assert_eq!(lf_buffer_registrations(cpu, &mut flags), lf_status::LF_OK);
            assert_eq!(flags, 0);
            lf_free(pinned);
            lf_free(cpu);
            lf_context_free(context);
        }
    }

    #[test]
    fn fallback_is_visible() {
        // SAFETY (whole test): out-pointers are writable.
        unsafe {
            let config = lf_context_config { gpu_policy: lf_gpu_policy::LF_GPU_DISABLED as u32, ..Default::default() };
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(&config, &mut context), lf_status::LF_OK);
            let buffer = alloc(context, 100, lf_memory_kind::LF_MEMORY_GPU_HOST_VISIBLE as u32);
            let (mut location, mut reason, mut base) = (0, ptr::null(), ptr::null_mut());
            assert_eq!(lf_buffer_location(buffer, &mut location), lf_status::LF_OK);
            assert_eq!(location, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32);
            assert_eq!(lf_buffer_fallback_reason(buffer, &mut reason), lf_status::LF_OK);
            let reason = CStr::from_ptr(reason).to_str().unwrap();
            assert!(
                reason.contains("GPU host-visible memory was asked for") && reason.contains("disables the GPU"),
                "{reason}"
            );
            assert_eq!(lf_buffer_ptr(buffer, &mut base), lf_status::LF_OK);
            assert_eq!(lf_buffer_fallback_reason(buffer, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            lf_free(buffer);
            lf_context_free(context);
        }
    }

    #[test]
    #[cfg(feature = "vulkan")]
    fn gpu_exports_travel_and_import_on_another_device() {
        use crate::export::{lf_buffer_export, lf_export, lf_export_recv, lf_export_send, lf_import};
        use std::os::fd::AsRawFd;
        use std::os::unix::net::UnixStream;
        // SAFETY (whole test): out-pointers are writable; fds are the test's own.
        unsafe {
            let (mut exporter, mut importer) = (ptr::null_mut(), ptr::null_mut());
            assert_eq!(lf_context_create(ptr::null(), &mut exporter), lf_status::LF_OK);
            assert_eq!(lf_context_create(ptr::null(), &mut importer), lf_status::LF_OK);
            if !has_gpu(exporter) {
                eprintln!("SKIP: no Vulkan device");
                lf_context_free(exporter);
                lf_context_free(importer);
                return;
            }
            let buffer = alloc(exporter, 3000, lf_memory_kind::LF_MEMORY_GPU_DEVICE_LOCAL as u32);
            assert_eq!(lf_buffer_write(buffer, 0, b"hello gpu".as_ptr().cast(), 9), lf_status::LF_OK);
            let mut export = lf_export::default();
            assert_eq!(lf_buffer_export(buffer, &mut export), lf_status::LF_OK);
            let uuid = crate::handle_ref(exporter, "exporter").ok().unwrap().context.device_info().unwrap().device_uuid;
            assert_eq!(
                (export.location, export.handle_type, export.size, export.device_uuid),
                (lf_memory_kind::LF_MEMORY_GPU_DEVICE_LOCAL as u32, 1, 3000, uuid)
            );
            let (a, b) = UnixStream::pair().unwrap();
            assert_eq!(lf_export_send(a.as_raw_fd(), &export), lf_status::LF_OK);
            let mut received = lf_export::default();
            assert_eq!(lf_export_recv(b.as_raw_fd(), &mut received), lf_status::LF_OK);
            assert_eq!(lf_export { fd: 0, ..received }, lf_export { fd: 0, ..export });
            let mut imported = ptr::null_mut();
            assert_eq!(lf_import(importer, &received, &mut imported), lf_status::LF_OK, "{}", last_error());
            let mut word = [0u8; 9];
            assert_eq!(lf_buffer_read(imported, 0, word.as_mut_ptr().cast(), 9), lf_status::LF_OK);
            assert_eq!(&word, b"hello gpu");
            assert_eq!(lf_buffer_write(imported, 0, b"HELLO".as_ptr().cast(), 5), lf_status::LF_OK);
            assert_eq!(lf_buffer_read(buffer, 0, word.as_mut_ptr().cast(), 9), lf_status::LF_OK);
            assert_eq!(&word, b"HELLO gpu");

            // Another GPU's (or driver's) memory is refused before Vulkan sees it; the fd closes.
            let mut foreign = lf_export { fd: crate::tests::dup_high(export.fd), ..export };
            foreign.device_uuid[0] ^= 1;
            assert_eq!(lf_import(importer, &foreign, &mut imported), lf_status::LF_ERR_UNSUPPORTED);
            assert!(last_error().contains("another GPU or driver"), "{}", last_error());
            assert!(libc::fcntl(foreign.fd, libc::F_GETFD) < 0, "the fd was closed");
            let outside = lf_export { fd: crate::tests::dup_high(export.fd), offset: export.arena_size, ..export };
            assert_eq!(lf_import(importer, &outside, &mut imported), lf_status::LF_ERR_INVALID_ARGUMENT);
            libc::close(export.fd);
            lf_free(imported);
            lf_free(buffer);
            lf_context_free(importer);
            lf_context_free(exporter);
        }
    }
}
