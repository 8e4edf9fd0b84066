//! What a handle received from a peer is, for the checks an importer makes before it maps
//! anything; and locking memory, and checking that a range is mapped, on Windows.

use std::os::windows::io::{AsHandle, AsRawHandle};

use windows_sys::Win32::Storage::FileSystem::{GetFileType, FILE_TYPE_CHAR, FILE_TYPE_DISK, FILE_TYPE_PIPE};
use windows_sys::Win32::System::Memory::{VirtualLock, VirtualQuery, MEMORY_BASIC_INFORMATION, MEM_COMMIT};

pub use crate::os::handle_facts::{HandleFacts, HandleKind};

/// The facts of `handle`.
pub fn facts(handle: &impl AsHandle) -> std::io::Result<HandleFacts> {
    if let Ok(size) = super::shm::size_of(handle) {
        return Ok(HandleFacts { identity: None, size, kind: HandleKind::Other, target: "a section".into() });
    }
    // SAFETY: GetFileType on any handle value at most answers FILE_TYPE_UNKNOWN.
    let kind = match unsafe { GetFileType(handle.as_handle().as_raw_handle()) } {
        FILE_TYPE_PIPE => HandleKind::Pipe,
        FILE_TYPE_DISK => HandleKind::RegularFile,
        FILE_TYPE_CHAR => HandleKind::CharDevice,
        _ => HandleKind::Other,
    };
    Ok(HandleFacts { identity: None, size: 0, kind, target: String::new() })
}

/// Locks `[ptr, ptr + len)` into the working set (`VirtualLock`), which also faults it in.
///
/// # Safety
/// The range must be mapped memory of this process.
pub unsafe fn lock_memory(ptr: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's range.
    if unsafe { VirtualLock(ptr.cast(), len) } != 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a failed [`lock_memory`] was refused by the working-set quota
/// (`ERROR_WORKING_SET_QUOTA`).
pub fn lock_refused_by_limit(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(windows_sys::Win32::Foundation::ERROR_WORKING_SET_QUOTA as i32)
}

/// The locked-memory limit: Windows bounds it by the working set's minimum
/// (`SetProcessWorkingSetSize`), which lava-flow does not read: `None`.
pub fn memlock_limit() -> Option<u64> {
    None
}

/// Checks that `[addr, addr + len)` is entirely committed memory of this process
/// (`VirtualQuery`); else the first address found not to be and why.
pub fn check_mapped(addr: usize, len: usize) -> Result<(), (usize, std::io::Error)> {
    let end = addr.saturating_add(len);
    let mut at = addr;
    while at < end {
        // SAFETY: zeroed is a valid MEMORY_BASIC_INFORMATION (integers and pointers).
        let mut info: MEMORY_BASIC_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: VirtualQuery reads no memory at `at`; `info` is writable for its size.
        let n = unsafe { VirtualQuery(at as *const _, &mut info, std::mem::size_of_val(&info)) };
        if n == 0 {
            return Err((at, std::io::Error::last_os_error()));
        }
        if info.State != MEM_COMMIT {
            return Err((at, std::io::Error::new(std::io::ErrorKind::InvalidInput, "not committed memory")));
        }
        at = info.BaseAddress as usize + info.RegionSize;
    }
    Ok(())
}

/// Closes a file descriptor a driver made: Windows drivers make handles, not POSIX file
/// descriptors, so there is never one to close.
#[allow(dead_code)]
pub fn close_foreign_fd(_fd: std::ffi::c_int) {}
