//! One producer's session at a shared-memory consumer: the producer's region, its socket and
//! process watch, the arenas it passed, and the reading of its ring.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::arenas::{map_arena, ControlRecord};
use super::handshake::Link;
use super::rendezvous;
use super::ring::{
    check_slot, expected_empty, in_arena, Slot, INLINE_MAX, KIND_ARENA, KIND_INLINE, KIND_POOL, KIND_ROUTED,
    MAX_ARENAS, POOL_ALIGN, PRODUCER_DETACHED,
};
use super::session::Session;
use super::{note_peer_watch, peer_end};
use crate::channels::transport::{Attachment, ConsumerSession, RawView, Release, Route, TransportInfo};
use crate::channels::wait::{sleep_once, wake_all, Waiter};
use crate::channels::{Peer, PeerState, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::notify::{drain, drain_peer, notify, notify_pair};
use crate::os::poller::{EventFlags, Poller};
use crate::os::stream::try_recv_with_handles;

/// The most attachments read from the socket and not yet taken: a bound on what a peer can
/// make the consumer hold.
const MAX_PENDING_ATTACHMENTS: usize = 4096;

/// What an event loop waits on: an epoll set over each watched session's notification socket,
/// rendezvous socket and producer process, and the consumer's own notification pair, which
/// keeps the set readable for what the consumer found itself (a message waiting when the set
/// was made, the producer's end).
pub(crate) struct Notify {
    pub(super) epoll: Poller,
    pub(super) own_signals: OwnedHandle,
    own_signal: OwnedHandle,
}

impl Notify {
    pub(super) fn new() -> Result<Notify> {
        let epoll = Poller::new()?;
        let (own_signals, own_signal) = notify_pair()?;
        epoll.add(
            crate::os::borrow(&own_signals),
            EventFlags::IN,
            crate::os::raw(&own_signals) as u64,
            "the channel's own notification socket",
        )?;
        Ok(Notify { epoll, own_signals, own_signal })
    }

    pub(super) fn signal(&self) {
        notify(crate::os::borrow(&self.own_signal));
    }
}

/// One producer's session at a shared-memory consumer.
pub(crate) struct ShmSession {
    name: String,
    wait: WaitStrategy,
    pub(super) link: Link,
    /// The carrier's route for this producer: the plan's, with a note where its end is polled.
    route: Route,
    /// The consumer's notification set, while the session is in it (`ShmConsumer::watch`):
    /// the channel keeps it readable while a message may wait.
    pub(super) notify: Option<Arc<Notify>>,
    arenas_received: u64,
}

impl std::fmt::Debug for ShmSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmSession").field("name", &self.name).field("next", &self.link.next).finish()
    }
}

impl ShmSession {
    /// The session over `link`, whose carrier route is `base` with what the producer's watch
    /// adds.
    pub(super) fn new(name: &str, wait: WaitStrategy, link: Link, base: &Route) -> ShmSession {
        let mut info = TransportInfo::new(vec![base.clone()]);
        note_peer_watch(&mut info, &base.reason, &link.watch);
        let route = info.routes.remove(0);
        ShmSession { name: name.to_owned(), wait, link, route, notify: None, arenas_received: 0 }
    }

    /// The session's ring, which a received Rust message points at (see
    /// [`Session::retire`]); its releases take the reclaim lock from now on.
    #[inline]
    pub(crate) fn session_ptr(&self) -> std::ptr::NonNull<Session> {
        self.link.session.note_message_out();
        std::ptr::NonNull::from(&**self.link.session as &Session)
    }

    /// The descriptors the consumer's notification set watches for this session.
    pub(super) fn watched_fds(&self) -> impl Iterator<Item = (BorrowedHandle<'_>, bool)> {
        [
            Some((crate::os::borrow(&self.link.signals), false)),
            Some((self.link.watch.socket_fd(), true)),
            self.link.watch.process_handle().map(|fd| (fd, false)),
        ]
        .into_iter()
        .flatten()
    }

    /// Asks the producer to signal the next message, and whether one waits already.
    pub(super) fn message_waits(&self) -> bool {
        self.ready() || {
            self.link.session.ask_for_signal();
            self.ready()
        }
    }

