//! The producer half of a shared-memory channel.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::arenas::{ControlRecord, SentArenas, MAX_ATTACHMENT_LEN};
use super::handshake::{self, Place};
use super::rendezvous::{self, End, EndLock, PeerWatch};
use super::ring::{
    pack_len_kind, pool_need, Geometry, Region, INLINE_MAX, KIND_ARENA, KIND_INLINE, KIND_POOL, KIND_ROUTED,
    PRODUCER_DETACHED,
};
use super::{note_peer_watch, peer_end};
use crate::channels::peers::{Peer, PeerState};
use crate::channels::transport::{Attachment, PeerHolds, ProducerTransport, RawLoan, SharedRegion, TransportInfo};
use crate::channels::wait::{publish_then_check, sleep_once, wake_if_sleeping, Waiter};
use crate::channels::{ChannelConfig, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::notify::notify;
use crate::os::stream::{try_send_with_handles, PeerIdentity};
use crate::os::wait::wake as wake_word;

// ---------------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------------

/// A stream of pool payloads goes back to the start of the pool once past this many bytes
/// (when the start is free): its bytes stay in the caches, whatever the pool's size. Loans
/// inside this window do not read the consumer's tail to start again where the last message
/// was: that cross-core read, and writing lines the consumer has just read, cost more than
/// they saved at every size measured below the window (16-256 KiB). A window of 2 MiB moved
/// 16-256 KiB messages 3-17% faster than one of 512 KiB on both machines measured (see the
/// benchmarks' README); a message that does not fit in what is left of the window reads the
/// tail.
const POOL_HOT: u64 = 2 << 20;

/// The producer half of a shared-memory channel.
pub(crate) struct ShmProducer {
    info: TransportInfo,
    name: String,
    region: Region,
    watch: PeerWatch,
    /// The producer's end of the notification pair whose other end the consumer's event loop
    /// waits on.
    signal: OwnedHandle,
    wait: WaitStrategy,
    mask: u64,
    slot_count: u64,
    /// Sequence number of the next message.
    head: u64,
    /// The consumer's tail as last read (all messages below it are released).
    tail: u64,
    /// Pool allocator: monotonic byte counters; position = counter % pool_size.
    pool_head: u64,
    pool_tail: u64,
    /// Where in the pool the next allocation starts (`pool_head` modulo the pool, tracked).
    pool_pos: u64,
    /// `pool_head` after each in-flight message's allocation, indexed by slot.
    pool_ends: Vec<u64>,
    loan: Option<PendingLoan>,
    /// Both processes registered for membarriers and the consumer spins before it sleeps:
    /// publish without a fence (see the wait protocol).
    fast_wake: bool,
    /// Likewise for the consumer's releases: this side's sleeps for room pay a membarrier.
    room_fast_wake: bool,
    sends_since_check: u32,
    /// This process's claim on the producer's end of the channel, until the drop.
    lock: Option<EndLock>,
    /// The consumer's end whose files the drop cleans up after, if it is over: a pair's
    /// consumer, or a fan-out's consumer in its slot.
    cleans_up: Option<End>,
    /// The consumer's lock file when it answered (see `rendezvous::clean_after_peer`).
    consumer_lock: Option<rendezvous::FileId>,
    /// Buffer sends (boxed: cold, and kept off the hot fields' cache lines).
    arenas: Box<SentArenas>,
    /// The consumer's rendezvous sections for the other routes, until taken.
    peer_sections: Vec<Attachment>,
    /// What the other routes keep alive for the consumer, let go of when it dies.
    holds: Arc<PeerHolds>,
    /// Whether the consumer's end was logged (it is, once).
    gone_logged: bool,
}

#[derive(Clone, Copy, Debug)]
struct PendingLoan {
    token: u64,
    ptr: *mut u8,
    len: usize,
    kind: u32,
    pool_offset: u64,
    pool_end: u64,
}

// SAFETY: the raw pointers in PendingLoan point into `region`, which the producer owns and
// which is valid in any thread.
unsafe impl Send for ShmProducer {}

impl std::fmt::Debug for ShmProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmProducer")
            .field("name", &self.name)
            .field("head", &self.head)
            .field("tail", &self.tail)
            .finish()
    }
}

