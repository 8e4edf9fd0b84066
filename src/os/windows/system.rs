//! System facts on Windows: memory totals (`GlobalMemoryStatusEx`), the current NUMA node
//! (`GetCurrentProcessorNumberEx` + `GetNumaProcessorNodeEx`), random bytes
//! (`BCryptGenRandom`). NUMA binding and transparent huge pages are Linux-only.

use windows_sys::Win32::System::Kernel::PROCESSOR_NUMBER;
use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
use windows_sys::Win32::System::Threading::{GetCurrentProcessorNumberEx, GetNumaProcessorNodeEx};

use crate::error::{Error, Result};

/// (physical memory + page file, physical memory) in bytes, or `None` where the system will not
/// say.
pub fn memory_totals() -> Option<(u64, u64)> {
    // A zero total is no answer: Wine 8 keeps the last answer for a second, and a thread that
    // asks while another fills it in gets zeros (seen with layer 1's tests in parallel). Asked
    // again a moment later, it has the real one.
    for _ in 0..3 {
        let mut status =
            MEMORYSTATUSEX { dwLength: std::mem::size_of::<MEMORYSTATUSEX>() as u32, ..Default::default() };
        // SAFETY: a structure of the size its length field says.
        if unsafe { GlobalMemoryStatusEx(&mut status) } == 0 {
            return None;
        }
        if status.ullTotalPhys > 0 {
            // ullTotalPageFile is the commit limit: physical memory plus the page files.
            return Some((status.ullTotalPageFile.max(status.ullTotalPhys), status.ullTotalPhys));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    None
}

/// The NUMA nodes with memory, as the Linux kernel lists them: Windows has no such list for
/// lava-flow to bind by (see [`bind_to_node`]), so `None`, and all memory counts as node 0.
pub fn numa_node_list(_node_dir: &str) -> Option<String> {
    None
}

/// The NUMA node of the processor this thread runs on now.
pub fn current_numa_node() -> Option<u32> {
    let mut processor = PROCESSOR_NUMBER::default();
    // SAFETY: writes the structure it is given.
    unsafe { GetCurrentProcessorNumberEx(&mut processor) };
    let mut node = 0u16;
    // SAFETY: a processor number from above and a place for the node.
    if unsafe { GetNumaProcessorNodeEx(&processor, &mut node) } != 0 && node != u16::MAX {
        return Some(u32::from(node));
    }
    // Wine answers no node for a processor; a system whose highest node is 0 has one node.
    let mut highest = 0u32;
    // SAFETY: a place for the number.
    (unsafe { windows_sys::Win32::System::Threading::GetNumaHighestNodeNumber(&mut highest) } != 0 && highest == 0)
        .then_some(0)
}

/// This computer's DNS host name (`GetComputerNameExW`).
pub fn hostname() -> std::io::Result<String> {
    use windows_sys::Win32::System::SystemInformation::{ComputerNameDnsHostname, GetComputerNameExW};
    let mut buf = [0u16; 256];
    let mut len = buf.len() as u32;
    // SAFETY: the buffer holds `len` UTF-16 units, which the call is told.
    if unsafe { GetComputerNameExW(ComputerNameDnsHostname, buf.as_mut_ptr(), &mut len) } == 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(String::from_utf16_lossy(&buf[..(len as usize).min(buf.len())]))
}

/// Eight random bytes from the system's generator.
pub fn random_u64() -> Option<u64> {
    use windows_sys::Win32::Security::Cryptography::{BCryptGenRandom, BCRYPT_USE_SYSTEM_PREFERRED_RNG};
    let mut value = 0u64;
    // SAFETY: the buffer is the eight bytes of `value`; no algorithm handle with the flag.
    let status = unsafe {
        BCryptGenRandom(std::ptr::null_mut(), (&mut value as *mut u64).cast(), 8, BCRYPT_USE_SYSTEM_PREFERRED_RNG)
    };
    (status >= 0).then_some(value)
}

/// Binding memory to a NUMA node: `Unsupported` here (Windows places a view's pages by the
/// node its section was created for, `CreateFileMappingNumaW`, not per range afterwards).
///
/// # Safety
/// None needed; `unsafe` to match the other platforms, which take a raw range.
pub unsafe fn bind_to_node(_ptr: *mut u8, _len: usize, node: u32) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "binding memory to NUMA node {node} is Linux-only (mbind); on Windows a section's node is chosen when it \
             is created, which lava-flow does not do yet"
        ),
    ))
}

/// The NUMA node of an address: `Unsupported` here (no `get_mempolicy`; the working-set
/// query that could tell is not used).
pub fn node_of_address(addr: *const u8) -> Result<i64> {
    Err(Error::Unsupported(format!(
        "the NUMA node of address {addr:p} is Linux-only (get_mempolicy); Windows lava-flow does not query it"
    )))
}

/// Transparent huge pages do not exist on Windows (large pages need a privilege and are
/// allocated as such, never promoted): nothing to advise.
///
/// # Safety
/// None needed; `unsafe` to match the other platforms.
pub unsafe fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

/// Why GPU memory cannot be shared between processes here, if it cannot.
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
pub const GPU_MEMORY_UNSHARED: Option<&str> = Some(
    "GPU memory shared between processes is not built on Windows yet (Vulkan NT handles); use CPU memory on Windows",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_totals_random_bytes_and_the_node_are_known() {
        let (total, ram) = memory_totals().expect("GlobalMemoryStatusEx");
        assert!(ram > 0 && total >= ram);
        let (a, b) = (random_u64().unwrap(), random_u64().unwrap());
        assert_ne!(a, b, "two random values in a row");
        assert!(current_numa_node().is_some());
    }
}
