//! The test hooks' stand-in for the CUDA driver (`LF_TEST_FAKE_CUDA_IPC=1`): exports a legacy
//! handle that names the allocation's buffer id, and "opens" it at an address derived from that
//! id, without touching any memory; a GPU buffer's arena (a real Vulkan fd) it "opens" at
//! [`arena_address`] of the arena's counter. It lets the route's negotiation, its records and a hostile
//! producer's descriptors be tested between real processes on machines without CUDA.

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};

use super::cuda::{self, Mapping};
use super::wire::{is_arena, Announce, MEMORY_LEGACY};
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
    fn export_vmm(&self, _pointer: &CudaPointer) -> Result<(Box<dyn Any + Send + Sync>, OwnedFd)> {
        Err(Error::Unsupported("the test hooks' stand-in for CUDA exports legacy handles only".into()))
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
    fn open(&self, allocation: &Announce, fd: Option<BorrowedFd<'_>>, _device: i32) -> Result<Box<dyn Mapping>> {
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
