//! The CUDA allocations a context registered: one registration per allocation, shared by
//! every buffer registered in it, and cached by (base, `BUFFER_ID`).
//!
//! Registering a second tensor of an allocation returns the registration the first made: the
//! buffers share one [`CudaRegistration`] (one buffer id, one registry entry for the whole
//! allocation), which ends when the last of them is dropped. A cached registration is served
//! only for the same base and the same `BUFFER_ID`: CUDA gives memory re-created at the same
//! address a new id, so a freed and re-allocated allocation is never served from the stale
//! entry. The stale registration is retired instead: out of the cache and out of the
//! registry (no address finds it any more), while the buffers that still hold it stay valid
//! objects until their owners drop them.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::cuda::CudaPointer;
use super::location::MemoryLocation;
use super::registry::{BufferId, BufferInfo, BufferOrigin, Registry};
use crate::error::Result;

/// One registered CUDA allocation: in the registry (and the cache) while it lives.
#[derive(Debug)]
pub(crate) struct CudaRegistration {
    pub(crate) pointer: CudaPointer,
    pub(crate) info: BufferInfo,
    pub(crate) registry: Arc<Registry>,
    cache: Arc<CudaRegistry>,
}

/// A context's CUDA registrations by base address. Live entries never overlap: CUDA
/// allocations that exist at once do not, and an entry that a new allocation overlaps is
/// stale and retired when the new one is registered.
#[derive(Debug, Default)]
pub(crate) struct CudaRegistry {
    by_base: Mutex<BTreeMap<u64, Weak<CudaRegistration>>>,
}

impl CudaRegistry {
    /// The registration of the allocation `pointer` names: the cached one where base and
    /// `BUFFER_ID` match, else a new one entered in `registry`, retiring the registrations of
    /// memory it overlaps (freed since, and re-allocated).
    pub(crate) fn register(
        self: &Arc<Self>,
        pointer: CudaPointer,
        registry: &Arc<Registry>,
    ) -> Result<Arc<CudaRegistration>> {
        // Registrations let go of here are dropped after the lock: their drop takes it.
        let mut released = Vec::new();
        let registration = {
            let mut by_base = self.by_base.lock();
            if let Some(cached) = by_base.get(&pointer.base).and_then(Weak::upgrade) {
                if cached.pointer.buffer_id == pointer.buffer_id && cached.pointer.size == pointer.size {
                    return Ok(cached);
                }
                released.push(cached);
            }
            let end = pointer.base.saturating_add(pointer.size as u64);
            let mut overlapping: Vec<u64> = by_base.range(pointer.base..end).map(|(&base, _)| base).collect();
            if let Some((&base, entry)) = by_base.range(..pointer.base).next_back() {
                match entry.upgrade() {
                    // A dead entry goes too, overlapping or not.
                    None => overlapping.push(base),
                    Some(before) => {
                        if base + before.pointer.size as u64 > pointer.base {
                            overlapping.push(base);
                        }
                        released.push(before);
                    }
                }
            }
            for base in overlapping {
                if let Some(stale) = by_base.remove(&base).and_then(|entry| entry.upgrade()) {
                    log::debug!(
                        "CUDA allocation [{:#x}, +{}) (buffer id {}) was freed and its memory re-allocated: \
                         registration {} retired",
                        stale.pointer.base,
                        stale.pointer.size,
                        stale.pointer.buffer_id,
                        stale.info.id
                    );
                    registry.remove(stale.info.id);
                    released.push(stale);
                }
            }
            let info = BufferInfo {
                id: BufferId::next(),
                base: pointer.base as usize,
                len: pointer.size,
                location: MemoryLocation::CudaDevice { ordinal: pointer.device_ordinal },
                page_size: crate::os::page_size(),
                origin: BufferOrigin::Cuda { kind: pointer.kind },
            };
            // Not exclusive: a stale registration that is being dropped right now may still
            // be in the registry for a moment, and lookups take the newest entry.
            registry.insert(info, false, None)?;
            let registration =
                Arc::new(CudaRegistration { pointer, info, registry: Arc::clone(registry), cache: Arc::clone(self) });
            by_base.insert(pointer.base, Arc::downgrade(&registration));
            registration
        };
        drop(released);
        Ok(registration)
    }

