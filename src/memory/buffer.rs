//! [`Buffer`]: a range of memory lava-flow hands out, and what it really is.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::arena::{Arena, ImportedArena, Pool, SharedArena};
use super::cpu::gpu_pinned::DeviceRegistration;
use super::cuda::CudaPointer;
use super::cuda_registry::CudaRegistration;
#[cfg(feature = "vulkan")]
use super::gpu::{copy_buffer, GpuBuffer, GpuMemoryKind, TimelineSemaphore};
use super::gpu_context::Pins;
use super::location::MemoryLocation;
pub use super::registry::{BufferId, BufferOrigin};
use super::registry::{BufferInfo, Registry, SharedMemory};
use super::suballocator::Allocation;
use crate::error::{Error, Result};

/// How long reading or writing a GPU view waits on the host for its semaphore value.
#[cfg(feature = "vulkan")]
const VIEW_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The registry of buffers that are in none: GPU views ([`Buffer::gpu_view`]) hold no
/// context's registry, and [`Buffer::registry`] names this one for them (never entered into).
fn detached_registry() -> &'static Arc<Registry> {
    static DETACHED: std::sync::OnceLock<Arc<Registry>> = std::sync::OnceLock::new();
    DETACHED.get_or_init(Arc::default)
}

/// What keeps a buffer's memory alive, and where it goes back on drop.
#[derive(Debug)]
pub(crate) enum Backing {
    Pooled {
        pool: Arc<Pool>,
        arena: Arc<Arena>,
        offset: usize,
        /// The range of the arena reserved for it (the size rounded up to a cache line).
        range: Allocation,
    },
    Dedicated {
        arena: Arc<Arena>,
    },
    Imported {
        arena: Arc<ImportedArena>,
        offset: usize,
    },
    Registered,
    /// CUDA memory the application allocated: the registration of its whole allocation,
    /// shared by every buffer registered in it.
    Cuda {
        registration: Arc<CudaRegistration>,
    },
    /// Vulkan memory of the context's device: allocated from its pooled arenas, or imported.
    #[cfg(feature = "vulkan")]
    Gpu {
        buffer: Arc<GpuBuffer>,
    },
    /// Part of a GPU buffer (typically a whole imported arena), from `offset`, whose data is
    /// ready once `wait`'s semaphore reaches its value. Made without any Vulkan call.
    #[cfg(feature = "vulkan")]
    GpuView {
        whole: Arc<GpuBuffer>,
        offset: u64,
        wait: Option<(Arc<TimelineSemaphore>, u64)>,
    },
}

impl Backing {
    /// The memory file the backing's memory lies in, and where it starts in it: for memory
    /// of lava-flow's CPU arenas (not registered user memory, not GPU memory).
    pub(crate) fn shared_arena(&self) -> Option<(SharedArena, usize)> {
        match self {
            Backing::Pooled { arena, offset, .. } => Some((SharedArena::local(arena), *offset)),
            Backing::Dedicated { arena } => Some((SharedArena::local(arena), 0)),
            Backing::Imported { arena, offset } => Some((SharedArena::imported(arena), *offset)),
            _ => None,
        }
    }

    /// The memory a peer can reach by itself in which a new buffer of this backing lies, if
    /// there is any (see [`SharedMemory`]).
    #[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
    fn shared_memory(&self, origin: BufferOrigin) -> Option<SharedMemory> {
        match self {
            #[cfg(feature = "vulkan")]
            Backing::Gpu { buffer } if origin == BufferOrigin::Allocated => Some(SharedMemory::Gpu(Arc::clone(buffer))),
            _ => self.shared_arena().map(|(arena, offset)| SharedMemory::File(arena, offset)),
        }
    }
}

/// Everything a new buffer is made of but its id and registry.
pub(crate) struct BufferParts {
    /// The first byte in this process: `None` for GPU memory the host cannot map.
    pub(crate) ptr: Option<NonNull<u8>>,
    pub(crate) len: usize,
    pub(crate) location: MemoryLocation,
    pub(crate) page_size: usize,
    pub(crate) origin: BufferOrigin,
    pub(crate) backing: Backing,
}

