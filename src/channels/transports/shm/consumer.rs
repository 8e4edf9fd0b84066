//! The consumer half of a shared-memory channel.

use std::any::Any;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::arenas::{map_arena, ControlRecord};
use super::handshake::{self, Link};
use super::rendezvous::{self, End, Listener};
use super::ring::{
    check_slot, expected_empty, in_arena, Slot, INLINE_MAX, KIND_ARENA, KIND_INLINE, KIND_POOL, KIND_ROUTED,
    MAX_ARENAS, POOL_ALIGN,
};
use super::session::{OwnedSession, Session};
use super::{note_peer_watch, peer_end};
use crate::channels::transport::{Attachment, ConsumerTransport, RawView, Release, TransportInfo};
use crate::channels::wait::{sleep_once, wake_all, Waiter};
use crate::channels::{ChannelConfig, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::epoll::{Epoll, EventFlags};
use crate::os::notify::{drain, drain_peer, notify, notify_pair};
use crate::os::try_recv_with_fds;

/// The most attachments read from the socket and not yet taken: a bound on what a peer can
/// make the consumer hold.
const MAX_PENDING_ATTACHMENTS: usize = 4096;

/// The consumer half of a shared-memory channel. It keeps listening, so that a new producer
/// can attach once the old one has gone.
pub(crate) struct ShmConsumer {
    info: TransportInfo,
    /// The carrier's reason as the plan gave it, before the note on the current producer's
    /// watch (see `note_peer_watch`).
    base_reason: String,
    name: String,
    wait: WaitStrategy,
    listener: Listener,
    link: Link,
    /// Earlier sessions whose views are still held (for release by value).
    old: Vec<OwnedSession>,
    sessions: u64,
    /// Set up by the first `notify_fd`: from then on, the channel keeps it readable while a
    /// message may wait.
    notify: Option<Notify>,
    arenas_received: u64,
    /// This consumer's sections for the other routes, the answer to every producer's hello.
    answers: Vec<Attachment>,
}

/// What an event loop waits on: an epoll set over the producer's notification socket, its
/// rendezvous socket and process, and the consumer's own notification pair, which keeps the
/// set readable for what the
/// consumer found itself (a message waiting when the set was made, the producer's end).
struct Notify {
    epoll: Epoll,
    own_signals: OwnedFd,
    own_signal: OwnedFd,
}

impl Notify {
    fn signal(&self) {
        notify(self.own_signal.as_fd());
    }
}

impl std::fmt::Debug for ShmConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmConsumer").field("name", &self.name).field("next", &self.link.next).finish()
    }
}

