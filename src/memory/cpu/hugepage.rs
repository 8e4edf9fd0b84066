//! Huge-page memory: hugetlbfs through `memfd_create(MFD_HUGETLB)`, and the best-effort
//! fallback to transparent huge pages on ordinary shared memory.

use crate::os::OwnedHandle;

use super::standard::create_shared_memory;
use crate::error::{Error, Result};
use crate::memory::location::HugePageSize;
use crate::os::Mapping;

fn sysfs_dir(page: HugePageSize) -> String {
    format!("/sys/kernel/mm/hugepages/hugepages-{}", page.sysfs_name())
}

fn read_count(page: HugePageSize, file: &str) -> Option<u64> {
    std::fs::read_to_string(format!("{}/{file}", sysfs_dir(page))).ok()?.trim().parse().ok()
}

/// The kernel's pool of huge pages of one size, as sysfs tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePagePool {
    /// Pages reserved (`nr_hugepages`).
    pub total: u64,
    /// Reserved pages nobody uses yet (`free_hugepages`).
    pub free: u64,
}

/// The pool of huge pages of `page` size, or `None` where the kernel or CPU offers no pages of
/// that size.
pub fn hugepage_pool(page: HugePageSize) -> Option<HugePagePool> {
    if !std::path::Path::new(&sysfs_dir(page)).exists() {
        return None;
    }
    Some(HugePagePool {
        total: read_count(page, "nr_hugepages").unwrap_or(0),
        free: read_count(page, "free_hugepages").unwrap_or(0),
    })
}

/// The shell command that makes the kernel reserve `pages` huge pages of `page` size in all
/// (to be run as root): `echo 64 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`.
pub fn reserve_command(page: HugePageSize, pages: u64) -> String {
    format!("echo {pages} > {}/nr_hugepages", sysfs_dir(page))
}

/// The end of the strict policy's message when huge pages are short, dropped from the reason a
/// best-effort fallback gives (which took that advice already).
pub(crate) const BEST_EFFORT_HINT: &str = ", or choose the best-effort hugepage policy to fall back to ordinary pages";

/// Creates `size` bytes (a multiple of the page size) on hugetlbfs pages. Fails, saying how
/// to reserve pages, when the kernel has too few free ones: the pages are reserved when the
/// memory is mapped, so a buffer that was handed out never faults for lack of pages later.
pub(crate) fn create(size: usize, page: HugePageSize) -> Result<(OwnedHandle, Mapping)> {
    if !std::path::Path::new(&sysfs_dir(page)).exists() {
        return Err(Error::Unsupported(format!(
            "this kernel or CPU offers no {page} huge pages ({} is missing)",
            sysfs_dir(page)
        )));
    }
    create_shared_memory(size, Some(page.bytes())).map_err(|error| match error {
        Error::OutOfMemory(_) => {
            let free = read_count(page, "free_hugepages").unwrap_or(0);
            let total = read_count(page, "nr_hugepages").unwrap_or(0);
            let wanted = size.div_ceil(page.bytes());
            let also = if page == HugePageSize::Size2M { " (or /proc/sys/vm/nr_hugepages)" } else { "" };
            let command = reserve_command(page, total + (wanted as u64).saturating_sub(free));
            Error::OutOfMemory(format!(
                "{size} bytes of {page} huge pages need {wanted} free page(s), but {free} of the \
                 {total} reserved are free; reserve more as root with `{command}`{also}{BEST_EFFORT_HINT}"
            ))
        }
        other => other,
    })
}

/// Asks for transparent huge pages on a mapping (best-effort fallback). Whether the kernel
/// grants them for shared memory depends on
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` and on memory fragmentation, so no
/// page size beyond the base one is promised.
pub(crate) fn advise_transparent(mapping: &Mapping) {
    // SAFETY: the range is exactly a live mapping this process owns. An error (THP compiled
    // out) leaves base pages, which is what the buffer reports anyway.
    unsafe { crate::os::system::advise_huge_pages(mapping.as_ptr(), mapping.len()) };
}

/// The page size the kernel really uses for the mapping holding `addr`
/// (`KernelPageSize` in `/proc/self/smaps`), in bytes.
pub fn kernel_page_size_of(addr: *const u8) -> Result<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").map_err(|e| Error::os("reading /proc/self/smaps", e))?;
    let addr = addr as usize;
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) {
                inside = (start..end).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(rest) = line.strip_prefix("KernelPageSize:") {
                let kb: usize = rest.trim().trim_end_matches("kB").trim().parse().map_err(|_| Error::Io {
                    context: "parsing /proc/self/smaps".into(),
                    source: std::io::Error::other(format!("bad KernelPageSize line {line:?}")),
                })?;
                return Ok(kb * 1024);
            }
        }
    }
    Err(Error::NotFound(format!("no mapping holds address {addr:#x} in /proc/self/smaps")))
}

#[cfg(test)]
mod tests {
    use super::*;

    // /proc/self/smaps and hugetlbfs are Linux's.
    #[cfg(target_os = "linux")]
    #[test]
    fn ordinary_memory_reports_the_base_page() {
        let mapping = Mapping::anonymous(1 << 16).unwrap();
        let page = kernel_page_size_of(mapping.as_ptr()).unwrap();
        assert_eq!(page, crate::os::page_size());
        assert!(matches!(kernel_page_size_of(std::ptr::null()), Err(Error::NotFound(_))));
    }

    /// Windows gives large pages only with a privilege ordinary accounts lack: refused,
    /// saying so.
    #[cfg(windows)]
    #[test]
    fn huge_pages_are_refused_naming_the_privilege() {
        let page = HugePageSize::Size2M;
        match create(page.bytes(), page) {
            Err(Error::Unsupported(message)) => assert!(message.contains("privilege"), "{message}"),
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("huge pages were given without the lock-memory privilege"),
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn hugetlb_memory_is_backed_by_huge_pages_or_says_how_to_reserve() {
        let page = HugePageSize::Size2M;
        match create(page.bytes(), page) {
            Ok((_fd, mapping)) => {
                assert_eq!(kernel_page_size_of(mapping.as_ptr()).unwrap(), page.bytes());
            }
            Err(Error::OutOfMemory(message)) => assert!(message.contains("nr_hugepages"), "{message}"),
            Err(other) => panic!("unexpected error: {other}"),
        }
    }

    #[test]
    fn the_pool_is_read_from_sysfs_and_the_command_names_its_file() {
        match hugepage_pool(HugePageSize::Size2M) {
            Some(pool) => assert!(pool.free <= pool.total, "{pool:?}"),
            None => assert!(!std::path::Path::new(&sysfs_dir(HugePageSize::Size2M)).exists()),
        }
        assert_eq!(
            reserve_command(HugePageSize::Size1G, 2),
            "echo 2 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
        );
    }
}
