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
//!
//! # Layering
//!
//! Each module uses only those below it (`scripts/check-layers.py` checks that no two sibling
//! modules reach each other):
//!
//! ```text
//! allocator     Context::allocate*: CPU pools, GPU memory with its CPU fallback
//!     |
//! context       Context: registry, pools, imports, the GPU; find, register, import, copy
//!     |
//! export        ExportHandle: a buffer's export record and fd; the import of CPU memory
//!     |
//! buffer        Buffer and what backs it
//!     |
//! cuda_registry the CUDA allocations registered: one registration each, cached by
//!     |         (base, CUDA's buffer id)
//! registry      which buffer holds an address; BufferId, BufferOrigin, BufferInfo
//!     |
//! arena         CPU arenas: pools (suballocated), imported arenas, SharedArena
//!     |
//! gpu_context   the context's GPU: device, GPU allocator and importer, pinning of CPU arenas
//!     |
//! config        ContextConfig, HugepagePolicy
//!     |
//! gpu, cpu, cuda, gpu_settings, location, suballocator, token
//!               (leaves; gpu uses gpu_settings, suballocator and token; cuda recognises
//!               CUDA memory by its address)
//! ```
//!
//! Inside `gpu`, the device knows none of the modules that use it:
//!
//! ```text
//! transfer -> shader_copy, semaphore, allocator, arena, copy_method, device (and the OS layer's
//! parallel copy)
//! import -> export -> allocator -> arena -> device -> copy_method
//! host_import -> allocator, arena, device
//! semaphore, shader_copy -> device
//! ```
//!
//! The device keeps per-device state for the modules above (the transfer queue, the import
//! cache) through the `DeviceState` trait it defines and they implement.

pub mod allocator;
mod arena;
pub mod buffer;
mod config;
pub mod context;
pub mod cpu;
pub mod cuda;
mod cuda_registry;
pub mod export;
#[cfg(feature = "vulkan")]
pub mod gpu;
mod gpu_context;
pub mod gpu_settings;
pub mod location;
pub mod registry;
mod suballocator;
mod token;

pub use crate::os::parallel_copy::{copy_threads, COPY_THREADS_ENV};
pub use allocator::auto_location;
pub use arena::SharedArena;
pub use buffer::Buffer;
pub use config::{ContextConfig, HugepagePolicy};
pub use context::Context;
pub use cpu::gpu_pinned::{has_ipc_lock, locked_bytes, memlock_limit, DeviceRegistration, MEMLOCK_FIX};
pub use cpu::hugepage::{hugepage_pool, kernel_page_size_of, reserve_command, HugePagePool};
pub use cpu::numa::{node_of_address, NumaTopology};
pub use cuda::{CudaMemoryKind, CudaPointer};
pub use export::{ExportDescriptor, ExportHandle, EXPORT_MAGIC, EXPORT_VERSION};
pub use gpu_settings::{format_uuid, DeviceSelector, GpuPolicy};
pub use location::{HugePageSize, MemoryLocation};
pub use registry::{BufferId, BufferInfo, BufferOrigin, FoundBuffer};
pub use token::process_token;
