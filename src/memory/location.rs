//! [`MemoryLocation`]: what kind of memory a buffer is, and where it lives.

use std::fmt;

use crate::error::{Error, Result};

/// The huge page sizes x86_64 Linux offers for `MFD_HUGETLB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HugePageSize {
    /// 2 MiB pages (`/sys/kernel/mm/hugepages/hugepages-2048kB`).
    Size2M,
    /// 1 GiB pages (`/sys/kernel/mm/hugepages/hugepages-1048576kB`).
    Size1G,
}

impl HugePageSize {
    pub fn bytes(self) -> usize {
        match self {
            HugePageSize::Size2M => 2 << 20,
            HugePageSize::Size1G => 1 << 30,
        }
    }

    /// The name the kernel gives the size in sysfs (`2048kB`, `1048576kB`).
    pub(crate) fn sysfs_name(self) -> String {
        format!("{}kB", self.bytes() / 1024)
    }
}

impl fmt::Display for HugePageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HugePageSize::Size2M => "2 MiB",
            HugePageSize::Size1G => "1 GiB",
        })
    }
}

/// Where a buffer's memory lives: the seed's matrix of CPU strategies and GPU memory types.
///
/// When asking for memory it is the request; on a [`Buffer`](super::Buffer) it is what was
/// really obtained (a NUMA request names the node it got; a best-effort hugepage request that
/// fell back reports `CpuStandard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocation {
    /// Ordinary pageable host memory, shareable with local peers.
    CpuStandard,
    /// Host memory bound to one NUMA node; `None` asks for the calling thread's node.
    CpuNuma { node: Option<u32> },
    /// Host memory backed by huge pages (hugetlbfs), for large and remote (MPI) buffers.
    CpuHugepage { page: HugePageSize },
    /// Locked (`mlock`ed) host memory, for CPU -> GPU staging without page faults.
    CpuGpuPinned,
    /// GPU memory only the device reaches (Vulkan `DEVICE_LOCAL`).
    GpuDeviceLocal,
    /// GPU memory the host can map (Vulkan `HOST_VISIBLE`).
    GpuHostVisible,
    /// CUDA memory the application allocated (`cudaMalloc`, a CUDA memory pool, CUDA VMM,
    /// managed memory) and registered ([`Context::register`](super::Context::register)), of
    /// the CUDA device of this ordinal (as CUDA numbers devices in this process). The host
    /// cannot read or write it through lava-flow; lava-flow never allocates it.
    CudaDevice { ordinal: i32 },
}

/// Wire and C codes of the locations (`LF_MEMORY_*`). Stable: they travel in export handles.
pub mod code {
    pub const CPU_STANDARD: u32 = 1;
    pub const CPU_NUMA: u32 = 2;
    pub const CPU_HUGEPAGE_2MB: u32 = 3;
    pub const CPU_HUGEPAGE_1GB: u32 = 4;
    pub const CPU_GPU_PINNED: u32 = 5;
    pub const GPU_DEVICE_LOCAL: u32 = 6;
    pub const GPU_HOST_VISIBLE: u32 = 7;
    pub const CUDA_DEVICE: u32 = 8;
}

impl MemoryLocation {
    /// Whether this is lava-flow's GPU memory (its Vulkan device's), not CUDA memory of the
    /// application's.
    pub fn is_gpu(self) -> bool {
        matches!(self, MemoryLocation::GpuDeviceLocal | MemoryLocation::GpuHostVisible)
    }

    /// Whether this is CUDA memory of the application's.
    pub fn is_cuda(self) -> bool {
        matches!(self, MemoryLocation::CudaDevice { .. })
    }

    /// Whether this is device memory of any kind (lava-flow's GPU memory or the
    /// application's CUDA memory): one test for what is not plain host memory.
    #[inline]
    pub fn is_device(self) -> bool {
        matches!(
            self,
            MemoryLocation::GpuDeviceLocal | MemoryLocation::GpuHostVisible | MemoryLocation::CudaDevice { .. }
        )
    }

    /// The `LF_MEMORY_*` code of this location (the NUMA node travels separately).
    pub fn code(self) -> u32 {
        match self {
            MemoryLocation::CpuStandard => code::CPU_STANDARD,
            MemoryLocation::CpuNuma { .. } => code::CPU_NUMA,
            MemoryLocation::CpuHugepage { page: HugePageSize::Size2M } => code::CPU_HUGEPAGE_2MB,
            MemoryLocation::CpuHugepage { page: HugePageSize::Size1G } => code::CPU_HUGEPAGE_1GB,
            MemoryLocation::CpuGpuPinned => code::CPU_GPU_PINNED,
            MemoryLocation::GpuDeviceLocal => code::GPU_DEVICE_LOCAL,
            MemoryLocation::GpuHostVisible => code::GPU_HOST_VISIBLE,
            MemoryLocation::CudaDevice { .. } => code::CUDA_DEVICE,
        }
    }

