//! Anonymous shared-memory files (`memfd_create`) and their seals.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{MemfdFlags as RawMemfdFlags, SealFlags};

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
    let mut raw_flags = RawMemfdFlags::CLOEXEC;
    if flags.allow_sealing {
        raw_flags |= RawMemfdFlags::ALLOW_SEALING;
    }
    if let Some(page) = flags.huge_page_size {
        if !page.is_power_of_two() {
            return Err(Error::invalid(format!("huge page size {page} is not a power of two")));
        }
        // The page size goes into bits 26..31 as its log2 (MFD_HUGE_SHIFT).
        raw_flags |= RawMemfdFlags::HUGETLB | RawMemfdFlags::from_bits_retain(page.trailing_zeros() << 26);
    }
    let fd = rustix::fs::memfd_create(name.replace('\0', ""), raw_flags)
        .map_err(|e| Error::os(format!("memfd_create({name:?})"), e.into()))?;
    rustix::fs::ftruncate(&fd, size)
        .map_err(|e| Error::os(format!("ftruncate(memfd {name:?}, {size} bytes)"), e.into()))?;
    Ok(fd)
}

/// The size of the file behind `fd`, from `fstat`.
pub fn fd_size(fd: &impl AsFd) -> Result<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::os("fstat", e.into()))?;
    Ok(st.st_size as u64)
}

/// The seals that forbid resizing a memfd, and adding or removing seals.
pub const RESIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// Adds `seals` to the memfd behind `fd` (`F_ADD_SEALS`; `what` names the file in the error).
/// The kernel refuses seals it does not know, such as `F_SEAL_FUTURE_WRITE` before Linux 5.1.
pub fn add_seals(fd: &impl AsFd, seals: SealFlags, what: &str) -> Result<()> {
    rustix::fs::fcntl_add_seals(fd, seals).map_err(|e| Error::os(format!("sealing {what}"), e.into()))
}

/// The seals on the file behind `fd` (`F_GET_SEALS`); `None` for a file without seal support.
pub fn seals(fd: &impl AsFd) -> Option<SealFlags> {
    rustix::fs::fcntl_get_seals(fd).ok()
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

    #[test]
    fn seals_stick_and_forbid_resizing() {
        let flags = MemfdFlags { huge_page_size: None, allow_sealing: true };
        let fd = memfd_create("lf-seal", 4096, flags).unwrap();
        add_seals(&fd, RESIZE_SEALS, "a test memfd").unwrap();
        assert!(seals(&fd).unwrap().contains(RESIZE_SEALS));
        assert!(rustix::fs::ftruncate(&fd, 8192).is_err());
        let unsealable = memfd_create("lf-noseal", 4096, MemfdFlags::default()).unwrap();
        assert!(add_seals(&unsealable, SealFlags::SHRINK, "a memfd without sealing").is_err());
    }
}
