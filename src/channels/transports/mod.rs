//! One file per transport.

pub mod shm;
pub mod shm_ring;
