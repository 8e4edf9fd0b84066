//! The same-host shared-memory transport.
//!
//! See [`super::shm_ring`] for the region's layout. Sending a message writes its slot (and,
//! for a large one, its pool bytes) and then the slot's `seq` word; that store is the only
//! synchronisation on the fast path. Afterwards the producer reads the consumer's
//! "sleeping" flags, a cache line the consumer writes only when it goes to sleep, and makes a
//! syscall (futex wake, eventfd write) only if one is set.
//!
//! Buffer sends (`send_region`) carry no payload: the slot holds (arena id, offset, len) of
//! bytes in one of the producer's arenas. The first time an arena goes over the channel, the
//! producer passes its fd over the rendezvous socket (`ControlRecord::Arena`) before
//! publishing; the consumer maps it once, read-only, and caches it per channel. The producer
//! keeps each arena alive until the messages pointing into it are released, and tells the
//! consumer which arenas died since (`ControlRecord::Forget`) when it announces a new one.
//!
//! That store-then-check against the sleeper's announce-then-check is Dekker's protocol and
//! needs a StoreLoad fence on both sides. Where both processes could register for global
//! membarriers (`fast_wake`), the sleeper pays for both with a membarrier and the publisher
//! uses a plain release store, which leaves the store buffer free to drain in the background
//! instead of stalling on the cache line the peer is polling. Elsewhere both sides fence.
//!
//! Peer death: each side keeps the rendezvous socket and a pidfd of the peer, and polls them
//! (one `poll` syscall with zero timeout) every [`LIVENESS_PERIOD`] while it waits; blocked
//! waits sleep at most [`SLEEP_SLICE`] at a time for that reason. A closing peer also sets its
//! `closed` word, which is seen at once.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::shm_ring::{pack_len_kind, Geometry, Region, INLINE_MAX, KIND_ARENA, KIND_INLINE, KIND_POOL, MAX_ARENAS, MAX_ARENA_LEN, POOL_ALIGN};
use crate::channels::rendezvous::{self, ControlRecord, Hello, Listener, PeerWatch};
use crate::channels::transport::{ConsumerTransport, ProducerTransport, RawLoan, RawView, Release, SharedRegion, TransportInfo};
use crate::channels::{ChannelConfig, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::eventfd::{eventfd, eventfd_drain, eventfd_signal};
use crate::os::futex::{futex_wait, futex_wake};
use crate::os::membarrier;
use crate::os::{recv_with_fds, send_with_fds, try_recv_with_fds, Mapping};

pub use super::shm_ring::INLINE_MAX as SHM_INLINE_MAX;

/// How often a waiting side checks that its peer is alive.
pub const LIVENESS_PERIOD: Duration = Duration::from_millis(2);
/// The longest a blocked wait sleeps before checking its peer (and its deadline) again.
pub const SLEEP_SLICE: Duration = Duration::from_millis(15);
/// Transport id in the hello.
const TRANSPORT_SHM: u32 = 1;

/// Sleeps on `futex` while `ready` stays false, announcing the sleep in `sleeping` so the
/// other side knows to wake us; returns after one wake-up or [`SLEEP_SLICE`] (or less, to
/// honour `deadline`). `fast_wake`: the other side publishes without a fence (see
/// [`publish_then_check`]), so the announcement is followed by a membarrier.
fn sleep_once(futex: &AtomicU32, sleeping: &AtomicU32, fast_wake: bool, deadline: Option<Instant>, ready: impl Fn() -> bool) {
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
fn publish_then_check(word: &AtomicU64, value: u64, fast_wake: bool) {
    if fast_wake {
        word.store(value, Ordering::Release);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        word.store(value, Ordering::SeqCst);
    }
}

/// Wakes the other side if it announced a sleep on `futex`. Call after [`publish_then_check`].
#[inline]
fn wake_if_sleeping(futex: &AtomicU32, sleeping: &AtomicU32, fast_wake: bool) {
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
struct Waiter {
    strategy: WaitStrategy,
    /// When spinning started: read from the clock at the first check, not on entry, so that
    /// a wait that ends within its first spins costs no clock read.
    start: Option<Instant>,
    deadline: Option<Instant>,
}

impl Waiter {
    fn new(strategy: WaitStrategy, deadline: Option<Instant>) -> Self {
        Waiter { strategy, start: None, deadline }
    }

    /// Whether to spin between checks: Block sleeps at once.
    fn spins(&self) -> bool {
        !matches!(self.strategy, WaitStrategy::Block)
    }

    fn spinning(&mut self, now: Instant) -> bool {
        match self.strategy {
            WaitStrategy::BusyPoll => true,
            WaitStrategy::SpinThenBlock { spin } => now.duration_since(*self.start.get_or_insert(now)) < spin,
            WaitStrategy::Block => false,
        }
    }

    fn timed_out(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

// ---------------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------------

/// The producer half of a shared-memory channel.
pub struct ShmProducer {
    info: TransportInfo,
    name: String,
    region: Region,
    watch: PeerWatch,
    eventfd: OwnedFd,
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
    /// Both processes registered for membarriers: publish without a fence (see the module doc).
    fast_wake: bool,
    sends_since_check: u32,
    last_check: Instant,
    socket_path: PathBuf,
    socket_id: Option<rendezvous::FileId>,
    /// Buffer sends (boxed: cold, and kept off the hot fields' cache lines).
    arenas: Box<SentArenas>,
}

/// The arenas a producer has passed to its consumer, by [`SharedRegion::identity`]. Each
/// entry holds a `Weak` of the arena, which keeps its address from being reused by another
/// arena: a known identity always means the same arena.
#[derive(Default)]
struct SentArenas {
    /// What keeps the memory of messages in flight alive until the consumer releases them.
    in_flight: VecDeque<(u64, Arc<dyn Any + Send + Sync>)>,
    by_identity: HashMap<usize, (u64, Weak<dyn Any + Send + Sync>)>,
    /// The last arena sent, (identity, id): a stream usually sends from one arena.
    last: Option<(usize, u64)>,
    next_id: u64,
    sent: u64,
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
        f.debug_struct("ShmProducer").field("name", &self.name).field("head", &self.head).field("tail", &self.tail).finish()
    }
}

impl ShmProducer {
    /// Connects to the consumer of `name` and hands it a fresh region.
    pub fn connect(name: &str, info: TransportInfo, config: &ChannelConfig) -> Result<Self> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let geometry = Geometry::new(config.capacity, config.pool_size as u64)?;
        let eventfd = eventfd()?;
        let can_membarrier = membarrier::register();
        let hello = Hello {
            version: super::shm_ring::VERSION,
            transport: TRANSPORT_SHM,
            slot_count: geometry.slot_count,
            pool_size: geometry.pool_size,
            total_len: geometry.total_len as u64,
            name: name.to_owned(),
        };
        // A consumer that is closing may still accept our connection and then drop it; such
        // a refusal by disappearance is retried until the deadline.
        let (sock, cred, socket_path, socket_id, region) = loop {
            let (sock, cred, path, id) = rendezvous::connect(name, deadline)?;
            let (region, memfd) = Region::create(name, geometry)?;
            // Before the hello: the consumer reads it during the handshake.
            region.producer_fast_wake().store(u32::from(can_membarrier), Ordering::Release);
            let eventfd_copy = eventfd.as_fd();
            let attempt = (|| {
                send_with_fds(&sock, &hello.encode(), &[memfd.as_fd(), eventfd_copy])?;
                sock.set_read_timeout(rendezvous::remaining(deadline))
                    .map_err(|e| Error::os("setting the rendezvous timeout", e))?;
                rendezvous::recv_ack(&sock, name)?;
                sock.set_read_timeout(None).map_err(|e| Error::os("clearing the rendezvous timeout", e))
            })();
            match attempt {
                Ok(()) => break (sock, cred, path, id, region),
                Err(Error::PeerGone(_)) | Err(Error::Io { .. }) if deadline.map_or(true, |d| Instant::now() < d) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        };
        let slot_count = u64::from(geometry.slot_count);
        // The consumer wrote its flag before its answer. A consumer that lies about it only
        // delays its own wake-ups (to the next sleep slice).
        let fast_wake = can_membarrier && region.consumer_fast_wake().load(Ordering::Acquire) == 1;
        Ok(ShmProducer {
            info,
            name: name.to_owned(),
            region,
            watch: PeerWatch::new(sock, cred.pid),
            eventfd,
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
            fast_wake,
            sends_since_check: 0,
            last_check: Instant::now(),
            socket_path,
            socket_id,
            arenas: Box::default(),
        })
    }

    fn consumer_gone(&mut self, force: bool) -> Result<()> {
        if self.region.consumer_closed().load(Ordering::Acquire) != 0 {
            return Err(Error::PeerGone(format!("the consumer of channel {:?} closed it", self.name)));
        }
        let now = Instant::now();
        if force || self.watch.known_gone() || now.duration_since(self.last_check) >= LIVENESS_PERIOD {
            self.last_check = now;
            if self.watch.is_gone() {
                return Err(Error::PeerGone(format!(
                    "the consumer of channel {:?} (pid {}) has exited or closed its socket",
                    self.name, self.watch.pid
                )));
            }
        }
        Ok(())
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
            while self.arenas.in_flight.front().is_some_and(|(seq, _)| *seq < tail) {
                self.arenas.in_flight.pop_front();
            }
        }
        Ok(())
    }

    /// Finds `len` contiguous pool bytes: (offset, new pool_head), committed on publish,
    /// which also moves `pool_pos`. No division on this path: the position is tracked.
    #[inline]
    fn pool_alloc(&self, len: usize) -> Option<(u64, u64)> {
        let size = self.region.geometry.pool_size;
        let need = pool_need(len);
        // Empty: start again at offset 0, so that even a pool-sized message fits.
        let pos = if self.pool_head == self.pool_tail { 0 } else { self.pool_pos };
        let (offset, taken) = if pos + need <= size { (pos, need) } else { (0, size - pos + need) };
        if self.pool_head - self.pool_tail + taken > size {
            return None;
        }
        Some((offset, self.pool_head + taken))
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
            PendingLoan { token: self.head, ptr: self.region.slot_inline(index), len, kind: KIND_INLINE, pool_offset: 0, pool_end: self.pool_head }
        } else {
            if len as u64 > self.region.geometry.pool_size {
                return None;
            }
            let (offset, end) = self.pool_alloc(len)?;
            let ptr = self.region.pool_range(offset, len as u64)?;
            PendingLoan { token: self.head, ptr, len, kind: KIND_POOL, pool_offset: offset, pool_end: end }
        };
        self.sends_since_check = self.sends_since_check.wrapping_add(1);
        self.loan = Some(pending);
        Some(RawLoan { ptr: pending.ptr, len, token: pending.token })
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
                ptr: self.region.slot_inline(index),
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
                "a {len}-byte message does not fit channel {:?}, whose pool holds {} bytes; raise ChannelConfig::pool_size",
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
            Some(p) if len == 0 || len > p.len => Error::invalid(format!("publishing {len} bytes of a {}-byte loan", p.len)),
            _ => Error::InvalidState(format!(
                "this loan is not the outstanding loan of channel {:?} (already published or cancelled?)",
                self.name
            )),
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
        for key in dead {
            let (id, _) = self.arenas.by_identity.remove(&key).expect("listed above");
            self.send_record(ControlRecord::Forget { id }, None)?;
        }
        self.arenas.next_id += 1;
        let id = self.arenas.next_id;
        self.send_record(ControlRecord::Arena { id, len: region.arena_len() as u64 }, Some(region.fd()))?;
        self.arenas.by_identity.insert(identity, (id, Arc::downgrade(&region.keep_alive())));
        self.arenas.last = Some((identity, id));
        self.arenas.sent += 1;
        Ok(id)
    }

    fn send_record(&mut self, record: ControlRecord, fd: Option<BorrowedFd<'_>>) -> Result<()> {
        let fds: &[BorrowedFd<'_>] = match &fd {
            Some(fd) => std::slice::from_ref(fd),
            None => &[],
        };
        if let Err(e) = send_with_fds(self.watch.socket(), &record.encode(), fds) {
            self.consumer_gone(true)?;
            return Err(e);
        }
        Ok(())
    }

    /// Publishes the slot lent by `loan` as a buffer send of `len` bytes at `offset` of
    /// `region`.
    fn publish_region(&mut self, loan: RawLoan, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        let id = match self.announce(region) {
            Ok(id) => id,
            Err(e) => {
                self.cancel(loan);
                return Err(e);
            }
        };
        let index = (self.head & self.mask) as usize;
        let [slot_id, slot_offset, slot_len] = self.region.slot_arena(index);
        slot_id.store(id, Ordering::Relaxed);
        slot_offset.store(offset as u64, Ordering::Relaxed);
        slot_len.store(len as u64, Ordering::Relaxed);
        if let Some(pending) = self.loan.as_mut() {
            pending.kind = KIND_ARENA;
            pending.len = len;
        }
        let keep = region.keep_alive();
        let seq = self.publish(RawLoan { len, ..loan }, len)?;
        self.arenas.in_flight.push_back((seq, keep));
        Ok(seq)
    }
}

impl ProducerTransport for ShmProducer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn max_message_len(&self) -> usize {
        self.region.geometry.pool_size as usize
    }

    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        Some(self.region.raw())
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
        let mut waiter = Waiter::new(self.wait, deadline);
        let mut spins = 0u32;
        let mut slept = false;
        loop {
            if self.room_for(len)? {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if waiter.spins() && spins % 128 != 0 && !slept {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            // Rate-limited: a sleep slice (15 ms) outlasts LIVENESS_PERIOD, so a timed-out
            // sleep always checks, while a woken one pays no syscall.
            slept = false;
            self.consumer_gone(false)?;
            if waiter.timed_out(now) {
                return Err(Error::Timeout(format!(
                    "channel {:?} stayed full ({} messages in flight) until the deadline",
                    self.name,
                    self.head - self.tail
                )));
            }
            if !waiter.spinning(now) {
                let region = &self.region;
                let (head, slot_count) = (self.head, self.slot_count);
                let tail_before = self.tail;
                sleep_once(region.room_futex(), region.room_sleeping(), self.fast_wake, deadline, || {
                    let t = region.tail().load(Ordering::SeqCst);
                    t != tail_before || head - t < slot_count && len <= INLINE_MAX
                });
                // Check the condition once more before the peer: a consumer may release and
                // then close.
                slept = true;
            }
        }
    }

    #[inline(always)]
    fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        let pending = match self.loan {
            Some(p) if p.token == loan.token && p.ptr == loan.ptr && len != 0 && len <= p.len => p,
            _ => return Err(self.publish_error(len)),
        };
        self.loan = None;
        let index = (self.head & self.mask) as usize;
        let region = &self.region;
        region.slot_len_kind(index).store(pack_len_kind(len as u32, pending.kind), Ordering::Relaxed);
        if pending.kind == KIND_POOL {
            region.slot_pool_offset(index).store(pending.pool_offset, Ordering::Relaxed);
        }
        self.pool_ends[index] = pending.pool_end;
        self.pool_head = pending.pool_end;
        if pending.kind == KIND_POOL {
            self.pool_pos = pending.pool_offset + pool_need(pending.len);
        }
        publish_then_check(region.slot_seq(index), self.head + 1, self.fast_wake);
        let seq = self.head;
        self.head += 1;
        wake_if_sleeping(region.data_futex(), region.data_sleeping(), self.fast_wake);
        let order = if self.fast_wake { Ordering::Relaxed } else { Ordering::SeqCst };
        if region.fd_waiting().load(order) != 0 && region.fd_waiting().swap(0, Ordering::SeqCst) != 0 {
            eventfd_signal(self.eventfd.as_fd());
        }
        Ok(seq)
    }

    fn cancel(&mut self, loan: RawLoan) {
        if self.loan.is_some_and(|p| p.token == loan.token) {
            self.loan = None;
        }
    }

    fn completed(&mut self) -> Result<u64> {
        self.refresh_tail()?;
        Ok(self.tail)
    }

    fn send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize, deadline: Option<Instant>) -> Result<u64> {
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
        let loan = self.try_loan(1)?;
        self.publish_region(loan, region, offset, len)
    }

    fn arenas_sent(&self) -> u64 {
        self.arenas.sent
    }

    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        if seq >= self.head {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.name)));
        }
        let mut waiter = Waiter::new(self.wait, deadline);
        let mut spins = 0u32;
        let mut slept = false;
        loop {
            self.refresh_tail()?;
            if self.tail > seq {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if waiter.spins() && spins % 128 != 0 && !slept {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            // Rate-limited: a sleep slice (15 ms) outlasts LIVENESS_PERIOD, so a timed-out
            // sleep always checks, while a woken one pays no syscall.
            slept = false;
            if let Err(gone) = self.consumer_gone(false) {
                // A consumer may release and then close between our two looks: the tail it
                // stored before its closed word decides.
                self.refresh_tail()?;
                if self.tail > seq {
                    return Ok(());
                }
                return Err(gone);
            }
            if waiter.timed_out(now) {
                return Err(Error::Timeout(format!(
                    "message {seq} of channel {:?} was not released by the deadline",
                    self.name
                )));
            }
            if !waiter.spinning(now) {
                let region = &self.region;
                sleep_once(region.room_futex(), region.room_sleeping(), self.fast_wake, deadline, || {
                    region.tail().load(Ordering::SeqCst) > seq
                });
                slept = true;
            }
        }
    }
}

