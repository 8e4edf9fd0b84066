//! The wait protocol of same-host transports: how a side that finds nothing to do (no
//! message, no room, no completion) spins, then sleeps on a futex in shared memory, and how
//! the other side wakes it without a system call while it is awake.
//!
//! A sleeper announces itself in a `sleeping` word, re-checks its condition, then sleeps on
//! a `futex` word; a publisher stores its value (a slot's sequence word, a tail) and then
//! reads the `sleeping` word, and if it is set, takes it (swaps it back to 0) and wakes the
//! futex: so a burst of messages that finds one sleeper pays one wake-up, not one each. That
//! store-then-check against the sleeper's announce-then-check is Dekker's protocol and needs
//! a StoreLoad fence on both sides. Where both processes could register for global
//! membarriers and the sleeper expects to spin more often than it sleeps (`fast_wake`), the
//! sleeper pays for both with a membarrier and the publisher uses a plain release store, which
//! leaves the store buffer free to drain in the background instead of stalling on the cache
//! line the peer is polling. Elsewhere both sides fence: a side that sleeps whenever it
//! waits (the Block strategy) would otherwise pay a membarrier, an interrupt of every core
//! running a registered process, on every wait, where a fence costs the publisher tens of
//! nanoseconds. Each direction of a channel chooses for itself, by its sleeper's strategy.
//!
//! A blocked wait sleeps until it is woken or reaches its deadline. Its peer's death wakes it
//! too where the transport can have it reported ([`PeerEnd::Reported`]: a watcher thread
//! wakes the futex when the peer's process exits); elsewhere it sleeps at most
//! [`SLEEP_SLICE`] at a time and polls the peer between ([`PeerEnd::Polled`]). Any transport
//! whose two sides share memory uses these pieces; the words themselves live wherever that
//! transport puts them.
//!
//! The pieces are generic over the words ([`Word32`], [`Word64`]): shared memory and futexes
//! in the transports, a model checker's atomics in the tests below, which check with loom
//! that no wake-up is lost and that a message's bytes are visible once its word is.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::WaitStrategy;
use crate::os::membarrier;
use crate::os::wait::{wait as futex_wait, wake as futex_wake};

/// How often a waiting side whose peer's end is [polled](PeerEnd::Polled) checks that its
/// peer is alive.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(2);
/// The longest a blocked wait sleeps before checking its peer (and its deadline) again, where
/// the peer's end is [polled](PeerEnd::Polled).
pub const SLEEP_SLICE: Duration = Duration::from_millis(15);

/// How a sleeping side learns that its peer has gone, which decides how long it may sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerEnd {
    /// Something wakes the sleeper's futex when the peer's end comes (a watcher of the peer's
    /// process): sleep until woken or the deadline.
    Reported,
    /// Nothing does: sleep at most [`SLEEP_SLICE`] at a time and check the peer between.
    Polled,
}
/// A 32-bit word of the protocol (a futex word or a sleeping flag), and the futex calls on it.
pub(crate) trait Word32 {
    fn load(&self, order: Ordering) -> u32;
    fn store(&self, value: u32, order: Ordering);
    fn fetch_add(&self, value: u32, order: Ordering) -> u32;
    fn swap(&self, value: u32, order: Ordering) -> u32;
    /// Sleeps while the word holds `expected`, until woken or `timeout` (`None`: no limit),
    /// or spuriously.
    fn futex_wait(&self, expected: u32, timeout: Option<Duration>);
    /// Wakes one sleeper of [`futex_wait`](Self::futex_wait).
    fn futex_wake_one(&self);
    /// Wakes every sleeper of [`futex_wait`](Self::futex_wait).
    fn futex_wake_all(&self);
}

/// A 64-bit word a side publishes (a slot's sequence word, the tail).
pub(crate) trait Word64 {
    fn store(&self, value: u64, order: Ordering);
}