    /// The location for an `LF_MEMORY_*` code and an optional NUMA node (used by
    /// `CPU_NUMA` only; the other codes refuse a node). Unknown codes are an error naming
    /// the value, never a guess.
    pub fn from_code(value: u32, node: Option<u32>) -> Result<Self> {
        let location = match value {
            code::CPU_STANDARD => MemoryLocation::CpuStandard,
            code::CPU_NUMA => return Ok(MemoryLocation::CpuNuma { node }),
            code::CPU_HUGEPAGE_2MB => MemoryLocation::CpuHugepage { page: HugePageSize::Size2M },
            code::CPU_HUGEPAGE_1GB => MemoryLocation::CpuHugepage { page: HugePageSize::Size1G },
            code::CPU_GPU_PINNED => MemoryLocation::CpuGpuPinned,
            code::GPU_DEVICE_LOCAL => MemoryLocation::GpuDeviceLocal,
            code::GPU_HOST_VISIBLE => MemoryLocation::GpuHostVisible,
            code::CUDA_DEVICE => {
                return Err(Error::invalid(
                    "CUDA memory (LF_MEMORY_CUDA_DEVICE) is not allocated by lava-flow: allocate it with CUDA \
                     and register it (lf_register), or allocate GPU memory of lava-flow's \
                     (LF_MEMORY_GPU_DEVICE_LOCAL)",
                ))
            }
            other => {
                return Err(Error::invalid(format!(
                    "unknown memory location value {other}; valid values are {}..={} (LF_MEMORY_*)",
                    code::CPU_STANDARD,
                    code::GPU_HOST_VISIBLE
                )))
            }
        };
        if let Some(node) = node {
            return Err(Error::invalid(format!(
                "a NUMA node ({node}) was given for {location}, which is not NUMA-bound memory"
            )));
        }
        Ok(location)
    }

    /// The NUMA node a `CpuNuma` location names.
    pub fn numa_node(self) -> Option<u32> {
        match self {
            MemoryLocation::CpuNuma { node } => node,
            _ => None,
        }
    }
}

impl fmt::Display for MemoryLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLocation::CpuStandard => f.write_str("CPU standard memory"),
            MemoryLocation::CpuNuma { node: Some(node) } => write!(f, "CPU memory on NUMA node {node}"),
            MemoryLocation::CpuNuma { node: None } => f.write_str("CPU memory on the local NUMA node"),
            MemoryLocation::CpuHugepage { page } => write!(f, "CPU memory on {page} huge pages"),
            MemoryLocation::CpuGpuPinned => f.write_str("GPU-pinned (locked) CPU memory"),
            MemoryLocation::GpuDeviceLocal => f.write_str("GPU device-local memory"),
            MemoryLocation::GpuHostVisible => f.write_str("GPU host-visible memory"),
            MemoryLocation::CudaDevice { ordinal } => write!(f, "CUDA memory of CUDA device {ordinal}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_values_are_named() {
        for location in [
            MemoryLocation::CpuStandard,
            MemoryLocation::CpuNuma { node: Some(3) },
            MemoryLocation::CpuNuma { node: None },
            MemoryLocation::CpuHugepage { page: HugePageSize::Size2M },
            MemoryLocation::CpuHugepage { page: HugePageSize::Size1G },
            MemoryLocation::CpuGpuPinned,
            MemoryLocation::GpuDeviceLocal,
            MemoryLocation::GpuHostVisible,
        ] {
            let back = MemoryLocation::from_code(location.code(), location.numa_node()).unwrap();
            assert_eq!(back, location);
        }
        let err = MemoryLocation::from_code(99, None).unwrap_err();
        assert!(err.to_string().contains("unknown memory location value 99"), "{err}");
        let err = MemoryLocation::from_code(code::CPU_STANDARD, Some(1)).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        // CUDA memory is registered, never allocated or imported by code.
        let cuda = MemoryLocation::CudaDevice { ordinal: 1 };
        assert_eq!(cuda.code(), code::CUDA_DEVICE);
        assert!(cuda.is_cuda() && cuda.is_device() && !cuda.is_gpu());
        assert_eq!(cuda.to_string(), "CUDA memory of CUDA device 1");
        let err = MemoryLocation::from_code(code::CUDA_DEVICE, None).unwrap_err();
        assert!(err.to_string().contains("register it (lf_register)"), "{err}");
    }
}
