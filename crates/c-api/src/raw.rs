//! The C enums as the integers C passes. The header names each function parameter and struct
//! field of these types by the enum's name (cbindgen sees the name, not the alias); Rust reads
//! them as `u32` and checks them with `CEnum::from_c` (the `abi` module).

#![allow(non_camel_case_types)]

pub type lf_status = u32;
pub type lf_log_level = u32;
pub type lf_hugepage_policy = u32;
pub type lf_gpu_policy = u32;
pub type lf_gpu_device_select = u32;
pub type lf_device_type = u32;
pub type lf_memory_kind = u32;
pub type lf_origin = u32;
pub type lf_cuda_kind = u32;
pub type lf_role = u32;
pub type lf_wait_strategy = u32;
pub type lf_channel_kind = u32;
pub type lf_peer_state = u32;
pub type lf_scope = u32;