impl Word32 for AtomicU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }
    #[inline]
    fn store(&self, value: u32, order: Ordering) {
        AtomicU32::store(self, value, order)
    }
    #[inline]
    fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        AtomicU32::fetch_add(self, value, order)
    }
    #[inline]
    fn swap(&self, value: u32, order: Ordering) -> u32 {
        AtomicU32::swap(self, value, order)
    }
    fn futex_wait(&self, expected: u32, timeout: Option<Duration>) {
        futex_wait(self, expected, timeout)
    }
    fn futex_wake_one(&self) {
        futex_wake(self, 1)
    }
    fn futex_wake_all(&self) {
        futex_wake(self, u32::MAX)
    }
}

impl Word64 for AtomicU64 {
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
}

/// Sleeps on `futex` while `ready` stays false, announcing the sleep in `sleeping` so the
/// other side knows to wake us; returns after one wake-up, at `deadline`, or (where the
/// peer's end is [`PeerEnd::Polled`]) after [`SLEEP_SLICE`]. `fast_wake`: the other side
/// publishes without a fence (see [`publish_then_check`]), so the announcement is followed by
/// a membarrier.
pub(crate) fn sleep_once<W: Word32 + ?Sized>(
    futex: &W,
    sleeping: &W,
    fast_wake: bool,
    peer: PeerEnd,
    deadline: Option<Instant>,
    ready: impl Fn() -> bool,
) {
    let seen = futex.load(Ordering::SeqCst);
    sleeping.store(1, Ordering::SeqCst);
    // A membarrier that failed (which the kernel does not do for a registered process) may
    // have left the publisher's store unseen: such a sleep is bounded by a slice.
    let barrier_failed = fast_wake && !membarrier::global_barrier();
    // The store (and membarrier) above and the other side's publish-then-check make this
    // re-check safe: either we see its message now, or it sees our flag and wakes us.
    if !ready() {
        let slice = (peer == PeerEnd::Polled || barrier_failed).then_some(SLEEP_SLICE);
        let timeout = match deadline {
            Some(d) => Some(d.saturating_duration_since(Instant::now()).min(slice.unwrap_or(Duration::MAX))),
            None => slice,
        };
        if timeout != Some(Duration::ZERO) {
            futex.futex_wait(seen, timeout);
        }
    }
    sleeping.store(0, Ordering::Relaxed);
}

/// Publishes `value` in `word` (a slot's sequence word or the tail), ordered before the
/// sleeping-flag loads that follow: by a StoreLoad fence (SeqCst store), or, with
/// `fast_wake`, by the sleeper's membarrier, so that only the compiler must keep the order.
#[inline]
pub(crate) fn publish_then_check<W: Word64 + ?Sized>(word: &W, value: u64, fast_wake: bool) {
    if fast_wake {
        word.store(value, Ordering::Release);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        word.store(value, Ordering::SeqCst);
    }
}

/// Wakes the other side if it announced a sleep on `futex`. Call after [`publish_then_check`].
/// The announcement is taken (swapped back to 0) by the one publisher that then wakes: later
/// publishes before the sleeper announces again make no system call.
#[inline]
pub(crate) fn wake_if_sleeping<W: Word32 + ?Sized>(futex: &W, sleeping: &W, fast_wake: bool) {
    // With fast_wake the order comes from the sleeper's membarrier (a SeqCst load would add
    // a barrier on weakly ordered CPUs); without, SeqCst pairs with the SeqCst store.
    let order = if fast_wake { Ordering::Relaxed } else { Ordering::SeqCst };
    if sleeping.load(order) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0 {
        futex.fetch_add(1, Ordering::SeqCst);
        futex.futex_wake_one();
    }
}

/// Wakes every sleeper on `futex`, announced or not: for what ends a wait other than the
/// other side's publish (a close, the peer's death). The word changes first, so that a side
/// about to sleep on the value it read before does not.
pub(crate) fn wake_all<W: Word32 + ?Sized>(futex: &W) {
    futex.fetch_add(1, Ordering::SeqCst);
    futex.futex_wake_all();
}

