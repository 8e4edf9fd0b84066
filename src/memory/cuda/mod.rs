//! CUDA memory the application allocated, recognised by its address: one
//! `cuPointerGetAttributes` call says whether an address is CUDA device memory, which
//! allocation holds it and how it was allocated ([`CudaMemoryKind`]), which decides how a peer
//! can reach it later.
//!
//! Nothing here loads the CUDA driver: a process that has not loaded `libcuda.so.1` has no
//! CUDA memory, so [`recognise`] answers "not CUDA memory" for it without initialising CUDA
//! (which would cost the application GPU memory and time).

use std::fmt;

use lava_flow_cuda::sys::{
    CUmemAllocationProp, CUmemLocation, CU_MEMORYTYPE_DEVICE, CU_MEM_ALLOCATION_TYPE_PINNED,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_CONTEXT,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
    CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
};
use lava_flow_cuda::Driver;

use crate::error::Result;

mod copy;
mod span;
pub(crate) use copy::copy_to_host;
pub(crate) use span::{is_span, pieces_of, span_from, Piece, MAX_PIECES};

/// How CUDA memory was allocated: what decides how another process can reach it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaMemoryKind {
    /// `cudaMalloc`/`cuMemAlloc` memory (PyTorch's and CuPy's default allocators): no
    /// shareable handle, only legacy CUDA IPC handles, which only CUDA consumers open.
    Legacy,
    /// CUDA VMM memory (`cuMemCreate`) made with POSIX file descriptor handles (PyTorch under
    /// `expandable_segments:True`): each piece exports an fd that CUDA and Vulkan import.
    Vmm,
    /// Memory of a CUDA memory pool (`cudaMallocAsync`) whose pool exports POSIX fds.
    Pool,
    /// Managed (unified) memory (`cudaMallocManaged`).
    Managed,
    /// Any other CUDA device memory: a VMM allocation without fd handles, a pool without IPC.
    Other,
}

impl CudaMemoryKind {
    /// Every kind, in the order of their codes.
    pub const ALL: [CudaMemoryKind; 5] = [
        CudaMemoryKind::Legacy,
        CudaMemoryKind::Vmm,
        CudaMemoryKind::Pool,
        CudaMemoryKind::Managed,
        CudaMemoryKind::Other,
    ];

    /// The kind's C code (`LF_CUDA_KIND_*`).
    pub fn code(self) -> u32 {
        match self {
            CudaMemoryKind::Legacy => 1,
            CudaMemoryKind::Vmm => 2,
            CudaMemoryKind::Pool => 3,
            CudaMemoryKind::Managed => 4,
            CudaMemoryKind::Other => 5,
        }
    }
}

impl fmt::Display for CudaMemoryKind {
    /// In words, naming the allocator: "cudaMalloc memory".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CudaMemoryKind::Legacy => "cudaMalloc memory",
            CudaMemoryKind::Vmm => "CUDA VMM memory with fd handles",
            CudaMemoryKind::Pool => "memory of a CUDA memory pool that exports fds",
            CudaMemoryKind::Managed => "CUDA managed memory",
            CudaMemoryKind::Other => "CUDA memory without a handle other processes can open",
        })
    }
}

/// A CUDA device pointer recognised: the allocation that holds it and what it is.
///
/// The range is the allocation: for `cudaMalloc` memory the whole `cudaMalloc` (a caching
/// allocator's segment, holding many tensors); for VMM memory the one piece (`cuMemCreate`
/// handle) mapped there. The driver reports the whole contiguously mapped span of a VMM
/// reservation as the range of any pointer in it (as PyTorch's expandable segments grow by
/// 2 MiB or 20 MiB pieces), but each piece has a `BUFFER_ID` of its own: the piece is found
/// within the span by its id, and is an allocation of its own. A tensor that straddles pieces
/// mapped back to back is registered as the span of the pieces it covers (see `span`): its
/// `buffer_id` is then the span's id, which changes when any of its pieces is re-created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaPointer {
    pub kind: CudaMemoryKind,
    /// The allocation's first byte (a device address).
    pub base: u64,
    /// The allocation's size in bytes.
    pub size: usize,
    /// CUDA's id of the allocation (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): unique in the process,
    /// new when memory is re-created at the same address, so that (base, id) names one
    /// allocation for good. For a span of VMM pieces, the span's id (top bit set), which
    /// mixes every piece's and changes when any of them is re-created.
    pub buffer_id: u64,
    /// The CUDA device's ordinal in this process.
    pub device_ordinal: i32,
    /// The CUDA context it was allocated in, as an address; 0 where it has none (VMM memory,
    /// or where the driver does not say).
    pub context: usize,
}

