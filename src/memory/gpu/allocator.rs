//! The GPU allocator: buffers of the two GPU memory kinds, carved out of pooled exportable
//! arenas so that one exported file descriptor serves many buffers.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use ash::vk;
use parking_lot::Mutex;

use super::arena::{self, Arena, ArenaId, ArenaOrigin, ArenaParts, GpuMemoryKind};
use super::device::{describe_memory_flags, external, vk_err, VulkanDevice};
use crate::error::{Error, Result};
use crate::memory::suballocator::Allocation;

/// How a [`GpuAllocator`] pools memory.
#[derive(Clone, Debug)]
pub struct GpuAllocatorConfig {
    /// Size of each pooled arena (default 64 MiB). Requests larger than a quarter of this
    /// get an arena of their own (so that a large buffer shares its exported memory with no
    /// other buffer, as for CPU memory).
    pub arena_size: u64,
    /// Allocate memory that can be exported to other processes (default). `false` gives plain
    /// device memory, e.g. as the in-process baseline of a benchmark.
    pub exportable: bool,
    /// Give every arena of its own (large and unpooled buffers) a dedicated allocation, even
    /// where the driver neither requires nor prefers one (default: only where it does).
    /// Importers learn it from the export (`GPU_EXPORT_DEDICATED`).
    pub dedicated_own_arenas: bool,
    /// Take DEVICE_LOCAL memory from the memory type the host can also write (a resizable
    /// BAR) where the device offers one over all its memory (default): [`GpuBuffer::write`]
    /// then writes straight into it, with no staging. Host reads still go through a GPU copy.
    pub host_writable_device_local: bool,
}

impl Default for GpuAllocatorConfig {
    fn default() -> Self {
        GpuAllocatorConfig {
            arena_size: 64 << 20,
            exportable: true,
            dedicated_own_arenas: false,
            host_writable_device_local: true,
        }
    }
}

/// A memory type of the GPU's own memory that the host can also write, in the same heap as
/// the plain device-local type `plain` (a resizable BAR over all of the GPU's memory; a small
/// BAR window has a heap of its own and is not taken).
fn resizable_bar_type(device: &VulkanDevice, allowed_bits: u32, plain: u32) -> Option<u32> {
    use vk::MemoryPropertyFlags as F;
    let types = &device.info().memory_types;
    let heap = types.get(plain as usize)?.heap_index;
    let want = (F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT).as_raw();
    (0..types.len() as u32).find(|&i| {
        let t = &types[i as usize];
        allowed_bits & (1 << i) != 0 && t.heap_index == heap && t.property_flags & want == want
    })
}

/// The size of a new pooled arena of `kind` when the pool already has arenas of `largest`
/// bytes at most (0: none yet), for a request of `reserved` bytes. HOST_VISIBLE memory is
/// pinned host memory that the driver clears when it allocates it (about a quarter of a
/// millisecond per MiB), so its arenas start at 1/32 of the arena size and double up to
/// it; DEVICE_LOCAL arenas are allocated whole.
fn new_arena_size(kind: GpuMemoryKind, arena_size: u64, largest: u64, reserved: u64) -> u64 {
    match kind {
        GpuMemoryKind::DeviceLocal => arena_size,
        GpuMemoryKind::HostVisible => {
            let first = (arena_size / 32).max(1 << 20);
            largest.saturating_mul(2).max(first).max(reserved.next_power_of_two()).min(arena_size)
        }
    }
}

/// The pooled arenas of one memory kind.
type Pool = Mutex<Vec<Arc<Arena>>>;

/// How many empty pooled arenas of a kind stay allocated for the next buffers: when a freed
/// buffer leaves another arena empty, that one goes back to the driver at once.
/// [`GpuAllocator::trim`] gives back these too.
pub const SPARE_EMPTY_ARENAS: usize = 1;

/// Hands out [`GpuBuffer`]s on one device. `Send + Sync`.
pub struct GpuAllocator {
    device: VulkanDevice,
    config: GpuAllocatorConfig,
    handle_types: vk::ExternalMemoryHandleTypeFlags,
    /// False where the driver exports only dedicated allocations: every buffer then gets its
    /// own arena.
    pooling: bool,
    memory_types: [Option<u32>; 2],
    pools: [Arc<Pool>; 2],
    /// The bytes of every arena allocated here and not freed yet, counted by the arenas.
    live: Arc<AtomicU64>,
}