impl Drop for ShmProducer {
    fn drop(&mut self) {
        let region = &self.region;
        region.producer_closed().store(1, Ordering::SeqCst);
        // Wake a sleeping consumer so it sees the close now rather than at its next check.
        region.data_futex().fetch_add(1, Ordering::SeqCst);
        futex_wake(region.data_futex(), 1);
        eventfd_signal(self.eventfd.as_fd());
        // A consumer that closed removed its socket itself; one that died left it behind.
        if region.consumer_closed().load(Ordering::SeqCst) == 0 && self.watch.is_gone() {
            rendezvous::remove_stale_socket(&self.socket_path, self.socket_id);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Consumer
// ---------------------------------------------------------------------------------------------

/// The arena mapping a view of a buffer send points into, while the view is held.
type ArenaHold = Mutex<Option<Arc<Mapping>>>;

/// Which view holds a slot: `state` is `seq << 1 | 1` while message `seq` is held,
/// `seq << 1` once released, u64::MAX before first use; `ptr` and `len` check views handed
/// back by C. Aligned so that a receive and a release touch one line per message.
#[repr(align(32))]
struct ViewRecord {
    state: AtomicU64,
    ptr: AtomicUsize,
    len: AtomicUsize,
}

impl Default for ViewRecord {
    fn default() -> Self {
        ViewRecord { state: AtomicU64::new(u64::MAX), ptr: AtomicUsize::new(0), len: AtomicUsize::new(0) }
    }
}

/// What views of one producer's session share: the region and which slots are still held.
pub(crate) struct Session {
    id: u64,
    region: Region,
    mask: u64,
    slot_count: u64,
    /// Per slot: the view that holds it, in one cache line per slot's record.
    views: Box<[ViewRecord]>,
    /// Messages received (next sequence number to read).
    received: AtomicU64,
    /// Messages released in order (mirrors the shared tail, which only we write).
    reclaimed: AtomicU64,
    reclaiming: AtomicBool,
    /// Set under the reclaim lock when the consumer gave the session up while views were still
    /// held: the release of the last one drops the consumer's reference (see [`Session::retire`]).
    orphaned: AtomicBool,
    /// Both processes registered for membarriers (see the module doc).
    fast_wake: bool,
    /// Per slot, made at the first buffer send: the arena mapping a held view points into,
    /// so that it stays mapped until the view is released whatever the producer says.
    arena_holds: OnceLock<Box<[ArenaHold]>>,
}

impl Session {
    fn new(id: u64, region: Region, fast_wake: bool) -> Self {
        let slot_count = u64::from(region.geometry.slot_count);
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
            orphaned: AtomicBool::new(false),
            fast_wake,
            arena_holds: OnceLock::new(),
        }
    }

    /// Asks the producer to signal the eventfd at its next message. Call before re-checking
    /// the ring. While the flag is still set the producer has not yet taken it, so it will
    /// signal after this call: only setting it needs the barrier.
    fn ask_for_signal(&self) {
        let flag = self.region.fd_waiting();
        if flag.load(Ordering::SeqCst) == 0 {
            flag.store(1, Ordering::SeqCst);
            if self.fast_wake {
                membarrier::global_barrier();
            }
        }
    }

    fn arena_holds(&self) -> &[ArenaHold] {
        self.arena_holds.get_or_init(|| (0..self.slot_count).map(|_| Mutex::new(None)).collect())
    }

    /// Whether a view of this session is still held (releases reclaim in order, so all are
    /// released exactly when the tail has caught up with what was received).
    #[inline]
    fn holds_views(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire) != self.received.load(Ordering::Acquire)
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
    /// wakes a producer waiting for room, all under the lock: each releaser scans after its
    /// own release, so no release is left unreclaimed (a "someone else will do it" hand-off
    /// would need a StoreLoad fence). Returns whether this was the last view of an orphaned
    /// session, which the caller must then drop. The unlock is this call's last access.
    #[inline]
    fn mark_released(&self, token: u64) -> bool {
        self.lock();
        self.views[(token & self.mask) as usize].state.store(token << 1, Ordering::Release);
        let start = self.reclaimed.load(Ordering::Relaxed);
        let received = self.received.load(Ordering::Acquire);
        let mut tail = start;
        while tail < received && self.views[(tail & self.mask) as usize].state.load(Ordering::Acquire) == tail << 1 {
            tail += 1;
        }
        if tail != start {
            self.reclaimed.store(tail, Ordering::Release);
            publish_then_check(self.region.tail(), tail, self.fast_wake);
            wake_if_sleeping(self.region.room_futex(), self.region.room_sleeping(), self.fast_wake);
        }
        let last = tail == received && self.orphaned.load(Ordering::Relaxed);
        self.reclaiming.store(false, Ordering::Release);
        last
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
                drop(holds[(view.token & s.mask) as usize].lock().take());
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
    fn release(&self, view: &RawView) -> Result<()> {
        let not_held = || {
            Error::InvalidState(format!(
                "message {} is not held by this consumer (already released, or not received from this channel)",
                view.token
            ))
        };
        if view.session != self.id || view.token >= self.received.load(Ordering::Acquire) {
            return Err(not_held());
        }
        let record = &self.views[(view.token & self.mask) as usize];
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
            drop(holds[(view.token & self.mask) as usize].lock().take());
        }
        // The consumer that received it (and releases it now) still holds the session.
        let last = self.mark_released(view.token);
        debug_assert!(!last, "a session is orphaned only once its consumer has gone");
        Ok(())
    }
}

/// The consumer's own reference to a session; dropping it retires the session, which keeps
/// it alive for the messages still held ([`Session::retire`]).
struct OwnedSession(Option<Arc<Session>>);

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

/// The consumer's connection to its current producer.
struct Link {
    session: OwnedSession,
    watch: PeerWatch,
    eventfd: OwnedFd,
    next: u64,
    last_check: Instant,
    gone: Option<String>,
    /// The producer's arenas mapped here (boxed: cold).
    arenas: Box<ReceivedArenas>,
}

/// The arenas a consumer has mapped for one producer, by the id it gave them, and the last
/// one used.
#[derive(Default)]
struct ReceivedArenas {
    by_id: HashMap<u64, Arc<Mapping>>,
    last: Option<(u64, Arc<Mapping>)>,
}

/// The consumer half of a shared-memory channel. It keeps listening, so that a new producer
/// can attach once the old one has gone.
pub struct ShmConsumer {
    info: TransportInfo,
    name: String,
    wait: WaitStrategy,
    listener: Listener,
    link: Link,
    /// Earlier sessions whose views are still held (for release by value).
    old: Vec<OwnedSession>,
    sessions: u64,
    epoll: Option<OwnedFd>,
    armed: bool,
    arenas_received: u64,
}

impl std::fmt::Debug for ShmConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmConsumer").field("name", &self.name).field("next", &self.link.next).finish()
    }
}

