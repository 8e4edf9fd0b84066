//! The GPU side of a [`Context`]: the Vulkan device opened eagerly by `Context::new` (or why
//! there is none), GPU allocation with its visible CPU fallback, the import of GPU exports,
//! copies between any two buffers, and the registration of GPU-pinned CPU arenas with Vulkan
//! and CUDA.
//!
//! Without the `vulkan` cargo feature the same API exists and reports that the build has no
//! GPU support, so callers need no `cfg` of their own.

use super::buffer::Buffer;
use super::context::{Context, ContextConfig, HugepagePolicy};
use super::cpu::gpu_pinned::DeviceRegistration;
use super::export::ExportHandle;
use super::gpu_settings::GpuPolicy;
use super::location::MemoryLocation;
use crate::error::{Error, Result};
use crate::os::Mapping;

#[cfg(feature = "vulkan")]
use std::ptr::NonNull;

#[cfg(feature = "vulkan")]
use super::buffer::{Backing, BufferOrigin, BufferParts};
#[cfg(feature = "vulkan")]
use super::gpu::{
    copy_buffer_waiting, cuda_host_register, import_host_memory, CudaHostRegistration, DeviceInfo, GpuAllocator,
    GpuAllocatorConfig, GpuBuffer, GpuConfig, GpuExport, GpuImporter, GpuMemoryKind, HostMemoryImport,
    TimelineSemaphore, VulkanDevice,
};

const DISABLED: &str = "the context's GPU policy disables the GPU";

/// The GPU APIs a pinned CPU arena is registered with, and why the others are missing.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    pub(crate) registrations: Vec<DeviceRegistration>,
    pub(crate) failures: Vec<String>,
    #[cfg(feature = "vulkan")]
    vulkan: Option<HostMemoryImport>,
    #[cfg(feature = "vulkan")]
    _cuda: Option<CudaHostRegistration>,
}

impl Pins {
    /// The Vulkan buffer over the whole arena, where it was imported into the device.
    #[cfg(feature = "vulkan")]
    pub(crate) fn vulkan_buffer(&self) -> Option<&GpuBuffer> {
        self.vulkan.as_ref().map(HostMemoryImport::buffer)
    }
}

/// The device and what allocates and imports on it.
#[cfg(feature = "vulkan")]
#[derive(Debug)]
pub(crate) struct OpenGpu {
    allocator: GpuAllocator,
    importer: GpuImporter,
}

/// A build without Vulkan never has a device.
#[cfg(not(feature = "vulkan"))]
pub(crate) type OpenGpu = std::convert::Infallible;

#[derive(Debug)]
pub(crate) struct ContextGpu {
    policy: GpuPolicy,
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    open: Option<OpenGpu>,
    /// Why there is no device (`None` when there is one).
    unavailable: Option<String>,
}

impl ContextGpu {
    pub(crate) fn disabled() -> Self {
        ContextGpu { policy: GpuPolicy::Disabled, open: None, unavailable: Some(DISABLED.into()) }
    }

    /// Opens the GPU as `config` says. Under [`GpuPolicy::Auto`] a missing loader, driver or
    /// usable device (and a failing Vulkan call) is recorded instead of returned; a device
    /// asked for by index or UUID that does not exist is an error under every policy.
    pub(crate) fn open(config: &ContextConfig) -> Result<Self> {
        let policy = config.gpu;
        if policy == GpuPolicy::Disabled {
            return Ok(Self::disabled());
        }
        match open_vulkan(config) {
            Ok(open) => Ok(ContextGpu { policy, open: Some(open), unavailable: None }),
            Err(e @ (Error::Unsupported(_) | Error::Vulkan(_))) if policy == GpuPolicy::Auto => {
                Ok(ContextGpu { policy, open: None, unavailable: Some(e.to_string()) })
            }
            Err(e) => Err(e),
        }
    }

    fn reason(&self) -> &str {
        self.unavailable.as_deref().unwrap_or("no Vulkan device")
    }

