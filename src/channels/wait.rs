//! The wait protocol of same-host transports: how a side that finds nothing to do (no
//! message, no room, no completion) spins, then sleeps on a futex in shared memory, and how
//! the other side wakes it without a system call while it is awake.
//!
//! A sleeper announces itself in a `sleeping` word, re-checks its condition, then sleeps on
//! a `futex` word; a publisher stores its value (a slot's sequence word, a tail) and then
//! reads the `sleeping` word, waking the futex only when it is set. That store-then-check
//! against the sleeper's announce-then-check is Dekker's protocol and needs a StoreLoad
//! fence on both sides. Where both processes could register for global membarriers
//! (`fast_wake`), the sleeper pays for both with a membarrier and the publisher uses a plain
//! release store, which leaves the store buffer free to drain in the background instead of
//! stalling on the cache line the peer is polling. Elsewhere both sides fence.
//!
//! Blocked waits sleep at most [`SLEEP_SLICE`] at a time so that they check their peer's
//! liveness (every [`LIVENESS_PERIOD`]) and their deadline. Any transport whose two sides
//! share memory uses these pieces; the words themselves live wherever that transport puts
//! them.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::WaitStrategy;
use crate::os::futex::{futex_wait, futex_wake};
use crate::os::membarrier;

/// How often a waiting side checks that its peer is alive.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(2);
/// The longest a blocked wait sleeps before checking its peer (and its deadline) again.
pub const SLEEP_SLICE: Duration = Duration::from_millis(15);
/// Sleeps on `futex` while `ready` stays false, announcing the sleep in `sleeping` so the
/// other side knows to wake us; returns after one wake-up or [`SLEEP_SLICE`] (or less, to
/// honour `deadline`). `fast_wake`: the other side publishes without a fence (see
/// [`publish_then_check`]), so the announcement is followed by a membarrier.
pub(crate) fn sleep_once(futex: &AtomicU32, sleeping: &AtomicU32, fast_wake: bool, deadline: Option<Instant>, ready: impl Fn() -> bool) {
    let seen = futex.load(Ordering::SeqCst);
    sleeping.store(1, Ordering::SeqCst);
    if fast_wake {
        membarrier::global_barrier();
    }
    // The store (and membarrier) above and the other side's publish-then-check make this
    // re-check safe: either we see its message now, or it sees our flag and wakes us.
    if !ready() {
        let slice = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLEEP_SLICE),
            None => SLEEP_SLICE,
        };
        if !slice.is_zero() {
            futex_wait(futex, seen, slice);
        }
    }
    sleeping.store(0, Ordering::Relaxed);
}

/// Publishes `value` in `word` (a slot's sequence word or the tail), ordered before the
/// sleeping-flag loads that follow: by a StoreLoad fence (SeqCst store), or, with
/// `fast_wake`, by the sleeper's membarrier, so that only the compiler must keep the order.
#[inline]
pub(crate) fn publish_then_check(word: &AtomicU64, value: u64, fast_wake: bool) {
    if fast_wake {
        word.store(value, Ordering::Release);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        word.store(value, Ordering::SeqCst);
    }
}

/// Wakes the other side if it announced a sleep on `futex`. Call after [`publish_then_check`].
#[inline]
pub(crate) fn wake_if_sleeping(futex: &AtomicU32, sleeping: &AtomicU32, fast_wake: bool) {
    // With fast_wake the order comes from the sleeper's membarrier (a SeqCst load would add
    // a barrier on weakly ordered CPUs); without, SeqCst pairs with the SeqCst store.
    let order = if fast_wake { Ordering::Relaxed } else { Ordering::SeqCst };
    if sleeping.load(order) != 0 {
        futex.fetch_add(1, Ordering::SeqCst);
        futex_wake(futex, 1);
    }
}

/// A generic wait loop: spins while the strategy allows, then sleeps in slices; between
/// attempts checks `done` (Ok(true) ends the wait), the peer and the deadline.
pub(crate) struct Waiter {
    strategy: WaitStrategy,
    /// When spinning started: read from the clock at the first check, not on entry, so that
    /// a wait that ends within its first spins costs no clock read.
    start: Option<Instant>,
    deadline: Option<Instant>,
}

impl Waiter {
    pub(crate) fn new(strategy: WaitStrategy, deadline: Option<Instant>) -> Self {
        Waiter { strategy, start: None, deadline }
    }

    /// Whether to spin between checks: Block sleeps at once.
    pub(crate) fn spins(&self) -> bool {
        !matches!(self.strategy, WaitStrategy::Block)
    }

    pub(crate) fn spinning(&mut self, now: Instant) -> bool {
        match self.strategy {
            WaitStrategy::BusyPoll => true,
            WaitStrategy::SpinThenBlock { spin } => now.duration_since(*self.start.get_or_insert(now)) < spin,
            WaitStrategy::Block => false,
        }
    }

    pub(crate) fn timed_out(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