impl ShmConsumer {
    /// Listens on `name` and waits for a producer.
    pub fn listen(name: &str, info: TransportInfo, config: &ChannelConfig) -> Result<Self> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let listener = Listener::bind(name)?;
        let mut refused = Vec::new();
        let link = loop {
            match listener.accept(deadline, &mut refused, name)? {
                None => {
                    let mut msg = format!("no producer of channel {name:?} connected to {} in time", listener.path().display());
                    if !refused.is_empty() {
                        msg.push_str(&format!("; refused: {}", refused.join("; ")));
                    }
                    return Err(Error::Timeout(msg));
                }
                Some((sock, cred)) => match handshake(sock, cred, name, deadline, 1) {
                    Ok(link) => break link,
                    Err(e) => refused.push(e.to_string()),
                },
            }
        };
        Ok(ShmConsumer {
            info,
            name: name.to_owned(),
            wait: config.wait,
            listener,
            link,
            old: Vec::new(),
            sessions: 1,
            epoll: None,
            armed: false,
            arenas_received: 0,
        })
    }

    /// Checks whether the current producer is gone (closed word at once, process and socket
    /// every LIVENESS_PERIOD or when `force`).
    fn producer_gone(&mut self, force: bool) -> bool {
        let link = &mut self.link;
        if link.gone.is_some() {
            return true;
        }
        if link.session.region.producer_closed().load(Ordering::Acquire) != 0 {
            link.gone = Some(format!("the producer of channel {:?} closed it", self.name));
            return true;
        }
        let now = Instant::now();
        if force || now.duration_since(link.last_check) >= LIVENESS_PERIOD {
            link.last_check = now;
            if link.watch.is_gone() {
                link.gone = Some(format!(
                    "the producer of channel {:?} (pid {}) has exited or closed its socket",
                    self.name, link.watch.pid
                ));
                return true;
            }
        }
        false
    }

    /// Whether a message is ready (or the slot fails validation, which try_recv reports).
    #[inline]
    fn ready(&self) -> bool {
        let s = &self.link.session;
        let next = self.link.next;
        s.region.slot_seq((next & s.mask) as usize).load(Ordering::Acquire) != expected_empty(next, s.slot_count)
            && next - s.reclaimed.load(Ordering::Relaxed) < s.slot_count
    }
    /// The next message if one is waiting and it is the common case: an inline or pool
    /// message that passes every check. Everything else (nothing waiting, every slot held, a
    /// buffer send, a slot that fails validation) is `None`, for [`try_read`](Self::try_read).
    /// Kept free of `Result` so that the hot path moves no error-sized values.
    #[inline(always)]
    fn read_fast(&mut self) -> Option<RawView> {
        let s = &*self.link.session;
        let next = self.link.next;
        let index = (next & s.mask) as usize;
        // The second test: every slot is held by a view, so a legitimate producer cannot have
        // published more.
        if s.region.slot_seq(index).load(Ordering::Acquire) != next + 1
            || next - s.reclaimed.load(Ordering::Relaxed) >= s.slot_count
        {
            return None;
        }
        let len_kind = s.region.slot_len_kind(index).load(Ordering::Relaxed);
        let len = len_kind as u32 as usize;
        let ptr = match (len_kind >> 32) as u32 {
            KIND_INLINE if len.wrapping_sub(1) < INLINE_MAX => s.region.slot_inline(index) as *const u8,
            KIND_POOL => {
                let offset = s.region.slot_pool_offset(index).load(Ordering::Relaxed);
                match s.region.pool_range(offset, len as u64) {
                    Some(p) if offset % POOL_ALIGN == 0 => p as *const u8,
                    _ => return None,
                }
            }
            _ => return None,
        };
        Some(self.hand_out(index, ptr, len, 0))
    }

    /// The next message if one is waiting (`Ok(None)` if not), or why the slot is invalid.
    #[inline]
    fn try_read(&mut self) -> Result<Option<RawView>> {
        match self.read_fast() {
            Some(view) => Ok(Some(view)),
            None => self.read_slow(),
        }
    }

    /// Reads the next slot with every case spelled out: what [`read_fast`](Self::read_fast)
    /// leaves to it, and a message that arrived after it looked.
    #[cold]
    #[inline(never)]
    fn read_slow(&mut self) -> Result<Option<RawView>> {
        let s = &*self.link.session;
        let next = self.link.next;
        let index = (next & s.mask) as usize;
        if next - s.reclaimed.load(Ordering::Relaxed) >= s.slot_count {
            return Ok(None);
        }
        let seq = s.region.slot_seq(index).load(Ordering::Acquire);
        let empty = expected_empty(next, s.slot_count);
        if seq == empty {
            return Ok(None);
        }
        if seq != next + 1 {
            return Err(self.corrupt(format!("slot {index} has sequence word {seq}, expected {} or {empty}", next + 1)));
        }
        let len_kind = s.region.slot_len_kind(index).load(Ordering::Relaxed);
        let len = len_kind as u32 as usize;
        let ptr = match (len_kind >> 32) as u32 {
            KIND_INLINE if (1..=INLINE_MAX).contains(&len) => s.region.slot_inline(index) as *const u8,
            KIND_INLINE => return Err(self.corrupt(format!("inline message {next} has length {len}"))),
            KIND_POOL => {
                let offset = s.region.slot_pool_offset(index).load(Ordering::Relaxed);
                match s.region.pool_range(offset, len as u64) {
                    Some(p) if offset % POOL_ALIGN == 0 => p as *const u8,
                    _ => {
                        return Err(self.corrupt(format!(
                            "pool message {next} claims {len} bytes at offset {offset}, outside the {}-byte pool \
                             or not {POOL_ALIGN}-byte aligned",
                            s.region.geometry.pool_size
                        )))
                    }
                }
            }
            KIND_ARENA => return self.read_arena_slot(index, next),
            kind => return Err(self.corrupt(format!("message {next} has unknown kind {kind}"))),
        };
        Ok(Some(self.hand_out(index, ptr, len, 0)))
    }

    /// Records that message `next` is held by a view of `len` bytes at `ptr`, and hands it out.
    #[inline(always)]
    fn hand_out(&mut self, index: usize, ptr: *const u8, len: usize, flags: u64) -> RawView {
        let s = &*self.link.session;
        let next = self.link.next;
        let record = &s.views[index];
        record.ptr.store(ptr as usize, Ordering::Relaxed);
        record.len.store(len, Ordering::Relaxed);
        record.state.store(next << 1 | 1, Ordering::Release);
        self.link.next = next + 1;
        s.received.store(next + 1, Ordering::Release);
        RawView { ptr, len, token: next, session: s.id, flags }
    }

    /// Reads a buffer send: (arena id, offset, len), each checked against the arenas mapped
    /// here, reading the arena's fd from the socket first if it is new.
    fn read_arena_slot(&mut self, index: usize, next: u64) -> Result<Option<RawView>> {
        let [id, offset, len] = self.link.session.region.slot_arena(index).map(|word| word.load(Ordering::Relaxed));
        let mapping = match &self.link.arenas.last {
            Some((last, mapping)) if *last == id => Arc::clone(mapping),
            _ => {
                if !self.link.arenas.by_id.contains_key(&id) {
                    self.receive_records(Some(id))?;
                }
                let Some(mapping) = self.link.arenas.by_id.get(&id).cloned() else {
                    return Err(self.corrupt(format!("message {next} points into arena {id}, which the producer never passed")));
                };
                self.link.arenas.last = Some((id, Arc::clone(&mapping)));
                mapping
            }
        };
        let in_bounds = offset.checked_add(len).is_some_and(|end| len > 0 && end <= mapping.len() as u64);
        if !in_bounds {
            return Err(self.corrupt(format!(
                "message {next} claims {len} bytes at offset {offset} of arena {id}, which has {} bytes",
                mapping.len()
            )));
        }
        // SAFETY: offset + len <= the mapping's length, checked above.
        let ptr = unsafe { mapping.as_ptr().add(offset as usize) } as *const u8;
        let len = len as usize;
        *self.link.session.arena_holds()[index].lock() = Some(mapping);
        Ok(Some(self.hand_out(index, ptr, len, RawView::ZERO_COPY)))
    }

    /// Reads the producer's control records waiting on the socket, without blocking: until
    /// arena `want` is known, or all of them. Each arena is checked (a sealed memory file of
    /// at least the announced size) and mapped once; its fd is closed after mapping.
    fn receive_records(&mut self, want: Option<u64>) -> Result<()> {
        loop {
            if want.is_some_and(|id| self.link.arenas.by_id.contains_key(&id)) {
                return Ok(());
            }
            let mut bytes = [0u8; ControlRecord::LEN];
            let Some((n, fds)) = try_recv_with_fds(self.link.watch.socket(), &mut bytes)? else {
                return Ok(());
            };
            if n == 0 {
                return Ok(());
            }
            let record = ControlRecord::decode(&bytes[..n]).map_err(|e| self.corrupt(e.to_string()))?;
            match (record, fds.len()) {
                (ControlRecord::Arena { id, len }, 1) => {
                    if self.link.arenas.by_id.contains_key(&id) {
                        return Err(self.corrupt(format!("arena {id} was passed twice")));
                    }
                    if self.link.arenas.by_id.len() >= MAX_ARENAS {
                        return Err(self.corrupt(format!("more than {MAX_ARENAS} arenas at once")));
                    }
                    let mapping = map_arena(&fds[0], len).map_err(|e| self.corrupt(format!("arena {id}: {e}")))?;
                    self.link.arenas.by_id.insert(id, Arc::new(mapping));
                    self.arenas_received += 1;
                }
                (ControlRecord::Forget { id }, 0) => {
                    // Views still held keep their mapping (Session::arena_holds).
                    self.link.arenas.by_id.remove(&id);
                    if self.link.arenas.last.as_ref().is_some_and(|(last, _)| *last == id) {
                        self.link.arenas.last = None;
                    }
                }
                (record, count) => return Err(self.corrupt(format!("{record:?} came with {count} fds"))),
            }
        }
    }

    /// The next message if one waits, `None` if not (no allocation on the blocking path),
    /// `PeerGone` when none waits and the producer has gone.
    /// `from_try`: called by try_recv, which keeps the fd's level and checks the producer
    /// itself; the blocking path leaves both to `wait`.
    #[inline]
    fn poll_recv(&mut self, from_try: bool) -> Result<Option<RawView>> {
        loop {
            if let Some(view) = self.try_read()? {
                return Ok(Some(view));
            }
            if self.armed && from_try {
                // Level-triggered notification: the fd is reset only when the ring is seen
                // empty, after asking the producer to signal the next message.
                eventfd_drain(self.link.eventfd.as_fd());
                self.link.session.ask_for_signal();
                if let Some(view) = self.try_read()? {
                    return Ok(Some(view));
                }
            }
            let gone = if self.link.gone.is_some() {
                true
            } else if from_try {
                self.producer_gone(false)
            } else {
                self.link.session.region.producer_closed().load(Ordering::Relaxed) != 0 && self.producer_gone(true)
            };
            if !gone {
                return Ok(None);
            }
            // Gone: messages published before the end are still read first.
            if let Some(view) = self.try_read()? {
                return Ok(Some(view));
            }
            if self.try_reattach()? {
                continue;
            }
            if self.armed {
                // Keep the fd readable so an event loop learns about the end.
                eventfd_signal(self.link.eventfd.as_fd());
            }
            return Err(self.gone_error());
        }
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!(
            "channel {:?}: the producer (pid {}) wrote an invalid descriptor: {what}",
            self.name, self.link.watch.pid
        ))
    }

    /// After the producer has gone and its messages are read: attach a new producer if one is
    /// waiting on the socket.
    fn try_reattach(&mut self) -> Result<bool> {
        let mut refused = Vec::new();
        let Some((sock, cred)) = self.listener.accept(Some(Instant::now()), &mut refused, &self.name)? else {
            return Ok(false);
        };
        let id = self.sessions + 1;
        let deadline = Some(Instant::now() + Duration::from_secs(2));
        let link = match handshake(sock, cred, &self.name, deadline, id) {
            Ok(l) => l,
            Err(_) => return Ok(false),
        };
        self.sessions = id;
        let old = std::mem::replace(&mut self.link, link);
        if let Some(epoll) = &self.epoll {
            for fd in [Some(old.eventfd.as_fd()), Some(old.watch.socket_fd()), old.watch.pidfd()].into_iter().flatten() {
                epoll_ctl(epoll.as_fd(), libc::EPOLL_CTL_DEL, fd, 0);
            }
            self.register_link_fds()?;
        }
        self.old.retain(|s| s.holds_views());
        if old.session.holds_views() {
            self.old.push(old.session);
        }
        Ok(true)
    }

    fn register_link_fds(&self) -> Result<()> {
        let epoll = self.epoll.as_ref().expect("epoll created");
        epoll_add(epoll.as_fd(), self.link.eventfd.as_fd(), libc::EPOLLIN as u32)?;
        epoll_add(epoll.as_fd(), self.link.watch.socket_fd(), (libc::EPOLLIN | libc::EPOLLRDHUP) as u32)?;
        if let Some(pidfd) = self.link.watch.pidfd() {
            epoll_add(epoll.as_fd(), pidfd, libc::EPOLLIN as u32)?;
        }
        Ok(())
    }

    fn gone_error(&self) -> Error {
        Error::PeerGone(self.link.gone.clone().unwrap_or_else(|| format!("the producer of channel {:?} has gone", self.name)))
    }
}