    /// Says why a new context has no GPU (the device it opened is reported as it opens).
    pub(crate) fn log_state(&self, config: &ContextConfig) {
        match (&self.unavailable, self.policy) {
            (None, _) => {}
            (Some(_), GpuPolicy::Disabled) => {
                log::debug!("the context's GPU policy disables the GPU: no GPU API is touched")
            }
            (Some(why), _) => log::info!(
                "this context has no GPU: {why}; GPU memory asked of it {}. Set the context's GPU policy to disabled \
                 where no GPU is wanted, or to required to make this an error",
                if config.strict_gpu { "is refused (strict_gpu)" } else { "is CPU memory, each buffer saying why" }
            ),
        }
    }

    #[cfg(feature = "vulkan")]
    fn device(&self) -> Option<&VulkanDevice> {
        self.open.as_ref().map(|open| open.allocator.device())
    }

    /// Registers a pinned arena's mapping with the context's Vulkan device and with CUDA,
    /// recording why each registration that did not happen is missing.
    pub(crate) fn pin(&self, mapping: &Mapping) -> Pins {
        let mut pins = Pins::default();
        if self.policy == GpuPolicy::Disabled {
            pins.failures.push(format!("Vulkan and CUDA: {DISABLED}"));
            return pins;
        }
        #[cfg(feature = "vulkan")]
        {
            let device = self.device();
            match device {
                // SAFETY: the mapping belongs to the arena being created, whose `pins` field
                // (this import) is dropped before the mapping is unmapped.
                Some(device) => match unsafe { import_host_memory(device, mapping.as_ptr(), mapping.len()) } {
                    Ok(import) => {
                        pins.registrations.push(DeviceRegistration::Vulkan { device_uuid: device.device_uuid() });
                        pins.vulkan = Some(import);
                    }
                    Err(e) => pins.failures.push(format!("Vulkan: {e}")),
                },
                None => pins.failures.push(format!("Vulkan: no device ({})", self.reason())),
            }
            // The CUDA device of the Vulkan device where CUDA has it (NVIDIA: equal UUIDs);
            // the registration is portable to every CUDA context either way.
            let register = |uuid| {
                // SAFETY: as above: the registration is dropped before the mapping.
                unsafe { cuda_host_register(mapping.as_ptr(), mapping.len(), uuid) }
            };
            let registered = match register(device.map(VulkanDevice::device_uuid)) {
                Err(Error::NotFound(_)) => register(None),
                other => other,
            };
            match registered {
                Ok(registration) => {
                    pins.registrations.push(DeviceRegistration::Cuda { device: registration.cuda_device() });
                    pins._cuda = Some(registration);
                }
                Err(e) => pins.failures.push(format!("CUDA: {e}")),
            }
        }
        #[cfg(not(feature = "vulkan"))]
        {
            let _ = mapping;
            pins.failures.push(format!("Vulkan and CUDA: {}", self.reason()));
        }
        if !pins.failures.is_empty() {
            crate::logging::log_first!(
                log::Level::Info,
                "GPU-pinned memory ({} bytes) is locked in RAM but not registered with every GPU API: {}; GPU \
                 transfers from it{} go through staging copies",
                mapping.len(),
                pins.failures.join("; "),
                if pins.registrations.is_empty() { "" } else { " by the other APIs" }
            );
        }
        pins
    }
}

#[cfg(feature = "vulkan")]
fn open_vulkan(config: &ContextConfig) -> Result<OpenGpu> {
    let gpu_config = match &config.gpu_device {
        Some(selector) => GpuConfig::with_device(selector.clone()),
        None => GpuConfig::default(),
    };
    let device = VulkanDevice::open(&gpu_config)?;
    let allocator = GpuAllocator::new(
        &device,
        GpuAllocatorConfig { arena_size: config.gpu_arena_size, ..GpuAllocatorConfig::default() },
    )?;
    Ok(OpenGpu { importer: GpuImporter::new(&device), allocator })
}

#[cfg(not(feature = "vulkan"))]
fn open_vulkan(_config: &ContextConfig) -> Result<OpenGpu> {
    Err(Error::Unsupported(
        "this build of lava-flow has no GPU support (it was built without the cargo feature `vulkan`)".into(),
    ))
}

