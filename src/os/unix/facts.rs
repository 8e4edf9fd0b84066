//! What a descriptor received from a peer is, for the checks an importer makes before it
//! maps anything: `fstat`, and on Linux the name `/proc/self/fd` gives it.

use std::os::fd::{AsFd, AsRawFd};

pub use crate::os::handle_facts::{HandleFacts, HandleKind};

/// The facts of `fd`, or why `fstat` could not tell them.
pub fn facts(fd: &impl AsFd) -> std::io::Result<HandleFacts> {
    let fd = fd.as_fd();
    // SAFETY: zeroed stat is a valid out-buffer; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open (borrowed); st is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFSOCK => HandleKind::Socket,
        libc::S_IFIFO => HandleKind::Pipe,
        libc::S_IFDIR => HandleKind::Directory,
        libc::S_IFCHR => HandleKind::CharDevice,
        libc::S_IFBLK => HandleKind::BlockDevice,
        libc::S_IFREG => HandleKind::RegularFile,
        _ => HandleKind::Other,
    };
    let size = if st.st_size > 0 {
        st.st_size as u64
    } else {
        // SAFETY: lseek on a borrowed fd; it moves only this descriptor's offset, which
        // nothing else uses (imports map, they do not read).
        u64::try_from(unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_END) }).unwrap_or(0)
    };
    #[allow(clippy::unnecessary_cast)] // st_dev is 32 bits on macOS
    Ok(HandleFacts { identity: Some((st.st_dev as u64, st.st_ino as u64)), size, kind, target })
}

/// Locks `[ptr, ptr + len)` into RAM (`mlock`), which also faults every page in.
///
/// # Safety
/// The range must be mapped memory of this process.
pub unsafe fn lock_memory(ptr: *mut u8, len: usize) -> std::io::Result<()> {
    // SAFETY: the caller's range.
    if unsafe { libc::mlock(ptr.cast(), len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a failed [`lock_memory`] was refused by the locked-memory limit (rather than
/// failing for another reason).
pub fn lock_refused_by_limit(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM))
}

/// The soft `RLIMIT_MEMLOCK` in bytes (what `ulimit -l` shows, in KiB), or `None` when
/// unlimited.
pub fn memlock_limit() -> Option<u64> {
    // SAFETY: zeroed rlimit is a valid out-buffer for getrlimit.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: limit is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return None;
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Checks that `[addr, addr + len)` is entirely mapped memory of this process (`mincore`
/// fails with ENOMEM on unmapped pages); else the first address found unmapped and why.
pub fn check_mapped(addr: usize, len: usize) -> Result<(), (usize, std::io::Error)> {
    let page = super::mapping::page_size();
    let start = addr & !(page - 1);
    let end = (addr + len).div_ceil(page) * page;
    const CHUNK_PAGES: usize = 4096;
    let mut residency = vec![0u8; CHUNK_PAGES];
    let mut at = start;
    while at < end {
        let chunk = (end - at).min(CHUNK_PAGES * page);
        // SAFETY: `at` is page-aligned; mincore writes one byte per page of `chunk` into
        // `residency`, which holds CHUNK_PAGES bytes.
        if unsafe { libc::mincore(at as *mut libc::c_void, chunk, residency.as_mut_ptr().cast()) } != 0 {
            return Err((at, std::io::Error::last_os_error()));
        }
        at += chunk;
    }
    Ok(())
}

/// Closes a file descriptor a driver made (CUDA's POSIX-fd export).
pub fn close_foreign_fd(fd: std::ffi::c_int) {
    use std::os::fd::FromRawFd;
    // SAFETY: a new fd the driver made for the caller, owned by nothing else.
    drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
}
