//! [`Context`]: the per-process memory state (pools, registry, imports, NUMA topology, the
//! Vulkan device). Create one per process and share it: it is `Send + Sync` and cheap to
//! clone.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::RwLock;

use super::arena::{ImportCache, Pool, SharedArena, Strategy};
use super::buffer::{Backing, Buffer, BufferParts};
pub use super::config::{ContextConfig, HugepagePolicy};
use super::cpu::numa::NumaTopology;
use super::cuda::CudaPointer;
use super::cuda_registry::CudaRegistry;
use super::export::ExportHandle;
#[cfg(feature = "vulkan")]
use super::gpu::{
    copy_buffer_waiting, DeviceInfo, GpuBuffer, GpuExport, GpuMemoryKind, TimelineSemaphore, VulkanDevice,
};
use super::gpu_context::ContextGpu;
use super::location::MemoryLocation;
use super::registry::{BufferOrigin, FoundBuffer, Registry, SharedMemory};
use crate::error::{Error, Result};
use crate::os::page_size;

/// The per-process memory context. Clones share the same state.
#[derive(Clone, Debug)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

#[derive(Debug)]
pub(crate) struct ContextInner {
    pub(crate) config: ContextConfig,
    pub(crate) topology: NumaTopology,
    /// RAM + swap, and RAM alone: what the host could ever give.
    pub(crate) memory_limit: u64,
    pub(crate) ram: u64,
    pub(crate) pools: RwLock<HashMap<Strategy, Arc<Pool>>>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) imports: Arc<ImportCache>,
    pub(crate) gpu: ContextGpu,
    /// The CUDA allocations registered, by base and CUDA's id of them.
    pub(crate) cuda: Arc<CudaRegistry>,
    /// The MPI world this context joined by itself under an MPI launcher, held for the
    /// context's life so that its channels find peers named in config files through it.
    #[cfg(feature = "mpi")]
    #[allow(dead_code)]
    mpi: Option<crate::mpi::MpiWorld>,
}

fn host_memory() -> (u64, u64) {
    crate::os::system::memory_totals().unwrap_or((u64::MAX, u64::MAX))
}

