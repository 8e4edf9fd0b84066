//! Layer 1: memory. One [`Context`] per process allocates CPU memory with four strategies
//! (standard, NUMA-bound, huge pages, GPU-pinned) and GPU memory (DEVICE_LOCAL and
//! HOST_VISIBLE, through the Vulkan device the context opens), all of it shareable: every
//! buffer is carved from an exportable arena (a memfd, or a Vulkan allocation exported as an
//! opaque fd) and can be exported to a process on the same host, which maps or imports the
//! very same memory. Without a GPU, GPU requests fall back to CPU memory and say so.
//!
//! ```
//! use lava_flow::memory::{Context, ContextConfig, MemoryLocation};
//!
//! let context = Context::new(ContextConfig::default())?;
//! let buffer = context.allocate(4096, MemoryLocation::CpuStandard)?;
//! buffer.write_at(0, b"hello")?;
//! let found = context.find(buffer.as_ptr().wrapping_add(3)).expect("a lava-flow buffer");
//! assert_eq!((found.info.id, found.offset), (buffer.id(), 3));
//! // Same-process import: a second mapping of the very same memory.
//! let twin = context.import(buffer.export()?)?;
//! let mut bytes = [0u8; 5];
//! twin.read_at(0, &mut bytes)?;
//! assert_eq!(&bytes, b"hello");
//! # Ok::<(), lava_flow::Error>(())
//! ```

pub mod allocator;
mod arena;
pub mod buffer;
pub mod context;
pub mod cpu;
pub mod export;
#[cfg(feature = "vulkan")]
pub mod gpu;
mod gpu_context;
pub mod gpu_settings;
pub mod location;
pub mod registry;

pub use allocator::auto_location;
pub use buffer::{Buffer, BufferId, BufferOrigin, SharedArena};
pub use context::{Context, ContextConfig, HugepagePolicy};
pub use cpu::gpu_pinned::{has_ipc_lock, locked_bytes, memlock_limit, DeviceRegistration, MEMLOCK_FIX};
pub use cpu::hugepage::{hugepage_pool, kernel_page_size_of, reserve_command, HugePagePool};
pub use cpu::numa::{node_of_address, NumaTopology};
pub use export::{process_token, ExportDescriptor, ExportHandle, EXPORT_MAGIC, EXPORT_VERSION};
pub use gpu_settings::{format_uuid, DeviceSelector, GpuPolicy};
pub use location::{HugePageSize, MemoryLocation};
pub use registry::{BufferInfo, FoundBuffer};
