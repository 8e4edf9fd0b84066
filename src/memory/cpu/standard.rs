//! Standard shareable memory: a sealed memfd mapped `MAP_SHARED`. Every other CPU strategy
//! starts from this and adds its own step (`mbind`, hugetlbfs, `mlock`).

use std::os::fd::{AsRawFd, OwnedFd};

use crate::error::{Error, Result};
use crate::os::{memfd_create, Mapping, MemfdFlags};

/// The prefix of every arena's memfd name (`/proc/PID/fd` shows `/memfd:lava-flow-arena`);
/// import checks it to tell lava-flow memory from any other memory file.
pub(crate) const ARENA_NAME: &str = "lava-flow-arena";

/// The seals every arena carries: its size is fixed for good, so an importer may trust
/// `fstat` and can never be made to fault (SIGBUS) by the exporter shrinking the file.
pub(crate) const ARENA_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Creates `size` bytes of shareable memory (hugetlbfs pages of `huge_page_size` when
/// given), sealed against resizing, and maps it. The memory is not touched.
pub(crate) fn create_shared_memory(size: usize, huge_page_size: Option<usize>) -> Result<(OwnedFd, Mapping)> {
    let flags = MemfdFlags { huge_page_size, allow_sealing: true };
    let fd = memfd_create(ARENA_NAME, size as u64, flags)?;
    // SAFETY: fd is a live memfd created with MFD_ALLOW_SEALING; F_ADD_SEALS takes an int.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, ARENA_SEALS) } != 0 {
        return Err(Error::last_os(format!("sealing a {size}-byte memory file")));
    }
    let mapping = Mapping::shared(&fd, 0, size)?;
    Ok((fd, mapping))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_memory_is_sealed_against_resizing() {
        let (fd, mapping) = create_shared_memory(1 << 16, None).unwrap();
        assert_eq!(mapping.len(), 1 << 16);
        // SAFETY: fd is live; ftruncate on a sealed file must fail, not resize it.
        let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) };
        assert_eq!(rc, -1);
        // SAFETY: as above.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        assert_eq!(seals & ARENA_SEALS, ARENA_SEALS);
    }
}