impl ShmProducer {
    /// Connects to the consumer of `name` and hands it a fresh region, with the other
    /// routes' sections that `offers` makes (anew for each attempt).
    pub(crate) fn connect(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
    ) -> Result<Self> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let geometry = Geometry::new(config.capacity, config.pool_size as u64)?;
        let (lock, place) = handshake::claim_producer_end(name, config.kind)?;
        let c = handshake::offer(name, geometry, place, config, deadline, offers)?;
        // The consumer that answered holds its lock file now: remembered, to tell it from a
        // later consumer's when cleaning up after this one.
        let consumer_lock = rendezvous::lock_file_id(name, End::Consumer);
        Ok(Self::over(name, info, config, geometry, c, Some(lock), consumer_lock))
    }

    /// The producer of a consumer met over a socket (a fan-out's consumer, which connected to
    /// it): its ring, with the other routes' sections that `offers` makes, and no claim on the
    /// channel's name, which the fan-out holds. `Place::slot` is the consumer's slot, whose
    /// lock file the ring removes if the consumer dies.
    pub(super) fn accepted(
        name: &str,
        sock: crate::os::stream::Stream,
        peer: PeerIdentity,
        info: TransportInfo,
        config: &ChannelConfig,
        place: Place,
        offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
    ) -> Result<Self> {
        // A consumer maps (and may fault in) the whole pool before it answers: as long as a
        // rendezvous may take, bounded, so that one that never answers cannot keep the others
        // from being met.
        let wait = config.rendezvous_timeout.unwrap_or(Duration::from_secs(30)).max(Duration::from_secs(2));
        let deadline = Some(Instant::now() + wait);
        let geometry = Geometry::new(config.capacity, config.pool_size as u64)?;
        let c = handshake::offer_on(sock, peer, name, geometry, place, config, deadline, offers)?;
        // The consumer claimed its slot before it answered.
        let end = End::FanOutConsumer(place.slot);
        let mut ring = Self::over(name, info, config, geometry, c, None, rendezvous::lock_file_id(name, end));
        ring.cleans_up = Some(end);
        Ok(ring)
    }

    fn over(
        name: &str,
        mut info: TransportInfo,
        config: &ChannelConfig,
        geometry: Geometry,
        c: handshake::Connected,
        lock: Option<EndLock>,
        consumer_lock: Option<rendezvous::FileId>,
    ) -> Self {
        let slot_count = u64::from(geometry.slot_count);
        let base = info.routes.first().map(|r| r.reason.clone()).unwrap_or_default();
        note_peer_watch(&mut info, &base, &c.watch);
        ShmProducer {
            info,
            name: name.to_owned(),
            region: c.region,
            watch: c.watch,
            signal: c.signal,
            wait: config.wait,
            mask: slot_count - 1,
            slot_count,
            head: 0,
            tail: 0,
            pool_head: 0,
            pool_tail: 0,
            pool_pos: 0,
            pool_ends: vec![0; slot_count as usize],
            loan: None,
            fast_wake: c.fast_wake,
            room_fast_wake: c.room_fast_wake,
            sends_since_check: 0,
            cleans_up: lock.is_some().then_some(End::Consumer),
            lock,
            consumer_lock,
            arenas: Box::default(),
            peer_sections: c.answers,
            holds: c.holds,
            gone_logged: false,
        }
    }

    // Inline into the send path's liveness checks (`has_room_for`, `poll_loan`), as the compiler
    // chose by itself before the platform layer moved the peer watch's calls around.
    #[inline]
    fn consumer_gone(&mut self, force: bool) -> Result<()> {
        if self.region.consumer_closed().load(Ordering::Acquire) != 0 {
            return Err(self.consumer_end(true));
        }
        if self.watch.check(force) {
            return Err(self.consumer_end(false));
        }
        Ok(())
    }

    /// The error for a consumer that `closed` its end, or died without; the first time, also
    /// a log record. Out of line, so that the liveness checks of the send path stay small.
    #[cold]
    #[inline(never)]
    fn consumer_end(&mut self, closed: bool) -> Error {
        let (name, pid) = (&self.name, self.watch.pid);
        let first = !std::mem::replace(&mut self.gone_logged, true);
        if closed {
            if first {
                log::info!(
                    "channel {name:?} (producer): the consumer (pid {pid}) closed its end; sends fail from now on"
                );
            }
            Error::PeerGone(format!("the consumer of channel {name:?} closed it"))
        } else {
            // Where the watcher did not report the death as it happened (it let go then).
            self.holds.consumer_died();
            if first {
                log::warn!(
                    "channel {name:?} (producer): the consumer (pid {pid}) exited or dropped its connection without \
                     closing the channel (killed, or crashed?); sends fail from now on"
                );
            }
            Error::PeerGone(format!("the consumer of channel {name:?} (pid {pid}) has exited or closed its socket"))
        }
    }

    /// Reads the consumer's tail, checks it, and frees the pool space of released messages.
    fn refresh_tail(&mut self) -> Result<()> {
        let tail = self.region.tail().load(Ordering::Acquire);
        if tail < self.tail || tail > self.head {
            return Err(Error::Corrupt(format!(
                "channel {:?}: the consumer's tail {tail} lies outside [{}, {}]",
                self.name, self.tail, self.head
            )));
        }
        if tail > self.tail {
            self.tail = tail;
            let end = self.pool_ends[((tail - 1) & self.mask) as usize];
            self.pool_tail = self.pool_tail.max(end);
            while self.arenas.in_flight.front().is_some_and(|(seq, _, _)| *seq < tail) {
                self.arenas.in_flight.pop_front();
            }
        }
        Ok(())
    }

    /// Finds `len` contiguous pool bytes: (offset, new pool_head), committed on publish,
    /// which also moves `pool_pos`. No division on this path: the position is tracked.
    ///
    /// Payloads stay in cache: an empty pool starts again at offset 0 (the bytes the last
    /// messages used), and a stream that has gone past [`POOL_HOT`] bytes goes back to the
    /// start as soon as the start is free, rather than through the whole pool.
    #[inline]
    fn pool_alloc(&self, len: usize) -> Option<(u64, u64)> {
        let size = self.region.geometry.pool_size;
        let need = pool_need(len);
        let pos = if self.pool_head == self.pool_tail { 0 } else { self.pool_pos };
        let fits = |taken: u64| self.pool_head - self.pool_tail + taken <= size;
        let wrap = size - pos + need;
        let (offset, taken) = if pos + need > POOL_HOT && pos != 0 && fits(wrap) {
            (0, wrap)
        } else if pos + need <= size {
            (pos, need)
        } else {
            (0, wrap)
        };
        fits(taken).then_some((offset, self.pool_head + taken))
    }

    /// Whether the consumer's tail is worth reading before a pool loan of `len` (one read of
    /// a line the consumer writes): when the pool may have emptied since the tail was last
    /// read and the message would take the stream past [`POOL_HOT`], so that it may go back to
    /// the start.
    #[inline]
    fn pool_refresh_due(&self, len: usize) -> bool {
        self.pool_head != self.pool_tail && self.pool_pos + pool_need(len) > POOL_HOT
    }

    /// Whether a loan of `len` could be granted now.
    #[inline]
    fn room_for(&mut self, len: usize) -> Result<bool> {
        if self.head - self.tail >= self.slot_count {
            self.refresh_tail()?;
            if self.head - self.tail >= self.slot_count {
                return Ok(false);
            }
        }
        if len <= INLINE_MAX {
            return Ok(true);
        }
        if self.pool_refresh_due(len) {
            self.refresh_tail()?;
        }
        if self.pool_alloc(len).is_some() {
            return Ok(true);
        }
        self.refresh_tail()?;
        Ok(self.pool_alloc(len).is_some())
    }

    /// The common case of a loan, free of `Result` so that the hot path moves no error-sized
    /// values: no loan outstanding, a valid length, room by the tail last read, the consumer
    /// open (its closed word is read every time) and no liveness check due (one in 64 sends
    /// goes to `poll_loan`, which polls the peer at most every [`LIVENESS_PERIOD`]).
    /// `None` says nothing: ask [`poll_loan`](Self::poll_loan).
    #[inline(always)]
    fn loan_fast(&mut self, len: usize) -> Option<RawLoan> {
        let pending = self.pending_fast(len)?;
        self.loan = Some(pending);
        Some(RawLoan { ptr: pending.ptr, len, token: pending.token })
    }

    /// The room of [`loan_fast`](Self::loan_fast), not yet recorded as the loan outstanding.
    #[inline(always)]
    fn pending_fast(&mut self, len: usize) -> Option<PendingLoan> {
        let due = self.sends_since_check.wrapping_add(1) % 64 == 0;
        if self.loan.is_some()
            || len == 0
            || due
            || self.head - self.tail >= self.slot_count
            || self.region.consumer_closed().load(Ordering::Relaxed) != 0
            || self.watch.known_gone()
        {
            return None;
        }
        let index = (self.head & self.mask) as usize;
        let pending = if len <= INLINE_MAX {
            PendingLoan {
                token: self.head,
                ptr: self.region.slot(index).inline(),
                len,
                kind: KIND_INLINE,
                pool_offset: 0,
                pool_end: self.pool_head,
            }
        } else {
            if len as u64 > self.region.geometry.pool_size || self.pool_refresh_due(len) {
                return None;
            }
            let (offset, end) = self.pool_alloc(len)?;
            let ptr = self.region.pool_range(offset, len as u64)?;
            PendingLoan { token: self.head, ptr, len, kind: KIND_POOL, pool_offset: offset, pool_end: end }
        };
        self.sends_since_check = self.sends_since_check.wrapping_add(1);
        Some(pending)
    }

    /// Publishes the first `len` bytes of `pending` (checked by the caller: 1 to its length),
    /// the room of the next message, as that message.
    #[inline(always)]
    fn publish_pending(&mut self, pending: PendingLoan, len: usize) -> u64 {
        let index = (self.head & self.mask) as usize;
        let region = &self.region;
        // One bounds check for the message's words.
        let slot = region.slot(index);
        slot.len_kind.store(pack_len_kind(len as u32, pending.kind), Ordering::Relaxed);
        if pending.kind == KIND_POOL {
            slot.pool_offset().store(pending.pool_offset, Ordering::Relaxed);
        }
        self.pool_ends[index] = pending.pool_end;
        self.pool_head = pending.pool_end;
        if pending.kind == KIND_POOL {
            self.pool_pos = pending.pool_offset + pool_need(pending.len);
        }
        publish_then_check(&slot.seq, self.head + 1, self.fast_wake);
        let seq = self.head;
        self.head += 1;
        wake_if_sleeping(region.data_futex(), region.data_sleeping(), self.fast_wake);
        let order = if self.fast_wake { Ordering::Relaxed } else { Ordering::SeqCst };
        if region.fd_waiting().load(order) != 0 && region.fd_waiting().swap(0, Ordering::SeqCst) != 0 {
            notify(crate::os::borrow(&self.signal));
        }
        seq
    }

    /// A loan if there is room now, `None` if not (no allocation: the blocking path calls
    /// this in a loop).
    #[inline]
    fn poll_loan(&mut self, len: usize) -> Result<Option<RawLoan>> {
        if self.loan.is_some() {
            return Err(Error::InvalidState(format!(
                "channel {:?} already has a loan outstanding; publish or cancel it first",
                self.name
            )));
        }
        self.check_len(len)?;
        // The closed word is read every time (a line the consumer writes once); the process
        // and socket are polled at most every LIVENESS_PERIOD, looked at every 64 sends.
        self.sends_since_check = self.sends_since_check.wrapping_add(1);
        if self.region.consumer_closed().load(Ordering::Relaxed) != 0
            || self.watch.known_gone()
            || self.sends_since_check % 64 == 0
        {
            self.consumer_gone(false)?;
        }
        if !self.room_for(len)? {
            return Ok(None);
        }
        let index = (self.head & self.mask) as usize;
        let pending = if len <= INLINE_MAX {
            PendingLoan {
                token: self.head,
                ptr: self.region.slot(index).inline(),
                len,
                kind: KIND_INLINE,
                pool_offset: 0,
                pool_end: self.pool_head,
            }
        } else {
            let (offset, end) = self.pool_alloc(len).expect("room_for found room");
            PendingLoan {
                token: self.head,
                ptr: self.region.pool_range(offset, len as u64).expect("allocation inside the pool"),
                len,
                kind: KIND_POOL,
                pool_offset: offset,
                pool_end: end,
            }
        };
        self.loan = Some(pending);
        Ok(Some(RawLoan { ptr: pending.ptr, len, token: pending.token }))
    }
    #[inline]
    fn check_len(&self, len: usize) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid("a message needs at least one byte"));
        }
        if len as u64 > self.region.geometry.pool_size {
            return Err(Error::invalid(format!(
                "a {len}-byte message does not fit channel {:?}, whose pool holds {} bytes; raise the channel's pool_size",
                self.name, self.region.geometry.pool_size
            )));
        }
        Ok(())
    }
}

