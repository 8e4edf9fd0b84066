//! The CUDA driver calls of the route: the producer's exports (a legacy IPC handle, a VMM
//! piece's fd) and the consumer's imports, each in the primary context of the device that
//! holds the memory, as the CUDA runtime and PyTorch use it. The consumer reaches the driver
//! through [`Opener`], which the route's tests replace.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::ffi::c_int;
use std::sync::Arc;

use lava_flow_cuda::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUexternalMemory, CUipcMemHandle, CUmemAccessDesc, CUmemGenericAllocationHandle,
    CUmemLocation, CUmemPoolPtrExportData, CUmemoryPool, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_DEDICATED, CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_LOCATION_TYPE_DEVICE, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
};
use lava_flow_cuda::Driver;

mod pool_span;

use super::wire::{is_arena, Announce, PoolAnnounce, MEMORY_ARENA_DEDICATED, MEMORY_LEGACY};
use crate::error::{Error, Result};
use crate::memory::CudaPointer;

pub(super) fn cuda_error(e: lava_flow_cuda::Error) -> Error {
    Error::Unsupported(e.to_string())
}

/// A device's primary context, retained while this lives.
pub(crate) struct PrimaryContext {
    driver: &'static Driver,
    device: CUdevice,
    context: CUcontext,
}

// SAFETY: a CUDA context handle may be made current on any thread; the driver is thread-safe.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    pub(crate) fn retain(driver: &'static Driver, ordinal: i32) -> Result<PrimaryContext> {
        let device = driver.device(ordinal).map_err(cuda_error)?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a device the driver just gave.
        unsafe { driver.device_primary_ctx_retain(&mut context, device) }.map_err(cuda_error)?;
        Ok(PrimaryContext { driver, device, context })
    }

    /// This process's ordinal of the context's device.
    pub(crate) fn ordinal(&self) -> i32 {
        self.device
    }

    /// The context's handle, alive while this lives.
    pub(crate) fn raw(&self) -> CUcontext {
        self.context
    }

    /// Runs `f` with the context current on this thread, as it was before afterwards.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&'static Driver) -> Result<T>) -> Result<T> {
        // SAFETY: a context retained by this object, alive until its drop.
        unsafe { self.driver.ctx_push_current(self.context) }.map_err(cuda_error)?;
        let out = f(self.driver);
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context pushed above; a valid out-pointer.
        let _ = unsafe { self.driver.ctx_pop_current(&mut popped) };
        out
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases the retain of `retain`, once.
        let _ = unsafe { self.driver.device_primary_ctx_release(self.device) };
    }
}

/// The UUIDs of the CUDA devices this process sees, by ordinal: what a consumer can open
/// memory on. Only in a process that has loaded the CUDA driver itself: one that never used
/// CUDA is not made to initialise it (it costs time, memory and file descriptors).
pub(crate) fn devices() -> std::result::Result<Vec<[u8; 16]>, String> {
    if lava_flow_cuda::disabled() {
        return Err(format!("{}=1 keeps lava-flow from using CUDA there", lava_flow_cuda::DISABLE_CUDA_ENV));
    }
    if !lava_flow_cuda::is_loaded() {
        return Err(format!(
            "the consumer had not loaded the CUDA driver ({}) when it created the channel: a consumer of CUDA \
             memory initialises CUDA first (cuInit, torch.cuda.init(), or any CUDA call)",
            lava_flow_cuda::LIBRARY
        ));
    }
    let driver = lava_flow_cuda::driver().map_err(|e| e.to_string())?;
    let count = driver.device_count().map_err(|e| e.to_string())?;
    (0..count).map(|i| driver.device(i).and_then(|d| driver.device_uuid(d)).map_err(|e| e.to_string())).collect()
}

/// The UUID of the producer's device `ordinal`.
pub(crate) fn device_uuid(ordinal: i32) -> Result<[u8; 16]> {
    let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
    driver.device(ordinal).and_then(|d| driver.device_uuid(d)).map_err(cuda_error)
}

