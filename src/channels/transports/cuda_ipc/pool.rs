//! Memory of a CUDA memory pool on the consumer's side: each pool imported once per channel,
//! each allocation imported only while a message into it is held.
//!
//! CUDA's rule for pool memory shared between processes: the importer frees its import of an
//! allocation before the exporter frees the allocation. The producer cannot keep pool memory
//! alive (as with `cudaMalloc` memory, the application must not free it before its messages
//! are complete), so the consumer frees its import when it lets go of the last message it holds
//! into the allocation, before that release reaches the producer: the next message into it
//! imports it again (`cuMemPoolImportPointer`, then `cuMemFreeAsync` and a synchronise of a
//! stream of the import's own, per such message).

use crate::os::OwnedHandle;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::cuda::{ImportedPool, Mapping, Opener};
use super::wire::PoolAnnounce;
use crate::error::Result;

/// A pool the producer announced: what the consumer imports it from, and the import once made.
pub(super) struct Pool {
    pub(super) announce: PoolAnnounce,
    fd: OwnedHandle,
    /// This process's ordinal of the device that holds the pool's memory.
    pub(super) device: i32,
    imported: OnceLock<Arc<dyn ImportedPool>>,
}

impl Pool {
    pub(super) fn new(announce: PoolAnnounce, fd: OwnedHandle, device: i32) -> Pool {
        Pool { announce, fd, device, imported: OnceLock::new() }
    }

    /// The pool imported here, importing it at the first call.
    pub(super) fn imported(&self, opener: &dyn Opener) -> Result<Arc<dyn ImportedPool>> {
        if let Some(pool) = self.imported.get() {
            return Ok(Arc::clone(pool));
        }
        let pool = opener.open_pool(&self.announce, crate::os::borrow(&self.fd), self.device)?;
        Ok(Arc::clone(self.imported.get_or_init(|| pool)))
    }
}

/// One allocation of an imported pool: imported while a message into it is held.
pub(super) struct PoolMapping {
    pool: Arc<dyn ImportedPool>,
    data: [u8; 64],
    device: i32,
    /// How many messages into the allocation are held.
    held: Mutex<u64>,
    /// The import's address while one is held (0: none).
    address: AtomicU64,
}

impl PoolMapping {
    pub(super) fn new(pool: Arc<dyn ImportedPool>, data: [u8; 64], device: i32) -> PoolMapping {
        PoolMapping { pool, data, device, held: Mutex::new(0), address: AtomicU64::new(0) }
    }
}

impl Mapping for PoolMapping {
    fn address(&self) -> u64 {
        self.address.load(Ordering::Acquire)
    }

    fn device(&self) -> i32 {
        self.device
    }

    fn grant(&self, device: i32) -> Result<()> {
        self.pool.grant(device)
    }

    fn per_message(&self) -> bool {
        true
    }

    fn hold(&self) -> Result<()> {
        let mut held = self.held.lock();
        if *held == 0 {
            let address = self.pool.import(&self.data)?;
            self.address.store(address, Ordering::Release);
        }
        *held += 1;
        Ok(())
    }

    fn let_go(&self) {
        let mut held = self.held.lock();
        *held = held.saturating_sub(1);
        if *held == 0 {
            let address = self.address.swap(0, Ordering::AcqRel);
            if address != 0 {
                if let Err(e) = self.pool.free(address) {
                    log::warn!("freeing the import of the producer's pool allocation at {address:#x}: {e}");
                }
            }
        }
    }
}

impl Drop for PoolMapping {
    fn drop(&mut self) {
        // Only where a held message's release never came (its view leaked): free it anyway.
        let address = *self.address.get_mut();
        if address != 0 {
            if let Err(e) = self.pool.free(address) {
                log::warn!("freeing the import of the producer's pool allocation at {address:#x}: {e}");
            }
        }
    }
}