impl Context {
    /// Creates a context, opening the GPU as `config.gpu` says: eagerly, so that a missing
    /// driver or a wrong device index shows up here. Errors: a bad arena size
    /// (InvalidArgument); a device index or deviceUUID that matches no device (NotFound,
    /// listing the devices); under [`GpuPolicy::Required`](super::GpuPolicy::Required), any reason Vulkan cannot be
    /// opened (Unsupported or Vulkan, with the loader's or driver's word).
    ///
    /// With the `mpi` feature, in a process started by an MPI launcher (see
    /// [`crate::mpi::launcher`]) and unless `LF_MPI=off`, the context joins `MPI_COMM_WORLD`
    /// last of all, once nothing else can fail: a collective, so every rank must create a
    /// context (the first one; later contexts, and an explicit join of `MPI_COMM_WORLD`, share
    /// that join). MPI initialised by the application is joined as it is; MPI that lava-flow
    /// initialised is finalized when the last context and world are gone.
    pub fn new(config: ContextConfig) -> Result<Context> {
        crate::logging::init();
        let size = config.arena_size;
        if !size.is_power_of_two() || !(ContextConfig::MIN_ARENA_SIZE..=ContextConfig::MAX_ARENA_SIZE).contains(&size) {
            return Err(Error::invalid(format!(
                "arena size {size} must be a power of two from {} to {} bytes",
                ContextConfig::MIN_ARENA_SIZE,
                ContextConfig::MAX_ARENA_SIZE
            )));
        }
        if !(1..=ContextConfig::MAX_GPU_ARENA_SIZE).contains(&config.gpu_arena_size) {
            return Err(Error::invalid(format!(
                "gpu_arena_size {} must be from 1 to {} bytes (1 TiB), and at most the GPU's largest memory heap",
                config.gpu_arena_size,
                ContextConfig::MAX_GPU_ARENA_SIZE
            )));
        }
        let gpu = ContextGpu::open(&config)?;
        gpu.log_state(&config);
        let (memory_limit, ram) = host_memory();
        log::debug!(
            "context created: hugepage policy {:?}, arenas of {} bytes, GPU policy {:?}, GPU arenas of {} bytes, strict_gpu {}",
            config.hugepage_policy,
            config.arena_size,
            config.gpu,
            config.gpu_arena_size,
            config.strict_gpu
        );
        // Last: a rank that failed before would leave the others waiting in the collective, one
        // that failed after would have to end the join again.
        #[cfg(feature = "mpi")]
        let mpi = crate::mpi::join_for_context()?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                config,
                topology: NumaTopology::detect(),
                memory_limit,
                ram,
                pools: RwLock::default(),
                registry: Arc::default(),
                imports: Arc::default(),
                gpu,
                cuda: Arc::default(),
                #[cfg(feature = "mpi")]
                mpi,
            }),
        })
    }

    pub fn config(&self) -> &ContextConfig {
        &self.inner.config
    }

    /// The NUMA nodes of this host that have memory.
    pub fn numa_nodes(&self) -> &[u32] {
        self.inner.topology.nodes()
    }

    /// Which buffer of this context (allocated, imported or registered) holds `addr`, and
    /// where in it. O(log n) in the number of buffers.
    pub fn find(&self, addr: *const u8) -> Option<FoundBuffer> {
        self.inner.registry.find(addr as usize)
    }

    /// The memory file holding all of `[ptr, ptr + len)` inside one buffer of this context
    /// that lies in one (allocated or imported CPU memory), and where the range starts in it:
    /// what a channel needs to send those bytes by reference. `None` for any other memory.
    /// Cheap when the answer is no: an atomic load when the context has no such buffer.
    pub fn find_shareable(&self, ptr: *const u8, len: usize) -> Option<(SharedArena, usize)> {
        match self.inner.registry.find_shareable(ptr as usize, len)? {
            (SharedMemory::File(arena, _), offset) => Some((arena, offset)),
            #[cfg(feature = "vulkan")]
            (SharedMemory::Gpu(_), _) => None,
        }
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// Makes a buffer of user memory, so that [`Context::find`] knows it (and, later, GPU
    /// APIs can register it). The memory stays the caller's: dropping the buffer (or
    /// [`Context::deregister`]) forgets it and frees nothing. A range overlapping a buffer
    /// already known is refused, as is memory that is not mapped.
    ///
    /// CUDA device memory is recognised (where the process has loaded the CUDA driver: a
    /// process that has not has no CUDA memory, and CUDA is not initialised to ask): the
    /// buffer is the whole CUDA allocation holding `[ptr, ptr + len)` (a `cudaMalloc`, a VMM
    /// piece), of location [`MemoryLocation::CudaDevice`] and origin
    /// [`BufferOrigin::Cuda`] with its kind, without a host address ([`Buffer::cuda`] gives
    /// its device address), so that [`Context::find`] finds any tensor in it. Registering
    /// more memory of an allocation already registered gives a buffer of the same
    /// registration (the same id); the registration ends with the last of them. Memory CUDA
    /// freed and re-allocated at the same address (a new CUDA buffer id) is a new
    /// registration; the stale one is no longer found. The host cannot read or write CUDA
    /// memory through the buffer (`InvalidState`), and it cannot be sent or exported yet
    /// (`Unsupported`, naming the way that works).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay valid memory of this process until the buffer is dropped.
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<Buffer> {
        let Some(nonnull) = NonNull::new(ptr) else {
            return Err(Error::invalid("cannot register a NULL pointer"));
        };
        if len == 0 {
            return Err(Error::invalid("cannot register 0 bytes"));
        }
        if (ptr as usize).checked_add(len).is_none() {
            return Err(Error::invalid(format!("range {ptr:p} + {len} bytes wraps around the address space")));
        }
        if let Some(pointer) = super::cuda::recognise(ptr)? {
            return self.register_cuda(pointer, ptr as u64, len);
        }
        check_mapped(ptr as usize, len).map_err(|e| match e {
            Error::InvalidArgument(why) => {
                Error::InvalidArgument(format!("{why}; {}", super::cuda::why_not_recognised()))
            }
            e => e,
        })?;
        let parts = BufferParts {
            ptr: Some(nonnull),
            len,
            location: MemoryLocation::CpuStandard,
            page_size: page_size(),
            origin: BufferOrigin::Registered,
            backing: Backing::Registered,
        };
        Buffer::new(parts, &self.inner.registry, true)
    }

    /// The buffer of the CUDA allocation `pointer` holding `[addr, addr + len)`.
    fn register_cuda(&self, mut pointer: CudaPointer, addr: u64, len: usize) -> Result<Buffer> {
        if !pointer.holds(addr, len) && pointer.kind == super::cuda::CudaMemoryKind::Vmm {
            // Across VMM pieces mapped back to back: the span of the pieces it covers.
            pointer = super::cuda::span_from(pointer, addr, len)?;
        }
        if !pointer.holds(addr, len) {
            return Err(Error::invalid(format!(
                "[{addr:#x}, +{len}) runs past the end of the CUDA allocation holding it, [{:#x}, +{}) ({} of \
                 CUDA device {}); register the range of one allocation (or of CUDA VMM pieces mapped back to back)",
                pointer.base, pointer.size, pointer.kind, pointer.device_ordinal
            )));
        }
        let registration = self.inner.cuda.register(pointer, &self.inner.registry)?;
        Ok(Buffer::over_cuda(registration))
    }

    /// A buffer of a CUDA allocation described by hand, for tests of what lava-flow does with
    /// CUDA memory on machines without CUDA (`pointer.base` need not be memory at all). Only
    /// with the `test-hooks` feature, which the tests turn on: not API.
    #[cfg(any(test, feature = "test-hooks"))]
    #[doc(hidden)]
    pub fn register_cuda_for_tests(&self, pointer: CudaPointer) -> Result<Buffer> {
        self.register_cuda(pointer, pointer.base, pointer.size)
    }

    /// Whether `buffer` is user memory (host or CUDA memory) registered with this context.
    pub fn holds_registered(&self, buffer: &Buffer) -> bool {
        buffer.origin().is_registered() && Arc::ptr_eq(buffer.registry(), &self.inner.registry)
    }

    /// Forgets a registered buffer (the same as dropping it), checking that it is registered
    /// user memory of this context.
    pub fn deregister(&self, buffer: Buffer) -> Result<()> {
        if !buffer.origin().is_registered() {
            return Err(Error::invalid(format!(
                "buffer {} is not registered user memory (it is {}); drop (free) it instead",
                buffer.id(),
                buffer.origin()
            )));
        }
        if !Arc::ptr_eq(buffer.registry(), &self.inner.registry) {
            return Err(Error::invalid(format!("buffer {} was registered with another context", buffer.id())));
        }
        drop(buffer);
        Ok(())
    }

    /// Imports an export handle from a process on this host (or this one): the buffer maps
    /// the very same memory, and its origin says it is imported. CPU memory is mapped (once
    /// per arena); GPU memory is imported on this context's Vulkan device (once per arena:
    /// the import cache), refused with a clear error when it comes from another GPU or
    /// driver (deviceUUID/driverUUID differ). Everything in the handle is validated first.
    /// The handle's fd is consumed on success and on failure alike.
    pub fn import(&self, handle: ExportHandle) -> Result<Buffer> {
        let location = handle.descriptor.validate_header()?;
        if location.is_gpu() {
            return self.import_gpu(handle, location);
        }
        super::export::import(handle, &self.inner.registry, &self.inner.imports)
    }
}

