//! `lf_export`: a buffer on its way to another process on this host, and its import there.
//!
//! An `lf_export` is plain data plus one file descriptor. Send it with `lf_export_send` (or
//! send its bytes and the fd with `SCM_RIGHTS` over your own Unix socket, then put the
//! received fd into `fd`), and `lf_import` it on the other side: the imported buffer maps the
//! very same memory.
//!
//! fd ownership: `lf_buffer_export` gives the caller a new fd (close it after sending);
//! `lf_import` always takes the fd (kept, or closed — also on every error).

use super::raw;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::buffer::lf_buffer;
use super::context::lf_context;
use super::status::lf_status;
use super::{boundary, handle_ref, out_ptr, write_out, Failure};
use lava_flow::memory::ExportDescriptor;
#[cfg(unix)]
use lava_flow::memory::ExportHandle;

/// The size of `lf_export`, in bytes.
pub const LF_EXPORT_SIZE: u32 = 128;
/// The layout version of `lf_export` this library writes and reads.
pub const LF_EXPORT_VERSION: u32 = 2;
/// `lf_export.gpu_flags`: the GPU arena is a dedicated allocation; import it as dedicated
/// (`cudaExternalMemoryDedicated`, `VkMemoryDedicatedAllocateInfo`).
pub const LF_EXPORT_GPU_DEDICATED: u32 = 1;

/// An exported buffer. The layout equals lava-flow's wire format (`fd` sits where the wire
/// format has a reserved word, and is ignored there): sending `sizeof(lf_export)` bytes plus
/// the fd carries everything. All fields are validated on import.
///
/// For GPU memory (`location` LF_MEMORY_GPU_*), `fd` is the Vulkan allocation exported as
/// `handle_type` (1: OPAQUE_FD) and the GPU fields say how to import it; CUDA takes it with
/// `cudaImportExternalMemory` (type OpaqueFd, size `arena_size`, flag
/// `cudaExternalMemoryDedicated` when `gpu_flags & LF_EXPORT_GPU_DEDICATED`) and
/// `cudaExternalMemoryGetMappedBuffer` at `offset`, `size`, on the CUDA device whose UUID
/// equals `device_uuid`. For CPU memory the GPU fields are 0.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct lf_export {
    /// LF_EXPORT_MAGIC, to recognise a lava-flow export.
    pub magic: u32,
    /// The layout version (LF_EXPORT_VERSION).
    pub version: u32,
    /// The kind of memory.
    pub location: raw::lf_memory_kind,
    /// The NUMA node of LF_MEMORY_CPU_NUMA memory, else -1.
    pub numa_node: i32,
    /// Where the buffer starts in its arena (the memory `fd` refers to).
    pub offset: u64,
    pub size: u64,
    pub arena_id: u64,
    /// The size of the whole memory `fd` refers to.
    pub arena_size: u64,
    /// The process that created the memory, and its random per-run token.
    pub exporter_pid: u32,
    /// The arena's memory: a sealed memfd (CPU), an exported Vulkan allocation (GPU).
    pub fd: i32,
    pub exporter_token: u64,
    /// GPU: the `VkExternalMemoryHandleTypeFlagBits` value of `fd` (1: OPAQUE_FD).
    pub handle_type: u32,
    /// GPU: the exporter's Vulkan memory type index and its `VkMemoryPropertyFlags`.
    pub memory_type_index: u32,
    pub memory_property_flags: u32,
    /// GPU: LF_EXPORT_GPU_DEDICATED or 0.
    pub gpu_flags: u32,
    /// GPU: the exporting device's deviceUUID (equal to CUDA's device UUID on NVIDIA).
    pub device_uuid: [u8; 16],
    /// GPU: the exporting driver's driverUUID.
    pub driver_uuid: [u8; 16],
    /// Must be 0.
    pub reserved: [u64; 2],
}

/// The magic number every export starts with ("LFEX").
pub const LF_EXPORT_MAGIC: u32 = 0x4c46_4558;

const _: () = assert!(
    LF_EXPORT_MAGIC == lava_flow::memory::EXPORT_MAGIC
        && LF_EXPORT_VERSION == lava_flow::memory::EXPORT_VERSION
        && LF_EXPORT_GPU_DEDICATED == lava_flow::memory::export::EXPORT_GPU_DEDICATED
        && LF_EXPORT_SIZE as usize == ExportDescriptor::SIZE
);

const _: () = assert!(std::mem::size_of::<lf_export>() == LF_EXPORT_SIZE as usize);

