//! The memory barrier across processes on Windows: `FlushProcessWriteBuffers`, which makes
//! every processor running a thread of this process serialise (an inter-processor interrupt,
//! as Linux's `membarrier`). It orders this process's threads only, whereas a channel's
//! receiver is another process: it is no substitute for the fence a sender owes a receiver of
//! another process, so [`register`] says no and senders fence every message on Windows.

/// Whether a barrier that reaches other processes is available: never on Windows.
pub fn register() -> bool {
    false
}

/// Runs `FlushProcessWriteBuffers`; `false` because it does not reach other processes (see
/// the module doc), so a caller must not count on it for them.
pub fn global_barrier() -> bool {
    // SAFETY: no arguments, no preconditions.
    unsafe { windows_sys::Win32::System::Threading::FlushProcessWriteBuffers() };
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_barrier_across_processes_is_claimed() {
        assert!(!register());
        assert!(!global_barrier());
    }
}
