//! The registry: which lava-flow buffer holds an address?
//!
//! Every buffer of a context (allocated, imported or registered user memory) is entered here
//! and removed when dropped. Ranges may overlap (the same exported buffer imported twice maps
//! the same bytes), so the registry keeps the address space cut into disjoint pieces, each
//! listing the buffers that cover it: a lookup is one `BTreeMap` predecessor search,
//! O(log n), whatever overlaps exist.
//!
//! Buffers that lie in a memory file (allocated and imported CPU memory) also keep their
//! arena here, so that a channel can send bytes found in them by reference
//! (`Registry::find_shareable`). That lookup runs on every copy send, so it starts with two
//! lock-free checks: no shareable buffer at all, or an address outside the span they cover.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(feature = "vulkan")]
use std::sync::Arc;

use parking_lot::RwLock;

use super::arena::SharedArena;
use super::cuda::CudaMemoryKind;
#[cfg(feature = "vulkan")]
use super::gpu::GpuBuffer;
use super::location::MemoryLocation;
use crate::error::{Error, Result};

/// Identifies a buffer within this process (unique across contexts, never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub(crate) u64);

impl BufferId {
    pub(crate) fn next() -> BufferId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        BufferId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How a buffer came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferOrigin {
    /// Allocated by this process from its arenas: exportable.
    Allocated,
    /// User memory entered with [`Context::register`](super::Context::register): not
    /// exportable, and its memory is the user's to free after the buffer is dropped.
    Registered,
    /// Another process's (or this process's) export, mapped here: the very same memory.
    Imported { exporter_pid: u32 },
    /// CUDA device memory the application allocated, entered with
    /// [`Context::register`](super::Context::register) (the whole allocation holding the
    /// address), of this kind. Not exportable yet, and the application's to free.
    Cuda { kind: CudaMemoryKind },
}

impl BufferOrigin {
    /// Whether the memory is the application's, entered with `register` (host or CUDA
    /// memory): forgotten, never freed, when the buffer goes.
    pub fn is_registered(self) -> bool {
        matches!(self, BufferOrigin::Registered | BufferOrigin::Cuda { .. })
    }
}

impl fmt::Display for BufferOrigin {
    /// In words, for messages: "allocated", "registered user memory", "imported from
    /// process 42", "registered cudaMalloc memory".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferOrigin::Allocated => f.write_str("allocated"),
            BufferOrigin::Registered => f.write_str("registered user memory"),
            BufferOrigin::Imported { exporter_pid } => write!(f, "imported from process {exporter_pid}"),
            BufferOrigin::Cuda { kind } => write!(f, "registered {kind}"),
        }
    }
}

/// What the registry knows of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    pub id: BufferId,
    pub base: usize,
    pub len: usize,
    pub location: MemoryLocation,
    pub page_size: usize,
    pub origin: BufferOrigin,
}

/// The answer to [`Context::find`](super::Context::find): the buffer holding an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundBuffer {
    pub info: BufferInfo,
    /// How far into the buffer the address is.
    pub offset: usize,
}

/// Memory a peer can reach by itself in which a registered buffer lies: what a channel needs
/// to send bytes of the buffer by reference.
#[derive(Clone, Debug)]
pub(crate) enum SharedMemory {
    /// A memory file, and where the buffer starts in it.
    File(SharedArena, usize),
    /// An allocated GPU buffer whose host mapping is registered (HOST_VISIBLE memory, or
    /// DEVICE_LOCAL where the host maps it).
    #[cfg(feature = "vulkan")]
    Gpu(Arc<GpuBuffer>),
}

#[derive(Debug)]
struct Piece {
    end: usize,
    /// The buffers covering the piece, oldest first.
    ids: Vec<BufferId>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Disjoint pieces keyed by start address.
    pieces: BTreeMap<usize, Piece>,
    buffers: HashMap<BufferId, BufferInfo>,
    /// The memory a peer can reach of each buffer that lies in some (see [`SharedMemory`]).
    arenas: HashMap<BufferId, SharedMemory>,
}