/// Every field of `lf_export` sits where the core's record has it (`fd` in its `reserved`
/// word, `reserved` in its `reserved2`), so the two convert as plain bytes.
macro_rules! same_layout {
    ($($c:ident = $core:ident),* $(,)?) => {
        const _: () = assert!(
            $(std::mem::offset_of!(lf_export, $c) == std::mem::offset_of!(ExportDescriptor, $core))&&*
        );
    };
}
same_layout!(
    magic = magic,
    version = version,
    location = location,
    numa_node = numa_node,
    offset = offset,
    size = size,
    arena_id = arena_id,
    arena_size = arena_size,
    exporter_pid = exporter_pid,
    fd = reserved,
    exporter_token = exporter_token,
    handle_type = handle_type,
    memory_type_index = memory_type_index,
    memory_property_flags = memory_property_flags,
    gpu_flags = gpu_flags,
    device_uuid = device_uuid,
    driver_uuid = driver_uuid,
    reserved = reserved2,
);

/// The core's record of an `lf_export`: its bytes, with the `fd` word zeroed (the wire
/// format's reserved word).
#[cfg_attr(not(unix), allow(dead_code))]
fn descriptor_of(e: &lf_export) -> ExportDescriptor {
    let mut descriptor: ExportDescriptor = zerocopy::transmute!(*e);
    descriptor.reserved = 0;
    descriptor
}

#[cfg_attr(not(unix), allow(dead_code))]
fn invalid(message: String) -> Failure {
    Failure { status: lf_status::LF_ERR_INVALID_ARGUMENT, message }
}

/// The file-descriptor side of the exports: Unix descriptors travel over Unix sockets.
#[cfg(unix)]
mod fds {
    use std::mem::ManuallyDrop;
    use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
    use std::os::unix::net::UnixStream;

    use super::{descriptor_of, invalid, lf_export};
    use crate::FfiResult;
    use lava_flow::memory::ExportHandle;

    pub(super) fn to_c(handle: ExportHandle) -> lf_export {
        let mut export: lf_export = zerocopy::transmute!(handle.descriptor);
        export.fd = handle.fd.into_raw_fd();
        export
    }

    pub(super) fn fd_is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD only queries the descriptor's flags; any integer is safe to ask about.
        fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0
    }

    /// Takes ownership of `fd` after checking that it is open (wrapping a closed fd in an
    /// OwnedFd would close someone else's later).
    pub(super) fn own_fd(fd: RawFd) -> FfiResult<OwnedFd> {
        if !fd_is_open(fd) {
            return Err(invalid(format!("export fd {fd} is not an open file descriptor")));
        }
        // SAFETY: fd is open, and the lf_import contract hands its ownership to lava-flow.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Borrows a socket fd as a UnixStream without taking it over.
    fn borrow_socket(socket: i32) -> FfiResult<ManuallyDrop<UnixStream>> {
        if !fd_is_open(socket) {
            return Err(invalid(format!("socket {socket} is not an open file descriptor")));
        }
        // SAFETY: open fd; ManuallyDrop keeps the caller's descriptor open.
        Ok(ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(socket) }))
    }

    /// Sends `export` with its fd over `socket`, both borrowed.
    pub(super) fn send(socket: i32, export: &lf_export) -> FfiResult<()> {
        let socket = borrow_socket(socket)?;
        if !fd_is_open(export.fd) {
            return Err(invalid(format!("export fd {} is not an open file descriptor", export.fd)));
        }
        // SAFETY: the fd was just checked to be open, and the caller keeps it open during the
        // call; it is only borrowed for the send.
        let fd = unsafe { BorrowedFd::borrow_raw(export.fd) };
        descriptor_of(export).send_with(&socket, fd)?;
        Ok(())
    }

    /// Receives one export on `socket` (borrowed), its fd the caller's.
    pub(super) fn recv(socket: i32) -> FfiResult<lf_export> {
        let socket = borrow_socket(socket)?;
        Ok(to_c(ExportHandle::recv(&socket)?))
    }
}

/// Windows shares memory by handle (a section), which the `int` fields and arguments of
/// these functions cannot carry: every function that hands out or takes a descriptor answers
/// LF_ERR_UNSUPPORTED, saying so.
#[cfg(not(unix))]
mod fds {
    use super::lf_export;
    use crate::status::lf_status;
    use crate::{Failure, FfiResult};
    use lava_flow::memory::ExportHandle;