impl fmt::Debug for GpuAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuAllocator")
            .field("device", &self.device)
            .field("config", &self.config)
            .field("handle_types", &self.handle_types)
            .field("pooling", &self.pooling)
            .field("memory_types", &self.memory_types)
            .finish()
    }
}

impl GpuAllocator {
    pub fn new(device: &VulkanDevice, config: GpuAllocatorConfig) -> Result<Self> {
        let info = device.info();
        let largest_heap = info.memory_heaps.iter().map(|h| h.size).max().unwrap_or(0);
        if config.arena_size == 0 || config.arena_size > largest_heap {
            return Err(Error::invalid(format!(
                "gpu_arena_size {} must be from 1 byte to the largest memory heap of Vulkan device {} ({}), \
                 {largest_heap} bytes: no GPU allocation could succeed otherwise",
                config.arena_size, info.index, info.name
            )));
        }
        let mut handle_types = vk::ExternalMemoryHandleTypeFlags::empty();
        if config.exportable {
            if !info.opaque_fd.exportable {
                return Err(Error::Unsupported(format!(
                    "Vulkan device {} ({}) cannot export buffer memory as an {}",
                    info.index,
                    info.name,
                    external::HANDLE_NAME
                )));
            }
            handle_types |= external::MEMORY_HANDLE;
            let dma_buf = vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT.as_raw();
            if info.dma_buf.exportable && info.opaque_fd.compatible_handle_types & dma_buf != 0 {
                handle_types |= vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT;
            }
        }
        let pooling = !(config.exportable
            && (info.opaque_fd.dedicated_only
                || info.dma_buf.dedicated_only
                    && handle_types.contains(vk::ExternalMemoryHandleTypeFlags::DMA_BUF_EXT)));

        // The memory types a buffer of our usage may live in (the same for every size).
        let probe = arena::create_buffer(device, 4096, handle_types)?;
        arena::destroy_buffer(device, probe.buffer);
        let bits = probe.requirements.memory_type_bits;
        use vk::MemoryPropertyFlags as F;
        let plain_device_local = device.find_memory_type(bits, F::DEVICE_LOCAL, &[], F::HOST_VISIBLE);
        let device_local = match plain_device_local {
            Some(plain) if config.host_writable_device_local => {
                Some(resizable_bar_type(device, bits, plain).unwrap_or(plain))
            }
            other => other,
        };
        let host_visible =
            device.find_memory_type(bits, F::HOST_VISIBLE | F::HOST_COHERENT, &[F::HOST_CACHED], F::DEVICE_LOCAL);
        Ok(GpuAllocator {
            device: device.clone(),
            config,
            handle_types,
            pooling,
            memory_types: [device_local, host_visible],
            pools: [Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new()))],
            live: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn device(&self) -> &VulkanDevice {
        &self.device
    }

    pub fn config(&self) -> &GpuAllocatorConfig {
        &self.config
    }

    /// The memory type index buffers of `kind` come from, if the device has one.
    pub fn memory_type_index(&self, kind: GpuMemoryKind) -> Option<u32> {
        self.memory_types[kind.index()]
    }

    /// Whether buffers share pooled arenas (false where the driver exports only dedicated
    /// allocations).
    pub fn pools_arenas(&self) -> bool {
        self.pooling
    }

    /// A buffer of `size` bytes of `kind`, from a pooled arena (or, above a quarter of the
    /// arena size, an arena of its own).
    /// HOST_VISIBLE arenas start smaller and grow (see `new_arena_size`).
    pub fn allocate(&self, size: u64, kind: GpuMemoryKind) -> Result<GpuBuffer> {
        self.allocate_inner(size, kind, self.pooling)
    }

    /// A buffer of `size` bytes in a fresh arena of its own, never pooled: the cost of a
    /// plain exportable allocation.
    pub fn allocate_unpooled(&self, size: u64, kind: GpuMemoryKind) -> Result<GpuBuffer> {
        self.allocate_inner(size, kind, false)
    }

    fn allocate_inner(&self, size: u64, kind: GpuMemoryKind, pooled: bool) -> Result<GpuBuffer> {
        if size == 0 {
            return Err(Error::invalid("cannot allocate a GPU buffer of 0 bytes"));
        }
        let type_index = self.memory_types[kind.index()].ok_or_else(|| {
            Error::Unsupported(format!(
                "Vulkan device {} ({}) has no {kind} memory type for {} buffers",
                self.device.info().index,
                self.device.info().name,
                if self.config.exportable { "exportable" } else { "plain" }
            ))
        })?;
        let new = arena::create_buffer(&self.device, size, self.handle_types)?;
        if new.requirements.memory_type_bits & (1 << type_index) == 0 {
            arena::destroy_buffer(&self.device, new.buffer);
            return Err(Error::Vulkan(format!(
                "a {size}-byte buffer may not live in memory type {type_index} (allowed: {:#x})",
                new.requirements.memory_type_bits
            )));
        }
        if !pooled || new.requires_dedicated || new.requirements.size > self.config.arena_size / 4 {
            return self.own_arena(size, kind, type_index, new);
        }

        let align = new.requirements.alignment.max(1).next_power_of_two();
        let reserved = new.requirements.size;
        let (arena, range) = {
            let mut pool = self.pools[kind.index()].lock();
            let found = pool.iter().find_map(|a| a.free.lock().allocate(reserved, align).map(|r| (a.clone(), r)));
            match found {
                Some(found) => found,
                None => {
                    let largest = pool.iter().map(|a| a.size).max().unwrap_or(0);
                    let arena_size = new_arena_size(kind, self.config.arena_size, largest, reserved);
                    let memory =
                        match arena::allocate_memory(&self.device, arena_size, type_index, self.handle_types, None) {
                            Ok(m) => m,
                            Err(e) => {
                                arena::destroy_buffer(&self.device, new.buffer);
                                return Err(e);
                            }
                        };
                    let arena = Arc::new(Arena::new(
                        &self.device,
                        ArenaParts {
                            memory,
                            size: arena_size,
                            memory_type_index: type_index,
                            kind,
                            id: ArenaId::new_local(),
                            handle_types: self.handle_types,
                            dedicated_buffer: None,
                            origin: ArenaOrigin::Pooled,
                            host_pointer: None,
                            reexport_fd: None,
                            counted: Some(Arc::clone(&self.live)),
                        },
                    ));
                    let range = arena.free.lock().allocate(reserved, align).expect("a fresh arena fits the request");
                    pool.push(arena.clone());
                    (arena, range)
                }
            }
        };
        let pool = Some(Arc::downgrade(&self.pools[kind.index()]));
        let buffer = GpuBuffer {
            arena,
            buffer: new.buffer,
            owns_buffer: true,
            offset: range.offset,
            vk_offset: 0,
            size,
            range: Some(range),
            pool,
        };
        buffer.bind()?;
        Ok(buffer)
    }

    fn own_arena(
        &self,
        size: u64,
        kind: GpuMemoryKind,
        type_index: u32,
        mut new: arena::NewBuffer,
    ) -> Result<GpuBuffer> {
        // Only where the driver requires it: a driver's preference for dedicated memory (as
        // NVIDIA's for exportable buffers) makes every import of the arena slower, and an
        // arena of its own is imported by every consumer it is sent to.
        let dedicated = new.requires_dedicated
            || self.config.dedicated_own_arenas
            || (self.config.exportable && self.device.info().opaque_fd.dedicated_only);
        if dedicated && new.requirements.size != size {
            // The buffer of a dedicated allocation spans the whole allocation, so that an
            // importer can create the identical buffer from the arena size alone (the import
            // of a dedicated allocation must use a buffer identical to the exporter's).
            let whole = arena::create_buffer(&self.device, new.requirements.size, self.handle_types);
            arena::destroy_buffer(&self.device, new.buffer);
            new = whole?;
        }
        let memory = match arena::allocate_memory(
            &self.device,
            new.requirements.size,
            type_index,
            self.handle_types,
            dedicated.then_some(new.buffer),
        ) {
            Ok(m) => m,
            Err(e) => {
                arena::destroy_buffer(&self.device, new.buffer);
                return Err(e);
            }
        };
        let arena = Arc::new(Arena::new(
            &self.device,
            ArenaParts {
                memory,
                size: new.requirements.size,
                memory_type_index: type_index,
                kind,
                id: ArenaId::new_local(),
                handle_types: self.handle_types,
                dedicated_buffer: dedicated.then_some(new.buffer),
                origin: ArenaOrigin::Own,
                host_pointer: None,
                reexport_fd: None,
                counted: Some(Arc::clone(&self.live)),
            },
        ));
        let buffer = GpuBuffer {
            arena,
            buffer: new.buffer,
            owns_buffer: !dedicated,
            offset: 0,
            vk_offset: 0,
            size,
            range: None,
            pool: None,
        };
        buffer.bind()?;
        Ok(buffer)
    }

    /// Gives back every pooled arena that no buffer uses (the spares too): returns how many
    /// bytes of GPU memory went back to the driver. An arena still referenced elsewhere (a
    /// channel holding a message's memory for its consumer) leaves the pool too, but goes back
    /// only when that reference goes, and is not counted here.
    pub fn trim(&self) -> u64 {
        self.pools.iter().map(|pool| release_empty_arenas(pool, 0)).sum()
    }

    /// How many pooled arenas of `kind` exist.
    pub fn arena_count(&self, kind: GpuMemoryKind) -> usize {
        self.pools[kind.index()].lock().len()
    }

    /// The bytes of GPU memory the pooled arenas of `kind` hold, used or not.
    pub fn pooled_bytes(&self, kind: GpuMemoryKind) -> u64 {
        self.pools[kind.index()].lock().iter().map(|a| a.size).sum()
    }

    /// The bytes of GPU memory allocated here that the driver has not got back yet, of both
    /// kinds: every arena not freed, pooled or of its own, used or not, and those that left
    /// the pool but that something else still holds (a channel, for a message its consumer
    /// has not released).
    pub fn allocated_bytes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }
}