impl CudaPointer {
    /// Whether `[addr, addr + len)` lies inside the allocation.
    pub fn holds(&self, addr: u64, len: usize) -> bool {
        addr >= self.base && addr.checked_add(len as u64).is_some_and(|end| end <= self.base + self.size as u64)
    }
}

/// What one `cuPointerGetAttributes` call says of an address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PointerAttributes {
    pub memory_type: u32,
    pub is_managed: bool,
    pub legacy_ipc_capable: bool,
    pub allowed_handle_types: u64,
    pub mempool: u64,
    pub range_start: u64,
    pub range_size: u64,
    pub buffer_id: u64,
    pub device_ordinal: i32,
    pub context: u64,
}

/// The kind of memory the attributes describe; `None` for memory that is not CUDA device
/// memory (host memory, registered or pinned with CUDA or not). `pool_exports_fds` is asked
/// only for memory of a pool, with the pool's handle.
pub(crate) fn classify(
    attributes: &PointerAttributes,
    pool_exports_fds: impl FnOnce(u64) -> bool,
) -> Option<CudaMemoryKind> {
    // Managed memory reads as host or device memory depending on where it lives now.
    if attributes.is_managed {
        return Some(CudaMemoryKind::Managed);
    }
    if attributes.memory_type != CU_MEMORYTYPE_DEVICE {
        return None;
    }
    let fd_handles = attributes.allowed_handle_types & u64::from(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    Some(if attributes.mempool != 0 {
        if fd_handles || pool_exports_fds(attributes.mempool) {
            CudaMemoryKind::Pool
        } else {
            CudaMemoryKind::Other
        }
    } else if fd_handles {
        CudaMemoryKind::Vmm
    } else if attributes.legacy_ipc_capable && attributes.allowed_handle_types == 0 {
        CudaMemoryKind::Legacy
    } else {
        CudaMemoryKind::Other
    })
}

/// The attributes of `addr`, in one call. Where the driver refuses the context attribute
/// (for memory of no context), they are asked again without it.
fn query(driver: &Driver, addr: u64) -> Result<PointerAttributes> {
    const ASKED: [u32; 9] = [
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let mut with_context = [0; 10];
    with_context[..9].copy_from_slice(&ASKED);
    with_context[9] = CU_POINTER_ATTRIBUTE_CONTEXT;
    let (values, context) = match driver.pointer_attributes(addr, with_context) {
        Ok(values) => (values[..9].try_into().expect("nine"), values[9]),
        Err(e) => {
            log::debug!("{e}; asking again without the context");
            (driver.pointer_attributes(addr, ASKED)?, 0)
        }
    };
    let values: [u64; 9] = values;
    Ok(PointerAttributes {
        memory_type: values[0] as u32,
        is_managed: values[1] as u32 != 0,
        legacy_ipc_capable: values[2] as u32 != 0,
        allowed_handle_types: values[3],
        mempool: values[4],
        range_start: values[5],
        range_size: values[6],
        buffer_id: values[7],
        device_ordinal: values[8] as u32 as i32,
        context,
    })
}

/// Whether the memory pool `pool` exports POSIX fds: it does if an export succeeds (the fd
/// made is closed at once).
fn pool_exports_fds(driver: &Driver, pool: u64) -> bool {
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: `pool` is the pool handle the driver gave for a live allocation; for POSIX fds
    // the out-value is an int.
    let exported = unsafe {
        driver.mem_pool_export_to_shareable_handle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            pool as usize as *mut std::ffi::c_void,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    if exported.is_ok() && fd >= 0 {
        crate::os::facts::close_foreign_fd(fd);
    }
    exported.is_ok()
}

/// The CUDA allocation holding `addr`, if `addr` is CUDA device memory of this process;
/// `None` for any other address, and, without asking anything, in a process that has not
/// loaded the CUDA driver (or where `LF_DISABLE_CUDA=1`), or whose driver cannot be
/// initialised (no device visible: no CUDA memory either). Errors: the driver refuses the
/// query.
pub fn recognise(addr: *const u8) -> Result<Option<CudaPointer>> {
    if lava_flow_cuda::disabled() || !lava_flow_cuda::is_loaded() {
        return Ok(None);
    }
    let driver = match lava_flow_cuda::driver() {
        Ok(driver) => driver,
        Err(why) => {
            log::debug!("{addr:p} is taken for host memory: {why}");
            return Ok(None);
        }
    };
    vmm_piece_at(driver, addr as u64)
}

/// The CUDA allocation holding `addr` (for VMM memory: the piece), asked of `driver`.
fn vmm_piece_at(driver: &Driver, addr: u64) -> Result<Option<CudaPointer>> {
    let attributes = query(driver, addr)?;
    let Some(kind) = classify(&attributes, |pool| pool_exports_fds(driver, pool)) else { return Ok(None) };
    let (mut base, mut size) = (attributes.range_start, attributes.range_size as usize);
    if base == 0 || size == 0 {
        // SAFETY: valid out-pointers; the driver looks the address up.
        unsafe { driver.mem_get_address_range(&mut base, &mut size, addr) }
            .map_err(|e| e.context(format!("cuMemGetAddressRange of {addr:#x}")))?;
    }
    if matches!(kind, CudaMemoryKind::Vmm) {
        (base, size) = vmm_piece(driver, addr, &attributes, (base, size))?;
    }
    Ok(Some(CudaPointer {
        kind,
        base,
        size,
        buffer_id: attributes.buffer_id,
        device_ordinal: attributes.device_ordinal,
        context: attributes.context as usize,
    }))
}

/// The VMM piece (one `cuMemCreate` handle's mapping) holding `addr`, inside the `range` the
/// driver reports: the contiguously mapped span around it, which may hold several pieces
/// mapped side by side (PyTorch's expandable segments), each with a `BUFFER_ID` of its own.
/// Pieces are mapped at multiples of the allocation granularity, so the piece is the run of
/// granularity steps around `addr` with its `BUFFER_ID`.
fn vmm_piece(driver: &Driver, addr: u64, attributes: &PointerAttributes, range: (u64, usize)) -> Result<(u64, usize)> {
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: attributes.device_ordinal },
        ..Default::default()
    };
    let mut granularity = 0usize;
    // SAFETY: valid out-pointer and properties.
    unsafe { driver.mem_get_allocation_granularity(&mut granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) }
        .map_err(|e| e.context("cuMemGetAllocationGranularity of VMM memory with POSIX fd handles"))?;
    let (start, end) = (range.0, range.0 + range.1 as u64);
    if granularity == 0 || range.1 <= granularity {
        return Ok(range);
    }
    let step = granularity as u64;
    let id = attributes.buffer_id;
    let same = |at: u64| -> Result<bool> {
        let [found] = driver.pointer_attributes(at, [CU_POINTER_ATTRIBUTE_BUFFER_ID])?;
        Ok(found == id)
    };
    let mut low = start + (addr - start) / step * step;
    while low > start && same(low - step)? {
        low -= step;
    }
    let mut high = low + step;
    while high < end && same(high)? {
        high += step;
    }
    Ok((low, (high.min(end) - low) as usize))
}

/// Why an address that is not mapped host memory could not be recognised as CUDA memory
/// either, and what to do: for messages. Loads nothing.
pub(crate) fn why_not_recognised() -> String {
    if lava_flow_cuda::disabled() {
        return format!(
            "no CUDA driver was used to recognise it as CUDA memory: {}=1 keeps lava-flow from loading one \
             (unset it to register CUDA memory)",
            lava_flow_cuda::DISABLE_CUDA_ENV
        );
    }
    if !lava_flow_cuda::is_loaded() {
        return format!(
            "no CUDA driver was found in this process ({} is not loaded), so it cannot be CUDA memory \
             lava-flow recognises: register mapped host memory, or CUDA memory of a process that uses CUDA \
             (with the NVIDIA driver installed)",
            lava_flow_cuda::LIBRARY
        );
    }
    match lava_flow_cuda::driver() {
        Err(e) => format!("the CUDA driver could not be used to recognise it as CUDA memory: {e}"),
        Ok(_) => "nor is it CUDA device memory (the CUDA driver does not know the address)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(allowed: u64, legacy: bool, pool: u64) -> PointerAttributes {
        PointerAttributes {
            memory_type: CU_MEMORYTYPE_DEVICE,
            legacy_ipc_capable: legacy,
            allowed_handle_types: allowed,
            mempool: pool,
            range_start: 0x7f00_0000_0000,
            range_size: 2 << 20,
            buffer_id: 7,
            ..PointerAttributes::default()
        }
    }

    /// Each allocator's attributes as the H200 host reported them (`reference/cuda-vmm`).
    #[test]
    fn each_allocation_kind_is_recognised_from_its_attributes() {
        let never = |_| panic!("asked of memory of no pool");
        // cudaMalloc: IS_LEGACY_CUDA_IPC_CAPABLE=1, ALLOWED_HANDLE_TYPES=0.
        assert_eq!(classify(&device(0, true, 0), never), Some(CudaMemoryKind::Legacy));
        // cuMemCreate with POSIX fds: ALLOWED_HANDLE_TYPES has bit 1, no legacy IPC.
        assert_eq!(classify(&device(1, false, 0), never), Some(CudaMemoryKind::Vmm));
        assert_eq!(classify(&device(1 | 8, false, 0), never), Some(CudaMemoryKind::Vmm));
        // cuMemCreate without handles, or with other handle types only.
        assert_eq!(classify(&device(0, false, 0), never), Some(CudaMemoryKind::Other));
        assert_eq!(classify(&device(8, false, 0), never), Some(CudaMemoryKind::Other));
        // A pool: by its export, or by the handle types its memory reports.
        assert_eq!(classify(&device(0, false, 0xabc), |pool| pool == 0xabc), Some(CudaMemoryKind::Pool));
        assert_eq!(classify(&device(0, false, 0xabc), |_| false), Some(CudaMemoryKind::Other));
        assert_eq!(classify(&device(1, false, 0xabc), |_| false), Some(CudaMemoryKind::Pool));
        // Managed memory, wherever it lives now.
        let managed = PointerAttributes { is_managed: true, memory_type: 1, ..PointerAttributes::default() };
        assert_eq!(classify(&managed, never), Some(CudaMemoryKind::Managed));
    }

    #[test]
    fn host_memory_is_not_cuda_memory() {
        let never = |_| panic!("asked of host memory");
        // Unknown to CUDA: every attribute at its NULL value.
        assert_eq!(classify(&PointerAttributes::default(), never), None);
        // cudaMallocHost or cudaHostRegister memory.
        let pinned = PointerAttributes { memory_type: 1, legacy_ipc_capable: false, ..PointerAttributes::default() };
        assert_eq!(classify(&pinned, never), None);
    }

    #[test]
    fn kinds_have_codes_and_words() {
        let codes: Vec<u32> = CudaMemoryKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes, [1, 2, 3, 4, 5]);
        assert_eq!(CudaMemoryKind::Legacy.to_string(), "cudaMalloc memory");
        let pointer = CudaPointer {
            kind: CudaMemoryKind::Legacy,
            base: 0x1000,
            size: 0x100,
            buffer_id: 1,
            device_ordinal: 0,
            context: 0,
        };
        assert!(pointer.holds(0x1000, 0x100) && pointer.holds(0x10ff, 1));
        assert!(!pointer.holds(0x0fff, 1) && !pointer.holds(0x1001, 0x100) && !pointer.holds(0x1000, usize::MAX));
    }

    /// Without the driver loaded, an address is not CUDA memory and nothing is loaded.
    #[test]
    fn without_a_loaded_driver_nothing_is_asked() {
        if lava_flow_cuda::is_loaded() {
            println!("skipped: this process has the CUDA driver loaded");
            return;
        }
        let on_stack = 0u8;
        assert_eq!(recognise(&on_stack).unwrap(), None);
        assert_eq!(recognise(0x10 as *const u8).unwrap(), None);
        assert!(!lava_flow_cuda::is_loaded(), "recognising an address must not load CUDA");
        assert!(why_not_recognised().contains("no CUDA driver was found"), "{}", why_not_recognised());
    }
}
