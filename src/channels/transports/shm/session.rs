//! A consumer's session with one producer: the mapped region, which slots are held by views,
//! and the in-order reclaim that turns releases into the shared tail the producer reads.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::ring::Region;
use crate::channels::transport::{RawView, Release};
use crate::channels::wait::{publish_then_check, wake_if_sleeping};
use crate::error::{Error, Result};
use crate::os::{membarrier, Mapping};

/// The arena mapping a view of a buffer send points into, while the view is held: one
/// reference, set by the receive and taken by the release of the slot's view. An atomic
/// pointer, not a lock: a receive is one plain store and a release one swap (a per-slot mutex
/// cost two locked instructions on each side).
pub(super) struct ArenaHold(AtomicPtr<Mapping>);

impl ArenaHold {
    fn new() -> Self {
        ArenaHold(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// Holds `mapping` for the slot's view. The slot's previous view was released before the
    /// slot could carry a new message, so nothing is held.
    pub(super) fn set(&self, mapping: Arc<Mapping>) {
        let old = self.0.swap(Arc::into_raw(mapping).cast_mut(), Ordering::AcqRel);
        debug_assert!(old.is_null(), "a slot's arena hold set twice");
        if !old.is_null() {
            // SAFETY: a non-null pointer here came from `Arc::into_raw` in `set` and was
            // swapped out, so this is its only owner.
            drop(unsafe { Arc::from_raw(old) });
        }
    }

    /// Lets go of the slot's mapping, if any.
    fn release(&self) {
        let held = self.0.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !held.is_null() {
            // SAFETY: as in `set`: the pointer came from `Arc::into_raw` and was swapped out.
            drop(unsafe { Arc::from_raw(held) });
        }
    }
}

impl Drop for ArenaHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// Which view holds a slot: `state` is `seq << 1 | 1` while message `seq` is held,
/// `seq << 1` once released, u64::MAX before first use; `ptr` and `len` check views handed
/// back by C. Aligned so that a receive and a release touch one line per message.
#[repr(align(32))]
pub(super) struct ViewRecord {
    pub(super) state: AtomicU64,
    pub(super) ptr: AtomicUsize,
    pub(super) len: AtomicUsize,
}

impl Default for ViewRecord {
    fn default() -> Self {
        ViewRecord { state: AtomicU64::new(u64::MAX), ptr: AtomicUsize::new(0), len: AtomicUsize::new(0) }
    }
}

/// What views of one producer's session share: the region and which slots are still held.
pub(crate) struct Session {
    pub(super) id: u64,
    pub(super) region: Region,
    pub(super) mask: u64,
    pub(super) slot_count: u64,
    /// Per slot: the view that holds it, in one cache line per slot's record. A power-of-two
    /// number of them (see [`Session::view`]), set once by `new`.
    views: Box<[ViewRecord]>,
    /// Messages received (next sequence number to read).
    pub(super) received: AtomicU64,
    /// Messages released in order (mirrors the shared tail, which only we write).
    pub(super) reclaimed: AtomicU64,
    reclaiming: AtomicBool,
    /// Set by the consumer before it hands out the session's first Rust `Message`, which may be
    /// dropped on any thread: from then on releases take the reclaim lock. Until then (always,
    /// through the C API, whose calls on a channel never overlap) every release comes from
    /// the consumer's caller, one at a time, and skips it: the lock's atomic swap was a
    /// sizeable part of a small message's cost.
    messages_out: AtomicBool,
    /// Set under the reclaim lock when the consumer gave the session up while views were still
    /// held: the release of the last one drops the consumer's reference (see [`Session::retire`]).
    orphaned: AtomicBool,
    /// The consumer's sleeps for messages pay a membarrier, and the producer publishes them
    /// without a fence (see the wait protocol).
    pub(super) data_fast_wake: bool,
    /// The producer's sleeps for room pay a membarrier, and releases are published without a
    /// fence.
    pub(super) room_fast_wake: bool,
    /// Per slot, made at the first buffer send: the arena mapping a held view points into,
    /// so that it stays mapped until the view is released whatever the producer says.
    arena_holds: OnceLock<Box<[ArenaHold]>>,
    /// Other routes' memory that views of this session may point into, dropped when the last
    /// view is released (see `ConsumerSession::keep_while_held`); `has_kept` says whether
    /// there is any. Both change only under the reclaim lock.
    kept: Mutex<Vec<Box<dyn Any + Send + Sync>>>,
    has_kept: AtomicBool,
}

impl Session {
    pub(super) fn new(id: u64, region: Region, data_fast_wake: bool, room_fast_wake: bool) -> Self {
        let slot_count = u64::from(region.geometry.slot_count);
        // (A region's geometry is checked when made; `view` relies on it.)
        assert!(slot_count.is_power_of_two(), "a channel's slot count is a power of two, not {slot_count}");
        let n = slot_count as usize;
        Session {
            id,
            region,
            mask: slot_count - 1,
            slot_count,
            views: (0..n).map(|_| ViewRecord::default()).collect(),
            received: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            reclaiming: AtomicBool::new(false),
            messages_out: AtomicBool::new(false),
            orphaned: AtomicBool::new(false),
            data_fast_wake,
            room_fast_wake,
            arena_holds: OnceLock::new(),
            kept: Mutex::new(Vec::new()),
            has_kept: AtomicBool::new(false),
        }
    }

    /// The record of the slot of message `seq` (`seq` modulo the slot count).
    #[inline(always)]
    pub(super) fn view(&self, seq: u64) -> &ViewRecord {
        let index = seq as usize & (self.views.len() - 1);
        // SAFETY: `views` has a power-of-two length (asserted in `new`, and the private field
        // is never replaced), so masking with length - 1 gives an index below the length.
        unsafe { self.views.get_unchecked(index) }
    }

    /// Asks the producer to notify at its next message. Call before re-checking
    /// the ring. While the flag is still set the producer has not yet taken it, so it will
    /// signal after this call: only setting it needs the barrier.
    pub(super) fn ask_for_signal(&self) {
        let flag = self.region.fd_waiting();
        if flag.load(Ordering::SeqCst) == 0 {
            flag.store(1, Ordering::SeqCst);
            if self.data_fast_wake {
                membarrier::global_barrier();
            }
        }
    }

    pub(super) fn arena_holds(&self) -> &[ArenaHold] {
        self.arena_holds.get_or_init(|| (0..self.slot_count).map(|_| ArenaHold::new()).collect())
    }

    /// Whether a view of this session is still held (releases reclaim in order, so all are
    /// released exactly when the tail has caught up with what was received).
    #[inline]
    pub(super) fn holds_views(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire) != self.received.load(Ordering::Acquire)
    }

    /// Keeps `keep` until the last view held now is released, or drops it now when none is.
    /// Called by the consumer, the only one that hands out views, once it hands out no more
    /// of this session's (its route's session ended).
    pub(super) fn keep_while_held(&self, keep: Box<dyn Any + Send + Sync>) {
        self.lock();
        let held = self.holds_views();
        if held {
            self.kept.lock().push(keep);
            self.has_kept.store(true, Ordering::Relaxed);
        }
        self.reclaiming.store(false, Ordering::Release);
        // (Not held: `keep` is dropped here, outside the lock.)
    }

    /// Notes that a Rust `Message` of this session is about to be handed out. Called by the
    /// consumer (before the message exists, so any thread that drops it sees the flag).
    #[inline]
    pub(super) fn note_message_out(&self) {
        if !self.messages_out.load(Ordering::Relaxed) {
            self.messages_out.store(true, Ordering::Relaxed);
        }
    }

    /// Takes the reclaim lock: views may be released from several threads.
    #[inline]
    fn lock(&self) {
        let mut spins = 0u32;
        while self.reclaiming.swap(true, Ordering::Acquire) {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Marks message `token` released, advances the shared tail over the released prefix and
    /// wakes a producer waiting for room, all under the lock (where releases can overlap, see
    /// `messages_out`): each releaser scans after its
    /// own release, so no release is left unreclaimed (a "someone else will do it" hand-off
    /// would need a StoreLoad fence). Returns whether this was the last view of an orphaned
    /// session, which the caller must then drop. The unlock is this call's last access.
    #[inline(always)]
    fn mark_released(&self, token: u64) -> bool {
        let locked = self.messages_out.load(Ordering::Relaxed);
        if locked {
            self.lock();
        }
        self.view(token).state.store(token << 1, Ordering::Release);
        let start = self.reclaimed.load(Ordering::Relaxed);
        let received = self.received.load(Ordering::Acquire);
        let mut tail = start;
        while tail < received && self.view(tail).state.load(Ordering::Acquire) == tail << 1 {
            tail += 1;
        }
        if tail != start {
            self.reclaimed.store(tail, Ordering::Release);
            publish_then_check(self.region.tail(), tail, self.room_fast_wake);
            wake_if_sleeping(self.region.room_futex(), self.region.room_sleeping(), self.room_fast_wake);
        }
        let (last, kept) = if tail == received {
            let kept = if self.has_kept.load(Ordering::Relaxed) { Some(self.take_kept()) } else { None };
            (self.orphaned.load(Ordering::Relaxed), kept)
        } else {
            (false, None)
        };
        if locked {
            self.reclaiming.store(false, Ordering::Release);
        }
        // The last view is gone: what it pointed into goes too (outside the lock; the
        // session is not touched again).
        if let Some(kept) = kept {
            drop_kept(kept);
        }
        last
    }

    /// What the last view pointed into, taken (under the reclaim lock) to be dropped.
    #[cold]
    #[inline(never)]
    fn take_kept(&self) -> Vec<Box<dyn Any + Send + Sync>> {
        self.has_kept.store(false, Ordering::Relaxed);
        std::mem::take(&mut *self.kept.lock())
    }

    /// Gives up the consumer's reference to a session. A Rust [`Message`] points at its
    /// session without a reference count (an atomic increment and decrement per message
    /// saved); instead, a session whose views are not all released is marked orphaned, and
    /// the release of its last view drops this reference ([`release_message`]).
    ///
    /// [`Message`]: crate::channels::Message
    fn retire(session: Arc<Session>) {
        session.lock();
        let held = session.reclaimed.load(Ordering::Relaxed) != session.received.load(Ordering::Acquire);
        session.orphaned.store(held, Ordering::Relaxed);
        session.reclaiming.store(false, Ordering::Release);
        if held {
            // Dropped by `release_message` when the last view goes.
            std::mem::forget(session);
        }
    }
}

/// The failure of a release of a view that is not held.
#[cold]
#[inline(never)]
fn not_held(token: u64) -> Error {
    Error::InvalidState(format!(
        "message {token} is not held by this consumer (already released, or not received from this channel)"
    ))
}

/// Drops what [`Session::take_kept`] took, out of the release's line.
#[cold]
#[inline(never)]
fn drop_kept(kept: Vec<Box<dyn Any + Send + Sync>>) {
    drop(kept);
}

/// Releases a Rust message's view.
///
/// # Safety
/// `session` points to a live session (the consumer's own reference, or, once the consumer
/// has retired it, the one this function drops when the last view goes), and `view` is held:
/// received from it and not released yet. Both hold for a [`Message`] until its drop.
///
/// [`Message`]: crate::channels::Message
#[inline]
pub(crate) unsafe fn release_message(session: std::ptr::NonNull<Session>, view: &RawView) {
    let last = {
        // SAFETY: the caller guarantees the session is alive; it stays so until the view is
        // marked released, which happens inside `mark_released`.
        let s = unsafe { session.as_ref() };
        // Only buffer sends (zero copy) hold an arena mapping; see `Session::release`.
        if view.is_zero_copy() {
            if let Some(holds) = s.arena_holds.get() {
                holds[(view.token & s.mask) as usize].release();
            }
        }
        s.mark_released(view.token)
    };
    if last {
        // SAFETY: the session was retired with its views held, leaking the consumer's strong
        // reference for this moment; this was its last view, so nothing else touches it.
        unsafe { Arc::decrement_strong_count(session.as_ptr().cast_const()) };
    }
}

impl Release for Session {
    #[inline(always)]
    fn release(&self, view: &RawView) -> Result<()> {
        let not_held = || not_held(view.token);
        if view.session != self.id || view.token >= self.received.load(Ordering::Acquire) {
            return Err(not_held());
        }
        let record = self.view(view.token);
        // A plain check-then-store is enough: each slot has one view, a Rust Message releases
        // once, and C releases are serialised by the channel's lock.
        if record.state.load(Ordering::Acquire) != view.token << 1 | 1
            || record.ptr.load(Ordering::Relaxed) != view.ptr as usize
            || record.len.load(Ordering::Relaxed) != view.len
        {
            return Err(not_held());
        }
        // Before the slot can be reused: a buffer send's arena may be unmapped from now on.
        if let Some(holds) = self.arena_holds.get() {
            holds[(view.token & self.mask) as usize].release();
        }
        // The consumer that received it (and releases it now) still holds the session.
        let last = self.mark_released(view.token);
        debug_assert!(!last, "a session is orphaned only once its consumer has gone");
        Ok(())
    }
}

/// The consumer's own reference to a session; dropping it retires the session, which keeps
/// it alive for the messages still held ([`Session::retire`]).
pub(super) struct OwnedSession(pub(super) Option<Arc<Session>>);

impl std::ops::Deref for OwnedSession {
    type Target = Arc<Session>;
    #[inline]
    fn deref(&self) -> &Arc<Session> {
        self.0.as_ref().expect("an owned session is present until dropped")
    }
}

impl Drop for OwnedSession {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            Session::retire(session);
        }
    }
}
