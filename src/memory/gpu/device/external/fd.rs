//! GPU memory and semaphores as opaque file descriptors (Unix).

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use ash::vk;

use lava_flow_cuda::sys::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;

use super::super::vk_error::vk_err;
use crate::error::{Error, Result};

pub(crate) const MEMORY_EXTENSION: &CStr = ash::khr::external_memory_fd::NAME;
pub(crate) const SEMAPHORE_EXTENSION: &CStr = ash::khr::external_semaphore_fd::NAME;
pub(crate) const MEMORY_HANDLE: vk::ExternalMemoryHandleTypeFlags = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
pub(crate) const SEMAPHORE_HANDLE: vk::ExternalSemaphoreHandleTypeFlags =
    vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD;
/// The opaque handle, as messages name it.
pub(crate) const HANDLE_NAME: &str = "opaque fd";

pub(crate) type MemoryApi = ash::khr::external_memory_fd::Device;
pub(crate) type SemaphoreApi = ash::khr::external_semaphore_fd::Device;

/// `fd` lent to a call that sends it (the platform layer's stream).
pub(crate) fn lend(fd: &OwnedFd) -> BorrowedFd<'_> {
    fd.as_fd()
}

/// A new descriptor of `memory` as `handle_type` (each call makes another).
///
/// # Safety
/// `memory` is a live allocation of `api`'s device, allocated exportable as `handle_type`.
pub(crate) unsafe fn export_memory(
    api: &MemoryApi,
    memory: vk::DeviceMemory,
    handle_type: vk::ExternalMemoryHandleTypeFlags,
    what: &str,
) -> Result<OwnedFd> {
    let info = vk::MemoryGetFdInfoKHR::default().memory(memory).handle_type(handle_type);
    // SAFETY: the caller vouches for the memory and its export type.
    let raw = unsafe { api.get_memory_fd(&info) }.map_err(vk_err(&format!("vkGetMemoryFdKHR of {what}")))?;
    if raw < 0 {
        return Err(Error::Vulkan(format!("vkGetMemoryFdKHR returned fd {raw}")));
    }
    // SAFETY: vkGetMemoryFdKHR returns a new descriptor that the caller owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Allocates `info` (its size, memory type and any dedicated buffer set) as an import of
/// `fd`, a `handle_type` export; `what` names the export in messages. The descriptor is
/// consumed: Vulkan owns it after a successful import, and a failed one closes it.
///
/// # Safety
/// As `vkAllocateMemory` with `VkImportMemoryFdInfoKHR`: the export comes from this GPU and
/// driver, and `info` asks for the memory type and size it was allocated with.
pub(crate) unsafe fn import_memory(
    device: &ash::Device,
    api: &MemoryApi,
    info: vk::MemoryAllocateInfo<'_>,
    handle_type: vk::ExternalMemoryHandleTypeFlags,
    fd: OwnedFd,
    what: &dyn std::fmt::Display,
) -> Result<vk::DeviceMemory> {
    if handle_type == vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT {
        // Only dma-bufs can be asked which memory types they fit (not opaque fds).
        let mut props = vk::MemoryFdPropertiesKHR::default();
        // SAFETY: fd is a live descriptor; the query does not take ownership.
        unsafe { api.get_memory_fd_properties(handle_type, fd.as_raw_fd(), &mut props) }
            .map_err(vk_err("vkGetMemoryFdPropertiesKHR"))?;
        if props.memory_type_bits & (1 << info.memory_type_index) == 0 {
            return Err(Error::invalid(format!(
                "{what}: the dma-buf does not fit memory type {} (fits {:#x})",
                info.memory_type_index, props.memory_type_bits
            )));
        }
    }
    let fd = own_position(fd);
    let named = file_id(fd.as_raw_fd());
    let mut import = vk::ImportMemoryFdInfoKHR::default().handle_type(handle_type).fd(fd.as_raw_fd());
    let info = info.push_next(&mut import);
    // SAFETY: the chain is live; the caller vouches for the rest.
    match unsafe { device.allocate_memory(&info, None) } {
        Ok(memory) => {
            // Vulkan owns the descriptor now and closes it when the memory is freed.
            let _ = fd.into_raw_fd();
            Ok(memory)
        }
        Err(r) => {
            // A failed import leaves the descriptor with us, but lavapipe closes it: closed
            // here only if its number still names the file it named.
            let raw = fd.into_raw_fd();
            if named.is_some() && file_id(raw) == named {
                // SAFETY: `raw` is the descriptor given up above, still open on that file.
                drop(unsafe { OwnedFd::from_raw_fd(raw) });
            }
            Err(vk_err(&format!("importing {what} (vkAllocateMemory)"))(r))
        }
    }
}

/// A new descriptor of the timeline semaphore `semaphore` (each call makes another).
///
/// # Safety
/// `semaphore` is a live semaphore of `api`'s device, created exportable as an opaque fd.
pub(crate) unsafe fn export_semaphore(api: &SemaphoreApi, semaphore: vk::Semaphore) -> Result<OwnedFd> {
    let info = vk::SemaphoreGetFdInfoKHR::default().semaphore(semaphore).handle_type(SEMAPHORE_HANDLE);
    // SAFETY: the caller vouches for the semaphore.
    let raw = unsafe { api.get_semaphore_fd(&info) }.map_err(vk_err("vkGetSemaphoreFdKHR (opaque fd)"))?;
    if raw < 0 {
        return Err(Error::Vulkan(format!("vkGetSemaphoreFdKHR returned fd {raw}")));
    }
    // SAFETY: vkGetSemaphoreFdKHR returns a new descriptor that the caller owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Makes `semaphore` an import of `fd`. The descriptor is consumed: Vulkan owns it after a
/// successful import, and a failed one closes it.
///
/// # Safety
/// `semaphore` is a live, unused timeline semaphore of `api`'s device.
pub(crate) unsafe fn import_semaphore(api: &SemaphoreApi, semaphore: vk::Semaphore, fd: OwnedFd) -> Result<()> {
    let info =
        vk::ImportSemaphoreFdInfoKHR::default().semaphore(semaphore).handle_type(SEMAPHORE_HANDLE).fd(fd.as_raw_fd());
    // SAFETY: the caller vouches for the semaphore; the fd is a live descriptor. Vulkan takes
    // ownership of it only when the call succeeds.
    unsafe { api.import_semaphore_fd(&info) }.map_err(vk_err("vkImportSemaphoreFdKHR (timeline, opaque fd)"))?;
    // Vulkan owns the descriptor now.
    let _ = fd.into_raw_fd();
    Ok(())
}

/// What `cuImportExternalMemory` takes for an opaque-fd export: its handle type and handle
/// words. The descriptor stays the caller's until [`given_to_cuda`].
pub(crate) fn cuda_memory_handle(fd: &OwnedFd) -> Result<(std::ffi::c_int, [u64; 2])> {
    Ok((CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, [fd.as_raw_fd() as u32 as u64, 0]))
}

/// After a successful `cuImportExternalMemory`: CUDA owns the descriptor now.
pub(crate) fn given_to_cuda(fd: OwnedFd) {
    let _ = fd.into_raw_fd();
}

/// `fd`, or, where it is a memfd, a new description of the same memory with a file position of
/// its own (opened through `/proc/self/fd`); `fd` itself where that cannot be done. The driver
/// reads a memfd's header at its file position, which the copies of one export that several
/// processes received share, so that their imports at the same moment would race.
pub(super) fn own_position(fd: OwnedFd) -> OwnedFd {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if !std::fs::read_link(&path).is_ok_and(|target| target.to_string_lossy().starts_with("/memfd:")) {
        return fd;
    }
    match std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&path) {
        Ok(file) => file.into(),
        Err(_) => fd,
    }
}

/// The file that descriptor `raw` names (device and inode), `None` where it names none.
fn file_id(raw: RawFd) -> Option<(u64, u64)> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `stat` into the buffer given, whatever `raw` is (EBADF otherwise).
    if unsafe { libc::fstat(raw, stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled the buffer.
    let stat = unsafe { stat.assume_init() };
    // (`st_dev` is signed on macOS.)
    #[allow(clippy::unnecessary_cast)]
    Some((stat.st_dev as u64, stat.st_ino as u64))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::own_position;
    use crate::os::{shm, ShmOptions};

    /// The copies of one export share a file position; the memfd an import reads gets its own,
    /// on the same memory.
    #[test]
    fn a_memfd_is_imported_through_a_position_of_its_own() {
        let memfd = shm::create("lf-import-test", 4096, ShmOptions::default()).unwrap();
        let copy = memfd.try_clone().unwrap();
        let own = own_position(copy);
        // SAFETY: lseek on descriptors this test owns.
        let (moved, position) = unsafe {
            (libc::lseek(memfd.as_raw_fd(), 100, libc::SEEK_SET), libc::lseek(own.as_raw_fd(), 0, libc::SEEK_CUR))
        };
        assert_eq!((moved, position), (100, 0), "the imported descriptor moved with the exporter's");
        // SAFETY: as above; the other file's size says it is the same memory.
        let size = unsafe { libc::lseek(own.as_raw_fd(), 0, libc::SEEK_END) };
        assert_eq!(size, 4096);
        // A descriptor that is no memfd is kept as it is.
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let raw = file.as_raw_fd();
        assert_eq!(own_position(file.into()).as_raw_fd(), raw);
    }
}
