//! [`Buffer`]: a range of memory lava-flow hands out, and what it really is.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::arena::{Arena, Pool};
use super::cpu::gpu_pinned::DeviceRegistration;
use super::export::{ExportHandle, ImportedArena};
use super::location::MemoryLocation;
use super::registry::{BufferInfo, Registry};
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
}

/// What keeps a buffer's memory alive, and where it goes back on drop.
#[derive(Debug)]
pub(crate) enum Backing {
    Pooled { pool: Arc<Pool>, arena: Arc<Arena>, offset: usize, order: usize },
    Dedicated { arena: Arc<Arena> },
    Imported { arena: Arc<ImportedArena>, offset: usize },
    Registered,
}

/// Everything a new buffer is made of but its id and registry.
pub(crate) struct BufferParts {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) location: MemoryLocation,
    pub(crate) page_size: usize,
    pub(crate) origin: BufferOrigin,
    pub(crate) backing: Backing,
}

/// A range of memory from lava-flow: allocated, imported or registered.
///
/// The memory may be shared with other processes, which can write it at any time; reading
/// and writing it is therefore done through raw pointers or the copying helpers
/// ([`Buffer::write_at`], [`Buffer::read_at`]), and synchronising with peers is the caller's
/// (or a channel's) business. Dropping the buffer returns its memory to its arena (and
/// removes it from the context's registry); the memory itself lives on while an importer
/// still maps it.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    info: BufferInfo,
    backing: Backing,
    registry: Arc<Registry>,
    registrations: Vec<DeviceRegistration>,
}

// SAFETY: a Buffer owns its range exclusively within this process (the pool hands a block to
// one buffer only) and holds Arcs to thread-safe arenas and registry; moving it to another
// thread moves that ownership.
unsafe impl Send for Buffer {}
// SAFETY: &Buffer gives out only the raw pointer, plain metadata and bounds-checked copies,
// whose concurrent use is as racy as any shared memory (documented above), never UB in Rust
// references.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Builds a buffer from its parts and enters it in `registry` (`exclusive`: refuse
    /// overlaps, for user registrations).
    pub(crate) fn new(parts: BufferParts, registry: &Arc<Registry>, exclusive: bool) -> Result<Buffer> {
        let BufferParts { ptr, len, location, page_size, origin, backing } = parts;
        let info = BufferInfo { id: BufferId::next(), base: ptr.as_ptr() as usize, len, location, page_size, origin };
        registry.insert(info, exclusive)?;
        Ok(Buffer { ptr, len, info, backing, registry: Arc::clone(registry), registrations: Vec::new() })
    }

    pub fn id(&self) -> BufferId {
        self.info.id
    }

    /// The first byte. Valid for `len()` bytes while the buffer lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: lava-flow never hands out empty buffers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The location really obtained (a NUMA buffer names its node; a best-effort hugepage
    /// request that fell back says `CpuStandard`). Imported buffers carry the exporter's.
    pub fn location(&self) -> MemoryLocation {
        self.info.location
    }

    /// The page size the memory is guaranteed to be backed by, in bytes: the huge page size
    /// for hugetlbfs memory, the base page size otherwise (transparent huge pages are never
    /// promised). For registered user memory: the base page size.
    pub fn page_size(&self) -> usize {
        self.info.page_size
    }

    pub fn origin(&self) -> BufferOrigin {
        self.info.origin
    }

    pub fn info(&self) -> BufferInfo {
        self.info
    }

    /// The GPU API registrations this buffer holds (none until the GPU layer adds them).
    pub fn registrations(&self) -> &[DeviceRegistration] {
        &self.registrations
    }

    #[allow(dead_code)]
    pub(crate) fn record_registration(&mut self, registration: DeviceRegistration) {
        self.registrations.push(registration);
    }

    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn check_range(&self, offset: usize, count: usize) -> Result<()> {
        if offset.checked_add(count).map_or(true, |end| end > self.len) {
            return Err(Error::invalid(format!(
                "range [{offset}, {offset} + {count}) is outside buffer {} of {} bytes",
                self.info.id, self.len
            )));
        }
        Ok(())
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        // SAFETY: the range was checked to lie inside the live buffer; `data` is a separate
        // Rust slice, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from the buffer at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The buffer as a byte slice.
    ///
    /// # Safety
    /// No one (thread or process) may write the memory while the slice is used.
    pub unsafe fn as_slice(&self) -> &[u8] {
        std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
    }

    /// The buffer as a mutable byte slice.
    ///
    /// # Safety
    /// No one else (thread or process) may read or write the memory while the slice is used.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
    }

    /// Exports the buffer for another process on this host: see [`ExportHandle`].
    pub fn export(&self) -> Result<ExportHandle> {
        super::export::export(self)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("id", &self.info.id)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("location", &self.info.location)
            .field("page_size", &self.info.page_size)
            .field("origin", &self.info.origin)
            .finish()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.registry.remove(self.info.id);
        if let Backing::Pooled { pool, arena, offset, order } = &self.backing {
            pool.release(arena, *offset, *order);
        }
        // Dedicated and imported arenas are released with their last Arc.
    }
}
