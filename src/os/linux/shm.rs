//! Shared memory: anonymous memory files (`memfd_create`) and their seals.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};

use crate::error::{Error, Result};
use crate::os::ShmOptions;

/// Creates an anonymous memory file of `size` bytes, close-on-exec. `name` shows up in
/// `/proc/PID/fd` and `/proc/PID/maps` for debugging only.
pub fn create(name: &str, size: u64, options: ShmOptions) -> Result<OwnedFd> {
    let mut raw_flags = MemfdFlags::CLOEXEC;
    if options.sealable {
        raw_flags |= MemfdFlags::ALLOW_SEALING;
    }
    if let Some(page) = options.huge_page_size {
        if !page.is_power_of_two() {
            return Err(Error::invalid(format!("huge page size {page} is not a power of two")));
        }
        // The page size goes into bits 26..31 as its log2 (MFD_HUGE_SHIFT).
        raw_flags |= MemfdFlags::HUGETLB | MemfdFlags::from_bits_retain(page.trailing_zeros() << 26);
    }
    let fd = rustix::fs::memfd_create(name.replace('\0', ""), raw_flags)
        .map_err(|e| Error::os(format!("memfd_create({name:?})"), e.into()))?;
    rustix::fs::ftruncate(&fd, size)
        .map_err(|e| Error::os(format!("ftruncate(memfd {name:?}, {size} bytes)"), e.into()))?;
    Ok(fd)
}

/// The size of the file behind `fd`, from `fstat`.
pub fn size_of(fd: &impl AsFd) -> Result<u64> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::os("fstat", e.into()))?;
    Ok(st.st_size as u64)
}

/// Whether `fd` is a shared-memory object of this kind: a memfd (`/proc/self/fd` names it
/// `/memfd:...`, and it is a regular file).
pub fn is_shm(fd: &impl AsFd) -> bool {
    let regular = rustix::fs::fstat(fd).is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file());
    regular && link_target(fd).starts_with("/memfd:")
}

/// Whether the shared-memory object behind `fd` was created with a name that starts with
/// `prefix` (its memfd name).
pub fn has_name_prefix(fd: &impl AsFd, prefix: &str) -> bool {
    link_target(fd).starts_with(&format!("/memfd:{prefix}"))
}

/// What `/proc/self/fd` names the file behind `fd`; empty if it cannot be read.
fn link_target(fd: &impl AsFd) -> String {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The size of the pages backing the object behind `fd`: a hugetlbfs memfd reports its huge
/// page size as its block size.
pub fn page_size_of(fd: &impl AsFd) -> Result<usize> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::os("fstat", e.into()))?;
    Ok(st.st_blksize as usize)
}

/// The seals that forbid resizing a memfd, and adding or removing seals.
const RESIZE_SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// Forbids resizing the memfd behind `fd` from now on, by anyone, and sealing it further
/// (`what` names it in the error). It must have been created sealable.
pub fn fix_size(fd: &impl AsFd, what: &str) -> Result<()> {
    add_seals(fd, RESIZE_SEALS, what)
}

/// Whether the file behind `fd` can never shrink (sealed so), whoever holds it: reading any
/// byte below its size can never fault.
pub fn size_is_fixed(fd: &impl AsFd) -> bool {
    seals(fd).is_some_and(|s| s.contains(SealFlags::SHRINK))
}

/// Forbids every writable use of the memfd behind `fd` from now on (`F_SEAL_FUTURE_WRITE`,
/// Linux 5.1): mappings made before keep writing, no new one can, nor can `write`. Returns a
/// handle to pass to peers (the same file). Call it before [`fix_size`], which forbids
/// further seals. `Unsupported` on older kernels.
pub fn read_only(fd: &impl AsFd, what: &str) -> Result<OwnedFd> {
    add_seals(fd, SealFlags::FUTURE_WRITE, what).map_err(|e| {
        Error::Unsupported(format!(
            "sealing {what} against writes needs F_SEAL_FUTURE_WRITE, which this kernel lacks (Linux 5.1): {e}"
        ))
    })?;
    fd.as_fd().try_clone_to_owned().map_err(|e| Error::os(format!("duplicating {what}"), e))
}

/// Adds `seals` to the memfd behind `fd` (`F_ADD_SEALS`; `what` names the file in the error).
/// The kernel refuses seals it does not know, such as `F_SEAL_FUTURE_WRITE` before Linux 5.1.
fn add_seals(fd: &impl AsFd, seals: SealFlags, what: &str) -> Result<()> {
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
        let fd = create("lf-test", 12345, ShmOptions::default()).unwrap();
        assert_eq!(size_of(&fd).unwrap(), 12345);
    }

    #[test]
    fn rejects_bad_huge_page_size() {
        let options = ShmOptions { huge_page_size: Some(3 << 20), sealable: false };
        assert!(matches!(create("x", 1 << 21, options), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_fixed_size_sticks_and_forbids_resizing() {
        let options = ShmOptions { huge_page_size: None, sealable: true };
        let fd = create("lf-seal", 4096, options).unwrap();
        assert!(!size_is_fixed(&fd));
        fix_size(&fd, "a test memfd").unwrap();
        assert!(size_is_fixed(&fd));
        assert!(seals(&fd).unwrap().contains(RESIZE_SEALS));
        assert!(rustix::fs::ftruncate(&fd, 8192).is_err());
        let unsealable = create("lf-noseal", 4096, ShmOptions::default()).unwrap();
        assert!(fix_size(&unsealable, "a memfd without sealing").is_err());
        assert!(!size_is_fixed(&unsealable));
    }
}
