//! Arenas: memfd-backed regions that buffers are carved from.
//!
//! One arena is one memory file (one fd) mapped once. Small buffers share pooled arenas, so
//! allocating one costs a lock and a few tree operations, no syscall; exporting any of them
//! hands out the arena's fd plus an offset. Buffers too large to pool get an arena of their
//! own, rounded up to the page size.
//!
//! Inside a pooled arena the [`Suballocator`] (the one GPU arenas use too) hands out ranges
//! of whole cache lines, under the pool's lock.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::cpu::{gpu_pinned, hugepage, numa, standard};
#[cfg(feature = "vulkan")]
use super::gpu::GpuBuffer;
use super::gpu_context::{ContextGpu, Pins};
use super::location::{HugePageSize, MemoryLocation};
use super::suballocator::{Allocation, Suballocator};
use crate::error::Result;
use crate::os::page_size;
use crate::os::{BorrowedHandle, Mapping, OwnedHandle};

/// The unit of pooled buffers, and so the alignment of every one: a cache line.
pub(crate) const MIN_BLOCK: usize = 64;

/// How an arena's memory is obtained: one pool per strategy (and node or page size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Strategy {
    Standard,
    Numa(u32),
    Hugetlb(HugePageSize),
    /// Best-effort hugepage fallback: ordinary memory advised for transparent huge pages.
    TransparentHuge,
    Pinned,
}

impl Strategy {
    /// The page size this strategy guarantees.
    pub(crate) fn page_size(self) -> usize {
        match self {
            Strategy::Hugetlb(page) => page.bytes(),
            _ => page_size(),
        }
    }

    /// The location a buffer of this strategy really is.
    fn obtained_location(self) -> MemoryLocation {
        match self {
            Strategy::Standard | Strategy::TransparentHuge => MemoryLocation::CpuStandard,
            Strategy::Numa(node) => MemoryLocation::CpuNuma { node: Some(node) },
            Strategy::Hugetlb(page) => MemoryLocation::CpuHugepage { page },
            Strategy::Pinned => MemoryLocation::CpuGpuPinned,
        }
    }

    /// The size of this strategy's pooled arenas, given the configured size.
    pub(crate) fn pooled_arena_size(self, configured: usize) -> usize {
        match self {
            Strategy::Hugetlb(page) => configured.max(page.bytes()),
            Strategy::TransparentHuge => configured.max(HugePageSize::Size2M.bytes()),
            _ => configured,
        }
    }
}

static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// One memory file, mapped here.
#[derive(Debug)]
pub(crate) struct Arena {
    /// GPU API registrations of pinned memory. Declared first so that they are dropped
    /// (unregistered) before the memory is unmapped.
    pub(crate) pins: Pins,
    /// Unique in this process; travels in export handles.
    pub(crate) id: u64,
    pub(crate) fd: OwnedHandle,
    pub(crate) mapping: Mapping,
    pub(crate) location: MemoryLocation,
    pub(crate) page_size: usize,
}

impl Arena {
    /// Creates an arena of `size` bytes (a multiple of the strategy's page size), applying the
    /// strategy's placement before anything touches the memory. Pinned arenas are registered
    /// with the GPU APIs `gpu` has (a failed registration is recorded, not an error).
    pub(crate) fn create(
        strategy: Strategy,
        size: usize,
        topology: &numa::NumaTopology,
        gpu: &ContextGpu,
    ) -> Result<Arena> {
        let (fd, mapping) = match strategy {
            Strategy::Hugetlb(page) => hugepage::create(size, page)?,
            _ => standard::create_shared_memory(size, None)?,
        };
        match strategy {
            Strategy::Numa(node) => numa::bind(&mapping, node, topology)?,
            Strategy::TransparentHuge => hugepage::advise_transparent(&mapping),
            Strategy::Pinned => gpu_pinned::lock(&mapping)?,
            Strategy::Standard | Strategy::Hugetlb(_) => {}
        }
        let pins = if strategy == Strategy::Pinned { gpu.pin(&mapping) } else { Pins::default() };
        Ok(Arena {
            pins,
            id: NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed),
            fd,
            mapping,
            location: strategy.obtained_location(),
            page_size: strategy.page_size(),
        })
    }
}

/// A block handed out by a pool: where it is, and what to give back.
pub(crate) struct Block {
    pub(crate) arena: Arc<Arena>,
    pub(crate) offset: usize,
    /// Its range of the arena (its size rounded up to [`MIN_BLOCK`]), to give back.
    pub(crate) range: Allocation,
}

/// The arenas of one strategy.
#[derive(Debug)]
pub(crate) struct Pool {
    strategy: Strategy,
    arena_size: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    arenas: Vec<(Arc<Arena>, Suballocator)>,
    /// The arena that served last: tried first.
    current: usize,
    /// Arenas with nothing allocated. One is kept for the next allocation; more are released.
    empty: usize,
}

