//! [`ContextConfig`]: how a [`Context`](super::Context) behaves.

use super::gpu_settings::{DeviceSelector, GpuPolicy};

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

/// How a [`Context`](super::Context) behaves. Start from `ContextConfig::default()` and set fields.
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