/// Refuses ranges containing unmapped pages (`os::facts::check_mapped`).
fn check_mapped(addr: usize, len: usize) -> Result<()> {
    crate::os::facts::check_mapped(addr, len).map_err(|(at, e)| {
        Error::invalid(format!(
            "[{addr:#x}, {:#x}) is not entirely mapped memory of this process (at {at:#x}: {e})",
            addr + len
        ))
    })
}

/// The GPU side of the context: its device, GPU buffers, imports of GPU exports, copies.
impl Context {
    /// Whether `Context::new` opened a Vulkan device; `None` when it did, else why not (the
    /// text of the Vulkan error, or the policy that disabled the GPU).
    pub fn gpu_unavailable_reason(&self) -> Option<&str> {
        self.inner.gpu.unavailable.as_deref()
    }

    /// How many arenas of other exporters this context holds imported now (mapped CPU
    /// arenas, and GPU arenas imported on its device): importing a second buffer of an
    /// arena, or the same buffer again, reuses the import and adds none.
    pub fn imported_arenas(&self) -> usize {
        #[cfg(feature = "vulkan")]
        let gpu = self.inner.gpu.open.as_ref().map_or(0, |open| open.importer.cached_arenas());
        #[cfg(not(feature = "vulkan"))]
        let gpu = 0;
        self.inner.imports.len() + gpu
    }

