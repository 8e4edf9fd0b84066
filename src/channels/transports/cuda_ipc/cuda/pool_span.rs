//! The CUDA driver's side of what the consumer imports of pool memory and maps of spans of VMM
//! pieces: an imported pool (whose allocations are imported and freed through it, see `pool`)
//! and a span mapped into one reserved range.

use crate::os::BorrowedHandle;
use std::sync::Arc;

use lava_flow_cuda::sys::{
    CUdevice, CUdeviceptr, CUmemAccessDesc, CUmemGenericAllocationHandle, CUmemLocation, CUmemPoolPtrExportData,
    CUmemoryPool, CUstream, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_STREAM_NON_BLOCKING,
};
use lava_flow_cuda::Driver;

use super::super::wire::Announce;
use super::{cuda_error, ImportedPool, Mapping, PrimaryContext};
use crate::error::Result;

/// Imports the memory pool of `fd` (which stays the caller's) in `context`, the primary context
/// of the device that holds it.
pub(super) fn open_pool(context: Arc<PrimaryContext>, fd: BorrowedHandle<'_>) -> Result<Arc<dyn ImportedPool>> {
    let (pool, stream) = context.with(|driver| {
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; for POSIX fds the handle is the fd itself, which
        // stays ours.
        unsafe {
            driver.mem_pool_import_from_shareable_handle(
                &mut pool,
                crate::os::driver_value(&fd),
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .map_err(|e| cuda_error(e.context("cuMemPoolImportFromShareableHandle")))?;
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, in the context current here.
        if let Err(e) = unsafe { driver.stream_create(&mut stream, CU_STREAM_NON_BLOCKING) } {
            // SAFETY: the pool just imported, given back once.
            let _ = unsafe { driver.mem_pool_destroy(pool) };
            return Err(cuda_error(e.context("cuStreamCreate for freeing a memory pool's imports")));
        }
        Ok((pool, stream))
    })?;
    Ok(Arc::new(DriverPool { context, pool, stream }))
}

/// Maps the span `allocation` announces, its pieces (offset, size, fd; the fds stay the
/// caller's) back to back in one range reserved in `context`, the primary context of the
/// device that holds them.
pub(super) fn open_span(
    context: Arc<PrimaryContext>,
    allocation: &Announce,
    pieces: &[(u64, u64, BorrowedHandle<'_>)],
) -> Result<Box<dyn Mapping>> {
    let device = context.ordinal();
    let size = allocation.size as usize;
    let address = context.with(|driver| {
        let mut address: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the driver picks the range.
        unsafe { driver.mem_address_reserve(&mut address, size, 0, 0, 0) }
            .map_err(|e| cuda_error(e.context(format!("cuMemAddressReserve of a {size}-byte span"))))?;
        let mut mapped = 0;
        let mut outcome = Ok(());
        for &(offset, piece_size, fd) in pieces {
            outcome = map_span_piece(driver, address + offset, piece_size as usize, fd, device);
            if outcome.is_err() {
                break;
            }
            mapped += 1;
        }
        if let Err(e) = outcome {
            for &(offset, piece_size, _) in &pieces[..mapped] {
                // SAFETY: a piece mapped above, unmapped once.
                let _ = unsafe { driver.mem_unmap(address + offset, piece_size as usize) };
            }
            // SAFETY: the range reserved above, freed once, nothing mapped in it any more.
            let _ = unsafe { driver.mem_address_free(address, size) };
            return Err(e);
        }
        Ok(address)
    })?;
    let pieces = pieces.iter().map(|&(offset, size, _)| (offset, size as usize)).collect();
    Ok(Box::new(SpanImport { context, address, size, pieces }))
}

/// A producer's memory pool imported here, with a stream of its device's primary context on
/// which its imports are freed (a stream of its own, so that freeing waits for nothing else:
/// `cuMemFree` of pool memory would synchronise the whole device).
struct DriverPool {
    context: Arc<PrimaryContext>,
    pool: CUmemoryPool,
    stream: CUstream,
}

// SAFETY: CUDA handles are process-wide and usable from any thread; the fields are only read.
unsafe impl Send for DriverPool {}
// SAFETY: as above.
unsafe impl Sync for DriverPool {}

impl ImportedPool for DriverPool {
    fn import(&self, data: &[u8; 64]) -> Result<u64> {
        let mut data = CUmemPoolPtrExportData { reserved: *data };
        self.context.with(|driver| {
            let mut address: CUdeviceptr = 0;
            // SAFETY: valid out-pointers; the pool imported here; the data are bytes the
            // driver checks.
            unsafe { driver.mem_pool_import_pointer(&mut address, self.pool, &mut data) }.map_err(|e| {
                cuda_error(e.context(
                    "cuMemPoolImportPointer (the producer freed the allocation before the message was complete?)",
                ))
            })?;
            Ok(address)
        })
    }

    fn free(&self, address: u64) -> Result<()> {
        self.context.with(|driver| {
            // SAFETY: an address `import` gave, freed once; no message points into it any more.
            unsafe { driver.mem_free_async(address, self.stream) }
                .map_err(|e| cuda_error(e.context(format!("cuMemFreeAsync of the pool import at {address:#x}"))))?;
            // SAFETY: the stream of this pool, alive while it is.
            unsafe { driver.stream_synchronize(self.stream) }.map_err(cuda_error)
        })
    }

    fn grant(&self, device: i32) -> Result<()> {
        let access = CUmemAccessDesc {
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        self.context.with(|driver| {
            // SAFETY: the pool imported here; a valid access descriptor for one device.
            unsafe { driver.mem_pool_set_access(self.pool, &access, 1) }.map_err(|e| {
                cuda_error(e.context(format!("cuMemPoolSetAccess of an imported memory pool for device {device}")))
            })
        })
    }
}

impl Drop for DriverPool {
    fn drop(&mut self) {
        let (pool, stream) = (self.pool, self.stream);
        let freed = self.context.with(|driver| {
            // SAFETY: the stream made by `open_pool`, destroyed once, its work done (`free`
            // synchronises it).
            unsafe { driver.stream_destroy(stream) }.map_err(cuda_error)?;
            // SAFETY: the pool imported by `open_pool`, given back once; every import of it
            // was freed (each holds this pool alive).
            unsafe { driver.mem_pool_destroy(pool) }.map_err(cuda_error)
        });
        if let Err(e) = freed {
            log::warn!("giving back an imported CUDA memory pool: {e}");
        }
    }
}

/// Imports the VMM piece `fd`, maps it at `address` (in a range reserved for its span) and lets
/// `device` read and write it.
fn map_span_piece(driver: &Driver, address: u64, size: usize, fd: BorrowedHandle<'_>, device: CUdevice) -> Result<()> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: for POSIX fds the handle is the fd itself, which stays the caller's.
    unsafe {
        driver.mem_import_from_shareable_handle(
            &mut handle,
            crate::os::driver_value(&fd),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }
    .map_err(|e| cuda_error(e.context("cuMemImportFromShareableHandle of a span's piece")))?;
    // SAFETY: `size` bytes at `address` of a range the caller reserved and has not mapped;
    // the handle is live.
    let mapped = unsafe { driver.mem_map(address, size, 0, handle, 0) }
        .map_err(|e| cuda_error(e.context(format!("cuMemMap of a {size}-byte piece of a span"))));
    // SAFETY: the mapping (where made) holds the memory; this drops the import's own
    // reference, once.
    let _ = unsafe { driver.mem_release(handle) };
    mapped?;
    let access = CUmemAccessDesc {
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the piece just mapped; a valid access descriptor.
    let access = unsafe { driver.mem_set_access(address, size, &access, 1) }
        .map_err(|e| cuda_error(e.context(format!("cuMemSetAccess of a {size}-byte piece of a span"))));
    if access.is_err() {
        // SAFETY: the piece mapped above, unmapped once (the caller unmaps only those before it).
        let _ = unsafe { driver.mem_unmap(address, size) };
    }
    access
}

/// A span of VMM pieces mapped back to back into one reserved range: each piece unmapped, and
/// the range freed, on drop.
struct SpanImport {
    context: Arc<PrimaryContext>,
    address: CUdeviceptr,
    size: usize,
    /// Each piece's (offset, size) in the range.
    pieces: Vec<(u64, usize)>,
}

impl Mapping for SpanImport {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.context.ordinal()
    }
    fn grant(&self, device: i32) -> Result<()> {
        let access = CUmemAccessDesc {
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        self.context.with(|driver| {
            for &(offset, size) in &self.pieces {
                // SAFETY: a piece `open_span` mapped; a valid access descriptor for one device.
                unsafe { driver.mem_set_access(self.address + offset, size, &access, 1) }.map_err(|e| {
                    cuda_error(e.context(format!("cuMemSetAccess of a span of CUDA VMM pieces for device {device}")))
                })?;
            }
            Ok(())
        })
    }
}

impl Drop for SpanImport {
    fn drop(&mut self) {
        let (address, size) = (self.address, self.size);
        let freed = self.context.with(|driver| {
            for &(offset, piece) in &self.pieces {
                // SAFETY: a piece `open_span` mapped, unmapped once.
                unsafe { driver.mem_unmap(address + offset, piece) }.map_err(cuda_error)?;
            }
            // SAFETY: the range `open_span` reserved, freed once, nothing mapped in it any more.
            unsafe { driver.mem_address_free(address, size) }.map_err(cuda_error)
        });
        if let Err(e) = freed {
            log::warn!("unmapping the imported span of CUDA VMM pieces at {address:#x}: {e}");
        }
    }
}