impl ShmProducer {
    /// Why [`publish`](ProducerTransport::publish) refused a loan.
    #[cold]
    #[inline(never)]
    fn publish_error(&self, len: usize) -> Error {
        match self.loan {
            Some(p) if len == 0 || len > p.len => {
                Error::invalid(format!("publishing {len} bytes of a {}-byte loan", p.len))
            }
            _ => Error::InvalidState(format!(
                "this loan is not the outstanding loan of channel {:?} (already published or cancelled?)",
                self.name
            )),
        }
    }
}

/// What a producer waits for from the consumer.
#[derive(Clone, Copy, Debug)]
enum Awaited {
    /// Room for a loan of `len` bytes: a slot, and pool bytes for a message longer than a slot
    /// holds.
    Room { len: usize },
    /// The release of message `seq` (and of every one before it).
    Release { seq: u64 },
}

/// Waiting for the consumer.
impl ShmProducer {
    /// Whether `what` has come, reading the consumer's tail.
    #[inline]
    fn arrived(&mut self, what: Awaited) -> Result<bool> {
        match what {
            Awaited::Room { len } => self.room_for(len),
            Awaited::Release { seq } => {
                self.refresh_tail()?;
                Ok(self.tail > seq)
            }
        }
    }

    /// Waits until `what` has come (`Ok`), the consumer has gone (`PeerGone`) or `deadline`
    /// (`Timeout`): spins as the wait strategy allows, then sleeps on the room futex, which
    /// the consumer's releases wake and, where its end is reported, so does its end.
    fn wait_for(&mut self, what: Awaited, deadline: Option<Instant>) -> Result<()> {
        let mut waiter = Waiter::new(self.wait, deadline);
        let mut spins = 0u32;
        let mut slept = false;
        loop {
            if self.arrived(what)? {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if waiter.spins() && spins % 128 != 0 && !slept {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            // No syscall where the watcher reports the consumer's end; where it is polled, a
            // sleep slice (15 ms) outlasts LIVENESS_PERIOD, so a timed-out sleep always checks,
            // while a woken one pays no syscall.
            slept = false;
            if let Err(gone) = self.consumer_gone(false) {
                // A consumer may release and then close between our two looks: the tail it
                // stored before its closed word decides.
                if self.arrived(what)? {
                    return Ok(());
                }
                return Err(gone);
            }
            if waiter.timed_out(now) {
                return Err(match what {
                    Awaited::Room { .. } => Error::Timeout(format!(
                        "channel {:?} stayed full ({} messages in flight) until the deadline",
                        self.name,
                        self.head - self.tail
                    )),
                    Awaited::Release { seq } => Error::Timeout(format!(
                        "message {seq} of channel {:?} was not released by the deadline",
                        self.name
                    )),
                });
            }
            if !waiter.spinning(now) {
                let (region, watch) = (&self.region, &self.watch);
                let (head, slot_count, tail_before) = (self.head, self.slot_count, self.tail);
                sleep_once(
                    region.room_futex(),
                    region.room_sleeping(),
                    self.room_fast_wake,
                    peer_end(watch),
                    deadline,
                    || {
                        let tail = region.tail().load(Ordering::SeqCst);
                        let may_have_come = match what {
                            // A release frees a slot, and may free the pool bytes the loan needs.
                            Awaited::Room { len } => {
                                tail != tail_before || head - tail < slot_count && len <= INLINE_MAX
                            }
                            Awaited::Release { seq } => tail > seq,
                        };
                        may_have_come || region.consumer_closed().load(Ordering::SeqCst) != 0 || watch.alarmed()
                    },
                );
                // The condition is checked once more before the peer: a consumer may release
                // and then close.
                slept = true;
            }
        }
    }
}

/// Buffer sends.
impl ShmProducer {
    fn check_region(&self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid("a message needs at least one byte"));
        }
        if offset.checked_add(len).map_or(true, |end| end > region.arena_len()) {
            return Err(Error::invalid(format!(
                "range [{offset}, {offset} + {len}) lies outside its {}-byte arena",
                region.arena_len()
            )));
        }
        Ok(())
    }