    fn unsupported(function: &str) -> Failure {
        Failure {
            status: lf_status::LF_ERR_UNSUPPORTED,
            message: format!(
                "{function} carries an int file descriptor, and Windows shares memory by handle (a section), which \
                 the C API does not hand out yet; name a buffer with lf_buffer_describe, and share memory between \
                 Windows processes from Rust (ExportHandle) until the C API has a handle-typed export"
            ),
        }
    }

    pub(super) fn to_c(_handle: ExportHandle) -> FfiResult<lf_export> {
        Err(unsupported("lf_buffer_export"))
    }

    pub(super) fn import(_export: &lf_export) -> FfiResult<ExportHandle> {
        Err(unsupported("lf_import"))
    }

    pub(super) fn send(_socket: i32, _export: &lf_export) -> FfiResult<()> {
        Err(unsupported("lf_export_send"))
    }

    pub(super) fn recv(_socket: i32) -> FfiResult<lf_export> {
        Err(unsupported("lf_export_recv"))
    }
}

/// Exports a buffer for another process on this host. `*out` receives the export; its `fd`
/// is a new descriptor owned by the caller (close it once sent). Registered user memory
/// cannot be exported (LF_ERR_UNSUPPORTED). Thread-safe.
///
/// # Safety
/// `buffer` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_export(buffer: *const lf_buffer, out: *mut lf_export) -> lf_status {
    boundary("lf_buffer_export", || {
        let out = out_ptr(out, "out")?;
        let buffer = &handle_ref(buffer, "buffer")?.buffer;
        #[cfg(unix)]
        write_out(out, fds::to_c(buffer.export()?));
        #[cfg(not(unix))]
        write_out(out, fds::to_c(buffer.export()?)?);
        Ok(())
    })
}

/// Describes a buffer as `lf_buffer_export` would, without a file descriptor: `*out` receives
/// the export's fields with `fd` -1. Makes no system or driver call (an export makes and the
/// caller closes a descriptor each time): for recognising memory imported before, by the
/// arena's `exporter_pid`, `exporter_token` and `arena_id` (a cache of imports), then
/// `lf_buffer_export` only for an arena not imported yet. LF_ERR_UNSUPPORTED where
/// `lf_buffer_export` is. Thread-safe.
///
/// # Safety
/// `buffer` must be NULL or a pointer obtained from lava-flow; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_buffer_describe(buffer: *const lf_buffer, out: *mut lf_export) -> lf_status {
    boundary("lf_buffer_describe", || {
        let out = out_ptr(out, "out")?;
        let descriptor = handle_ref(buffer, "buffer")?.buffer.describe()?;
        let mut export: lf_export = zerocopy::transmute!(descriptor);
        export.fd = -1;
        write_out(out, export);
        Ok(())
    })
}

/// Imports an export into `context`: `*out` receives a buffer mapping the very same memory
/// (its origin LF_ORIGIN_IMPORTED), to release with `lf_free`. Importing several buffers of
/// one arena maps it once. Everything is validated: a foreign or damaged export gives
/// LF_ERR_INVALID_ARGUMENT (or LF_ERR_UNSUPPORTED for another version) with the reason.
///
/// `export->fd` is taken in every case, success or error, once `export` is readable.
///
/// # Safety
/// `context` must be NULL or a pointer obtained from lava-flow; `export` NULL or readable;
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_import(
    context: *const lf_context,
    export: *const lf_export,
    out: *mut *mut lf_buffer,
) -> lf_status {
    boundary("lf_import", || {
        // SAFETY: the caller promises export is NULL or readable.
        let export = unsafe { export.as_ref() }.ok_or_else(|| Failure::null("export"))?;
        // The fd is owned from here on: every early return below closes it.
        #[cfg(unix)]
        let handle = ExportHandle { fd: fds::own_fd(export.fd)?, descriptor: descriptor_of(export) };
        #[cfg(not(unix))]
        let handle = fds::import(export)?;
        let out = out_ptr(out, "out")?;
        let context = &handle_ref(context, "context")?.context;
        let buffer = context.import(handle)?;
        write_out(out, lf_buffer::into_handle(buffer)?);
        Ok(())
    })
}

/// Sends an export over a connected Unix stream socket (`SCM_RIGHTS`). `export->fd` stays
/// open and the caller's. Blocks as the socket does.
///
/// # Safety
/// `export` must be NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn lf_export_send(socket: i32, export: *const lf_export) -> lf_status {
    boundary("lf_export_send", || {
        // SAFETY: the caller promises export is NULL or readable.
        let export = unsafe { export.as_ref() }.ok_or_else(|| Failure::null("export"))?;
        fds::send(socket, export)
    })
}

