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

// An `unsafe fn`'s body is not one unsafe block: each unsafe operation in it says why it holds.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod channels;
pub mod config;
pub mod env;
pub mod error;
pub mod logging;
pub mod memory;
pub mod mpi;
pub(crate) mod os;
pub mod types;

#[cfg(test)]
mod fuzz;

pub use config::ProcessConfig;
pub use error::{Error, Result};
pub use types::{detect_scope, CommunicationScope, ProcessLocation, ProcessName};
