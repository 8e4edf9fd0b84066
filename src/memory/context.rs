//! [`Context`]: the per-process memory state (pools, registry, imports, NUMA topology, the
//! Vulkan device). Create one per process and share it: it is `Send + Sync` and cheap to
//! clone.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::RwLock;

use super::arena::{Pool, Strategy};
use super::buffer::{Backing, Buffer, BufferOrigin, BufferParts, SharedArena};
use super::cpu::numa::NumaTopology;
use super::export::{ExportHandle, ImportCache};
use super::gpu_context::ContextGpu;
use super::gpu_settings::{DeviceSelector, GpuPolicy};
use super::location::MemoryLocation;
use super::registry::{FoundBuffer, Registry, SharedMemory};
use crate::error::{Error, Result};
use crate::os::mapping::page_size;

/// What to do when huge pages are asked for and the kernel has none to give.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugepagePolicy {
    /// Fail, with a message saying how to reserve huge pages.
    #[default]
    Strict,
    /// Fall back to ordinary shared memory advised for transparent huge pages; the buffer
    /// then reports `CpuStandard` and the base page size, so the fallback is never silent.
    BestEffort,
}

/// How a [`Context`] behaves. Start from `ContextConfig::default()` and set fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextConfig {
    pub hugepage_policy: HugepagePolicy,
    /// The size of pooled arenas: a power of two from 64 KiB to 1 GiB. Buffers up to a
    /// quarter of it share arenas; larger ones get their own.
    pub arena_size: usize,
    /// Whether `Context::new` opens Vulkan (eagerly), and what happens when it cannot.
    pub gpu: GpuPolicy,
    /// The Vulkan device to open. `None`: the one `LF_VULKAN_DEVICE` names (an index or a
    /// deviceUUID), else the first discrete GPU, else the first device.
    pub gpu_device: Option<DeviceSelector>,
    /// A GPU location asked of a context without a device is an error (`Unsupported`, saying
    /// why there is no device) instead of CPU memory that reports the fallback.
    pub strict_gpu: bool,
    /// The size of pooled GPU arenas (one exportable `VkDeviceMemory` each), in bytes.
    /// Buffers larger than a quarter of it get an allocation of their own.
    pub gpu_arena_size: u64,
}

impl ContextConfig {
    pub const DEFAULT_ARENA_SIZE: usize = 2 << 20;
    pub const MIN_ARENA_SIZE: usize = 64 << 10;
    pub const MAX_ARENA_SIZE: usize = 1 << 30;
    pub const DEFAULT_GPU_ARENA_SIZE: u64 = 64 << 20;
    /// The largest GPU arena (1 TiB): beyond any GPU's memory, and far from overflowing the
    /// allocator's arithmetic. The device's largest heap bounds it further once it is open.
    pub const MAX_GPU_ARENA_SIZE: u64 = 1 << 40;
}

impl Default for ContextConfig {
    fn default() -> Self {
        ContextConfig {
            hugepage_policy: HugepagePolicy::Strict,
            arena_size: Self::DEFAULT_ARENA_SIZE,
            gpu: GpuPolicy::Auto,
            gpu_device: None,
            strict_gpu: false,
            gpu_arena_size: Self::DEFAULT_GPU_ARENA_SIZE,
        }
    }
}

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
}

fn host_memory() -> (u64, u64) {
    // SAFETY: zeroed sysinfo is a valid out-buffer.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: info is writable.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return (u64::MAX, u64::MAX);
    }
    let unit = u64::from(info.mem_unit.max(1));
    let ram = (info.totalram as u64).saturating_mul(unit);
    (ram.saturating_add((info.totalswap as u64).saturating_mul(unit)), ram)
}

impl Context {
    /// Creates a context, opening the GPU as `config.gpu` says: eagerly, so that a missing
    /// driver or a wrong device index shows up here. Errors: a bad arena size
    /// (InvalidArgument); a device index or deviceUUID that matches no device (NotFound,
    /// listing the devices); under [`GpuPolicy::Required`], any reason Vulkan cannot be
    /// opened (Unsupported or Vulkan, with the loader's or driver's word).
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
        check_mapped(ptr as usize, len)?;
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

    /// Whether `buffer` is user memory registered with this context.
    pub fn holds_registered(&self, buffer: &Buffer) -> bool {
        buffer.origin() == BufferOrigin::Registered && Arc::ptr_eq(buffer.registry(), &self.inner.registry)
    }

    /// Forgets a registered buffer (the same as dropping it), checking that it is registered
    /// user memory of this context.
    pub fn deregister(&self, buffer: Buffer) -> Result<()> {
        if buffer.origin() != BufferOrigin::Registered {
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

/// Refuses ranges containing unmapped pages (`mincore` fails with ENOMEM on them).
fn check_mapped(addr: usize, len: usize) -> Result<()> {
    let page = page_size();
    let start = addr & !(page - 1);
    let end = (addr + len).div_ceil(page) * page;
    const CHUNK_PAGES: usize = 4096;
    let mut residency = vec![0u8; CHUNK_PAGES];
    let mut at = start;
    while at < end {
        let chunk = (end - at).min(CHUNK_PAGES * page);
        // SAFETY: `at` is page-aligned; mincore writes one byte per page of `chunk` into
        // `residency`, which holds CHUNK_PAGES bytes.
        if unsafe { libc::mincore(at as *mut libc::c_void, chunk, residency.as_mut_ptr()) } != 0 {
            return Err(Error::invalid(format!(
                "[{addr:#x}, {:#x}) is not entirely mapped memory of this process (at {at:#x}: {})",
                addr + len,
                std::io::Error::last_os_error()
            )));
        }
        at += chunk;
    }
    Ok(())
}
