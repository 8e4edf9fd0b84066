//! The GPU of a [`Context`](super::Context): the Vulkan device opened eagerly by
//! `Context::new` (or why there is none), what allocates and imports on it, and the
//! registration of GPU-pinned CPU arenas with Vulkan and CUDA. The context's GPU methods
//! (allocation with its visible CPU fallback, import, copies) are built on it.
//!
//! Without the `vulkan` cargo feature the same API exists and reports that the build has no
//! GPU support, so callers need no `cfg` of their own.

use super::config::ContextConfig;
use super::cpu::gpu_pinned::DeviceRegistration;
use super::gpu_settings::GpuPolicy;
#[cfg(feature = "vulkan")]
use super::location::MemoryLocation;
use crate::error::{Error, Result};
use crate::os::Mapping;

#[cfg(feature = "vulkan")]
use super::gpu::{
    cuda_host_register, import_host_memory, CudaHostRegistration, GpuAllocator, GpuAllocatorConfig, GpuBuffer,
    GpuConfig, GpuImporter, GpuMemoryKind, HostMemoryImport, VulkanDevice,
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
    pub(crate) allocator: GpuAllocator,
    pub(crate) importer: GpuImporter,
}

/// A build without Vulkan never has a device.
#[cfg(not(feature = "vulkan"))]
pub(crate) type OpenGpu = std::convert::Infallible;

#[derive(Debug)]
pub(crate) struct ContextGpu {
    policy: GpuPolicy,
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) open: Option<OpenGpu>,
    /// Why there is no device (`None` when there is one).
    pub(crate) unavailable: Option<String>,
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

    pub(crate) fn reason(&self) -> &str {
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
    pub(crate) fn device(&self) -> Option<&VulkanDevice> {
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
    pub(crate) fn allocate(&self, size: usize, location: MemoryLocation) -> Result<GpuBuffer> {
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
