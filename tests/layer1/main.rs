//! Layer 0 and Layer 1 integration tests: scope detection and memory. One test binary, one
//! module per concern (the seed's `tests/layer1/` layout).

#[cfg(unix)]
#[path = "../common/child.rs"]
mod child;
mod cpu_strategies;
// CUDA's driver library and its messages are Linux's here.
#[cfg(unix)]
mod cuda_memory;
#[cfg(feature = "vulkan")]
mod gpu_context;
#[cfg(feature = "vulkan")]
mod gpu_copy;
#[cfg(feature = "vulkan")]
mod gpu_memory;
#[cfg(feature = "vulkan")]
mod gpu_sharing;
mod scope_detection;