impl PoolState {
    /// `reserved` bytes (a multiple of [`MIN_BLOCK`]) of the arena at `index`, if it has them.
    fn allocate_from(&mut self, index: usize, reserved: usize) -> Option<Block> {
        let (arena, ranges) = &mut self.arenas[index];
        let was_empty = ranges.is_empty();
        let range = ranges.allocate(reserved as u64, MIN_BLOCK as u64)?;
        if was_empty {
            self.empty -= 1;
        }
        self.current = index;
        Some(Block { arena: Arc::clone(arena), offset: range.offset as usize, range })
    }
}

impl Pool {
    pub(crate) fn new(strategy: Strategy, arena_size: usize) -> Pool {
        Pool { strategy, arena_size, state: Mutex::new(PoolState::default()) }
    }

    /// Whether buffers of `size` bytes come from this pool's arenas (or get their own).
    pub(crate) fn serves(&self, size: usize) -> bool {
        size <= self.arena_size / 4
    }

    /// A block of at least `size` bytes (one this pool [`serves`](Self::serves)).
    pub(crate) fn allocate(&self, size: usize, topology: &numa::NumaTopology, gpu: &ContextGpu) -> Result<Block> {
        let reserved = size.max(1).next_multiple_of(MIN_BLOCK);
        {
            let mut state = self.state.lock();
            let count = state.arenas.len();
            let start = state.current.min(count.saturating_sub(1));
            for index in (start..count).chain(0..start) {
                if let Some(block) = state.allocate_from(index, reserved) {
                    return Ok(block);
                }
            }
        }
        // Every arena is full: make one without holding the lock (it may take a while for
        // pinned or huge-page memory), then carve from it.
        let arena = Arc::new(Arena::create(self.strategy, self.arena_size, topology, gpu)?);
        let mut state = self.state.lock();
        state.arenas.push((arena, Suballocator::new(self.arena_size as u64)));
        state.empty += 1;
        let index = state.arenas.len() - 1;
        Ok(state.allocate_from(index, reserved).expect("a fresh arena serves any pooled size"))
    }

    /// Gives back a block: its arena and range.
    pub(crate) fn release(&self, arena: &Arc<Arena>, range: Allocation) {
        let released = {
            let mut state = self.state.lock();
            let Some(index) = state.arenas.iter().position(|(a, _)| Arc::ptr_eq(a, arena)) else {
                debug_assert!(false, "block released to a pool that does not hold its arena");
                return;
            };
            let ranges = &mut state.arenas[index].1;
            ranges.release(range);
            if !ranges.is_empty() {
                return;
            }
            if state.empty == 0 {
                state.empty = 1;
                return;
            }
            let (released, _) = state.arenas.swap_remove(index);
            if state.current >= state.arenas.len() {
                state.current = 0;
            }
            released
        };
        // Unmapped and closed here, outside the lock, unless an export still holds it.
        drop(released);
    }

    #[cfg(test)]
    fn arena_count(&self) -> usize {
        self.state.lock().arenas.len()
    }
}

/// An arena imported from an export handle, mapped here once however many buffers use it.
#[derive(Debug)]
pub(crate) struct ImportedArena {
    key: (u64, u64),
    pub(crate) fd: OwnedHandle,
    pub(crate) mapping: Mapping,
    pub(crate) arena_id: u64,
    pub(crate) exporter_pid: u32,
    pub(crate) exporter_token: u64,
    cache: Arc<ImportCache>,
}

impl Drop for ImportedArena {
    fn drop(&mut self) {
        let mut map = self.cache.map.lock();
        // A fresh import of the same file may already have replaced this entry.
        if map.get(&self.key).is_some_and(|weak| weak.strong_count() == 0) {
            map.remove(&self.key);
        }
    }
}

/// The arenas a context has imported, keyed by the memory file's identity (device, inode):
/// what the fd really is, not what the handle claims.
#[derive(Debug, Default)]
pub(crate) struct ImportCache {
    map: Mutex<HashMap<(u64, u64), Weak<ImportedArena>>>,
}

impl ImportCache {
    /// How many imported arenas are mapped now.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().values().filter(|arena| arena.strong_count() > 0).count()
    }

    /// The imported arena of the memory file whose identity is `key`: the one mapped already
    /// (`fd` is closed then), or `fd` mapped now, all `size` bytes of it, for the arena
    /// `arena_id` of `exporter` (pid, token).
    pub(crate) fn get_or_map(
        self: &Arc<Self>,
        key: (u64, u64),
        fd: OwnedHandle,
        size: usize,
        arena_id: u64,
        (exporter_pid, exporter_token): (u32, u64),
    ) -> Result<Arc<ImportedArena>> {
        let mut map = self.map.lock();
        if let Some(arena) = map.get(&key).and_then(Weak::upgrade) {
            return Ok(arena);
        }
        let mapping = Mapping::shared(&fd, 0, size)?;
        let arena = Arc::new(ImportedArena {
            key,
            fd,
            mapping,
            arena_id,
            exporter_pid,
            exporter_token,
            cache: Arc::clone(self),
        });
        map.insert(key, Arc::downgrade(&arena));
        Ok(arena)
    }
}

