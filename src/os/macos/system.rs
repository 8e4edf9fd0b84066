//! Facts about the machine and this process that the memory layer asks for. macOS has no NUMA
//! interface and no transparent huge pages for shared memory: those are reported unsupported.

use crate::error::{Error, Result};

/// (RAM, RAM) in bytes, from `sysctl hw.memsize` (macOS's swap grows on demand and is not
/// counted); `None` if it does not tell.
pub fn memory_totals() -> Option<(u64, u64)> {
    let mut ram: u64 = 0;
    let mut len = std::mem::size_of::<u64>();
    // SAFETY: a NUL-terminated name, an out-buffer of `len` bytes, no new value.
    let rc = unsafe {
        libc::sysctlbyname(c"hw.memsize".as_ptr(), (&mut ram as *mut u64).cast(), &mut len, std::ptr::null_mut(), 0)
    };
    (rc == 0 && len == std::mem::size_of::<u64>()).then_some((ram, ram))
}

/// The kernel's list of the NUMA nodes with memory (`0-1,3`), from sysfs under `node_dir`
/// (`has_memory`, else `online`); `None` where it is not there to read.
pub fn numa_node_list(node_dir: &str) -> Option<String> {
    std::fs::read_to_string(format!("{node_dir}/has_memory"))
        .or_else(|_| std::fs::read_to_string(format!("{node_dir}/online")))
        .ok()
}

/// macOS does not tell a thread's NUMA node (its machines have one memory node).
pub fn current_numa_node() -> Option<u32> {
    None
}

/// Eight random bytes from the kernel (`getentropy`); `None` if it fails.
pub fn random_u64() -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: getentropy writes 8 bytes into the u64.
    let rc = unsafe { libc::getentropy((&mut value as *mut u64).cast(), 8) };
    (rc == 0).then_some(value)
}

/// NUMA binding is Linux-only (`mbind`).
///
/// # Safety
/// None needed here; the signature matches Linux's.
pub unsafe fn bind_to_node(_ptr: *mut u8, _len: usize, node: u32) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("binding memory to NUMA node {node} is Linux-only (mbind); macOS has no NUMA interface"),
    ))
}

/// The NUMA node of a page: Linux-only (`get_mempolicy`).
pub fn node_of_address(addr: *const u8) -> Result<i64> {
    Err(Error::Unsupported(format!(
        "the NUMA node of address {addr:p} is Linux-only (get_mempolicy); macOS has no NUMA interface"
    )))
}

/// Transparent huge pages for shared memory are Linux-only: nothing to do.
///
/// # Safety
/// None needed here; the signature matches Linux's.
pub unsafe fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

/// Why GPU memory cannot be shared between processes here: Vulkan on macOS is MoltenVK over
/// Metal, which exports no memory to other processes (no `VK_KHR_external_memory_fd`).
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
pub const GPU_MEMORY_UNSHARED: Option<&str> = Some(
    "GPU memory shared between processes is Linux-only: Vulkan on macOS (MoltenVK over Metal) exports no memory to \
     other processes; use CPU memory on macOS",
);