impl ShmConsumer {
    /// Releases a view of a session that a producer before the current one began.
    #[inline(never)]
    fn release_old(&mut self, view: &RawView) -> Result<()> {
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

    /// Listens on `name` and waits for a producer, answering its hello with `answers` (the
    /// other routes' sections).
    pub(crate) fn listen(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<Self> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let listener = Listener::bind(name)?;
        let mut refused = Vec::new();
        let link = loop {
            match listener.accept(deadline, &mut refused, name)? {
                None => {
                    let mut msg =
                        format!("no producer of channel {name:?} connected to {} in time", listener.path().display());
                    if !refused.is_empty() {
                        msg.push_str(&format!("; refused: {}", refused.join("; ")));
                    }
                    return Err(Error::Timeout(msg));
                }
                Some((sock, cred)) => match handshake::accept(sock, cred, name, config.wait, deadline, 1, &answers) {
                    Ok(link) => break link,
                    Err(e) => refused.push(e.to_string()),
                },
            }
        };
        let mut info = info;
        let base_reason = info.routes.first().map(|r| r.reason.clone()).unwrap_or_default();
        note_peer_watch(&mut info, &base_reason, &link.watch);
        Ok(ShmConsumer {
            info,
            base_reason,
            name: name.to_owned(),
            wait: config.wait,
            listener,
            link,
            old: Vec::new(),
            sessions: 1,
            notify: None,
            arenas_received: 0,
            answers,
        })
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
        if link.session.region.producer_closed().load(Ordering::Acquire) != 0 {
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
    /// [`take_attachments`](ConsumerTransport::take_attachments). Each arena is checked (a sealed memory file of
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
                (ControlRecord::Attachment { route, bytes }, _) => {
                    if self.link.attachments.len() >= MAX_PENDING_ATTACHMENTS {
                        return Err(
                            self.corrupt(format!("more than {MAX_PENDING_ATTACHMENTS} attachments wait unread"))
                        );
                    }
                    self.link.attachments.push(Attachment { route, bytes, fds });
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
        loop {
            if let Some(view) = self.try_read()? {
                return Ok(Some(view));
            }
            let mut hung_up = false;
            if let Some(notify) = self.notify.as_ref().filter(|_| from_try) {
                // Level-triggered notification: the fd is reset only when the ring is seen
                // empty, after asking the producer to signal the next message.
                hung_up = drain_peer(self.link.signals.as_fd());
                drain(notify.own_signals.as_fd());
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
                self.link.session.region.producer_closed().load(Ordering::Relaxed) != 0
                    && self.producer_gone(true, false)
            };
            if !gone {
                return Ok(None);
            }
            // Gone: messages published before the end are still read first.
            if let Some(view) = self.try_read()? {
                return Ok(Some(view));
            }
            // A new producer is attached only once the end of this one has been reported: its
            // messages start again at sequence number 0, and the application must know.
            if self.link.gone_reported && self.try_reattach()? {
                continue;
            }
            self.link.gone_reported = true;
            if let Some(notify) = &self.notify {
                // Keep the fd readable so an event loop learns about the end.
                notify.signal();
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
        let link = match handshake::accept(sock, cred, &self.name, self.wait, deadline, id, &self.answers) {
            Ok(l) => l,
            Err(_) => return Ok(false),
        };
        self.sessions = id;
        log::info!(
            "channel {:?} (consumer): a new producer (pid {}) attached after the last one had gone; its messages \
             start again at sequence number 0",
            self.name,
            link.watch.pid
        );
        note_peer_watch(&mut self.info, &self.base_reason, &link.watch);
        let old = std::mem::replace(&mut self.link, link);
        if let Some(notify) = &self.notify {
            for fd in [Some(old.signals.as_fd()), Some(old.watch.socket_fd()), old.watch.pidfd()].into_iter().flatten()
            {
                notify.epoll.delete(fd);
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
        let epoll = &self.notify.as_ref().expect("notification set up").epoll;
        let what = "the channel's notification fd";
        let add = |fd: BorrowedFd<'_>, events: EventFlags| epoll.add(fd, events, fd.as_raw_fd() as u64, what);
        add(self.link.signals.as_fd(), EventFlags::IN)?;
        add(self.link.watch.socket_fd(), EventFlags::IN | EventFlags::RDHUP)?;
        if let Some(pidfd) = self.link.watch.pidfd() {
            add(pidfd, EventFlags::IN)?;
        }
        Ok(())
    }

    fn gone_error(&self) -> Error {
        Error::PeerGone(
            self.link.gone.clone().unwrap_or_else(|| format!("the producer of channel {:?} has gone", self.name)),
        )
    }
}

impl ShmConsumer {
    /// The current session, which a received Rust message points at (see
    /// [`Session::retire`]); its releases take the reclaim lock from now on.
    #[inline]
    pub(crate) fn session_ptr(&self) -> std::ptr::NonNull<Session> {
        self.link.session.note_message_out();
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

    fn arenas_received(&self) -> u64 {
        self.arenas_received
    }

    fn take_peer_sections(&mut self) -> Option<(u64, Vec<Attachment>)> {
        let sections = self.link.peer_sections.take()?;
        Some((self.link.session.id, sections))
    }

    fn take_attachments(&mut self) -> Result<Vec<Attachment>> {
        self.receive_records(None)?;
        Ok(std::mem::take(&mut self.link.attachments))
    }

    fn released_below(&self) -> u64 {
        self.link.session.reclaimed.load(Ordering::Acquire)
    }

    fn keep_while_held(&mut self, session: u64, keep: Box<dyn Any + Send + Sync>) {
        // A session that is neither current nor among the old ones holds no view any more.
        if self.link.session.id == session {
            self.link.session.keep_while_held(keep);
        } else if let Some(old) = self.old.iter().find(|s| s.id == session) {
            old.keep_while_held(keep);
        }
    }

    #[inline(always)]
    unsafe fn release(&mut self, view: &RawView) -> Result<()> {
        let session = &self.link.session;
        if view.session == session.id {
            return session.release(view);
        }
        self.release_old(view)
    }

    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.notify.is_none() {
            let epoll = Epoll::new()?;
            let (own_signals, own_signal) = notify_pair()?;
            epoll.add(
                own_signals.as_fd(),
                EventFlags::IN,
                own_signals.as_raw_fd() as u64,
                "the channel's own notification socket",
            )?;
            self.notify = Some(Notify { epoll, own_signals, own_signal });
            self.register_link_fds()?;
            // Make the fd reflect messages already waiting.
            let waiting = self.ready() || {
                self.link.session.ask_for_signal();
                self.ready()
            };
            if waiting {
                self.notify.as_ref().expect("set up above").signal();
            }
        }
        Ok(self.notify.as_ref().expect("set up above").epoll.as_fd())
    }
}

impl Drop for ShmConsumer {
    fn drop(&mut self) {
        let region = &self.link.session.region;
        region.consumer_closed().store(1, Ordering::SeqCst);
        wake_all(region.room_futex());
        let producer_over = self.link.gone.is_some() || region.producer_closed().load(Ordering::SeqCst) != 0;
        // The socket file and this end's claim go first, so that a peer closing at the same
        // time never waits for us while we wait for it.
        self.listener.close();
        // A producer that died left its lock file behind: removed once its lock is free.
        if producer_over || self.link.watch.is_gone() {
            rendezvous::clean_after_peer(&self.name, End::Producer, &self.link.watch, self.link.producer_lock);
        }
    }
}