    /// Checks whether the current producer is gone: its closed word at once, its process and
    /// socket as `PeerWatch::check` does (the watcher's report, or a poll every
    /// LIVENESS_PERIOD). `force`: poll them now. `hung_up`: the producer's end of the
    /// notification pair was found closed, which it is only once the producer has gone.
    fn producer_gone(&mut self, force: bool, hung_up: bool) -> bool {
        let link = &mut self.link;
        if link.gone.is_some() {
            return true;
        }
        let closed = link.session.region.producer_closed().load(Ordering::Acquire);
        if closed == PRODUCER_DETACHED {
            link.gone = Some(format!(
                "the producer of fan-out channel {:?} detached this consumer: it kept the producer waiting for room \
                 longer than the channel's slow_consumer_timeout; receive faster, or create the consumer again to \
                 rejoin",
                self.name
            ));
            log::warn!("channel {:?} (consumer): {}", self.name, link.gone.as_deref().unwrap_or_default());
            return true;
        }
        if closed != 0 {
            link.gone = Some(format!("the producer of channel {:?} closed it", self.name));
            log::info!(
                "channel {:?} (consumer): the producer (pid {}) closed its end; its messages are delivered, then \
                 the channel reports that it has gone, and a new producer may attach",
                self.name,
                link.watch.pid
            );
            return true;
        }
        if link.watch.check(force) || hung_up {
            link.gone = Some(format!(
                "the producer of channel {:?} (pid {}) has exited or closed its socket",
                self.name, link.watch.pid
            ));
            log::warn!(
                "channel {:?} (consumer): the producer (pid {}) exited or dropped its connection without closing \
                 the channel (killed, or crashed?); the messages it published are still delivered, then the channel \
                 reports that it has gone, and a new producer may attach",
                self.name,
                link.watch.pid
            );
            return true;
        }
        false
    }

    /// Whether a message is ready (or the slot fails validation, which try_recv reports).
    #[inline]
    fn ready(&self) -> bool {
        let s = &self.link.session;
        let next = self.link.next;
        s.region.slot((next & s.mask) as usize).seq.load(Ordering::Acquire) != expected_empty(next, s.slot_count)
            && next - s.reclaimed.load(Ordering::Relaxed) < s.slot_count
    }
    /// The next message if one is waiting and it is the common case: an inline, pool or
    /// routed message, or a buffer send into the arena of the one before, that passes every
    /// check. Everything else (nothing waiting, every slot held, a buffer send into another
    /// arena, a slot that fails validation) is `None`, for [`try_read`](Self::try_read).
    /// Kept free of `Result` so that the hot path moves no error-sized values.
    #[inline(always)]
    fn read_fast(&mut self) -> Option<RawView> {
        let s = &*self.link.session;
        let next = self.link.next;
        let index = (next & s.mask) as usize;
        // One bounds check for the message's words.
        let slot = s.region.slot(index);
        // The second test: every slot is held by a view, so a legitimate producer cannot have
        // published more.
        if slot.seq.load(Ordering::Acquire) != next + 1 || next - s.reclaimed.load(Ordering::Relaxed) >= s.slot_count {
            return None;
        }
        let len_kind = slot.len_kind.load(Ordering::Relaxed);
        let len = len_kind as u32 as usize;
        let ptr = match (len_kind >> 32) as u32 {
            KIND_INLINE if len.wrapping_sub(1) < INLINE_MAX => slot.inline() as *const u8,
            KIND_POOL => {
                let offset = slot.pool_offset().load(Ordering::Relaxed);
                match s.region.pool_range(offset, len as u64) {
                    Some(p) if offset % POOL_ALIGN == 0 => p as *const u8,
                    _ => return None,
                }
            }
            kind if kind & 0xff == KIND_ROUTED && kind >> 16 == 0 && len.wrapping_sub(1) < INLINE_MAX => {
                let ptr = slot.inline() as *const u8;
                return Some(self.hand_out(ptr, len, RawView::routed_flags(kind >> 8)));
            }
            KIND_ARENA => return self.read_arena_fast(index),
            _ => return None,
        };
        Some(self.hand_out(ptr, len, 0))
    }

    /// A buffer send into the arena the last one named, checked as
    /// [`read_arena_slot`](Self::read_arena_slot) checks it; `None` for anything else.
    #[inline]
    fn read_arena_fast(&mut self, index: usize) -> Option<RawView> {
        let [id, offset, len] = self.link.session.region.slot(index).arena().map(|word| word.load(Ordering::Relaxed));
        let (last, mapping) = self.link.arenas.last.as_ref()?;
        if *last != id || !in_arena(offset, len, mapping.len() as u64) {
            return None;
        }
        // SAFETY: offset + len <= the mapping's length, checked above.
        let ptr = unsafe { mapping.as_ptr().add(offset as usize) } as *const u8;
        self.link.session.arena_holds()[index].set(Arc::clone(mapping));
        Some(self.hand_out(ptr, len as usize, RawView::ZERO_COPY))
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
        let seq = s.region.slot(index).seq.load(Ordering::Acquire);
        let len_kind = s.region.slot(index).len_kind.load(Ordering::Relaxed);
        let pool_offset = s.region.slot(index).pool_offset().load(Ordering::Relaxed);
        let (ptr, len, flags) = match check_slot(next, &s.region.geometry, seq, len_kind, pool_offset) {
            Err(what) => return Err(self.corrupt(what)),
            Ok(Slot::Empty) => return Ok(None),
            Ok(Slot::Inline { len }) => (s.region.slot(index).inline() as *const u8, len, 0),
            Ok(Slot::Pool { offset, len }) => {
                let ptr = s.region.pool_range(offset, len as u64).expect("check_slot checked the range");
                (ptr as *const u8, len, 0)
            }
            Ok(Slot::Arena) => return self.read_arena_slot(index, next),
            Ok(Slot::Routed { route, len }) => {
                (s.region.slot(index).inline() as *const u8, len, RawView::routed_flags(route))
            }
        };
        Ok(Some(self.hand_out(ptr, len, flags)))
    }