/// Whether a side that waits with `strategy` spins before it sleeps, so that it sleeps rarely
/// and a membarrier per sleep is worth the publisher's fence per message that it saves (see
/// the module doc). A side that blocks at once sleeps on nearly every wait: its publisher
/// fences instead.
pub(crate) fn sleeps_rarely(strategy: WaitStrategy) -> bool {
    !matches!(strategy, WaitStrategy::Block)
}

/// The state of one wait: spins while the strategy allows, then sleeps ([`sleep_once`]);
/// between attempts its user checks its condition, the peer and the deadline.
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

/// The model check of the protocol with loom: every interleaving (up to a preemption bound)
/// of a producer and a consumer that use [`publish_then_check`], [`wake_if_sleeping`] and
/// [`sleep_once`] as the shared-memory transport does. A lost wake-up shows as a deadlock
/// (the model's futex waits have no timeout), a message's bytes read before they are
/// published, or a slot rewritten before its release, as a data race on the payload.
///
/// Only the fenced path (`fast_wake` off, what a Block sleeper's direction uses) is modelled:
/// loom cannot express a membarrier, which the fast path relies on instead of the publisher's
/// fence. A peer's death, reported as the transport's watcher reports it (a flag, then
/// [`wake_all`]), is modelled too.
// Loom's model runs abort under Wine (a panic cannot start in them); the model is the same
// on every platform, so Unix runs it.
#[cfg(all(unix, test))]
mod tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{fence, AtomicU32 as ModelU32, AtomicU64 as ModelU64};
    use loom::sync::{Arc, Condvar, Mutex};

    // loom models SeqCst loads and stores as AcqRel only (it does model SeqCst fences), which
    // would report Dekker's protocol as broken when it is not. The model words therefore add a
    // SeqCst fence after a SeqCst store and before a SeqCst load: what those accesses are on
    // x86 (a locked instruction) and at least as strong as the C11 rules for them.
    fn fence_if_seqcst(order: Ordering) {
        if order == Ordering::SeqCst {
            fence(Ordering::SeqCst);
        }
    }

    /// A futex word of the model: an atomic, and a lock and condition variable that stand in
    /// for the kernel's wait queue.
    struct ModelWord {
        word: ModelU32,
        queue: Mutex<()>,
        woken: Condvar,
    }

    impl ModelWord {
        fn new() -> Self {
            ModelWord { word: ModelU32::new(0), queue: Mutex::new(()), woken: Condvar::new() }
        }
    }

    impl Word32 for ModelWord {
        fn load(&self, order: Ordering) -> u32 {
            fence_if_seqcst(order);
            self.word.load(order)
        }
        fn store(&self, value: u32, order: Ordering) {
            self.word.store(value, order);
            fence_if_seqcst(order);
        }
        fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
            let old = self.word.fetch_add(value, order);
            fence_if_seqcst(order);
            old
        }
        fn swap(&self, value: u32, order: Ordering) -> u32 {
            let old = self.word.swap(value, order);
            fence_if_seqcst(order);
            old
        }
        /// As FUTEX_WAIT, checked and queued under the queue's lock, but without a timeout.
        fn futex_wait(&self, expected: u32, _timeout: Option<Duration>) {
            let queued = self.queue.lock().unwrap();
            if self.word.load(Ordering::SeqCst) == expected {
                drop(self.woken.wait(queued).unwrap());
            }
        }
        fn futex_wake_one(&self) {
            let _queue = self.queue.lock().unwrap();
            self.woken.notify_one();
        }
        fn futex_wake_all(&self) {
            let _queue = self.queue.lock().unwrap();
            self.woken.notify_all();
        }
    }

    struct ModelWord64(ModelU64);

    impl Word64 for ModelWord64 {
        fn store(&self, value: u64, order: Ordering) {
            self.0.store(value, order);
            fence_if_seqcst(order);
        }
    }

    impl ModelWord64 {
        fn load(&self, order: Ordering) -> u64 {
            fence_if_seqcst(order);
            self.0.load(order)
        }
    }

    /// One slot's words, its payload, and both waits' words: a channel of capacity 1.
    struct Ring {
        seq: ModelWord64,
        tail: ModelWord64,
        payload: UnsafeCell<u64>,
        data_futex: ModelWord,
        data_sleeping: ModelWord,
        room_futex: ModelWord,
        room_sleeping: ModelWord,
    }

    impl Ring {
        fn new() -> Self {
            Ring {
                seq: ModelWord64(ModelU64::new(0)),
                tail: ModelWord64(ModelU64::new(0)),
                payload: UnsafeCell::new(0),
                data_futex: ModelWord::new(),
                data_sleeping: ModelWord::new(),
                room_futex: ModelWord::new(),
                room_sleeping: ModelWord::new(),
            }
        }

        /// Waits as a blocked side does: check, then sleep until `ready`.
        fn wait_until(futex: &ModelWord, sleeping: &ModelWord, ready: impl Fn() -> bool) {
            while !ready() {
                sleep_once(futex, sleeping, false, PeerEnd::Reported, None, &ready);
            }
        }

        /// The producer: waits for room, writes the payload, publishes, wakes.
        fn produce(&self, messages: u64) {
            for m in 0..messages {
                Self::wait_until(&self.room_futex, &self.room_sleeping, || self.tail.load(Ordering::SeqCst) >= m);
                // SAFETY (model): the slot is free once the consumer released message m - 1.
                self.payload.with_mut(|p| unsafe { *p = 100 + m });
                publish_then_check(&self.seq, m + 1, false);
                wake_if_sleeping(&self.data_futex, &self.data_sleeping, false);
            }
        }

        /// The consumer: waits for each message, reads it, releases it (the tail), wakes.
        fn consume(&self, messages: u64) {
            for m in 0..messages {
                Self::wait_until(&self.data_futex, &self.data_sleeping, || self.seq.load(Ordering::SeqCst) == m + 1);
                // SAFETY (model): message m is published and not yet released.
                let got = self.payload.with(|p| unsafe { *p });
                assert_eq!(got, 100 + m, "message {m} read with the wrong bytes");
                publish_then_check(&self.tail, m + 1, false);
                wake_if_sleeping(&self.room_futex, &self.room_sleeping, false);
            }
        }
    }

    fn check(messages: u64, preemptions: usize) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(preemptions);
        model.check(move || {
            let ring = Arc::new(Ring::new());
            let producer = {
                let ring = Arc::clone(&ring);
                loom::thread::spawn(move || ring.produce(messages))
            };
            ring.consume(messages);
            producer.join().unwrap();
        });
    }

    /// A consumer asleep on the data futex is always woken by the message it waits for, and
    /// reads the bytes written before it.
    #[test]
    fn no_wake_up_is_lost_and_bytes_arrive_before_their_word() {
        check(1, 3);
    }

    /// Two messages through one slot: the producer waits for room (the consumer's release),
    /// the consumer for data, each asleep or not; nothing deadlocks, nothing is read early,
    /// and the slot is never rewritten before its release.
    #[test]
    fn room_and_data_waits_wake_each_other() {
        check(2, 2);
    }

    /// The peer's death as the watcher reports it, a flag and then every sleeper woken, while
    /// the consumer waits for a message that never comes: the consumer always wakes and sees
    /// the flag, however the report and its sleep interleave.
    #[test]
    fn a_reported_death_always_wakes_the_sleeper() {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(|| {
            let ring = Arc::new(Ring::new());
            let gone = Arc::new(ModelWord::new());
            let watcher = {
                let (ring, gone) = (Arc::clone(&ring), Arc::clone(&gone));
                loom::thread::spawn(move || {
                    gone.store(1, Ordering::SeqCst);
                    wake_all(&ring.data_futex);
                })
            };
            Ring::wait_until(&ring.data_futex, &ring.data_sleeping, || {
                ring.seq.load(Ordering::SeqCst) != 0 || gone.load(Ordering::SeqCst) != 0
            });
            watcher.join().unwrap();
        });
    }
}
