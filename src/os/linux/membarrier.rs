//! Asymmetric memory barriers across processes (`membarrier(2)`, global expedited).
//!
//! A Dekker-style wake protocol needs a StoreLoad fence on both sides: "I published, is the
//! peer asleep?" against "I am going to sleep, has the peer published?". Where the publisher
//! runs once per message and the sleeper rarely (it spins first), the sleeper pays for both:
//! after announcing its sleep it calls [`global_barrier`], which makes every running thread of
//! every registered process execute a full memory barrier before it returns, by interrupting
//! the cores they run on. The publisher then needs only a compiler fence between its store
//! and its load. Both processes must have called [`register`] before the protocol relies on
//! it. A sleeper that sleeps on nearly every wait leaves the fence to the publisher instead:
//! an interrupt of other cores per sleep costs more than a fence per message.

use std::sync::OnceLock;

use rustix::thread::{membarrier, membarrier_query, MembarrierCommand};

/// Registers this process as a target of global expedited barriers, once per process.
/// Returns whether it worked and [`global_barrier`] is available; false on kernels before
/// 4.16, or where a seccomp filter forbids the call. Callers fall back to fences then.
pub fn register() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let supported = membarrier_query();
        let registered = supported.contains_command(MembarrierCommand::GlobalExpedited)
            && supported.contains_command(MembarrierCommand::RegisterGlobalExpedited)
            && membarrier(MembarrierCommand::RegisterGlobalExpedited).is_ok();
        if !registered {
            log::info!(
                "membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) is not available (a kernel before 4.16, or a seccomp \
                 filter that forbids it): channel senders fence every message instead, which costs some latency on \
                 channels whose receivers spin before sleeping"
            );
        }
        registered
    })
}

/// Makes every running thread of every registered process (this one included) execute a
/// full memory barrier. Only valid after [`register`] returned true; a failure (which the
/// kernel does not produce for a supported command) is reported as false so the caller can
/// still sleep safely in bounded slices.
pub fn global_barrier() -> bool {
    membarrier(MembarrierCommand::GlobalExpedited).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_is_idempotent_and_the_barrier_works_when_registered() {
        let first = register();
        assert_eq!(first, register());
        if first {
            assert!(global_barrier());
        }
    }
}