#[cfg(feature = "vulkan")]
impl OpenGpu {
    fn allocate(&self, size: usize, location: MemoryLocation) -> Result<GpuBuffer> {
        let kind = match location {
            MemoryLocation::GpuDeviceLocal => GpuMemoryKind::DeviceLocal,
            _ => GpuMemoryKind::HostVisible,
        };
        if size == 0 {
            return Err(Error::invalid(format!("size 0 asked for {location}: a buffer needs at least one byte")));
        }
        let info = self.allocator.device().info();
        let heap = self
            .allocator
            .memory_type_index(kind)
            .and_then(|t| info.memory_types.get(t as usize))
            .and_then(|t| info.memory_heaps.get(t.heap_index as usize));
        if let Some(heap) = heap.filter(|heap| size as u64 > heap.size) {
            return Err(Error::OutOfMemory(format!(
                "{size} bytes asked for {location}, more than the {} bytes of its memory heap on {}",
                heap.size, info.name
            )));
        }
        self.allocator.allocate(size as u64, kind)
    }
}

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
    /// spare the allocator keeps too. Returns how many bytes that was. Without asking, a freed
    /// buffer that leaves its pooled arena empty gives that arena back unless it is the one
    /// empty spare of its memory kind ([`SPARE_EMPTY_ARENAS`]); buffers of their own arena
    /// (over a quarter of the arena size) give theirs back when freed.
    ///
    /// [`SPARE_EMPTY_ARENAS`]: crate::memory::gpu::SPARE_EMPTY_ARENAS
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

    /// A GPU location: from the device's pooled exportable arenas, or, without a device,
    /// CPU standard memory that says it fell back (an error under `strict_gpu`).
    pub(crate) fn allocate_gpu(&self, size: usize, location: MemoryLocation, policy: HugepagePolicy) -> Result<Buffer> {
        #[cfg(feature = "vulkan")]
        if let Some(open) = &self.inner.gpu.open {
            let gpu = open.allocate(size, location)?;
            return self.gpu_buffer(gpu, BufferOrigin::Allocated);
        }
        let reason = self.inner.gpu.reason();
        if self.inner.config.strict_gpu {
            return Err(Error::Unsupported(format!(
                "{location} of {size} bytes: this context has no Vulkan device and strict_gpu forbids \
                 the CPU fallback: {reason}"
            )));
        }
        let mut buffer = self.allocate_with(size, MemoryLocation::CpuStandard, policy)?;
        let fallback = format!(
            "{location} was asked for, but this context has no Vulkan device ({reason}); the buffer is CPU standard memory"
        );
        crate::logging::log_first!(
            log::Level::Warn,
            "{size} bytes: {fallback}. Set strict_gpu to make this an error instead"
        );
        buffer.set_fallback(fallback);
        Ok(buffer)
    }

    /// A buffer over GPU memory: with a host address where the memory is mappable.
    #[cfg(feature = "vulkan")]
    fn gpu_buffer(&self, gpu: GpuBuffer, origin: BufferOrigin) -> Result<Buffer> {
        let location = match gpu.kind() {
            GpuMemoryKind::DeviceLocal => MemoryLocation::GpuDeviceLocal,
            GpuMemoryKind::HostVisible => MemoryLocation::GpuHostVisible,
        };
        let ptr = if gpu.is_host_mappable() { NonNull::new(gpu.map()?.as_ptr()) } else { None };
        let parts = BufferParts {
            ptr,
            len: gpu.size() as usize,
            location,
            page_size: crate::os::mapping::page_size(),
            origin,
            backing: Backing::Gpu { buffer: std::sync::Arc::new(gpu) },
        };
        Buffer::new(parts, &self.inner.registry, false)
    }

    /// Imports a GPU export on this context's device. The fd is consumed on every path.
    pub(crate) fn import_gpu(&self, handle: ExportHandle, location: MemoryLocation) -> Result<Buffer> {
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
