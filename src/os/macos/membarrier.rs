//! Memory barriers across processes: macOS has no `membarrier(2)`, so senders fence every
//! message (what the callers do when [`register`] says no).

/// Always false here: nothing can make other processes' threads execute a barrier.
pub fn register() -> bool {
    false
}

/// Never called once [`register`] said false; false all the same.
pub fn global_barrier() -> bool {
    false
}