    /// The id under which the consumer knows `region`'s arena, passing its fd first if this
    /// channel has not carried it yet (and telling the consumer to forget arenas that have
    /// died here since: their messages are all released, or they would still be alive).
    fn announce(&mut self, region: &dyn SharedRegion) -> Result<u64> {
        let identity = region.identity();
        match self.arenas.last {
            Some((last, id)) if last == identity => return Ok(id),
            _ => {}
        }
        if let Some((id, _)) = self.arenas.by_identity.get(&identity) {
            self.arenas.last = Some((identity, *id));
            return Ok(*id);
        }
        let dead: Vec<usize> =
            self.arenas.by_identity.iter().filter(|(_, (_, weak))| weak.strong_count() == 0).map(|(k, _)| *k).collect();
        // Each record's state is committed once it went out: a full socket (`WouldBlock`) leaves
        // the rest for the next send.
        for key in dead {
            let id = self.arenas.by_identity[&key].0;
            self.send_record(ControlRecord::Forget { id }, &[])?;
            self.arenas.by_identity.remove(&key);
        }
        let id = self.arenas.next_id + 1;
        self.send_record(ControlRecord::Arena { id, len: region.arena_len() as u64 }, &[region.fd()])?;
        self.arenas.next_id = id;
        self.arenas.by_identity.insert(identity, (id, Arc::downgrade(&region.keep_alive())));
        self.arenas.last = Some((identity, id));
        self.arenas.sent += 1;
        Ok(id)
    }