    /// Gives freed GPU memory back to the driver now: every pooled arena no buffer uses, the
    /// spare the allocator keeps too. Returns how many bytes went back. Without asking, a freed
    /// buffer that leaves its pooled arena empty gives that arena back unless it is the one
    /// empty spare of its memory kind (`memory::gpu::SPARE_EMPTY_ARENAS`, with the `vulkan` feature); buffers of their own arena
    /// (over a quarter of the arena size) give theirs back when freed. An arena that a channel
    /// still holds for a message (its consumer has not released it) leaves the pool, but goes
    /// back only when the channel lets go of it (at the release, when the consumer dies, or
    /// with the channel), and is not counted here ([`gpu_allocated_bytes`](Self::gpu_allocated_bytes)
    /// still counts it).
    pub fn trim(&self) -> u64 {
        #[cfg(feature = "vulkan")]
        return self.inner.gpu.open.as_ref().map_or(0, |open| open.allocator.trim());
        #[cfg(not(feature = "vulkan"))]
        0
    }

    /// How many pooled GPU arenas this context holds now, of both memory kinds (empty spares
    /// included): what [`trim`](Self::trim) could give back is the empty ones.
    pub fn gpu_pooled_arenas(&self) -> usize {
        #[cfg(feature = "vulkan")]
        return self
            .inner
            .gpu
            .open
            .as_ref()
            .map_or(0, |open| GpuMemoryKind::ALL.iter().map(|&kind| open.allocator.arena_count(kind)).sum());
        #[cfg(not(feature = "vulkan"))]
        0
    }

    /// The bytes of GPU memory the pooled arenas of both kinds hold now, used or not.
    pub fn gpu_pooled_bytes(&self) -> u64 {
        #[cfg(feature = "vulkan")]
        return self
            .inner
            .gpu
            .open
            .as_ref()
            .map_or(0, |open| GpuMemoryKind::ALL.iter().map(|&kind| open.allocator.pooled_bytes(kind)).sum());
        #[cfg(not(feature = "vulkan"))]
        0
    }

    /// The bytes of GPU memory this context allocated that have not gone back to the driver,
    /// of both memory kinds: every arena not freed yet, pooled or of its own, used or not,
    /// and arenas that left the pool but that a channel still holds for a message.
    pub fn gpu_allocated_bytes(&self) -> u64 {
        #[cfg(feature = "vulkan")]
        return self.inner.gpu.open.as_ref().map_or(0, |open| open.allocator.allocated_bytes());
        #[cfg(not(feature = "vulkan"))]
        0
    }

    /// The Vulkan device this context allocates GPU memory on, if it has one.
    #[cfg(feature = "vulkan")]
    pub fn gpu_device(&self) -> Option<&VulkanDevice> {
        self.inner.gpu.device()
    }

    /// What was found: name, UUIDs, driver, memory heaps and types, extensions.
    #[cfg(feature = "vulkan")]
    pub fn device_info(&self) -> Option<&DeviceInfo> {
        self.gpu_device().map(VulkanDevice::info)
    }

