//! Facts about the machine and this process that the memory layer asks for: memory totals,
//! the current NUMA node, random bytes, NUMA binding and transparent huge pages.

use crate::error::Result;

/// (RAM plus swap, RAM) in bytes, from `sysinfo`; `None` if the kernel does not tell.
pub fn memory_totals() -> Option<(u64, u64)> {
    // SAFETY: zeroed sysinfo is a valid out-buffer.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: info is writable.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    let unit = u64::from(info.mem_unit.max(1));
    let ram = (info.totalram as u64).saturating_mul(unit);
    Some((ram.saturating_add((info.totalswap as u64).saturating_mul(unit)), ram))
}

/// The kernel's list of the NUMA nodes with memory (`0-1,3`), from sysfs under `node_dir`
/// (`has_memory`, else `online`); `None` where it is not there to read.
pub fn numa_node_list(node_dir: &str) -> Option<String> {
    std::fs::read_to_string(format!("{node_dir}/has_memory"))
        .or_else(|_| std::fs::read_to_string(format!("{node_dir}/online")))
        .ok()
}

/// The NUMA node of the CPU the calling thread is running on, if the kernel tells.
pub fn current_numa_node() -> Option<u32> {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: getcpu writes one unsigned int through each of the two valid pointers; the
    // third argument (tcache) is unused since Linux 2.6.24 and may be NULL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (rc == 0).then_some(node)
}

/// Eight random bytes from the kernel (`getrandom`); `None` without an entropy source.
pub fn random_u64() -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into the u64.
    let n = unsafe { libc::getrandom((&mut value as *mut u64).cast(), 8, 0) };
    (n == 8).then_some(value)
}

const MPOL_BIND: libc::c_int = 2;
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 2;

/// Binds the pages of `[ptr, ptr + len)` to NUMA node `node` (`mbind` with `MPOL_BIND`): where
/// they are allocated when first touched. The OS's error as it came (ENOSYS without NUMA).
///
/// # Safety
/// The range must be a mapping this process owns.
pub unsafe fn bind_to_node(ptr: *mut u8, len: usize, node: u32) -> std::io::Result<()> {
    let words = node as usize / 64 + 1;
    let mut mask = vec![0u64; words];
    mask[node as usize / 64] |= 1u64 << (node % 64);
    // SAFETY: the caller owns the range; the mask holds `words` 64-bit words and maxnode
    // tells the kernel to read no more (it counts maxnode - 1 bits).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            (words * 64 + 1) as libc::c_ulong,
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The NUMA node of the page holding `addr` (`get_mempolicy` with `MPOL_F_NODE |
/// MPOL_F_ADDR`); the page is faulted in if it was not yet. The kernel checks the address.
pub fn node_of_address(addr: *const u8) -> Result<i64> {
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is a valid out-int; no nodemask is asked for (NULL, maxnode 0); the
    // kernel validates `addr` and fails with EFAULT if it is not mapped.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if rc != 0 {
        return Err(crate::error::Error::last_os(format!("get_mempolicy(node of address {addr:p})")));
    }
    Ok(i64::from(node))
}

/// Asks for transparent huge pages on `[ptr, ptr + len)` (`MADV_HUGEPAGE`), best effort: an
/// error (THP compiled out) leaves base pages.
///
/// # Safety
/// The range must be a mapping this process owns.
pub unsafe fn advise_huge_pages(ptr: *mut u8, len: usize) {
    // SAFETY: the caller owns the range; madvise only changes the kernel's paging policy.
    unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
}

/// Why GPU memory cannot be shared between processes here, if it cannot: Linux's drivers
/// export it as descriptors (`VK_KHR_external_memory_fd`), so it can.
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
pub const GPU_MEMORY_UNSHARED: Option<&str> = None;