    /// Records that message `next` is held by a view of `len` bytes at `ptr`, and hands it out.
    #[inline(always)]
    fn hand_out(&mut self, ptr: *const u8, len: usize, flags: u64) -> RawView {
        let s = &*self.link.session;
        let next = self.link.next;
        let record = s.view(next);
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
        let [id, offset, len] = self.link.session.region.slot(index).arena().map(|word| word.load(Ordering::Relaxed));
        let mapping = match &self.link.arenas.last {
            Some((last, mapping)) if *last == id => Arc::clone(mapping),
            _ => {
                if !self.link.arenas.by_id.contains_key(&id) {
                    self.receive_records(Some(id))?;
                }
                let Some(mapping) = self.link.arenas.by_id.get(&id).cloned() else {
                    return Err(
                        self.corrupt(format!("message {next} points into arena {id}, which the producer never passed"))
                    );
                };
                self.link.arenas.last = Some((id, Arc::clone(&mapping)));
                mapping
            }
        };
        if !in_arena(offset, len, mapping.len() as u64) {
            return Err(self.corrupt(format!(
                "message {next} claims {len} bytes at offset {offset} of arena {id}, which has {} bytes",
                mapping.len()
            )));
        }
        // SAFETY: offset + len <= the mapping's length, checked above.
        let ptr = unsafe { mapping.as_ptr().add(offset as usize) } as *const u8;
        let len = len as usize;
        self.link.session.arena_holds()[index].set(mapping);
        Ok(Some(self.hand_out(ptr, len, RawView::ZERO_COPY)))
    }

    /// Reads the producer's control records waiting on the socket, without blocking: until
    /// arena `want` is known, or all of them. Other routes' attachments are kept for
    /// [`take_attachments`](ConsumerSession::take_attachments). Each arena is checked (a sealed memory file of
    /// at least the announced size) and mapped once; its fd is closed after mapping.
    fn receive_records(&mut self, want: Option<u64>) -> Result<()> {
        loop {
            if want.is_some_and(|id| self.link.arenas.by_id.contains_key(&id)) {
                return Ok(());
            }
            let mut bytes = [0u8; ControlRecord::LEN];
            let Some((n, fds)) = try_recv_with_handles(self.link.watch.socket(), &mut bytes)? else {
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
                (ControlRecord::Attachment { route, bytes }, _) => {
                    if self.link.attachments.len() >= MAX_PENDING_ATTACHMENTS {
                        return Err(
                            self.corrupt(format!("more than {MAX_PENDING_ATTACHMENTS} attachments wait unread"))
                        );
                    }
                    self.link.attachments.push(Attachment { route, bytes, handles: fds });
                }
                (record, count) => return Err(self.corrupt(format!("{} came with {count} fds", record.describe()))),
            }
        }
    }

    /// The next message if one waits, `None` if not (no allocation on the blocking path),
    /// `PeerGone` when none waits and the producer has gone.
    /// `from_try`: called by try_recv, which keeps the fd's level and checks the producer
    /// itself; the blocking path leaves both to `wait`.
    #[inline]
    fn poll_recv(&mut self, from_try: bool) -> Result<Option<RawView>> {
        if let Some(view) = self.try_read()? {
            return Ok(Some(view));
        }
        let mut hung_up = false;
        if let Some(notify) = self.notify.as_ref().filter(|_| from_try) {
            // Level-triggered notification: the fd is reset only when the ring is seen
            // empty, after asking the producer to signal the next message.
            hung_up = drain_peer(crate::os::borrow(&self.link.signals));
            drain(crate::os::borrow(&notify.own_signals));
            self.link.session.ask_for_signal();
            if let Some(view) = self.try_read()? {
                return Ok(Some(view));
            }
        }
        let gone = if self.link.gone.is_some() {
            true
        } else if from_try {
            // Readable must mean that this call has something to say. The fd's set holds
            // the producer's pidfd, its socket and its end of the notification pair, so
            // it polls readable the moment the kernel knows of a death: the pair's
            // hang-up (often the first sign) is read by the drain above, and the pidfd
            // and socket are polled now, not left to the watcher's report (which may come
            // later) or to the next LIVENESS_PERIOD. One poll, on a path that has just
            // drained two sockets; without the fd nobody waits on one, and callers that
            // spin on try_recv keep the cheap check.
            self.producer_gone(self.notify.is_some(), hung_up)
        } else {
            self.link.session.region.producer_closed().load(Ordering::Relaxed) != 0 && self.producer_gone(true, false)
        };
        if !gone {
            return Ok(None);
        }
        // Gone: messages published before the end are still read first.
        if let Some(view) = self.try_read()? {
            return Ok(Some(view));
        }
        if let Some(notify) = &self.notify {
            // Keep the fd readable so an event loop learns about the end.
            notify.signal();
        }
        Err(self.gone_error())
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!(
            "channel {:?}: the producer (pid {}) wrote an invalid descriptor: {what}",
            self.name, self.link.watch.pid
        ))
    }

    fn gone_error(&self) -> Error {
        Error::PeerGone(
            self.link.gone.clone().unwrap_or_else(|| format!("the producer of channel {:?} has gone", self.name)),
        )
    }
}