    /// A buffer over GPU memory: with a host address where the memory is mappable.
    #[cfg(feature = "vulkan")]
    pub(crate) fn gpu_buffer(&self, gpu: GpuBuffer, origin: BufferOrigin) -> Result<Buffer> {
        let location = match gpu.kind() {
            GpuMemoryKind::DeviceLocal => MemoryLocation::GpuDeviceLocal,
            GpuMemoryKind::HostVisible => MemoryLocation::GpuHostVisible,
        };
        let ptr = if gpu.is_host_mappable() { NonNull::new(gpu.map()?.as_ptr()) } else { None };
        let parts = BufferParts {
            ptr,
            len: gpu.size() as usize,
            location,
            page_size: crate::os::page_size(),
            origin,
            backing: Backing::Gpu { buffer: Arc::new(gpu) },
        };
        Buffer::new(parts, &self.inner.registry, false)
    }

    /// Imports a GPU export on this context's device. The fd is consumed on every path.
    fn import_gpu(&self, handle: ExportHandle, location: MemoryLocation) -> Result<Buffer> {
        #[cfg(feature = "vulkan")]
        if let Some(open) = &self.inner.gpu.open {
            let desc = handle.descriptor.to_gpu()?;
            let origin = BufferOrigin::Imported { exporter_pid: desc.exporter_pid };
            let gpu = open.importer.import(GpuExport { desc, fd: handle.fd })?;
            return self.gpu_buffer(gpu, origin);
        }
        drop(handle);
        Err(Error::Unsupported(format!(
            "cannot import {location}: this context has no Vulkan device ({})",
            self.inner.gpu.reason()
        )))
    }

    /// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`, whatever memory
    /// each is: on the GPU when both are memory of this context's device (GPU buffers, and
    /// GPU-pinned buffers imported into it; a compute shader for large copies on GPUs, the
    /// copy engine otherwise, as `gpu::CopyMethod` says), else through the host (staged
    /// for GPU memory the host cannot map). Returns when the data is in place. Overlapping
    /// ranges are refused on the GPU and copied as `memmove` does on the host.
    pub fn copy(&self, dst: &Buffer, dst_offset: usize, src: &Buffer, src_offset: usize, len: usize) -> Result<()> {
        src.check_range(src_offset, len)?;
        dst.check_range(dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        #[cfg(feature = "vulkan")]
        if let (Some((s, s_base)), Some((d, d_base))) = (src.gpu_region(), dst.gpu_region()) {
            if s.device().same_device(d.device()) {
                let (from, to) = (s_base + src_offset as u64, d_base + dst_offset as u64);
                // The GPU, not the host, waits for the data of views.
                let waits: Vec<(&TimelineSemaphore, u64)> = src.gpu_wait().into_iter().chain(dst.gpu_wait()).collect();
                return copy_buffer_waiting(s, from, d, to, len as u64, &waits);
            }
        }
        // Through the host: views' data must be ready first.
        src.wait_ready()?;
        dst.wait_ready()?;
        match (src.host_ptr(), dst.host_ptr()) {
            (Ok(from), Ok(to)) => {
                // SAFETY: both ranges were checked to lie inside live buffers; `copy` allows
                // them to overlap.
                unsafe { std::ptr::copy(from.add(src_offset), to.add(dst_offset), len) };
                Ok(())
            }
            (Ok(from), Err(_)) => {
                // SAFETY: the range lies inside the live source buffer; it cannot overlap the
                // destination, which has no host address.
                dst.write_at(dst_offset, unsafe { std::slice::from_raw_parts(from.add(src_offset), len) })
            }
            (Err(_), Ok(to)) => {
                // SAFETY: as above, with the roles swapped.
                src.read_at(src_offset, unsafe { std::slice::from_raw_parts_mut(to.add(dst_offset), len) })
            }
            (Err(_), Err(_)) => {
                const CHUNK: usize = 16 << 20;
                let mut bounce = vec![0u8; len.min(CHUNK)];
                for at in (0..len).step_by(CHUNK) {
                    let piece = &mut bounce[..(len - at).min(CHUNK)];
                    src.read_at(src_offset + at, piece)?;
                    dst.write_at(dst_offset + at, piece)?;
                }
                Ok(())
            }
        }
    }
}