/// The memory file (arena) a CPU buffer lies in: what a peer maps to read the buffer where it
/// lies. Cloning it keeps the arena's memory alive (in this process) as long as the clone.
#[derive(Clone)]
pub struct SharedArena {
    arena: ArenaRef,
}

#[derive(Clone)]
enum ArenaRef {
    Local(Arc<Arena>),
    Imported(Arc<ImportedArena>),
}

impl SharedArena {
    /// The memory file of an arena of this process.
    pub(crate) fn local(arena: &Arc<Arena>) -> SharedArena {
        SharedArena { arena: ArenaRef::Local(Arc::clone(arena)) }
    }

    /// The memory file of an imported arena.
    pub(crate) fn imported(arena: &Arc<ImportedArena>) -> SharedArena {
        SharedArena { arena: ArenaRef::Imported(Arc::clone(arena)) }
    }

    /// The Vulkan buffer over the whole arena, for GPU-pinned memory imported into the
    /// context's device.
    #[cfg(feature = "vulkan")]
    pub(crate) fn vulkan_buffer(&self) -> Option<&GpuBuffer> {
        match &self.arena {
            ArenaRef::Local(a) => a.pins.vulkan_buffer(),
            ArenaRef::Imported(_) => None,
        }
    }

    /// The memory file, to pass to the peer (`SCM_RIGHTS`).
    pub fn fd(&self) -> BorrowedHandle<'_> {
        match &self.arena {
            ArenaRef::Local(a) => crate::os::borrow(&a.fd),
            ArenaRef::Imported(a) => crate::os::borrow(&a.fd),
        }
    }

    /// The size of the memory file (all of it is mapped, here and by the peer).
    pub fn len(&self) -> usize {
        match &self.arena {
            ArenaRef::Local(a) => a.mapping.len(),
            ArenaRef::Imported(a) => a.mapping.len(),
        }
    }

    /// Always false: arenas are never empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the arena is mapped in this process.
    pub fn base(&self) -> *const u8 {
        match &self.arena {
            ArenaRef::Local(a) => a.mapping.as_ptr(),
            ArenaRef::Imported(a) => a.mapping.as_ptr(),
        }
    }

    /// A reference that keeps the arena's memory mapped (and its file open) while held.
    pub fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        match &self.arena {
            ArenaRef::Local(a) => Arc::clone(a) as Arc<dyn Any + Send + Sync>,
            ArenaRef::Imported(a) => Arc::clone(a) as Arc<dyn Any + Send + Sync>,
        }
    }

    /// Identifies the arena in this process while anything (a clone, a `Weak` of
    /// [`keep_alive`](Self::keep_alive)) still refers to it: the address of its shared state.
    pub fn identity(&self) -> usize {
        match &self.arena {
            ArenaRef::Local(a) => Arc::as_ptr(a) as *const () as usize,
            ArenaRef::Imported(a) => Arc::as_ptr(a) as *const () as usize,
        }
    }
}

impl fmt::Debug for SharedArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedArena").field("base", &self.base()).field("len", &self.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_blocks_are_whole_cache_lines() {
        let topology = numa::NumaTopology::detect();
        let gpu = ContextGpu::disabled();
        let pool = Pool::new(Strategy::Standard, 1 << 16);
        let blocks: Vec<Block> =
            [1, 64, 65, 1000].iter().map(|&n| pool.allocate(n, &topology, &gpu).unwrap()).collect();
        assert!(blocks.iter().all(|b| b.offset % MIN_BLOCK == 0));
        let mut offsets: Vec<usize> = blocks.iter().map(|b| b.offset).collect();
        offsets.sort();
        // 1 and 64 bytes take a cache line each, 65 bytes two, 1000 bytes sixteen.
        let reserved: Vec<usize> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
        let mut expected = [64, 64, 128];
        let mut got = reserved.clone();
        got.sort();
        expected.sort();
        assert_eq!(got, expected, "blocks at {offsets:?}");
        for block in blocks {
            pool.release(&block.arena, block.range);
        }
        assert_eq!(pool.arena_count(), 1);
    }

    #[test]
    fn pool_keeps_one_empty_arena_and_releases_the_rest() {
        let topology = numa::NumaTopology::detect();
        let gpu = ContextGpu::disabled();
        let pool = Pool::new(Strategy::Standard, 1 << 16);
        let mut blocks = Vec::new();
        for _ in 0..12 {
            blocks.push(pool.allocate(1 << 14, &topology, &gpu).unwrap());
        }
        assert_eq!(pool.arena_count(), 3);
        for block in blocks.drain(..) {
            pool.release(&block.arena, block.range);
        }
        assert_eq!(pool.arena_count(), 1);
        let again = pool.allocate(64, &topology, &gpu).unwrap();
        assert_eq!(pool.arena_count(), 1);
        pool.release(&again.arena, again.range);
    }
}