/// A range of memory from lava-flow: allocated, imported or registered; CPU or GPU memory.
///
/// GPU memory that the host cannot map (DEVICE_LOCAL memory of a discrete GPU) has no host
/// pointer: [`Buffer::host_ptr`] says so, and [`Buffer::write_at`], [`Buffer::read_at`] and
/// [`Context::copy`](super::Context::copy) move its data (staged through the GPU).
///
/// The memory may be shared with other processes, which can write it at any time; reading
/// and writing it is therefore done through raw pointers or the copying helpers
/// ([`Buffer::write_at`], [`Buffer::read_at`]), and synchronising with peers is the caller's
/// (or a channel's) business. Dropping the buffer returns its memory to its arena (and
/// removes it from the context's registry); the memory itself lives on while an importer
/// still maps it.
pub struct Buffer {
    ptr: Option<NonNull<u8>>,
    len: usize,
    info: BufferInfo,
    backing: Backing,
    /// The context registry the buffer is entered in; `None` for GPU views, which are in none.
    registry: Option<Arc<Registry>>,
    /// Why the buffer is not at the location asked for (a GPU request served by CPU memory).
    fallback: Option<String>,
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
    /// overlaps, for user registrations). Memory without a host address stays out of the
    /// registry: no address of this process can point into it.
    pub(crate) fn new(parts: BufferParts, registry: &Arc<Registry>, exclusive: bool) -> Result<Buffer> {
        let BufferParts { ptr, len, location, page_size, origin, backing } = parts;
        let base = ptr.map_or(0, |p| p.as_ptr() as usize);
        let info = BufferInfo { id: BufferId::next(), base, len, location, page_size, origin };
        if ptr.is_some() {
            registry.insert(info, exclusive, backing.shared_memory(origin))?;
        }
        Ok(Buffer { ptr, len, info, backing, registry: Some(Arc::clone(registry)), fallback: None })
    }

    /// A buffer over a registered CUDA allocation (already entered in its registry by the
    /// registration, which it shares with every other buffer of the allocation: they have
    /// one id). No host address: the host cannot reach CUDA device memory.
    pub(crate) fn over_cuda(registration: Arc<CudaRegistration>) -> Buffer {
        let info = registration.info;
        let registry = Some(Arc::clone(&registration.registry));
        Buffer { ptr: None, len: info.len, info, backing: Backing::Cuda { registration }, registry, fallback: None }
    }

    /// A buffer over `len` bytes of `whole` from `offset`, whose data is ready once `wait`'s
    /// semaphore reaches its value (`None`: ready now). Costs no Vulkan call and no lock: the
    /// view is entered in no context's registry ([`Context::find`](super::Context::find) does
    /// not know it). Its host pointer, where `whole` is host-mappable, is `whole`'s mapping +
    /// `offset`; its location is `whole`'s kind of memory.
    ///
    /// [`Buffer::read_at`] and [`Buffer::write_at`] first wait on the host for the semaphore
    /// (10 s, then `Timeout`); [`Context::copy`](super::Context::copy) to or from another
    /// buffer of the same device makes the GPU wait instead; [`Buffer::export`] exports
    /// `whole`'s arena with the view's offset and size. [`Buffer::as_ptr`] and
    /// [`Buffer::host_ptr`] do not wait: check [`Buffer::gpu_wait`] first.
    #[cfg(feature = "vulkan")]
    pub fn gpu_view(
        whole: Arc<GpuBuffer>,
        offset: u64,
        len: usize,
        wait: Option<(Arc<TimelineSemaphore>, u64)>,
        origin: BufferOrigin,
    ) -> Result<Buffer> {
        if len == 0 {
            return Err(Error::invalid("a GPU buffer view needs at least one byte"));
        }
        if offset.checked_add(len as u64).map_or(true, |end| end > whole.size()) {
            return Err(Error::invalid(format!(
                "a view of {len} bytes at offset {offset} overruns its GPU buffer of {} bytes",
                whole.size()
            )));
        }
        if let Some((semaphore, _)) = &wait {
            if !semaphore.device().same_device(whole.device()) {
                return Err(Error::invalid(format!(
                    "a GPU buffer view on {} cannot wait on a semaphore of another device ({}); \
                     import the semaphore on the buffer's device",
                    whole.device().info().name,
                    semaphore.device().info().name
                )));
            }
        }
        let base = if whole.is_host_mappable() { whole.map()?.as_ptr() } else { std::ptr::null_mut() };
        Ok(Buffer::gpu_view_mapped(whole, offset, len, base, wait, origin))
    }