    /// Passes `record` (and `fds`) over the socket, never waiting: a consumer that has not read
    /// what was passed before (a full socket) gets the message refused with `WouldBlock`.
    fn send_record(&mut self, record: ControlRecord, fds: &[BorrowedHandle<'_>]) -> Result<()> {
        match try_send_with_handles(self.watch.socket(), &record.encode(), fds) {
            Ok(()) => Ok(()),
            Err(Error::WouldBlock(_)) => Err(Error::WouldBlock(format!(
                "channel {:?}: the consumer has not read the descriptors passed to it before (its socket is full); \
                 try again once it has received more messages",
                self.name
            ))),
            Err(e) => {
                self.consumer_gone(true)?;
                Err(e)
            }
        }
    }

    /// Publishes the slot lent by `loan` as a buffer send of `len` bytes at `offset` of
    /// `region`.
    fn publish_region(&mut self, loan: RawLoan, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        let id = match self.announce(region) {
            Ok(id) => id,
            Err(e) => {
                // SAFETY: the loan was lent by this producer for this send (its callers').
                unsafe { self.cancel(loan) };
                return Err(e);
            }
        };
        let index = (self.head & self.mask) as usize;
        let [slot_id, slot_offset, slot_len] = self.region.slot(index).arena();
        slot_id.store(id, Ordering::Relaxed);
        slot_offset.store(offset as u64, Ordering::Relaxed);
        slot_len.store(len as u64, Ordering::Relaxed);
        if let Some(pending) = self.loan.as_mut() {
            pending.kind = KIND_ARENA;
            pending.len = len;
        }
        // SAFETY: as above: this producer's outstanding loan.
        let seq = unsafe { self.publish(RawLoan { len, ..loan }, len)? };
        let identity = region.identity();
        match self.arenas.in_flight.back_mut() {
            // A run of sends from one arena shares one reference, kept until its last message
            // is released: no reference count per message.
            Some((last, arena, _)) if *arena == identity => *last = seq,
            _ => self.arenas.in_flight.push_back((seq, identity, region.keep_alive())),
        }
        Ok(seq)
    }
}

/// Other routes' messages.
impl ShmProducer {
    /// Passes `attachments` over the socket, then publishes the slot lent by `loan` as route
    /// `route`'s `descriptor`, inline.
    fn publish_routed(
        &mut self,
        loan: RawLoan,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Attachment>,
    ) -> Result<u64> {
        // Each attachment leaves `attachments` once it went out: after a full socket
        // (`WouldBlock`) the rest go with the next message.
        while let Some(attachment) = attachments.first() {
            let fds: Vec<BorrowedHandle<'_>> = attachment.handles.iter().map(|f| crate::os::borrow(f)).collect();
            let record = ControlRecord::Attachment { route: attachment.route, bytes: attachment.bytes.clone() };
            if let Err(e) = self.send_record(record, &fds) {
                // SAFETY: the loan was lent by this producer for this send (its caller's).
                unsafe { self.cancel(loan) };
                return Err(e);
            }
            attachments.remove(0);
        }
        // SAFETY: the loan is `descriptor.len()` (<= INLINE_MAX) writable bytes of the slot,
        // which nothing else writes until it is published.
        unsafe { std::ptr::copy_nonoverlapping(descriptor.as_ptr(), loan.ptr, descriptor.len()) };
        if let Some(pending) = self.loan.as_mut() {
            pending.kind = KIND_ROUTED | (route & 0xff) << 8;
        }
        // SAFETY: as above: this producer's outstanding loan.
        unsafe { self.publish(loan, descriptor.len()) }
    }
}

impl ProducerTransport for ShmProducer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn max_message_len(&self) -> usize {
        self.region.geometry.pool_size as usize
    }