    /// How many registrations are cached (live or not yet pruned).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_base.lock().len()
    }
}

impl Drop for CudaRegistration {
    fn drop(&mut self) {
        // A retired registration is in neither any more; removing it again is a no-op.
        self.registry.remove(self.info.id);
        let mut by_base = self.cache.by_base.lock();
        if by_base.get(&self.pointer.base).is_some_and(|entry| std::ptr::eq(entry.as_ptr(), self)) {
            by_base.remove(&self.pointer.base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::cuda::CudaMemoryKind;

    fn pointer(base: u64, size: usize, buffer_id: u64) -> CudaPointer {
        CudaPointer { kind: CudaMemoryKind::Legacy, base, size, buffer_id, device_ordinal: 0, context: 0 }
    }

    #[test]
    fn one_registration_per_allocation_until_the_last_holder_goes() {
        let (cache, registry) = (Arc::new(CudaRegistry::default()), Arc::new(Registry::default()));
        let first = cache.register(pointer(0x10_0000, 0x1000, 1), &registry).unwrap();
        let second = cache.register(pointer(0x10_0000, 0x1000, 1), &registry).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let found = registry.find(0x10_0800).unwrap();
        assert_eq!((found.info.id, found.offset), (first.info.id, 0x800));
        assert_eq!(found.info.origin, BufferOrigin::Cuda { kind: CudaMemoryKind::Legacy });
        drop(first);
        assert!(registry.find(0x10_0800).is_some(), "the second holder keeps it");
        drop(second);
        assert!(registry.find(0x10_0800).is_none());
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn memory_re_created_at_the_same_address_is_a_new_registration() {
        let (cache, registry) = (Arc::new(CudaRegistry::default()), Arc::new(Registry::default()));
        let old = cache.register(pointer(0x10_0000, 0x1000, 1), &registry).unwrap();
        // Freed and re-allocated at the same base: a new BUFFER_ID.
        let new = cache.register(pointer(0x10_0000, 0x1000, 2), &registry).unwrap();
        assert!(!Arc::ptr_eq(&old, &new));
        assert_ne!(old.info.id, new.info.id);
        assert_eq!(registry.find(0x10_0000).unwrap().info.id, new.info.id);
        // The stale one is retired: gone from the registry, and its drop leaves the new one.
        assert!(!registry.contains(old.info.id));
        drop(old);
        assert_eq!(registry.find(0x10_0000).unwrap().info.id, new.info.id);
        assert!(Arc::ptr_eq(&cache.register(pointer(0x10_0000, 0x1000, 2), &registry).unwrap(), &new));
        // A smaller allocation inside the old range, at another base, retires it too.
        let inside = cache.register(pointer(0x10_0800, 0x100, 3), &registry).unwrap();
        assert!(!registry.contains(new.info.id));
        assert_eq!(registry.find(0x10_0850).unwrap().info.id, inside.info.id);
        assert!(registry.find(0x10_0000).is_none());
        drop((new, inside));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn neighbours_are_left_alone() {
        let (cache, registry) = (Arc::new(CudaRegistry::default()), Arc::new(Registry::default()));
        let low = cache.register(pointer(0x10_0000, 0x1000, 1), &registry).unwrap();
        let high = cache.register(pointer(0x10_1000, 0x1000, 2), &registry).unwrap();
        assert_eq!(registry.find(0x10_0fff).unwrap().info.id, low.info.id);
        assert_eq!(registry.find(0x10_1000).unwrap().info.id, high.info.id);
        assert_eq!(cache.len(), 2);
    }
}
