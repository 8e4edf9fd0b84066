//! The test hooks' stand-in for the CUDA driver (`LF_TEST_FAKE_CUDA_IPC=1`): exports a legacy
//! handle that names the allocation's buffer id, and "opens" it at an address derived from that
//! id, without touching any memory; a GPU buffer's arena (a real Vulkan fd) it "opens" at
//! [`arena_address`] of the arena's counter. Memory of a pool ([`CudaMemoryKind::Pool`]) it exports
//! as a pool (an fd of `/dev/null`, named by the allocation's 4 GiB-aligned region) and export data
//! naming the buffer id, and "imports" at [`pool_address`] of that id. It lets the route's negotiation,
//! its records and a hostile producer's descriptors be tested between real processes on machines
//! without CUDA.
//!
//! [`CudaMemoryKind::Pool`]: crate::memory::CudaMemoryKind::Pool

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::sync::Arc;

use super::cuda::{self, ImportedPool, Mapping};
use super::wire::{is_arena, Announce, PoolAnnounce, MEMORY_LEGACY};
use crate::error::{Error, Result};
use crate::memory::CudaPointer;

/// The one device both halves pretend to have.
pub(super) const UUID: [u8; 16] = *b"lava-flow-fakeCU";

pub(super) struct Exporter;

impl cuda::Exporter for Exporter {
    fn device_uuid(&self, _ordinal: i32) -> Result<[u8; 16]> {
        Ok(UUID)
    }
    fn export_legacy(&self, pointer: &CudaPointer) -> Result<[u8; 64]> {
        let mut handle = [0u8; 64];
        handle[..8].copy_from_slice(&pointer.buffer_id.to_le_bytes());
        Ok(handle)
    }
    fn export_vmm(&self, _pointer: &CudaPointer) -> Result<(Box<dyn Any + Send + Sync>, OwnedHandle)> {
        Err(Error::Unsupported("the test hooks' stand-in for CUDA exports legacy handles and pools only".into()))
    }
    fn export_vmm_span(&self, _pointer: &CudaPointer) -> Result<Vec<cuda::SpanPiece>> {
        Err(Error::Unsupported("the test hooks' stand-in for CUDA exports legacy handles and pools only".into()))
    }
    fn export_pool_pointer(&self, pointer: &CudaPointer) -> Result<(u64, [u8; 64])> {
        let mut data = [0u8; 64];
        data[..8].copy_from_slice(&pointer.buffer_id.to_le_bytes());
        Ok((pointer.base >> 32, data))
    }
    fn export_pool(&self, _pool: u64) -> Result<OwnedHandle> {
        let null = std::fs::File::open("/dev/null").map_err(|e| Error::os("opening /dev/null", e))?;
        Ok(null.into())
    }
}

/// Where the stand-in "imports" the pool allocation of buffer id `id`.
pub const fn pool_address(id: u64) -> u64 {
    0x3000_0000_0000 + (id << 24)
}

struct FakePool;

impl ImportedPool for FakePool {
    fn import(&self, data: &[u8; 64]) -> Result<u64> {
        Ok(pool_address(u64::from_le_bytes(data[..8].try_into().expect("8 bytes"))))
    }
    fn free(&self, _address: u64) -> Result<()> {
        Ok(())
    }
}

struct FakeMapping(u64);

impl Mapping for FakeMapping {
    fn address(&self) -> u64 {
        self.0
    }
    fn device(&self) -> i32 {
        0
    }
}

/// Where the stand-in "opens" the arena whose `ArenaId::counter` is `counter`.
pub const fn arena_address(counter: u64) -> u64 {
    0x2000_0000_0000 + (counter << 24)
}

pub(super) struct Opener;

impl cuda::Opener for Opener {
    fn open_pool(&self, _pool: &PoolAnnounce, _fd: BorrowedHandle<'_>, _device: i32) -> Result<Arc<dyn ImportedPool>> {
        Ok(Arc::new(FakePool))
    }

    fn open(&self, allocation: &Announce, fd: Option<BorrowedHandle<'_>>, _device: i32) -> Result<Box<dyn Mapping>> {
        if is_arena(allocation.memory) {
            if fd.is_none() {
                return Err(Error::Corrupt("a GPU buffer's arena came without its fd".into()));
            }
            return Ok(Box::new(FakeMapping(arena_address(allocation.buffer_id))));
        }
        if allocation.memory != MEMORY_LEGACY {
            return Err(Error::Unsupported("the test hooks' stand-in for CUDA opens legacy handles only".into()));
        }
        let id = u64::from_le_bytes(allocation.ipc_handle[..8].try_into().expect("8 bytes"));
        Ok(Box::new(FakeMapping(0x1000_0000_0000 + (id << 24))))
    }
}
