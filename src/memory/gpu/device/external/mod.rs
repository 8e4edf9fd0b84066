//! How GPU memory and semaphores cross process boundaries on this platform: the one place
//! that chooses the OS handle Vulkan exports them as.
//!
//! - Linux (and any Unix): opaque file descriptors (`VK_KHR_external_memory_fd`,
//!   `VK_KHR_external_semaphore_fd`); Vulkan owns a descriptor it imported.
//! - Windows: opaque NT handles (`VK_KHR_external_memory_win32`,
//!   `VK_KHR_external_semaphore_win32`); an import leaves the handle with the caller, which
//!   closes it.
//!
//! Everything above names only what is re-exported here: the extension names, the handle-type
//! bits, the loaders, and the export and import calls. The handles themselves are the platform
//! layer's [`OwnedHandle`](crate::os::OwnedHandle), which the channel's stream carries.

#[cfg(unix)]
mod fd;
#[cfg(windows)]
mod win32;

#[cfg(unix)]
use fd as platform;
#[cfg(windows)]
use win32 as platform;

pub(crate) use platform::{
    cuda_memory_handle, export_memory, export_semaphore, given_to_cuda, import_memory, import_semaphore, lend,
    MemoryApi, SemaphoreApi, HANDLE_NAME, MEMORY_EXTENSION, MEMORY_HANDLE, SEMAPHORE_EXTENSION, SEMAPHORE_HANDLE,
};
