//! GPU-pinned memory: shareable memory locked into RAM (`mlock`), so a GPU can DMA from it
//! without the pages moving. Each pinned arena is then registered with the GPU APIs present
//! (Vulkan external host memory, CUDA `cuMemHostRegister`: see `memory::gpu_context`), and
//! its buffers report those registrations ([`Buffer::registrations`](crate::memory::Buffer::registrations)).

use crate::error::{Error, Result};
use crate::os::Mapping;

/// A registration of a buffer's memory with a GPU API. Registrations cover the buffer's whole
/// arena and last as long as it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceRegistration {
    /// Imported into the context's Vulkan device with `VK_EXT_external_memory_host`: GPU
    /// copies read and write it directly, with no staging ([`Context::copy`](crate::memory::Context::copy)).
    Vulkan { device_uuid: [u8; 16] },
    /// Registered with CUDA (`cuMemHostRegister`, portable to every CUDA context) through
    /// the primary context of this CUDA device ordinal.
    Cuda { device: i32 },
}

impl DeviceRegistration {
    /// The `LF_REGISTRATION_*` bit of the registration's API.
    pub const fn flag(self) -> u32 {
        match self {
            DeviceRegistration::Vulkan { .. } => 1,
            DeviceRegistration::Cuda { .. } => 2,
        }
    }
}

/// Locks the whole mapping into RAM (which also faults every page in).
pub(crate) fn lock(mapping: &Mapping) -> Result<()> {
    // SAFETY: the range is exactly a live mapping this process owns.
    let Err(err) = (unsafe { crate::os::facts::lock_memory(mapping.as_ptr(), mapping.len()) }) else {
        return Ok(());
    };
    let len = mapping.len();
    match memlock_limit() {
        Some(limit) if crate::os::facts::lock_refused_by_limit(&err) => {
            let locked = locked_bytes().map_or_else(|| "an unknown number".into(), |b| b.to_string());
            Err(Error::PermissionDenied(format!(
                "locking {len} bytes for GPU-pinned memory was refused ({err}): RLIMIT_MEMLOCK is \
                 {limit} bytes and {locked} bytes are locked already; {MEMLOCK_FIX}"
            )))
        }
        _ => Err(Error::os(format!("mlock({len} bytes of GPU-pinned memory)"), err)),
    }
}

/// How to let a process lock more memory, as the error of a refused lock says it.
pub const MEMLOCK_FIX: &str = "raise the limit (`ulimit -l`, `memlock` in /etc/security/limits.conf, \
    `LimitMEMLOCK=` for systemd services) or give the process CAP_IPC_LOCK";

/// The soft RLIMIT_MEMLOCK in bytes (what `ulimit -l` shows, in KiB), or `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    crate::os::facts::memlock_limit()
}

/// Whether this process may lock memory beyond RLIMIT_MEMLOCK (it has CAP_IPC_LOCK, as root
/// usually has), as `CapEff` in /proc/self/status says.
pub fn has_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// `VmLck` of this process, in bytes.
pub fn locked_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmLck:"))?;
    let kb: u64 = line["VmLck:".len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}