/// The pool bytes a message of `len` bytes takes: rounded up to cache lines.
#[inline]
fn pool_need(len: usize) -> u64 {
    (len as u64 + POOL_ALIGN - 1) & !(POOL_ALIGN - 1)
}

/// The sequence word of the slot that will carry message `next` while it is still empty:
/// the previous lap's message number + 1, or 0 on the first lap.
#[inline]
fn expected_empty(next: u64, slot_count: u64) -> u64 {
    if next >= slot_count { next + 1 - slot_count } else { 0 }
}

fn epoll_ctl(epoll: BorrowedFd<'_>, op: i32, fd: BorrowedFd<'_>, events: u32) -> i32 {
    let mut ev = libc::epoll_event { events, u64: fd.as_raw_fd() as u64 };
    // SAFETY: both descriptors are live; ev is a valid epoll_event.
    unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) }
}

fn epoll_add(epoll: BorrowedFd<'_>, fd: BorrowedFd<'_>, events: u32) -> Result<()> {
    if epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, events) != 0 {
        return Err(Error::last_os("epoll_ctl(ADD) for the channel's notification fd"));
    }
    Ok(())
}

/// The consumer's side of the rendezvous: receive the hello and the fds, check everything,
/// map the region, answer.
fn handshake(sock: std::os::unix::net::UnixStream, cred: libc::ucred, name: &str, deadline: Option<Instant>, id: u64) -> Result<Link> {
    sock.set_read_timeout(rendezvous::remaining(deadline))
        .map_err(|e| Error::os("setting the rendezvous timeout", e))?;
    let mut buf = [0u8; 256];
    let (n, fds) = recv_with_fds(&sock, &mut buf).map_err(|e| match e {
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::WouldBlock => {
            Error::Timeout(format!("producer pid {} sent no hello in time", cred.pid))
        }
        other => other,
    })?;
    if n == 0 {
        return Err(Error::PeerGone(format!("process {} connected and closed without a hello", cred.pid)));
    }
    let checked = (|| {
        let hello = Hello::decode(&buf[..n])?;
        if hello.version != super::shm_ring::VERSION || hello.transport != TRANSPORT_SHM {
            return Err(Error::Unsupported(format!(
                "producer speaks version {} transport {}, this consumer version {} transport {TRANSPORT_SHM} (shm)",
                hello.version,
                hello.transport,
                super::shm_ring::VERSION
            )));
        }
        if hello.name != name {
            return Err(Error::Corrupt(format!("producer asked for channel {:?}, this is {name:?}", hello.name)));
        }
        let mut fds = fds.into_iter();
        let (Some(memfd), Some(evfd), None) = (fds.next(), fds.next(), fds.next()) else {
            return Err(Error::Corrupt("producer's hello must carry exactly two fds (memfd, eventfd)".into()));
        };
        let geometry = Geometry::new(hello.slot_count, hello.pool_size)?;
        if geometry.pool_size != hello.pool_size || geometry.total_len as u64 != hello.total_len {
            return Err(Error::Corrupt("producer's geometry is inconsistent".into()));
        }
        let region = Region::attach(&memfd, geometry)?;
        check_is_eventfd(&evfd)?;
        Ok((region, evfd))
    })();
    match checked {
        Ok((region, eventfd)) => {
            // Before the answer: the producer reads it once the answer arrives. A producer
            // that lies about its own flag only delays its own messages' wake-ups (to the
            // next sleep slice).
            let can_membarrier = membarrier::register();
            region.consumer_fast_wake().store(u32::from(can_membarrier), Ordering::Release);
            let fast_wake = can_membarrier && region.producer_fast_wake().load(Ordering::Acquire) == 1;
            rendezvous::send_ack(&sock, rendezvous::ACK_OK, "")?;
            sock.set_read_timeout(None).map_err(|e| Error::os("clearing the rendezvous timeout", e))?;
            Ok(Link {
                session: OwnedSession(Some(Arc::new(Session::new(id, region, fast_wake)))),
                watch: PeerWatch::new(sock, cred.pid),
                eventfd,
                next: 0,
                last_check: Instant::now(),
                gone: None,
                arenas: Box::default(),
            })
        }
        Err(e) => {
            let _ = rendezvous::send_ack(&sock, rendezvous::ACK_REFUSED, &e.to_string());
            Err(e)
        }
    }
}

