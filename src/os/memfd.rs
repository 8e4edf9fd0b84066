//! Anonymous shared-memory files (`memfd_create`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// Options for [`memfd_create`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemfdFlags {
    /// Back the file with hugetlbfs pages of this size (bytes, a power of two), or `None`
    /// for ordinary pages.
    pub huge_page_size: Option<usize>,
    /// Allow seals (`F_SEAL_*`) to be added later, e.g. to forbid shrinking.
    pub allow_sealing: bool,
}

/// Creates an anonymous memory file of `size` bytes, close-on-exec. `name` shows up in
/// `/proc/PID/fd` and `/proc/PID/maps` for debugging only.
pub fn memfd_create(name: &str, size: u64, flags: MemfdFlags) -> Result<OwnedFd> {
    let cname = CString::new(name.replace('\0', "")).expect("NULs were removed");
    let mut raw_flags = libc::MFD_CLOEXEC;
    if flags.allow_sealing {
        raw_flags |= libc::MFD_ALLOW_SEALING;
    }
    if let Some(page) = flags.huge_page_size {
        if !page.is_power_of_two() {
            return Err(Error::invalid(format!("huge page size {page} is not a power of two")));
        }
        // The page size goes into bits 26..31 as its log2 (MFD_HUGE_SHIFT).
        raw_flags |= libc::MFD_HUGETLB | (page.trailing_zeros() << libc::MFD_HUGE_SHIFT);
    }
    // SAFETY: cname is a valid NUL-terminated string; flags are plain integers.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), raw_flags) };
    if fd < 0 {
        return Err(Error::last_os(format!("memfd_create({name:?})")));
    }
    // SAFETY: fd was just returned by the kernel and is owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let size_i64 =
        i64::try_from(size).map_err(|_| Error::invalid(format!("memfd size {size} does not fit in off_t")))?;
    // SAFETY: fd is a valid memfd; ftruncate has no memory-safety preconditions.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size_i64) } != 0 {
        return Err(Error::last_os(format!("ftruncate(memfd {name:?}, {size} bytes)")));
    }
    Ok(fd)
}

/// The size of the file behind `fd`, from `fstat`.
pub fn fd_size(fd: &impl AsRawFd) -> Result<u64> {
    // SAFETY: zeroed stat is a valid out-buffer; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid, writable stat struct.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Error::last_os("fstat"));
    }
    Ok(st.st_size as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_sized_file() {
        let fd = memfd_create("lf-test", 12345, MemfdFlags::default()).unwrap();
        assert_eq!(fd_size(&fd).unwrap(), 12345);
    }

    #[test]
    fn rejects_bad_huge_page_size() {
        let flags = MemfdFlags { huge_page_size: Some(3 << 20), allow_sealing: false };
        assert!(matches!(memfd_create("x", 1 << 21, flags), Err(Error::InvalidArgument(_))));
    }
}