impl ConsumerSession for ShmSession {
    fn id(&self) -> u64 {
        self.link.session.id
    }

    fn route(&self) -> Option<Route> {
        Some(self.route.clone())
    }

    fn peer(&self) -> Peer {
        let link = &self.link;
        let gone = link.gone.is_some() || link.session.region.producer_closed().load(Ordering::Relaxed) != 0;
        Peer {
            slot: link.slot,
            state: if gone { PeerState::Gone } else { PeerState::Alive },
            pid: link.watch.pid as u32,
            rank: None,
            // This host: the core names it.
            host: String::new(),
            route: Some(self.route.kind.name()),
        }
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
            if self.producer_gone(false, false) {
                return Ok(());
            }
            if waiter.timed_out(now) {
                return Err(Error::Timeout(format!(
                    "no message arrived on channel {:?} before the deadline",
                    self.name
                )));
            }
            if !waiter.spinning(now) {
                let (session, watch) = (&self.link.session, &self.link.watch);
                let region = &session.region;
                let (next, slot_count) = (self.link.next, session.slot_count);
                sleep_once(
                    region.data_futex(),
                    region.data_sleeping(),
                    session.data_fast_wake,
                    peer_end(watch),
                    deadline,
                    || {
                        region.slot((next & (slot_count - 1)) as usize).seq.load(Ordering::SeqCst)
                            != expected_empty(next, slot_count)
                            || region.producer_closed().load(Ordering::SeqCst) != 0
                            || watch.alarmed()
                    },
                );
                // Rate-limited like every check where it polls: a woken sleep pays no syscall.
                if self.producer_gone(false, false) {
                    return Ok(());
                }
            }
        }
    }

    fn releaser(&self) -> Arc<dyn Release> {
        Arc::clone(&self.link.session) as Arc<dyn Release>
    }

    #[inline(always)]
    unsafe fn release(&mut self, view: &RawView) -> Result<()> {
        self.link.session.release(view)
    }

    fn holds_views(&self) -> bool {
        self.link.session.holds_views()
    }

    fn released_below(&self) -> u64 {
        self.link.session.reclaimed.load(Ordering::Acquire)
    }

    fn keep_while_held(&mut self, keep: Box<dyn Any + Send + Sync>) {
        self.link.session.keep_while_held(keep);
    }

    fn take_offers(&mut self) -> Option<Vec<Attachment>> {
        self.link.peer_sections.take()
    }

    fn take_attachments(&mut self) -> Result<Vec<Attachment>> {
        self.receive_records(None)?;
        Ok(std::mem::take(&mut self.link.attachments))
    }

    fn arenas_received(&self) -> u64 {
        self.arenas_received
    }
}

impl Drop for ShmSession {
    fn drop(&mut self) {
        let region = &self.link.session.region;
        region.consumer_closed().store(1, Ordering::SeqCst);
        wake_all(region.room_futex());
        let producer_over = self.link.gone.is_some() || region.producer_closed().load(Ordering::SeqCst) != 0;
        // A producer that died left its lock file behind: removed once its lock is free (the
        // consumer's socket file and claim went first, with the consumer's listener).
        if producer_over || self.link.watch.is_gone() {
            rendezvous::clean_after_peer(&self.name, self.link.producer_end, &self.link.watch, self.link.producer_lock);
            if let Some(lock) = self.link.producer_socket_lock {
                // A fan-out's producer listened: its socket and the lock it held for it.
                rendezvous::clean_after_peer(&self.name, rendezvous::End::Consumer, &self.link.watch, Some(lock));
            }
        }
    }
}
