#[cfg(feature = "vulkan")]
pub mod gpu;
