//! Layer 2 integration tests: channels between real processes.
//!
//! Every test is an orchestrator: it re-executes this test binary (`current_exe()`) as child
//! processes (the harness of `tests/common/child.rs`), each in a role, so that the same test
//! function runs the child's part. Each test gets its own runtime dir (`LF_RUNTIME_DIR`), which
//! it checks is empty at the end.

#[path = "../common/child.rs"]
mod child;
mod common;

mod backpressure;
mod blocked;
mod buffers;
mod cuda_ipc;
mod cuda_ipc_fake;
#[cfg(feature = "vulkan")]
mod cuda_peer;
mod delivery;
mod fan_in;
#[cfg(feature = "vulkan")]
mod fan_in_gpu;
mod fan_out;
#[cfg(feature = "vulkan")]
mod fan_out_gpu;
#[cfg(feature = "vulkan")]
mod gpu;
#[cfg(feature = "vulkan")]
mod gpu_release;
mod hostile;
mod leaks;
mod peer_death;
mod peer_death_fd;
mod rendezvous;