/// Receives one export sent with `lf_export_send`: `*out` receives it, its `fd` owned by the
/// caller (hand it to `lf_import`). Anything else arriving on the socket is refused
/// (LF_ERR_CORRUPT, the message naming what is wrong) and any fds that came with it are
/// closed: a message that is not one 128-byte record with one fd; a record with another magic
/// or version, non-zero reserved fields, an unknown location, handle type or flag, GPU fields
/// on CPU memory, or an empty range or one outside its arena; an fd that is not memory (for
/// CPU memory a memfd sealed against shrinking) of at least the arena's size.
/// LF_ERR_PEER_GONE when the socket closed first.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lf_export_recv(socket: i32, out: *mut lf_export) -> lf_status {
    boundary("lf_export_recv", || {
        let out = out_ptr(out, "out")?;
        write_out(out, fds::recv(socket)?);
        Ok(())
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::alloc::{lf_alloc, lf_register};
    use crate::buffer::{lf_buffer_origin, lf_buffer_ptr, lf_free, lf_memory_kind, lf_origin};
    use crate::context::{lf_context_create, lf_context_free};
    use crate::location::LF_UNSET;
    use std::os::fd::AsRawFd;
    use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::ptr;

    fn is_open(fd: i32) -> bool {
        // SAFETY: F_GETFD only queries the descriptor.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    #[test]
    fn export_travels_and_imports_the_same_memory() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, 300, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            let mut export = lf_export::default();
            assert_eq!(lf_buffer_export(buffer, &mut export), lf_status::LF_OK);
            let (a, b) = UnixStream::pair().unwrap();
            assert_eq!(lf_export_send(a.as_raw_fd(), &export), lf_status::LF_OK);
            libc::close(export.fd);
            let mut received = lf_export::default();
            assert_eq!(lf_export_recv(b.as_raw_fd(), &mut received), lf_status::LF_OK);
            let mut imported = ptr::null_mut();
            assert_eq!(lf_import(context, &received, &mut imported), lf_status::LF_OK);
            let mut origin = 0;
            assert_eq!(lf_buffer_origin(imported, &mut origin), lf_status::LF_OK);
            assert_eq!(origin, lf_origin::LF_ORIGIN_IMPORTED as u32);
            let (mut here, mut there) = (ptr::null_mut(), ptr::null_mut());
            lf_buffer_ptr(buffer, &mut here);
            lf_buffer_ptr(imported, &mut there);
            assert_ne!(here, there);
            here.cast::<u8>().add(299).write(7);
            assert_eq!(there.cast::<u8>().add(299).read(), 7);
            lf_free(imported);
            lf_free(buffer);
            lf_context_free(context);
        }
    }

    /// Sends `export`'s bytes with `fd` over a fresh socket pair and receives it back.
    unsafe fn round_trip(export: &lf_export, fd: BorrowedFd<'_>) -> (lf_status, String, lf_export) {
        // SAFETY: `received` is a valid out-pointer and `b` a live socket that this function owns.
        unsafe {
            let (a, b) = UnixStream::pair().unwrap();
            descriptor_of(export).send_with(&a, fd).unwrap();
            let mut received = lf_export { fd: -1, ..lf_export::default() };
            let status = lf_export_recv(b.as_raw_fd(), &mut received);
            (status, crate::tests::last_error(), received)
        }
    }

    #[test]
    fn received_exports_are_validated() {
        use std::os::fd::AsFd;
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, 64, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            let mut good = lf_export::default();
            assert_eq!(lf_buffer_export(buffer, &mut good), lf_status::LF_OK);
            let arena = OwnedFd::from_raw_fd(good.fd);
            let event = crate::tests::eventfd();
            let small = crate::tests::memfd("small", 4096, true);
            libc::fcntl(small.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK);
            let unsealed = crate::tests::memfd("unsealed", good.arena_size, false);
            let (sock, _other) = UnixStream::pair().unwrap();
            let cases: Vec<(lf_export, BorrowedFd<'_>, &str)> = vec![
                (lf_export::default(), arena.as_fd(), "magic 0x00000000"),
                (lf_export { version: 9, ..good }, arena.as_fd(), "version 9"),
                (lf_export { reserved: [0, 1], ..good }, arena.as_fd(), "reserved"),
                (lf_export { location: 99, ..good }, arena.as_fd(), "unknown memory location value 99"),
                (lf_export { numa_node: 3, ..good }, arena.as_fd(), "NUMA node"),
                (lf_export { handle_type: 1, ..good }, arena.as_fd(), "carries GPU fields"),
                (lf_export { size: 0, ..good }, arena.as_fd(), "size 0"),
                (lf_export { offset: u64::MAX - 8, ..good }, arena.as_fd(), "lies outside"),
                (lf_export { offset: 3, ..good }, arena.as_fd(), "not a multiple"),
                (
                    lf_export { arena_size: good.arena_size * 2, size: good.arena_size * 2, ..good },
                    arena.as_fd(),
                    "fewer than the",
                ),
                (good, event.as_fd(), "not a memory file"),
                (good, sock.as_fd(), "a socket"),
                (good, small.as_fd(), "fewer than the"),
                (good, unsealed.as_fd(), "not sealed against shrinking"),
            ];
            for (export, fd, text) in cases {
                let (status, message, received) = round_trip(&export, fd);
                assert_eq!(status, lf_status::LF_ERR_CORRUPT, "{text}: {message}");
                assert!(message.starts_with("lf_export_recv: ") && message.contains(text), "{text}: {message}");
                assert_eq!(received.fd, -1, "out untouched on failure");
            }
            let (status, message, received) = round_trip(&good, arena.as_fd());
            assert_eq!(status, lf_status::LF_OK, "{message}");
            let mut imported = ptr::null_mut();
            assert_eq!(lf_import(context, &received, &mut imported), lf_status::LF_OK);
            lf_free(imported);
            lf_free(buffer);
            lf_context_free(context);
        }
    }

    #[test]
    fn bad_exports_are_refused_and_their_fds_closed() {
        unsafe {
            let mut context = ptr::null_mut();
            assert_eq!(lf_context_create(ptr::null(), &mut context), lf_status::LF_OK);
            let mut buffer = ptr::null_mut();
            assert_eq!(
                lf_alloc(context, 64, lf_memory_kind::LF_MEMORY_CPU_STANDARD as u32, LF_UNSET, 0, &mut buffer),
                lf_status::LF_OK
            );
            let mut good = lf_export::default();
            assert_eq!(lf_buffer_export(buffer, &mut good), lf_status::LF_OK);
            let low = good.fd;
            good.fd = crate::tests::dup_high(low);
            libc::close(low);
            let foreign_fd = crate::tests::memfd("not-lava-flow", 1 << 21, false).into_raw_fd();
            let broken: [(lf_export, &str); 6] = [
                (lf_export { magic: 1, ..good }, "not a lava-flow export handle"),
                (lf_export { location: 99, ..good }, "unknown memory location value 99"),
                (lf_export { offset: good.arena_size, ..good }, "outside its"),
                (lf_export { size: 0, ..good }, "size 0"),
                (lf_export { arena_size: good.arena_size * 2, ..good }, "the handle says"),
                (lf_export { fd: foreign_fd, ..good }, "not a lava-flow memory file"),
            ];
            for (export, text) in broken {
                let fd = crate::tests::dup_high(export.fd);
                let export = lf_export { fd, ..export };
                let mut imported = ptr::null_mut();
                assert_ne!(lf_import(context, &export, &mut imported), lf_status::LF_OK, "{text}");
                let message = std::ffi::CStr::from_ptr(crate::status::lf_last_error_message()).to_string_lossy();
                assert!(message.contains(text), "{message}");
                assert!(imported.is_null());
                assert!(!is_open(fd), "fd closed on error ({text})");
            }
            libc::close(foreign_fd);
            assert_eq!(
                lf_import(context, &lf_export { fd: -1, ..good }, &mut ptr::null_mut()),
                lf_status::LF_ERR_INVALID_ARGUMENT
            );
            assert_eq!(lf_import(context, ptr::null(), &mut ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            // A NULL out still takes (closes) the fd.
            assert_eq!(lf_import(context, &good, ptr::null_mut()), lf_status::LF_ERR_NULL_POINTER);
            assert!(!is_open(good.fd));
            let mut user = [0u8; 64];
            let mut registered = ptr::null_mut();
            assert_eq!(lf_register(context, user.as_mut_ptr().cast(), 64, &mut registered), lf_status::LF_OK);
            assert_eq!(lf_buffer_export(registered, &mut good), lf_status::LF_ERR_UNSUPPORTED);
            lf_free(registered);
            lf_free(buffer);
            lf_context_free(context);
        }
    }
}
