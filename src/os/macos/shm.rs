//! Shared memory: POSIX shared-memory objects (`shm_open`) under a unique name that is
//! unlinked at once, so that, like a memfd, the object lives only as long as its descriptors
//! and mappings. Their size cannot change after the first `ftruncate`, so there is nothing to
//! seal; a read-only descriptor of an unlinked object cannot be had.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::os::ShmOptions;

/// Creates a shared-memory object of `size` bytes, close-on-exec, that no name reaches.
/// `name` is for messages only (macOS keeps no name on an unlinked object).
pub fn create(name: &str, size: u64, options: ShmOptions) -> Result<OwnedFd> {
    if let Some(page) = options.huge_page_size {
        return Err(Error::Unsupported(format!(
            "{name}: huge pages of {page} bytes for shared memory are Linux-only (hugetlbfs); on macOS choose \
             ordinary pages"
        )));
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let fd = loop {
        // Names are at most 31 bytes here (PSHMNAMLEN).
        let unique = format!("/lf.{:x}.{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let c_name = CString::new(unique).expect("no NUL in a formatted name");
        // SAFETY: a NUL-terminated name; the mode is passed as the variadic unsigned int.
        let raw = unsafe {
            libc::shm_open(c_name.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600 as libc::c_uint)
        };
        if raw < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::AlreadyExists {
                // Left by a process of the same pid that died before its unlink: another name.
                continue;
            }
            return Err(Error::os(format!("shm_open for {name:?}"), err));
        }
        // SAFETY: a descriptor shm_open just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the name just created; the object lives on through `fd`.
        unsafe { libc::shm_unlink(c_name.as_ptr()) };
        break fd;
    };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| Error::os(format!("FD_CLOEXEC on the shared memory of {name:?}"), e.into()))?;
    rustix::fs::ftruncate(&fd, size)
        .map_err(|e| Error::os(format!("ftruncate(shared memory {name:?}, {size} bytes)"), e.into()))?;
    Ok(fd)
}

/// The size of the object behind `fd`, from `fstat`.
pub fn size_of(fd: &impl AsFd) -> Result<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::os("fstat", e.into()))?;
    Ok(st.st_size as u64)
}

/// The size of the pages backing a shared-memory object: the base page size (macOS has no
/// huge pages for them).
pub fn page_size_of(_fd: &impl AsFd) -> Result<usize> {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).map_err(|_| Error::last_os("sysconf(_SC_PAGESIZE)"))
}

/// Nothing to do: a shared-memory object's size is fixed by its first `ftruncate`.
pub fn fix_size(_fd: &impl AsFd, _what: &str) -> Result<()> {
    Ok(())
}

/// Whether `fd` is a POSIX shared-memory object, whose size can never change once set (a
/// regular file's could): reading any byte below its size can never fault.
pub fn size_is_fixed(fd: &impl AsFd) -> bool {
    is_shm(fd)
}

/// `proc_pidfdinfo`'s flavour that answers only for POSIX shared-memory descriptors.
const PROC_PIDFDPSHMINFO: libc::c_int = 8;

/// Whether `fd` is a POSIX shared-memory object (the kernel describes it as one).
pub fn is_shm(fd: &impl AsFd) -> bool {
    // Room for `struct pshm_fdinfo` (about 1.2 KiB), which the kernel fills.
    let mut info = [0u64; 256];
    // SAFETY: the buffer is live and its length is passed; the kernel writes within it.
    let n = unsafe {
        libc::proc_pidfdinfo(
            std::process::id() as libc::c_int,
            fd.as_fd().as_raw_fd(),
            PROC_PIDFDPSHMINFO,
            info.as_mut_ptr().cast(),
            std::mem::size_of_val(&info) as libc::c_int,
        )
    };
    n > 0
}

/// An unlinked object keeps no name to check: any shared-memory object passes.
pub fn has_name_prefix(fd: &impl AsFd, _prefix: &str) -> bool {
    is_shm(fd)
}

/// `Unsupported`: a read-only descriptor of a shared-memory object is opened by its name, and
/// the name is unlinked as the object is created.
pub fn read_only(_fd: &impl AsFd, what: &str) -> Result<OwnedFd> {
    Err(Error::Unsupported(format!(
        "{what}: a read-only handle of shared memory needs Linux's F_SEAL_FUTURE_WRITE; macOS unlinks the object's \
         name at creation, so no read-only descriptor can be opened later"
    )))
}