    /// [`Buffer::gpu_view`] of a range already checked, with `whole`'s mapping (`base`, null
    /// where the host cannot map it) already looked up: no check, no lock, no call.
    #[cfg(feature = "vulkan")]
    pub(crate) fn gpu_view_mapped(
        whole: Arc<GpuBuffer>,
        offset: u64,
        len: usize,
        base: *mut u8,
        wait: Option<(Arc<TimelineSemaphore>, u64)>,
        origin: BufferOrigin,
    ) -> Buffer {
        debug_assert!(len > 0 && offset + len as u64 <= whole.size());
        let ptr = if base.is_null() {
            None
        } else {
            // SAFETY: offset + len <= whole.size() (the caller checked): the result lies
            // inside the mapping of `whole`, which lives as long as the view holds it.
            NonNull::new(unsafe { base.add(offset as usize) })
        };
        let location = match whole.kind() {
            GpuMemoryKind::DeviceLocal => MemoryLocation::GpuDeviceLocal,
            GpuMemoryKind::HostVisible => MemoryLocation::GpuHostVisible,
        };
        let info = BufferInfo {
            id: BufferId::next(),
            base: ptr.map_or(0, |p| p.as_ptr() as usize),
            len,
            location,
            page_size: crate::os::page_size(),
            origin,
        };
        Buffer { ptr, len, info, backing: Backing::GpuView { whole, offset, wait }, registry: None, fallback: None }
    }

    /// The buffer's id. Buffers registered in the same CUDA allocation share its
    /// registration, and so one id.
    pub fn id(&self) -> BufferId {
        self.info.id
    }

    /// The first byte. Valid for `len()` bytes while the buffer lives. NULL for GPU memory
    /// the host cannot map and for CUDA memory (whose address is [`Buffer::cuda`]'s base);
    /// [`Buffer::host_ptr`] gives an error saying so instead.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }

    /// The first byte in this process, valid for `len()` bytes while the buffer lives: CPU
    /// memory, and GPU memory the host can map (HOST_VISIBLE; DEVICE_LOCAL where the driver
    /// maps it, as on resizable-BAR or CPU drivers). For other GPU memory an `InvalidState`
    /// error that names the way to its data ([`Buffer::write_at`], [`Buffer::read_at`]).
    pub fn host_ptr(&self) -> Result<*mut u8> {
        self.ptr.map(NonNull::as_ptr).ok_or_else(|| {
            if let Backing::Cuda { registration } = &self.backing {
                return Error::InvalidState(format!(
                    "buffer {} is {} ({}), which the host cannot read or write: move its data with CUDA \
                     (cudaMemcpy), or copy it into a lava-flow buffer on the GPU",
                    self.info.id, self.info.location, registration.pointer.kind
                ));
            }
            Error::InvalidState(format!(
                "buffer {} is {} that the host cannot map; move its data with the buffer write and \
                 read calls (lf_buffer_write/lf_buffer_read), which stage through the GPU, or copy it \
                 to another buffer (lf_buffer_copy)",
                self.info.id, self.info.location
            ))
        })
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

    /// For registered CUDA memory: the allocation (its device address, size, kind, device
    /// and CUDA's id of it). `None` for every other buffer.
    pub fn cuda(&self) -> Option<CudaPointer> {
        match &self.backing {
            Backing::Cuda { registration } => Some(registration.pointer),
            _ => None,
        }
    }

    /// What keeps a CUDA buffer's registration (its allocation's entry) alive, for a route that
    /// sends it: `None` for other memory.
    pub(crate) fn cuda_keep(&self) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        match &self.backing {
            Backing::Cuda { registration } => Some(Arc::clone(registration) as Arc<dyn std::any::Any + Send + Sync>),
            _ => None,
        }
    }