    fn try_loan(&mut self, len: usize) -> Result<RawLoan> {
        match self.poll_loan(len)? {
            Some(loan) => Ok(loan),
            None => Err(Error::WouldBlock(format!(
                "channel {:?} is full ({} messages in flight, or no pool room for {len} bytes)",
                self.name,
                self.head - self.tail
            ))),
        }
    }

    #[inline(always)]
    fn loan_fast(&mut self, len: usize) -> Option<RawLoan> {
        ShmProducer::loan_fast(self, len)
    }

    #[inline(always)]
    fn send_fast(&mut self, data: &[u8]) -> Option<u64> {
        let pending = self.pending_fast(data.len())?;
        // SAFETY: the pending room is `data.len()` writable bytes of the channel's region (an
        // inline slot or a pool range checked by `pool_range`) that nothing else writes (or
        // reads) until it is published; `data` is a separate Rust slice.
        unsafe { crate::os::parallel_copy::copy_message(data.as_ptr(), pending.ptr, data.len()) };
        Some(self.publish_pending(pending, data.len()))
    }

    fn loan(&mut self, len: usize, deadline: Option<Instant>) -> Result<RawLoan> {
        loop {
            if let Some(loan) = self.poll_loan(len)? {
                return Ok(loan);
            }
            self.wait_for_room(len, deadline)?;
        }
    }

    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        self.check_len(len)?;
        // Waiting anyway: one relaxed load when trace is off.
        if log::log_enabled!(log::Level::Trace) {
            log::trace!(
                "channel {:?} (producer): no room for {len} bytes ({} messages in flight); waiting for the consumer",
                self.name,
                self.head - self.tail
            );
        }
        self.wait_for(Awaited::Room { len }, deadline)
    }

    #[inline(always)]
    unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        let pending = match self.loan {
            Some(p) if p.token == loan.token && p.ptr == loan.ptr && len != 0 && len <= p.len => p,
            _ => return Err(self.publish_error(len)),
        };
        self.loan = None;
        Ok(self.publish_pending(pending, len))
    }

    unsafe fn cancel(&mut self, loan: RawLoan) {
        if self.loan.is_some_and(|p| p.token == loan.token) {
            self.loan = None;
        }
    }

    fn completed(&mut self) -> Result<u64> {
        self.refresh_tail()?;
        Ok(self.tail)
    }

    #[inline]
    fn completed_hint(&self) -> u64 {
        self.tail
    }

    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        self.check_region(region, offset, len)?;
        loop {
            // A buffer send needs a slot and no pool: a one-byte loan asks for exactly that.
            if let Some(loan) = self.poll_loan(1)? {
                return self.publish_region(loan, region, offset, len);
            }
            self.wait_for_room(1, deadline)?;
        }
    }

    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        self.check_region(region, offset, len)?;
        // A buffer send needs a slot and no pool: a one-byte loan asks for exactly that.
        let loan = match self.loan_fast(1) {
            Some(loan) => loan,
            None => self.try_loan(1)?,
        };
        self.publish_region(loan, region, offset, len)
    }

    fn arenas_sent(&self) -> u64 {
        self.arenas.sent
    }

    fn send_routed(
        &mut self,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Attachment>,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        if descriptor.is_empty() || descriptor.len() > INLINE_MAX || route > 0xff {
            return Err(Error::invalid(format!(
                "a route descriptor of {} bytes for route {route}: it must have 1 to {INLINE_MAX} bytes and a route below 256",
                descriptor.len()
            )));
        }
        if let Some(a) = attachments.iter().find(|a| a.bytes.len() > MAX_ATTACHMENT_LEN) {
            return Err(Error::invalid(format!(
                "an attachment of {} bytes exceeds {MAX_ATTACHMENT_LEN}",
                a.bytes.len()
            )));
        }
        loop {
            // The descriptor goes inline: a loan of its length asks for a slot and no pool.
            let loan = match self.loan_fast(descriptor.len()) {
                Some(loan) => Some(loan),
                None => self.poll_loan(descriptor.len())?,
            };
            if let Some(loan) = loan {
                return self.publish_routed(loan, route, descriptor, attachments);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::WouldBlock(format!(
                    "channel {:?} is full ({} messages in flight)",
                    self.name,
                    self.head - self.tail
                )));
            }
            self.wait_for_room(descriptor.len(), deadline)?;
        }
    }

    fn peer_sections(&mut self) -> Vec<Attachment> {
        std::mem::take(&mut self.peer_sections)
    }

    fn peer_holds(&self) -> Option<Arc<PeerHolds>> {
        Some(Arc::clone(&self.holds))
    }

    fn peer(&self) -> Peer {
        Peer { pid: self.watch.pid as u32, state: PeerState::Alive, route: Some(super::ID.name()), ..Peer::free(0) }
    }

    fn has_room_for(&mut self, len: usize) -> Result<bool> {
        self.consumer_gone(false)?;
        self.room_for(len)
    }

    #[inline]
    fn prefetch_publish(&self) {
        let slot = self.region.slot((self.head & self.mask) as usize);
        crate::os::prefetch_for_write(std::ptr::from_ref(slot).cast());
    }

    /// The consumer's receives say that it was detached, after the messages it has.
    fn detach(&mut self) {
        self.region.producer_closed().store(PRODUCER_DETACHED, Ordering::SeqCst);
    }

    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        if seq >= self.head {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.name)));
        }
        self.wait_for(Awaited::Release { seq }, deadline)
    }
}

impl Drop for ShmProducer {
    fn drop(&mut self) {
        let region = &self.region;
        // A detached consumer's word says so already.
        let _ = region.producer_closed().compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        // Wake a sleeping consumer so it sees the close now rather than at its next check.
        region.data_futex().fetch_add(1, Ordering::SeqCst);
        wake_word(region.data_futex(), 1);
        notify(crate::os::borrow(&self.signal));
        // Another producer may attach from now on.
        drop(self.lock.take());
        // A consumer whose end is over (closed, or dead) may have left its socket and lock
        // file behind: removed once its lock is free, whatever it wrote in the region.
        if let Some(end) = self.cleans_up {
            if region.consumer_closed().load(Ordering::SeqCst) != 0 || self.watch.is_gone() {
                rendezvous::clean_after_peer(&self.name, end, &self.watch, self.consumer_lock);
            }
        }
    }
}