/// Drops the pool's reference to its empty arenas beyond the first `keep`; returns the bytes
/// of those this freed (the pool's was their last reference). Takes the pool's lock, then each
/// arena's (the order the allocation path uses).
fn release_empty_arenas(pool: &Pool, keep: usize) -> u64 {
    let released: Vec<Arc<Arena>> = {
        let mut pool = pool.lock();
        let mut kept = 0;
        let (stay, go) = std::mem::take(&mut *pool).into_iter().partition(|arena| {
            if arena.free.lock().used() != 0 {
                return true;
            }
            kept += 1;
            kept <= keep
        });
        *pool = stay;
        go
    };
    // Outside the pool's lock: an arena whose last reference was the pool's is freed here;
    // one that something else still holds (a channel, for a message its consumer has not
    // released) goes back when that lets go of it, and is not counted.
    let mut freed = 0;
    for arena in released {
        let size = arena.size;
        if let Some(last) = Arc::into_inner(arena) {
            drop(last);
            freed += size;
        }
    }
    freed
}

/// A range of GPU memory bound to a `VkBuffer`: allocated here from an arena, or imported
/// from another process. Dropping it returns the range to its arena; the arena's memory is
/// freed when its last buffer goes (and the allocator no longer pools it).
pub struct GpuBuffer {
    pub(crate) arena: Arc<Arena>,
    pub(crate) buffer: vk::Buffer,
    /// False when the buffer belongs to a dedicated arena, which destroys it.
    pub(crate) owns_buffer: bool,
    pub(crate) offset: u64,
    /// Where the buffer's first byte lies in `buffer` (0 but for imports at an offset that is
    /// not a multiple of the buffer alignment, and for imports inside a dedicated allocation,
    /// whose `VkBuffer` spans the whole allocation): `buffer` is bound at
    /// `offset - vk_offset`.
    pub(crate) vk_offset: u64,
    pub(crate) size: u64,
    /// The range taken from a pooled arena (`None`: the buffer has its arena to itself, or
    /// is imported).
    pub(crate) range: Option<Allocation>,
    /// The pool of a pooled arena's buffer, told when the buffer leaves its arena empty.
    pub(crate) pool: Option<Weak<Pool>>,
}

