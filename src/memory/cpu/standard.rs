//! Standard shareable memory: a sealed memfd mapped `MAP_SHARED`. Every other CPU strategy
//! starts from this and adds its own step (`mbind`, hugetlbfs, `mlock`).

use crate::os::OwnedHandle;

use crate::error::Result;
use crate::os::{shm, Mapping, ShmOptions};

/// The prefix of every arena's memfd name (`/proc/PID/fd` shows `/memfd:lava-flow-arena`);
/// import checks it to tell lava-flow memory from any other memory file.
pub(crate) const ARENA_NAME: &str = "lava-flow-arena";

/// Creates `size` bytes of shareable memory (hugetlbfs pages of `huge_page_size` when
/// given), its size fixed for good (so that an importer may trust `fstat` and can never be made
/// to fault, SIGBUS, by the exporter shrinking it), and maps it. The memory is not touched.
pub(crate) fn create_shared_memory(size: usize, huge_page_size: Option<usize>) -> Result<(OwnedHandle, Mapping)> {
    let options = ShmOptions { huge_page_size, sealable: true };
    let fd = shm::create(ARENA_NAME, size as u64, options)?;
    shm::fix_size(&fd, &format!("a {size}-byte memory file"))?;
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
        assert!(shm::size_is_fixed(&fd));
        // (A Windows section has no call that could resize it.)
        #[cfg(unix)]
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err(), "a fixed size cannot shrink");
        assert_eq!(shm::size_of(&fd).unwrap(), 1 << 16);
    }
}