    pub fn info(&self) -> BufferInfo {
        self.info
    }

    /// The GPU API registrations the buffer's memory holds: GPU-pinned memory is imported
    /// into the context's Vulkan device (`VK_EXT_external_memory_host`) and registered with
    /// CUDA (`cuMemHostRegister`) where each is available. Empty for other memory.
    pub fn registrations(&self) -> &[DeviceRegistration] {
        self.pins().map_or(&[], |pins| &pins.registrations)
    }

    /// Why each registration that GPU-pinned memory could have had is missing (e.g. "CUDA:
    /// libcuda.so.1 is not installed"). A missing registration is no allocation failure.
    pub fn registration_failures(&self) -> &[String] {
        self.pins().map_or(&[], |pins| &pins.failures)
    }

    fn pins(&self) -> Option<&Pins> {
        match &self.backing {
            Backing::Pooled { arena, .. } | Backing::Dedicated { arena } => Some(&arena.pins),
            _ => None,
        }
    }

    /// Why the buffer is not at the location asked for: `Some` whenever it is elsewhere, that
    /// is when a GPU location was asked of a context without a Vulkan device (and `strict_gpu`
    /// unset), or huge pages under the best-effort policy (also [`Context::allocate_auto`]'s
    /// staging memory for a remote peer) and the kernel had none, which gave CPU standard
    /// memory instead. [`Buffer::location`] always says what the buffer really is.
    ///
    /// [`Context::allocate_auto`]: crate::memory::Context::allocate_auto
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    pub(crate) fn set_fallback(&mut self, reason: String) {
        self.fallback = Some(reason);
    }

    /// The GPU buffer behind the memory, and where in it this buffer starts: GPU memory (for
    /// views, the whole buffer and the view's offset), and GPU-pinned memory imported into
    /// the context's device.
    #[cfg(feature = "vulkan")]
    pub(crate) fn gpu_region(&self) -> Option<(&GpuBuffer, u64)> {
        match &self.backing {
            Backing::Gpu { buffer } => Some((buffer, 0)),
            Backing::GpuView { whole, offset, .. } => Some((whole, *offset)),
            Backing::Pooled { arena, offset, .. } => arena.pins.vulkan_buffer().map(|b| (b, *offset as u64)),
            Backing::Dedicated { arena } => arena.pins.vulkan_buffer().map(|b| (b, 0)),
            _ => None,
        }
    }

    /// The GPU memory of a GPU buffer or view (not GPU-pinned host memory) and where this
    /// buffer starts in it.
    #[cfg(feature = "vulkan")]
    fn gpu_memory(&self) -> Option<(&GpuBuffer, u64)> {
        match &self.backing {
            Backing::Gpu { buffer } => Some((buffer, 0)),
            Backing::GpuView { whole, offset, .. } => Some((whole, *offset)),
            _ => None,
        }
    }

    /// For a host transfer of `len` bytes at `addr` to or from `gpu`: the GPU-pinned arena of
    /// this buffer's context that holds the whole range, imported into `gpu`'s device, and
    /// where the range starts in it. The GPU then copies by DMA, with no host copy at all.
    /// Small transfers are left to the host.
    #[cfg(feature = "vulkan")]
    fn pinned_range(&self, addr: *const u8, len: usize, gpu: &GpuBuffer) -> Option<(SharedArena, u64)> {
        const PINNED_MIN: usize = 256 << 10;
        if len < PINNED_MIN {
            return None;
        }
        let (SharedMemory::File(arena, _), _) = self.registry().find_shareable(addr as usize, len)? else {
            return None;
        };
        let at = (addr as usize).checked_sub(arena.base() as usize)?;
        let pinned = arena.vulkan_buffer()?;
        (pinned.device().same_device(gpu.device()) && at + len <= pinned.size() as usize).then_some((arena, at as u64))
    }

