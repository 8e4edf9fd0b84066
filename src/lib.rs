//! lava-flow moves data between processes with zero copies wherever the hardware allows.
//!
//! The crate is layered as its folders are:
//! - Layer 0, [`types`] and [`config`]: who a process is, where it runs, and the
//!   [`CommunicationScope`] between two processes; [`mpi`] finds every process of an MPI job
//!   (with the `mpi` feature).
//! - Layer 1, `memory`: one allocator for GPU (Vulkan) and CPU memory, shareable with local
//!   peers.
//! - Layer 2, `channels`: ordered producer/consumer channels whose transport follows the
//!   peers' scope.
//! - [`logging`]: what lava-flow chose, every fallback it took and peers it lost, through the
//!   `log` crate (`LF_LOG_LEVEL`; the C API's `lf_set_log_callback`).
//! - [`env`](mod@env): every `LF_*` environment variable lava-flow reads, with its default.
//!
//! The C API (`include/lava_flow.h`, `liblava_flow.so`) is a thin layer over this crate, in
//! crates/c-api; the tools (`lf-info`, the benchmarks) are in crates/tools.
//!
//! # A guide to the two layers
//!
//! **Memory (Layer 1).** One [`memory::Context`] per process allocates every kind of memory
//! through one call, [`Context::allocate`](memory::Context::allocate)`(size, location)`: CPU
//! memory (standard shareable memory, bound to a NUMA node, huge pages, or locked and
//! registered with the GPU) and GPU memory through Vulkan (device-local or host-visible). It
//! hands back the same [`memory::Buffer`] for all of them, which reports the
//! [`memory::MemoryLocation`] it really got, never what was merely asked for. A buffer is
//! exported to a process of the same host ([`Buffer::export`](memory::Buffer::export)) and
//! imported there ([`Context::import`](memory::Context::import)); CUDA memory the application
//! allocated is recognised by [`Context::register`](memory::Context::register).
//!
//! **Channels (Layer 2).** A [`channels::Producer`] and a [`channels::Consumer`], each in its
//! own process, name one channel and say where they and their peer run
//! ([`ProcessLocation`]); the scope between the two picks the transport: shared memory on one
//! host (with Vulkan IPC for GPU buffers, and CUDA IPC for CUDA memory), MPI between hosts
//! (with the `mpi` feature). Messages are copied into shared memory, written in place
//! ([`Producer::loan`](channels::Producer::loan)), or sent by reference from a buffer of
//! Layer 1 ([`Producer::send_buffer`](channels::Producer::send_buffer)); a received
//! [`channels::Message`] is a view that is released when it drops.
//! [`channels::ChannelConfig`] chooses a pair channel, a fan-in (several producers) or a
//! fan-out (several consumers). `examples/channel.rs` is a complete producer and consumer.
//!
//! # Documentation
//!
//! The repository's `README.md` is the front page (what lava-flow is, a complete example per
//! language, the platforms it runs on); its `docs/` folder has the reference by concept:
//! `docs/memory.md`, `docs/channels.md` (pairs, fan-in, fan-out), `docs/gpu-buffers.md`
//! (Vulkan IPC, CUDA memory, interop), `docs/mpi.md`, `docs/locations.md` (config files),
//! `docs/logging.md`, `docs/environment.md` (every `LF_*` variable), `docs/tools.md`
//! (`lf-info`), `docs/benchmarks.md`, `docs/developing.md` and, for the other languages,
//! `docs/c-api.md`, `docs/cpp.md` and `docs/python.md`. Changes are listed in `CHANGELOG.md`.

// An `unsafe fn`'s body is not one unsafe block: each unsafe operation in it says why it holds.
#![deny(unsafe_op_in_unsafe_fn)]

// Channels are built wherever memory is (on Windows without the `vulkan` feature so far).
#[cfg(any(unix, not(feature = "vulkan")))]
pub mod channels;
pub mod config;
pub mod env;
pub mod error;
pub mod logging;
// On Windows without its GPU half for now: `memory::gpu` (Vulkan) is not built there yet, so
// memory is compiled there only in builds without the `vulkan` feature.
#[cfg(any(unix, not(feature = "vulkan")))]
// Parts of it serve only what Windows does not build yet (GPU routes).
#[cfg_attr(not(unix), allow(dead_code, unused_imports))]
pub mod memory;
pub mod mpi;
// Parts of it serve only what Windows does not build yet (see `memory`).
#[cfg_attr(not(unix), allow(dead_code))]
pub(crate) mod os;
pub mod types;

#[cfg(test)]
mod fuzz;

pub use config::ProcessConfig;
pub use error::{Error, Result};
pub use types::{detect_scope, CommunicationScope, ProcessLocation, ProcessName};
