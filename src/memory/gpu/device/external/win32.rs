//! GPU memory and semaphores as opaque NT handles (Windows).
//!
//! Memory is allocated exportable with no `VkExportMemoryWin32HandleInfoKHR`: its handles get
//! the default security descriptor of this process's token and no name, so another process
//! reaches one only through a duplicate made into it (the platform layer's stream makes it,
//! after the channel's same-user check). Importing an NT handle does not transfer it to
//! Vulkan: the handle is closed here once the import is done, on every path.

use std::ffi::CStr;
use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle, RawHandle};

use ash::vk;

use super::super::vk_error::vk_err;
use crate::error::{Error, Result};

pub(crate) const MEMORY_EXTENSION: &CStr = ash::khr::external_memory_win32::NAME;
pub(crate) const SEMAPHORE_EXTENSION: &CStr = ash::khr::external_semaphore_win32::NAME;
pub(crate) const MEMORY_HANDLE: vk::ExternalMemoryHandleTypeFlags = vk::ExternalMemoryHandleTypeFlags::OPAQUE_WIN32;
pub(crate) const SEMAPHORE_HANDLE: vk::ExternalSemaphoreHandleTypeFlags =
    vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_WIN32;
/// The opaque handle, as messages name it.
pub(crate) const HANDLE_NAME: &str = "opaque Win32 handle";

pub(crate) type MemoryApi = ash::khr::external_memory_win32::Device;
pub(crate) type SemaphoreApi = ash::khr::external_semaphore_win32::Device;

/// Takes ownership of an NT handle a `vkGet*Win32HandleKHR` call returned.
fn owned(raw: vk::HANDLE, call: &str) -> Result<OwnedHandle> {
    if raw == 0 {
        return Err(Error::Vulkan(format!("{call} returned a null handle")));
    }
    // SAFETY: for NT handle types each successful call makes a new handle that the caller owns
    // (and must close), and nothing else holds it.
    Ok(unsafe { OwnedHandle::from_raw_handle(raw as RawHandle) })
}

/// `handle` lent to a call that sends it (the platform layer's stream).
pub(crate) fn lend(handle: &OwnedHandle) -> BorrowedHandle<'_> {
    handle.as_handle()
}

/// A new NT handle of `memory` as `handle_type` (each call makes another).
///
/// # Safety
/// `memory` is a live allocation of `api`'s device, allocated exportable as `handle_type`.
pub(crate) unsafe fn export_memory(
    api: &MemoryApi,
    memory: vk::DeviceMemory,
    handle_type: vk::ExternalMemoryHandleTypeFlags,
    what: &str,
) -> Result<OwnedHandle> {
    let info = vk::MemoryGetWin32HandleInfoKHR::default().memory(memory).handle_type(handle_type);
    // SAFETY: the caller vouches for the memory and its export type.
    let raw = unsafe { api.get_memory_win32_handle(&info) }
        .map_err(vk_err(&format!("vkGetMemoryWin32HandleKHR of {what}")))?;
    owned(raw, "vkGetMemoryWin32HandleKHR")
}

/// Allocates `info` (its size, memory type and any dedicated buffer set) as an import of
/// `handle`, a `handle_type` export; `what` names the export in messages. The handle is closed
/// when the import is done (Vulkan keeps its own reference to the memory).
///
/// # Safety
/// As `vkAllocateMemory` with `VkImportMemoryWin32HandleInfoKHR`: the export comes from this
/// GPU and driver, and `info` asks for the memory type and size it was allocated with.
pub(crate) unsafe fn import_memory(
    device: &ash::Device,
    _api: &MemoryApi,
    info: vk::MemoryAllocateInfo<'_>,
    handle_type: vk::ExternalMemoryHandleTypeFlags,
    handle: OwnedHandle,
    what: &dyn std::fmt::Display,
) -> Result<vk::DeviceMemory> {
    let mut import = vk::ImportMemoryWin32HandleInfoKHR::default()
        .handle_type(handle_type)
        .handle(handle.as_raw_handle() as vk::HANDLE);
    let info = info.push_next(&mut import);
    // SAFETY: the chain is live and the handle open for the call; the caller vouches for the
    // rest.
    let memory = unsafe { device.allocate_memory(&info, None) };
    drop(handle);
    memory.map_err(vk_err(&format!("importing {what} (vkAllocateMemory)")))
}

/// A new NT handle of the timeline semaphore `semaphore` (each call makes another).
///
/// # Safety
/// `semaphore` is a live semaphore of `api`'s device, created exportable as an opaque Win32
/// handle.
pub(crate) unsafe fn export_semaphore(api: &SemaphoreApi, semaphore: vk::Semaphore) -> Result<OwnedHandle> {
    let info = vk::SemaphoreGetWin32HandleInfoKHR::default().semaphore(semaphore).handle_type(SEMAPHORE_HANDLE);
    // SAFETY: the caller vouches for the semaphore.
    let raw = unsafe { api.get_semaphore_win32_handle(&info) }
        .map_err(vk_err("vkGetSemaphoreWin32HandleKHR (opaque Win32 handle)"))?;
    owned(raw, "vkGetSemaphoreWin32HandleKHR")
}

/// Makes `semaphore` an import of `handle`, which is closed when the import is done.
///
/// # Safety
/// `semaphore` is a live, unused timeline semaphore of `api`'s device.
pub(crate) unsafe fn import_semaphore(api: &SemaphoreApi, semaphore: vk::Semaphore, handle: OwnedHandle) -> Result<()> {
    let info = vk::ImportSemaphoreWin32HandleInfoKHR::default()
        .semaphore(semaphore)
        .handle_type(SEMAPHORE_HANDLE)
        .handle(handle.as_raw_handle() as vk::HANDLE);
    // SAFETY: the caller vouches for the semaphore; the handle is open for the call, and an
    // NT handle's import does not take it.
    unsafe { api.import_semaphore_win32_handle(&info) }
        .map_err(vk_err("vkImportSemaphoreWin32HandleKHR (timeline, opaque Win32 handle)"))
}

/// CUDA does not import lava-flow's GPU memory on Windows.
pub(crate) fn cuda_memory_handle(_handle: &OwnedHandle) -> Result<(std::ffi::c_int, [u64; 2])> {
    Err(Error::Unsupported(
        "importing Vulkan memory into CUDA on Windows (cuImportExternalMemory with \
         CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_WIN32) is not built; copy between GPU buffers with \
         Vulkan there (LF_GPU_COPY=engine or shader)"
            .into(),
    ))
}

/// After a successful `cuImportExternalMemory` (never, here): CUDA keeps its own reference.
pub(crate) fn given_to_cuda(handle: OwnedHandle) {
    drop(handle);
}