impl fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("kind", &self.arena.kind)
            .field("size", &self.size)
            .field("arena", &self.arena.id.to_string())
            .field("offset", &self.offset)
            .field("arena_size", &self.arena.size)
            .field("memory_type", &self.arena.memory_type_index)
            .field("flags", &describe_memory_flags(self.arena.property_flags.as_raw()))
            .finish()
    }
}

impl GpuBuffer {
    /// Binds the buffer at its offset; on failure, dropping `self` undoes the allocation.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: buffer and memory are live and of this device; offset + size lies inside
        // the arena and is aligned (the suballocator or the importer's checks made sure).
        unsafe {
            self.arena.device.shared.device.bind_buffer_memory(
                self.buffer,
                self.arena.memory,
                self.offset - self.vk_offset,
            )
        }
        .map_err(vk_err(&format!(
            "vkBindBufferMemory({} bytes at offset {} of arena {})",
            self.vk_offset + self.size,
            self.offset - self.vk_offset,
            self.arena.id
        )))
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Where the buffer starts in its arena.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn arena_size(&self) -> u64 {
        self.arena.size
    }

    pub fn arena_id(&self) -> ArenaId {
        self.arena.id
    }

    pub fn kind(&self) -> GpuMemoryKind {
        self.arena.kind
    }

