//! Thin, safe wrappers over the Linux facilities every layer uses: memfd-backed shared memory,
//! RAII memory mappings, file-descriptor passing over Unix sockets, futexes, epoll, notification
//! sockets, and the process's watcher of descriptors (a thread that reports a peer's exit).
//! Nothing here knows about lava-flow's own concepts.

pub mod epoll;
pub mod eventfd;
pub mod fdpass;
pub mod futex;
pub mod mapping;
pub mod membarrier;
pub mod memfd;
pub mod notify;
pub(crate) mod parallel_copy;
pub mod watcher;

pub use fdpass::{recv_with_fds, send_with_fds, try_recv_with_fds, try_send_with_fds};

/// A timeout as the kernel takes it; one beyond `i64::MAX` seconds waits as long.
pub(crate) fn timespec(timeout: std::time::Duration) -> rustix::event::Timespec {
    rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec { tv_sec: i64::MAX, tv_nsec: 0 })
}
pub use mapping::Mapping;
pub use memfd::{memfd_create, MemfdFlags};

/// Asks the CPU for the cache line at `ptr` in a state it can write (`prefetchw`), without
/// waiting for it: a hint. x86-64 processors that predate the instruction run it as a no-op.
#[inline(always)]
pub(crate) fn prefetch_for_write(ptr: *const u8) {
    // (`_mm_prefetch` with `_MM_HINT_ET0` compiles to a read prefetch for baseline x86-64.)
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads and writes nothing, never faults whatever the address, and
    // touches no register but the one it is given.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}
