//! liblava_flow.so and liblava_flow.a: every function of the C API (crates/c-api), exported.
pub use lava_flow_c_api::*;