    pub fn memory_type_index(&self) -> u32 {
        self.arena.memory_type_index
    }

    /// `VkMemoryPropertyFlags` of its memory type.
    pub fn memory_property_flags(&self) -> u32 {
        self.arena.property_flags.as_raw()
    }

    /// Whether the host can map it ([`GpuBuffer::map`]) and read/write it without staging.
    pub fn is_host_mappable(&self) -> bool {
        self.arena.host_mappable()
    }

    /// Whether it was imported from another process's export.
    pub fn is_imported(&self) -> bool {
        self.arena.origin == ArenaOrigin::Imported
    }

    /// Whether it may be exported to other processes: memory allocated exportable, and
    /// memory imported from an opaque fd (exported again as a copy of that fd).
    pub fn is_exportable(&self) -> bool {
        !self.arena.handle_types.is_empty() || self.arena.reexport_fd.is_some()
    }

    /// Whether its arena is a dedicated allocation (importers, CUDA included, must say so).
    pub fn is_dedicated(&self) -> bool {
        self.arena.dedicated_buffer.is_some()
    }

    pub fn device(&self) -> &VulkanDevice {
        &self.arena.device
    }

    /// The `VkBuffer`, for callers recording their own commands. Valid while `self` lives.
    /// The buffer's first byte lies at [`GpuBuffer::raw_buffer_offset`] in it.
    pub fn raw_buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// Where the buffer's first byte lies in [`GpuBuffer::raw_buffer`]: 0 but for some
    /// imported buffers (an export at an unaligned offset, or inside a dedicated allocation).
    pub fn raw_buffer_offset(&self) -> u64 {
        self.vk_offset
    }

    /// A reference that keeps the buffer's arena (its memory, and the device) alive while
    /// held, e.g. for memory a peer still reads after the buffer itself was dropped.
    #[allow(dead_code)] // for the channel layer's GPU route
    pub(crate) fn arena_keep_alive(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::clone(&self.arena) as Arc<dyn std::any::Any + Send + Sync>
    }

    /// The arena's `VkDeviceMemory` (shared with the other buffers of the arena).
    pub fn raw_memory(&self) -> vk::DeviceMemory {
        self.arena.memory
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if self.owns_buffer {
            arena::destroy_buffer(&self.arena.device, self.buffer);
        }
        if let Some(range) = self.range {
            let emptied = {
                let mut free = self.arena.free.lock();
                free.release(range);
                free.is_empty()
            };
            // The arena's lock is let go first: the pool's comes before it.
            if let Some(pool) = self.pool.as_ref().and_then(Weak::upgrade).filter(|_| emptied) {
                release_empty_arenas(&pool, SPARE_EMPTY_ARENAS);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{GpuExport, GpuImporter, HostMemoryImport};
    use super::*;

    #[test]
    fn host_visible_arenas_start_small_and_double() {
        const MIB: u64 = 1 << 20;
        let sizes: Vec<u64> = std::iter::successors(Some(0), |&largest| {
            Some(new_arena_size(GpuMemoryKind::HostVisible, 64 * MIB, largest, 4096))
        })
        .skip(1)
        .take(7)
        .collect();
        assert_eq!(sizes, [2, 4, 8, 16, 32, 64, 64].map(|m| m * MIB));
        // A request larger than the next size gets an arena that fits it.
        assert_eq!(new_arena_size(GpuMemoryKind::HostVisible, 64 * MIB, 2 * MIB, 9 * MIB), 16 * MIB);
        // Small arena sizes: never below 1 MiB, never above the arena size.
        assert_eq!(new_arena_size(GpuMemoryKind::HostVisible, 4 * MIB, 0, 4096), MIB);
        assert_eq!(new_arena_size(GpuMemoryKind::HostVisible, 512 << 10, 0, 4096), 512 << 10);
        assert_eq!(new_arena_size(GpuMemoryKind::DeviceLocal, 64 * MIB, 0, 4096), 64 * MIB);
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn gpu_handles_are_send_and_sync() {
        assert_send_sync::<GpuAllocator>();
        assert_send_sync::<GpuBuffer>();
        assert_send_sync::<GpuImporter>();
        assert_send_sync::<GpuExport>();
        assert_send_sync::<HostMemoryImport>();
    }
}