/// Maps an arena passed by a producer, read-only, after checking that it is a memory file
/// sealed against shrinking (so that reading it can never fault) and holds at least `len`
/// bytes.
fn map_arena(fd: &OwnedFd, len: u64) -> Result<Mapping> {
    if len == 0 || len > MAX_ARENA_LEN {
        return Err(Error::Corrupt(format!("its length {len} is not between 1 and {MAX_ARENA_LEN}")));
    }
    // SAFETY: zeroed stat is a valid out-buffer; fstat on a descriptor we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Error::Corrupt("its fd is not a memory file".into()));
    }
    // SAFETY: F_GET_SEALS only reads the file's seals.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err(Error::Corrupt("its memory file is not sealed against shrinking; refusing to map it".into()));
    }
    if (st.st_size as u64) < len {
        return Err(Error::Corrupt(format!("its memory file has {} bytes, {len} were announced", st.st_size)));
    }
    Mapping::shared_read_only(fd, 0, len as usize)
}

/// Refuses a descriptor that is not an eventfd (writing to an arbitrary fd could block).
fn check_is_eventfd(fd: &OwnedFd) -> Result<()> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default();
    if link.to_string_lossy() != "anon_inode:[eventfd]" {
        return Err(Error::Corrupt(format!("producer's second fd is {}, not an eventfd", link.display())));
    }
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok(())
}