/// The legacy IPC handle of `cudaMalloc` memory's allocation, asked in the context it was
/// allocated in (the device's primary context where the driver did not say).
pub(crate) fn export_legacy(pointer: &CudaPointer) -> Result<[u8; 64]> {
    let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
    let get = |driver: &'static Driver| {
        let mut handle = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: a valid out-pointer; the base of a live allocation of the current context.
        unsafe { driver.ipc_get_mem_handle(&mut handle, pointer.base) }
            .map_err(|e| cuda_error(e.context(format!("cuIpcGetMemHandle of {:#x}", pointer.base))))?;
        Ok(handle.reserved)
    };
    in_context_of(driver, pointer, get)
}

/// Runs `f` in the context `pointer`'s memory was allocated in (its device's primary context
/// where the driver did not say).
fn in_context_of<T>(
    driver: &'static Driver,
    pointer: &CudaPointer,
    f: impl FnOnce(&'static Driver) -> Result<T>,
) -> Result<T> {
    if pointer.context == 0 {
        return PrimaryContext::retain(driver, pointer.device_ordinal)?.with(f);
    }
    let context = pointer.context as CUcontext;
    // SAFETY: the context the allocation was made in, alive while the allocation is (the
    // caller's registration of live memory).
    unsafe { driver.ctx_push_current(context) }.map_err(cuda_error)?;
    let out = f(driver);
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above; a valid out-pointer.
    let _ = unsafe { driver.ctx_pop_current(&mut popped) };
    out
}

/// The memory pool of a pool allocation (its handle, which names it in this process) and the
/// allocation's `cuMemPoolExportPointer` data.
pub(crate) fn export_pool_pointer(pointer: &CudaPointer) -> Result<(u64, [u8; 64])> {
    let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
    let [pool] = driver
        .pointer_attributes(pointer.base, [CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE])
        .map_err(|e| cuda_error(e.context(format!("the memory pool of {:#x}", pointer.base))))?;
    if pool == 0 {
        return Err(Error::Unsupported(format!(
            "the CUDA memory at {:#x} belongs to no memory pool any more (freed, and re-allocated otherwise?): \
             register the memory again",
            pointer.base
        )));
    }
    // The driver exports an allocation only from a pool that has been shared: before any
    // export of the pool itself, cuMemPoolExportPointer answers CUDA_ERROR_INVALID_VALUE
    // (driver 580 on an H200). The pool's fd (made again for each allocation announced, not
    // for each message) is closed at once.
    drop(export_pool(pool)?);
    in_context_of(driver, pointer, |driver| {
        let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
        // SAFETY: a valid out-pointer; the base of a live pool allocation (the driver checks).
        unsafe { driver.mem_pool_export_pointer(&mut data, pointer.base) }
            .map_err(|e| cuda_error(e.context(format!("cuMemPoolExportPointer of {:#x}", pointer.base))))?;
        Ok((pool, data.reserved))
    })
}

/// A new fd of memory pool `pool` (a handle this process's driver gave) for the consumer.
pub(crate) fn export_pool(pool: u64) -> Result<OwnedHandle> {
    let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
    let mut fd: c_int = -1;
    // SAFETY: for POSIX fds the out-value is an int; the pool is one a live allocation of this
    // process belongs to.
    unsafe {
        driver.mem_pool_export_to_shareable_handle(
            (&mut fd as *mut c_int).cast(),
            pool as usize as CUmemoryPool,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .map_err(|e| {
        cuda_error(e.context(format!(
            "cuMemPoolExportToShareableHandle of pool {pool:#x} (create the pool with handle type \
             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)"
        )))
    })?;
    // SAFETY: a new fd the driver made for this call, owned by nothing else.
    Ok(unsafe { crate::os::own_driver_value(fd) })
}

/// A VMM piece's allocation handle, retained: the physical memory stays alive while this
/// lives, whatever the application frees.
pub(crate) struct Retained {
    driver: &'static Driver,
    handle: CUmemGenericAllocationHandle,
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: releases the reference cuMemRetainAllocationHandle took, once.
        let _ = unsafe { self.driver.mem_release(self.handle) };
    }
}

/// A VMM piece's allocation handle, retained, and a new fd of it for the consumer.
pub(crate) fn export_vmm(pointer: &CudaPointer) -> Result<(Retained, OwnedHandle)> {
    let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: a valid out-pointer; the base of a live VMM mapping (the driver checks).
    unsafe { driver.mem_retain_allocation_handle(&mut handle, pointer.base as usize as *mut std::ffi::c_void) }
        .map_err(|e| cuda_error(e.context(format!("cuMemRetainAllocationHandle of {:#x}", pointer.base))))?;
    let retained = Retained { driver, handle };
    let mut fd: c_int = -1;
    // SAFETY: for POSIX fds the out-value is an int; the handle is retained above.
    unsafe {
        driver.mem_export_to_shareable_handle(
            (&mut fd as *mut c_int).cast(),
            handle,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    }
    .map_err(|e| cuda_error(e.context(format!("cuMemExportToShareableHandle of {:#x}", pointer.base))))?;
    // SAFETY: a new fd the driver made for this call, owned by nothing else.
    Ok((retained, unsafe { crate::os::own_driver_value(fd) }))
}

/// A producer's allocation opened in this process: its address here, on `device` (this
/// process's ordinal). Dropping it closes the import.
pub(crate) trait Mapping: Send + Sync {
    fn address(&self) -> u64;
    fn device(&self) -> i32;
    /// Lets this process's device `device` (another than the one that holds the memory, with a
    /// peer path to it) read and write the mapping, where the mapping needs that said.
    fn grant(&self, _device: i32) -> Result<()> {
        Ok(())
    }
    /// Whether the mapping is made per held message ([`Mapping::hold`], [`Mapping::let_go`]):
    /// memory of a CUDA memory pool, whose import must be freed before the producer frees it.
    fn per_message(&self) -> bool {
        false
    }
    /// A message into the mapping is held from now: the memory is mapped while one is.
    fn hold(&self) -> Result<()> {
        Ok(())
    }
    /// A message into the mapping was released.
    fn let_go(&self) {}
}

/// A producer's memory pool imported in this process: the allocations of it are imported
/// (and freed) through it.
pub(crate) trait ImportedPool: Send + Sync {
    /// Imports the allocation `data` (its `cuMemPoolExportPointer` data) names: its address here.
    fn import(&self, data: &[u8; 64]) -> Result<u64>;
    /// Frees the import at `address`, done when this returns.
    fn free(&self, address: u64) -> Result<()>;
    /// Lets this process's device `device` (another than the pool's) read and write the pool's
    /// memory.
    fn grant(&self, _device: i32) -> Result<()> {
        Ok(())
    }
}

/// Opens producers' allocations: the CUDA driver, or a test's stand-in.
pub(crate) trait Opener: Send + Sync {
    /// Opens `allocation` (with its fd for a VMM piece or an arena) on this process's device
    /// `device`.
    fn open(&self, allocation: &Announce, fd: Option<BorrowedHandle<'_>>, device: i32) -> Result<Box<dyn Mapping>>;

    /// Imports the memory pool `pool` announces (its fd, which stays the caller's) on this
    /// process's device `device`.
    fn open_pool(&self, _pool: &PoolAnnounce, _fd: BorrowedHandle<'_>, _device: i32) -> Result<Arc<dyn ImportedPool>> {
        Err(Error::Unsupported("this consumer imports no CUDA memory pools".into()))
    }

    /// Maps the span `allocation` announces, its pieces (offset, size, fd; the fds stay the
    /// caller's) back to back in one address range, on this process's device `device`.
    fn open_span(
        &self,
        _allocation: &Announce,
        _pieces: &[(u64, u64, BorrowedHandle<'_>)],
        _device: i32,
    ) -> Result<Box<dyn Mapping>> {
        Err(Error::Unsupported("this consumer maps no spans of CUDA VMM pieces".into()))
    }

    /// This process's ordinal of the CUDA device current on this thread, if any.
    fn current_device(&self) -> Option<i32> {
        None
    }

    /// Whether device `device`'s work reaches memory of device `peer` directly.
    fn peer_path(&self, _device: i32, _peer: i32) -> bool {
        true
    }

    /// Whether the application uses device `device` through CUDA (its primary context is
    /// active).
    fn in_use(&self, _device: i32) -> bool {
        true
    }

    /// Lets device `device`'s primary context reach memory of device `peer` (which holds an
    /// open import): `Ok(false)` where that context is not active (the application does not
    /// use the GPU through CUDA), and none is made.
    fn enable_peer_access(&self, _device: i32, _peer: i32) -> Result<bool> {
        Ok(true)
    }
}

/// Opens allocations through the CUDA driver, in each device's primary context (retained
/// once per device while the opener lives).
#[derive(Default)]
pub(crate) struct DriverOpener {
    contexts: parking_lot::Mutex<Vec<(i32, Arc<PrimaryContext>)>>,
}

impl DriverOpener {
    fn context(&self, device: i32) -> Result<Arc<PrimaryContext>> {
        let mut contexts = self.contexts.lock();
        if let Some((_, context)) = contexts.iter().find(|(d, _)| *d == device) {
            return Ok(Arc::clone(context));
        }
        let driver = lava_flow_cuda::driver().map_err(cuda_error)?;
        let context = Arc::new(PrimaryContext::retain(driver, device)?);
        contexts.push((device, Arc::clone(&context)));
        Ok(context)
    }
}

/// A legacy IPC import: closed with `cuIpcCloseMemHandle`.
struct LegacyImport {
    context: Arc<PrimaryContext>,
    address: CUdeviceptr,
}

impl Mapping for LegacyImport {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.context.device
    }
}

impl Drop for LegacyImport {
    fn drop(&mut self) {
        let address = self.address;
        // SAFETY: an address cuIpcOpenMemHandle gave in this context, closed once.
        let closed = self.context.with(|driver| unsafe { driver.ipc_close_mem_handle(address) }.map_err(cuda_error));
        if let Err(e) = closed {
            log::warn!("closing the CUDA IPC import at {address:#x}: {e}");
        }
    }
}

/// A VMM piece mapped into an address range of this process: unmapped and freed on drop.
struct VmmImport {
    context: Arc<PrimaryContext>,
    address: CUdeviceptr,
    size: usize,
}

impl Mapping for VmmImport {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.context.device
    }
    fn grant(&self, device: i32) -> Result<()> {
        let access = CUmemAccessDesc {
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
            flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let (address, size) = (self.address, self.size);
        self.context.with(|driver| {
            // SAFETY: the range `open` mapped; a valid access descriptor for one device.
            unsafe { driver.mem_set_access(address, size, &access, 1) }
                .map_err(|e| cuda_error(e.context(format!("cuMemSetAccess of a CUDA VMM piece for device {device}"))))
        })
    }
}

impl Drop for VmmImport {
    fn drop(&mut self) {
        let (address, size) = (self.address, self.size);
        let freed = self.context.with(|driver| {
            // SAFETY: the range reserved and mapped by `open`, unmapped and freed once.
            unsafe { driver.mem_unmap(address, size) }.map_err(cuda_error)?;
            // SAFETY: as above.
            unsafe { driver.mem_address_free(address, size) }.map_err(cuda_error)
        });
        if let Err(e) = freed {
            log::warn!("unmapping the imported CUDA VMM piece at {address:#x}: {e}");
        }
    }
}

impl Opener for DriverOpener {
    fn current_device(&self) -> Option<i32> {
        current_device()
    }

    fn peer_path(&self, device: i32, peer: i32) -> bool {
        peer_path(device, peer)
    }

    fn in_use(&self, device: i32) -> bool {
        primary_active(device)
    }

    fn enable_peer_access(&self, device: i32, peer: i32) -> Result<bool> {
        if !primary_active(device) {
            return Ok(false);
        }
        let (from, to) = (self.context(device)?, self.context(peer)?);
        enable_peer_access(&from, &to)
    }

    fn open_pool(&self, _pool: &PoolAnnounce, fd: BorrowedHandle<'_>, device: i32) -> Result<Arc<dyn ImportedPool>> {
        pool_span::open_pool(self.context(device)?, fd)
    }

    fn open_span(
        &self,
        allocation: &Announce,
        pieces: &[(u64, u64, BorrowedHandle<'_>)],
        device: i32,
    ) -> Result<Box<dyn Mapping>> {
        pool_span::open_span(self.context(device)?, allocation, pieces)
    }

    fn open(&self, allocation: &Announce, fd: Option<BorrowedHandle<'_>>, device: i32) -> Result<Box<dyn Mapping>> {
        let context = self.context(device)?;
        if is_arena(allocation.memory) {
            let fd = fd.ok_or_else(|| Error::Corrupt("a GPU buffer's arena came without its fd".into()))?;
            return open_arena(context, allocation, fd);
        }
        if allocation.memory == MEMORY_LEGACY {
            let handle = CUipcMemHandle { reserved: allocation.ipc_handle };
            let address = context.with(|driver| {
                let mut address: CUdeviceptr = 0;
                // SAFETY: a valid out-pointer; the handle is bytes the driver checks.
                unsafe { driver.ipc_open_mem_handle(&mut address, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) }
                    .map_err(|e| cuda_error(e.context("cuIpcOpenMemHandle")))?;
                Ok(address)
            })?;
            return Ok(Box::new(LegacyImport { context, address }));
        }
        let fd = fd.ok_or_else(|| Error::Corrupt("a CUDA VMM piece came without its fd".into()))?;
        let size = allocation.size as usize;
        let device_id = context.device;
        let address = context.with(|driver| {
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: for POSIX fds the handle is the fd itself, which stays ours.
            unsafe {
                driver.mem_import_from_shareable_handle(
                    &mut handle,
                    crate::os::driver_value(&fd),
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            }
            .map_err(|e| cuda_error(e.context("cuMemImportFromShareableHandle")))?;
            let mapped = map_piece(driver, handle, size, device_id);
            // SAFETY: the mapping (where made) holds the memory; this drops the import's own
            // reference, once.
            let _ = unsafe { driver.mem_release(handle) };
            mapped
        })?;
        Ok(Box::new(VmmImport { context, address, size }))
    }
}

/// Reserves `size` bytes of addresses, maps `handle` there and lets `device` read and write.
fn map_piece(driver: &Driver, handle: CUmemGenericAllocationHandle, size: usize, device: CUdevice) -> Result<u64> {
    let mut address: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the driver picks the range.
    unsafe { driver.mem_address_reserve(&mut address, size, 0, 0, 0) }
        .map_err(|e| cuda_error(e.context(format!("cuMemAddressReserve of {size} bytes"))))?;
    let access = CUmemAccessDesc {
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range just reserved, of the piece's size; the handle is live.
    let mapped = unsafe { driver.mem_map(address, size, 0, handle, 0) }.and_then(|()| {
        // SAFETY: the range just mapped; a valid access descriptor.
        unsafe { driver.mem_set_access(address, size, &access, 1) }
    });
    if let Err(e) = mapped {
        // SAFETY: undoes what was done above, once (unmapping a range never mapped fails harmlessly).
        let _ = unsafe { driver.mem_unmap(address, size) };
        // SAFETY: as above.
        let _ = unsafe { driver.mem_address_free(address, size) };
        return Err(cuda_error(e.context(format!("mapping a CUDA VMM piece of {size} bytes"))));
    }
    Ok(address)
}

/// What keeps a sent allocation alive for the consumer: its registration, and a VMM piece's
/// retained handle.
pub(crate) struct Keep {
    pub(crate) _registration: Arc<dyn Any + Send + Sync>,
    pub(crate) _retained: Option<Box<dyn Any + Send + Sync>>,
}

/// Makes what the producer announces: the CUDA driver, or the test hooks' stand-in.
pub(crate) trait Exporter: Send + Sync {
    /// The UUID of this process's device `ordinal`.
    fn device_uuid(&self, ordinal: i32) -> Result<[u8; 16]>;
    /// The legacy IPC handle of `cudaMalloc` memory's allocation.
    fn export_legacy(&self, pointer: &CudaPointer) -> Result<[u8; 64]>;
    /// A VMM piece's fd, and what keeps the piece alive while held.
    fn export_vmm(&self, pointer: &CudaPointer) -> Result<(Box<dyn Any + Send + Sync>, OwnedHandle)>;
    /// Each piece of span `pointer`, as it is mapped now (an error where it changed since it
    /// was registered): where it lies, what keeps it alive while held, and a new fd of it.
    fn export_vmm_span(&self, pointer: &CudaPointer) -> Result<Vec<SpanPiece>>;
    /// A pool allocation's pool (its handle here) and `cuMemPoolExportPointer` data.
    fn export_pool_pointer(&self, pointer: &CudaPointer) -> Result<(u64, [u8; 64])>;
    /// A new fd of memory pool `pool`.
    fn export_pool(&self, pool: u64) -> Result<OwnedHandle>;
}

/// One exported piece of a span: where it lies, what keeps it alive while held, its new fd.
pub(crate) type SpanPiece = (crate::memory::cuda::Piece, Box<dyn Any + Send + Sync>, OwnedHandle);

/// Exports through the CUDA driver.
pub(crate) struct DriverExporter;

impl Exporter for DriverExporter {
    fn device_uuid(&self, ordinal: i32) -> Result<[u8; 16]> {
        device_uuid(ordinal)
    }
    fn export_legacy(&self, pointer: &CudaPointer) -> Result<[u8; 64]> {
        export_legacy(pointer)
    }
    fn export_vmm(&self, pointer: &CudaPointer) -> Result<(Box<dyn Any + Send + Sync>, OwnedHandle)> {
        let (retained, fd) = export_vmm(pointer)?;
        Ok((Box::new(retained), fd))
    }
    fn export_vmm_span(&self, pointer: &CudaPointer) -> Result<Vec<SpanPiece>> {
        let pieces = crate::memory::cuda::pieces_of(pointer)?;
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let at = CudaPointer {
                base: pointer.base + piece.offset,
                size: piece.size,
                buffer_id: piece.buffer_id,
                ..*pointer
            };
            let (retained, fd) = export_vmm(&at)?;
            out.push((piece, Box::new(retained) as Box<dyn Any + Send + Sync>, fd));
        }
        Ok(out)
    }
    fn export_pool_pointer(&self, pointer: &CudaPointer) -> Result<(u64, [u8; 64])> {
        export_pool_pointer(pointer)
    }
    fn export_pool(&self, pool: u64) -> Result<OwnedHandle> {
        export_pool(pool)
    }
}

// ---- lava-flow GPU buffers' arenas (see `arena`): their import, and peer access ----

/// A GPU buffer's arena imported into CUDA: unmapped and destroyed on drop.
struct ArenaImport {
    context: Arc<PrimaryContext>,
    memory: CUexternalMemory,
    address: CUdeviceptr,
}

// SAFETY: CUDA handles are process-wide and usable from any thread; the fields are only read.
unsafe impl Send for ArenaImport {}
// SAFETY: as above.
unsafe impl Sync for ArenaImport {}

impl Mapping for ArenaImport {
    fn address(&self) -> u64 {
        self.address
    }
    fn device(&self) -> i32 {
        self.context.ordinal()
    }
}

impl Drop for ArenaImport {
    fn drop(&mut self) {
        let (address, memory) = (self.address, self.memory);
        let freed = self.context.with(|driver| {
            // SAFETY: the mapping made by `open`, freed once; no message points into it any more.
            unsafe { driver.mem_free(address) }.map_err(cuda_error)?;
            // SAFETY: the import made by `open`, destroyed once, after its mapping.
            unsafe { driver.destroy_external_memory(memory) }.map_err(cuda_error)
        });
        if let Err(e) = freed {
            log::warn!("unmapping the producer's GPU buffer arena imported at {address:#x}: {e}");
        }
    }
}

/// Imports the arena `allocation` announces (its opaque fd `fd`, which stays the caller's) in
/// `context`, the primary context of the device that holds it, mapped whole.
fn open_arena(context: Arc<PrimaryContext>, allocation: &Announce, fd: BorrowedHandle<'_>) -> Result<Box<dyn Mapping>> {
    let size = allocation.size;
    // CUDA takes the fd it imports; the slot keeps its own, to import again after the cache
    // closed this import.
    let fd = fd.try_clone_to_owned().map_err(|e| Error::os("duplicating a GPU buffer arena's fd", e))?;
    let desc = CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
        type_: CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
        handle: [crate::os::driver_value(&fd) as usize as u64, 0],
        size,
        flags: if allocation.memory == MEMORY_ARENA_DEDICATED { CUDA_EXTERNAL_MEMORY_DEDICATED } else { 0 },
        reserved: [0; 16],
    };
    let (memory, address) = context.with(|driver| {
        let mut memory: CUexternalMemory = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the descriptor is filled as cuda.h says, with a live fd.
        unsafe { driver.import_external_memory(&mut memory, &desc) }.map_err(|e| {
            cuda_error(e.context(format!(
                "cuImportExternalMemory of a {size}-byte Vulkan arena (the producer's and this process's NVIDIA \
                 drivers must be the same)"
            )))
        })?;
        // On success CUDA owns the fd.
        crate::os::give_to_driver(fd);
        let buffer = CUDA_EXTERNAL_MEMORY_BUFFER_DESC { offset: 0, size, flags: 0, reserved: [0; 16] };
        let mut address: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the import just made, mapped whole.
        if let Err(e) = unsafe { driver.external_memory_get_mapped_buffer(&mut address, memory, &buffer) } {
            // SAFETY: the import just made, destroyed once.
            let _ = unsafe { driver.destroy_external_memory(memory) };
            return Err(cuda_error(
                e.context(format!("cuExternalMemoryGetMappedBuffer of a {size}-byte Vulkan arena")),
            ));
        }
        Ok((memory, address))
    })?;
    Ok(Box::new(ArenaImport { context, memory, address }))
}

/// This process's ordinal of the CUDA device whose context is current on this thread, where
/// the process has loaded CUDA and made one current (asking loads nothing and makes nothing).
pub(super) fn current_device() -> Option<i32> {
    if !lava_flow_cuda::is_loaded() || lava_flow_cuda::disabled() {
        return None;
    }
    let driver = lava_flow_cuda::driver().ok()?;
    let mut context = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.ctx_get_current(&mut context) }.ok()?;
    if context.is_null() {
        return None;
    }
    let mut device = 0;
    // SAFETY: a valid out-pointer; a context is current.
    unsafe { driver.ctx_get_device(&mut device) }.ok()?;
    Some(device)
}

/// Whether device `device`'s work reaches memory of device `peer` directly.
fn peer_path(device: i32, peer: i32) -> bool {
    let Ok(driver) = lava_flow_cuda::driver() else { return false };
    let (Ok(a), Ok(b)) = (driver.device(device), driver.device(peer)) else { return false };
    let mut can = 0;
    // SAFETY: a valid out-pointer; devices the driver gave.
    unsafe { driver.device_can_access_peer(&mut can, a, b) }.is_ok() && can != 0
}

/// Lets `from`, the primary context of a device this process uses, reach memory of `to`'s
/// context. `Ok(false)` where `from` is not active: the application does not use that GPU
/// through CUDA, and no context is made for it.
fn enable_peer_access(from: &PrimaryContext, to: &PrimaryContext) -> Result<bool> {
    from.with(|driver| {
        // SAFETY: `to` is a context this process retains; flags must be 0.
        match unsafe { driver.ctx_enable_peer_access(to.raw(), 0) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) => Ok(true),
            Err(e) => Err(cuda_error(e.context(format!(
                "cuCtxEnablePeerAccess from CUDA device {} to device {}",
                from.ordinal(),
                to.ordinal()
            )))),
        }
    })
}

/// Whether the primary context of device `ordinal` is active (the application uses the GPU
/// through CUDA).
fn primary_active(ordinal: i32) -> bool {
    let Ok(driver) = lava_flow_cuda::driver() else { return false };
    driver.device(ordinal).and_then(|d| driver.primary_context_active(d)).unwrap_or(false)
}
