//! The four CPU strategies. Each starts from shareable memory ([`standard`]) and adds its own
//! step before the memory is first touched.

pub mod gpu_pinned;
pub mod hugepage;
pub mod numa;
pub mod standard;
