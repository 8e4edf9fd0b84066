//! Thin, safe wrappers over the Linux facilities every layer uses: memfd-backed shared memory,
//! RAII memory mappings, and file-descriptor passing over Unix sockets. Nothing here knows
//! about lava-flow's own concepts.

pub mod eventfd;
pub mod fdpass;
pub mod futex;
pub mod mapping;
pub mod membarrier;
pub mod memfd;

pub use fdpass::{recv_with_fds, send_with_fds, try_recv_with_fds};
pub use mapping::Mapping;
pub use memfd::{memfd_create, MemfdFlags};