    /// The GPU buffer behind a GPU buffer (allocated or imported; not a view, not GPU-pinned
    /// memory): its arena identity, device and exports.
    #[cfg(feature = "vulkan")]
    pub fn gpu_buffer(&self) -> Option<&GpuBuffer> {
        match &self.backing {
            Backing::Gpu { buffer } => Some(buffer),
            _ => None,
        }
    }

    /// For a GPU view: the semaphore and value its data is ready at, if it has one.
    #[cfg(feature = "vulkan")]
    pub fn gpu_wait(&self) -> Option<(&TimelineSemaphore, u64)> {
        match &self.backing {
            Backing::GpuView { wait: Some((semaphore, value)), .. } => Some((semaphore, *value)),
            _ => None,
        }
    }

    /// Waits on the host until a GPU view's data is ready (at most 10 s); at once for every
    /// other buffer.
    pub(crate) fn wait_ready(&self) -> Result<()> {
        #[cfg(feature = "vulkan")]
        if let Some((semaphore, value)) = self.gpu_wait() {
            if !semaphore.wait(value, VIEW_WAIT)? {
                let now = semaphore.value().map_or_else(|e| format!("unreadable: {e}"), |v| v.to_string());
                return Err(Error::Timeout(format!(
                    "buffer {} (a view of GPU memory) is ready when its timeline semaphore reaches \
                     value {value}, which did not happen within {VIEW_WAIT:?} (the semaphore is at {now}); \
                     the producer has not signalled it",
                    self.info.id
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn backing(&self) -> &Backing {
        &self.backing
    }

    /// The context registry the buffer is in (for GPU views, which are in none, a registry
    /// of no context).
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        self.registry.as_ref().unwrap_or_else(|| detached_registry())
    }

    pub(crate) fn check_range(&self, offset: usize, count: usize) -> Result<()> {
        if offset.checked_add(count).map_or(true, |end| end > self.len) {
            return Err(Error::invalid(format!(
                "range [{offset}, {offset} + {count}) is outside buffer {} of {} bytes",
                self.info.id, self.len
            )));
        }
        Ok(())
    }

    /// Copies `data` into the buffer at `offset`. GPU memory the host cannot map is written
    /// through a staging buffer and a GPU copy; the data is in place when the call returns.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        #[cfg(feature = "vulkan")]
        if let Some((gpu, start)) = self.gpu_memory() {
            self.wait_ready()?;
            let at = start + offset as u64;
            return match self.pinned_range(data.as_ptr(), data.len(), gpu) {
                Some((pinned, from)) => {
                    copy_buffer(pinned.vulkan_buffer().expect("checked"), from, gpu, at, data.len() as u64)
                }
                None => gpu.write(at, data),
            };
        }
        let base = self.host_ptr()?;
        // SAFETY: the range was checked to lie inside the live buffer; `data` is a separate
        // Rust slice, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(offset), data.len()) };
        Ok(())
    }

    /// Copies `out.len()` bytes from the buffer at `offset` into `out` (staged for GPU memory
    /// the host cannot map, as `write_at`).
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        #[cfg(feature = "vulkan")]
        if let Some((gpu, start)) = self.gpu_memory() {
            self.wait_ready()?;
            let at = start + offset as u64;
            return match self.pinned_range(out.as_ptr(), out.len(), gpu) {
                Some((pinned, to)) => {
                    copy_buffer(gpu, at, pinned.vulkan_buffer().expect("checked"), to, out.len() as u64)
                }
                None => gpu.read(at, out),
            };
        }
        let base = self.host_ptr()?;
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy_nonoverlapping(base.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The buffer as a byte slice.
    ///
    /// # Safety
    /// No one (thread or process) may write the memory while the slice is used.
    ///
    /// # Panics
    /// For GPU memory the host cannot map ([`Buffer::host_ptr`] fails).
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: mapped() is the start of the buffer's host mapping of `len` bytes; the caller
        // keeps others from writing them while the slice lives.
        unsafe { std::slice::from_raw_parts(self.mapped(), self.len) }
    }

    /// The buffer as a mutable byte slice.
    ///
    /// # Safety
    /// No one else (thread or process) may read or write the memory while the slice is used.
    ///
    /// # Panics
    /// As [`Buffer::as_slice`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the caller keeps everyone else off the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.mapped(), self.len) }
    }

    fn mapped(&self) -> *mut u8 {
        match self.host_ptr() {
            Ok(ptr) => ptr,
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether the buffer is registered user memory (`lf_register`), which no peer can map.
    pub(crate) fn is_registered(&self) -> bool {
        matches!(self.backing, Backing::Registered)
    }

    /// The memory file this buffer lies in and the buffer's offset in it, for sending the
    /// buffer by reference (a channel's buffer send). CPU memory allocated or imported by
    /// lava-flow has one; registered user memory and GPU memory are `Unsupported`, saying why.
    pub fn shared_arena(&self) -> Result<(SharedArena, usize)> {
        if let Some(found) = self.backing.shared_arena() {
            return Ok(found);
        }
        Err(Error::Unsupported(match &self.backing {
            Backing::Registered => format!(
                "buffer {} is registered user memory, which lives in no memory file another process \
                 can map; allocate it from the context (lf_alloc) to send it by reference, or \
                 send a copy",
                self.info.id
            ),
            Backing::Cuda { registration } => cuda_unsupported(self.info.id, registration.pointer),
            _ => format!(
                "buffer {} is {}, which lies in no memory file: GPU buffers are sent by reference \
                 through the channel's GPU route; to send its bytes through CPU memory, copy them \
                 into a CPU buffer first (lf_buffer_copy)",
                self.info.id, self.info.location
            ),
        }))
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
            .field("fallback", &self.fallback)
            .finish()
    }
}

/// Why CUDA memory of the application's cannot be exported or shared as a memory file, and
/// what can.
pub(crate) fn cuda_unsupported(id: BufferId, pointer: CudaPointer) -> String {
    format!(
        "buffer {id} is {} of CUDA device {}: exporting CUDA memory that lava-flow did not allocate is \
         not supported yet (channels send it by reference to a consumer on this host: lf_send_buffer); \
         lava-flow's own GPU buffers export (lf_alloc with LF_MEMORY_GPU_DEVICE_LOCAL, which CUDA \
         imports): copy the data into one (cudaMemcpy to its CUDA mapping, or lf_buffer_copy)",
        pointer.kind, pointer.device_ordinal
    )
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // A CUDA registration leaves the registry with its last buffer (its own drop).
        if let Some(registry) = &self.registry {
            if !matches!(self.backing, Backing::Cuda { .. }) {
                registry.remove(self.info.id);
            }
        }
        if let Backing::Pooled { pool, arena, range, .. } = &self.backing {
            pool.release(arena, *range);
        }
        // Dedicated and imported arenas are released with their last Arc.
    }
}

/// What bytes found in a [`SharedMemory`] are, for a channel to send them by reference.
pub(crate) enum SharedBytes {
    /// Bytes at an offset of a memory file.
    File(SharedArena, usize),
    /// A buffer over the bytes in GPU memory lava-flow allocated.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    Gpu(Buffer),
}

impl SharedMemory {
    /// The `len` bytes at `offset` of the memory (the offset [`Registry::find_shareable`] gave).
    #[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
    pub(crate) fn bytes(self, offset: usize, len: usize) -> Result<SharedBytes> {
        match self {
            SharedMemory::File(arena, _) => Ok(SharedBytes::File(arena, offset)),
            #[cfg(feature = "vulkan")]
            SharedMemory::Gpu(whole) => {
                Ok(SharedBytes::Gpu(Buffer::gpu_view(whole, offset as u64, len, None, BufferOrigin::Allocated)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_read_as_words() {
        assert_eq!(BufferOrigin::Allocated.to_string(), "allocated");
        assert_eq!(BufferOrigin::Registered.to_string(), "registered user memory");
        assert_eq!(BufferOrigin::Imported { exporter_pid: 42 }.to_string(), "imported from process 42");
    }
}