#[derive(Debug)]
pub(crate) struct Registry {
    inner: RwLock<Inner>,
    /// How many entries `arenas` holds, and a span `[low, high)` covering all of them (it
    /// only grows while any is left): read without the lock by `find_shareable`.
    shareable: AtomicUsize,
    low: AtomicUsize,
    high: AtomicUsize,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            inner: RwLock::default(),
            shareable: AtomicUsize::new(0),
            low: AtomicUsize::new(usize::MAX),
            high: AtomicUsize::new(0),
        }
    }
}

impl Inner {
    /// Cuts the piece that straddles `at`, if any, so that `at` starts a piece.
    fn split_at(&mut self, at: usize) {
        let Some((&start, piece)) = self.pieces.range_mut(..at).next_back() else { return };
        if piece.end > at {
            let tail = Piece { end: piece.end, ids: piece.ids.clone() };
            piece.end = at;
            debug_assert!(start < at);
            self.pieces.insert(at, tail);
        }
    }

    /// The first buffer overlapping `[start, end)`, if any.
    fn overlapping(&self, start: usize, end: usize) -> Option<&BufferInfo> {
        let (_, piece) = self.pieces.range(..end).next_back()?;
        (piece.end > start).then(|| &self.buffers[&piece.ids[0]])
    }
}