impl ShmConsumer {
    /// The current session, which a received message points at (see [`Session::retire`]).
    #[inline]
    pub(crate) fn session_ptr(&self) -> std::ptr::NonNull<Session> {
        std::ptr::NonNull::from(&**self.link.session as &Session)
    }
}

impl ConsumerTransport for ShmConsumer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    #[inline]
    fn try_recv(&mut self) -> Result<RawView> {
        match self.poll_recv(true)? {
            Some(view) => Ok(view),
            None => Err(Error::WouldBlock(format!("no message waiting on channel {:?}", self.name))),
        }
    }

    #[inline]
    fn recv_fast(&mut self) -> Option<RawView> {
        self.read_fast()
    }

    fn recv(&mut self, deadline: Option<Instant>) -> Result<RawView> {
        loop {
            if let Some(view) = self.read_fast() {
                return Ok(view);
            }
            if let Some(view) = self.poll_recv(false)? {
                return Ok(view);
            }
            self.wait(deadline)?;
        }
    }

    fn wait(&mut self, deadline: Option<Instant>) -> Result<()> {
        let mut waiter = Waiter::new(self.wait, deadline);
        let mut spins = 0u32;
        loop {
            if self.ready() || self.link.gone.is_some() {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if waiter.spins() && spins % 256 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            if self.producer_gone(false) {
                return Ok(());
            }
            if waiter.timed_out(now) {
                return Err(Error::Timeout(format!("no message arrived on channel {:?} before the deadline", self.name)));
            }
            if !waiter.spinning(now) {
                let region = &self.link.session.region;
                let (next, slot_count) = (self.link.next, self.link.session.slot_count);
                sleep_once(region.data_futex(), region.data_sleeping(), self.link.session.fast_wake, deadline, || {
                    region.slot_seq((next & (slot_count - 1)) as usize).load(Ordering::SeqCst) != expected_empty(next, slot_count)
                        || region.producer_closed().load(Ordering::SeqCst) != 0
                });
                // Rate-limited like every check: a woken sleep pays no syscall.
                if self.producer_gone(false) {
                    return Ok(());
                }
            }
        }
    }

    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        Some(self.link.session.region.raw())
    }

    fn releaser(&self) -> Arc<dyn Release> {
        Arc::clone(&self.link.session) as Arc<dyn Release>
    }

    fn arenas_received(&self) -> u64 {
        self.arenas_received
    }

    fn release(&mut self, view: &RawView) -> Result<()> {
        if view.session == self.link.session.id {
            return self.link.session.release(view);
        }
        match self.old.iter().find(|s| s.id == view.session) {
            Some(s) => {
                let r = s.release(view);
                self.old.retain(|s| s.holds_views());
                r
            }
            None => Err(Error::InvalidState(format!(
                "message {} is not held by this consumer (already released, or from another channel)",
                view.token
            ))),
        }
    }

    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.epoll.is_none() {
            // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(Error::last_os("epoll_create1"));
            }
            // SAFETY: fresh descriptor owned by no one else.
            self.epoll = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            self.register_link_fds()?;
            self.armed = true;
            // Make the fd reflect messages already waiting.
            if self.ready() {
                eventfd_signal(self.link.eventfd.as_fd());
            } else {
                self.link.session.ask_for_signal();
                if self.ready() {
                    eventfd_signal(self.link.eventfd.as_fd());
                }
            }
        }
        Ok(self.epoll.as_ref().expect("created above").as_fd())
    }
}

impl Drop for ShmConsumer {
    fn drop(&mut self) {
        let region = &self.link.session.region;
        region.consumer_closed().store(1, Ordering::SeqCst);
        region.room_futex().fetch_add(1, Ordering::SeqCst);
        futex_wake(region.room_futex(), 1);
        // The listener's drop removes the socket file.
    }
}