impl Registry {
    /// Enters a buffer, with its arena when it lies in a memory file. With `exclusive`, a range
    /// overlapping any registered buffer is refused.
    pub(crate) fn insert(&self, info: BufferInfo, exclusive: bool, arena: Option<SharedMemory>) -> Result<()> {
        let (start, end) = (info.base, info.base + info.len);
        let mut inner = self.inner.write();
        if exclusive {
            if let Some(other) = inner.overlapping(start, end) {
                return Err(Error::invalid(format!(
                    "[{start:#x}, {end:#x}) overlaps lava-flow buffer {} at [{:#x}, {:#x}) ({}); \
                     a range can be registered once",
                    other.id,
                    other.base,
                    other.base + other.len,
                    other.location
                )));
            }
        }
        inner.split_at(start);
        inner.split_at(end);
        let mut cursor = start;
        let mut gaps = Vec::new();
        for (&piece_start, piece) in inner.pieces.range_mut(start..end) {
            if piece_start > cursor {
                gaps.push((cursor, piece_start));
            }
            piece.ids.push(info.id);
            cursor = piece.end;
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        for (gap_start, gap_end) in gaps {
            inner.pieces.insert(gap_start, Piece { end: gap_end, ids: vec![info.id] });
        }
        inner.buffers.insert(info.id, info);
        if let Some(arena) = arena {
            inner.arenas.insert(info.id, arena);
            // Under the write lock: the span and the count change together.
            self.low.fetch_min(start, Ordering::Relaxed);
            self.high.fetch_max(end, Ordering::Relaxed);
            self.shareable.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    pub(crate) fn remove(&self, id: BufferId) {
        let mut inner = self.inner.write();
        let Some(info) = inner.buffers.remove(&id) else { return };
        if inner.arenas.remove(&id).is_some() && self.shareable.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.low.store(usize::MAX, Ordering::Relaxed);
            self.high.store(0, Ordering::Relaxed);
        }
        let mut emptied = Vec::new();
        for (&start, piece) in inner.pieces.range_mut(info.base..info.base + info.len) {
            piece.ids.retain(|&other| other != id);
            if piece.ids.is_empty() {
                emptied.push(start);
            }
        }
        for start in emptied {
            inner.pieces.remove(&start);
        }
    }

    pub(crate) fn find(&self, addr: usize) -> Option<FoundBuffer> {
        let inner = self.inner.read();
        let (_, piece) = inner.pieces.range(..=addr).next_back()?;
        if piece.end <= addr {
            return None;
        }
        let info = inner.buffers[piece.ids.last()?];
        Some(FoundBuffer { info, offset: addr - info.base })
    }

    /// The memory a peer can reach holding all of `[addr, addr + len)` inside one buffer, and
    /// where the range starts in it (in the memory file; in the GPU buffer); `None` for any
    /// other memory. Costs one atomic load when no such buffer exists, two more when `addr`
    /// lies outside them all; only then a lock and a tree search.
    #[inline]
    pub(crate) fn find_shareable(&self, addr: usize, len: usize) -> Option<(SharedMemory, usize)> {
        if self.shareable.load(Ordering::Acquire) == 0 {
            return None;
        }
        let end = addr.checked_add(len)?;
        if addr < self.low.load(Ordering::Relaxed) || end > self.high.load(Ordering::Relaxed) {
            return None;
        }
        self.find_shareable_slow(addr, end)
    }

    #[cold]
    fn find_shareable_slow(&self, addr: usize, end: usize) -> Option<(SharedMemory, usize)> {
        let inner = self.inner.read();
        let (_, piece) = inner.pieces.range(..=addr).next_back()?;
        if piece.end <= addr {
            return None;
        }
        // Overlapping buffers (one export imported twice) are mappings of the same memory:
        // any of them that holds the whole range will do.
        piece.ids.iter().rev().find_map(|id| {
            let info = &inner.buffers[id];
            let memory = inner.arenas.get(id)?;
            let start = match memory {
                SharedMemory::File(_, offset) => offset,
                #[cfg(feature = "vulkan")]
                SharedMemory::Gpu(_) => &0,
            };
            (end <= info.base + info.len).then(|| (memory.clone(), start + (addr - info.base)))
        })
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, id: BufferId) -> bool {
        self.inner.read().buffers.contains_key(&id)
    }

    #[cfg(test)]
    fn piece_count(&self) -> usize {
        self.inner.read().pieces.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(id: u64, base: usize, len: usize) -> BufferInfo {
        BufferInfo {
            id: BufferId(id),
            base,
            len,
            location: MemoryLocation::CpuStandard,
            page_size: 4096,
            origin: BufferOrigin::Allocated,
        }
    }

    #[test]
    fn finds_the_buffer_holding_an_address() {
        let registry = Registry::default();
        registry.insert(info(1, 1000, 100), true, None).unwrap();
        registry.insert(info(2, 1100, 50), true, None).unwrap();
        assert_eq!(registry.find(999), None);
        assert_eq!(registry.find(1000).unwrap().info.id, BufferId(1));
        let found = registry.find(1099).unwrap();
        assert_eq!((found.info.id, found.offset), (BufferId(1), 99));
        assert_eq!(registry.find(1100).unwrap().info.id, BufferId(2));
        assert_eq!(registry.find(1150), None);
        let err = registry.insert(info(3, 1080, 10), true, None).unwrap_err();
        assert!(err.to_string().contains("overlaps lava-flow buffer #1"), "{err}");
    }

    #[test]
    fn overlapping_ranges_are_tracked_and_removed_cleanly() {
        let registry = Registry::default();
        registry.insert(info(1, 0, 100), false, None).unwrap();
        registry.insert(info(2, 50, 100), false, None).unwrap();
        registry.insert(info(3, 0, 100), false, None).unwrap();
        assert_eq!(registry.find(10).unwrap().info.id, BufferId(3));
        assert_eq!(registry.find(120).unwrap().info.id, BufferId(2));
        registry.remove(BufferId(3));
        assert_eq!(registry.find(10).unwrap().info.id, BufferId(1));
        assert_eq!(registry.find(60).unwrap().info.id, BufferId(2));
        registry.remove(BufferId(2));
        assert_eq!(registry.find(120), None);
        assert_eq!(registry.find(60).unwrap().info.id, BufferId(1));
        registry.remove(BufferId(1));
        assert_eq!(registry.piece_count(), 0);
        assert!(!registry.contains(BufferId(1)));
    }
}
