//! A fan-in consumer's producers, one session per slot: served in turns of up to `TURN`
//! messages (a producer with none waiting ends its turn at once), each producer's end
//! reported after its last message, new producers taken up as they attach.
//!
//! The consumer waits on its carrier's notification fd, which watches every session and the
//! carrier's rendezvous: a message in any session, a producer's end or a producer that
//! attaches makes it readable.
//!
//! Producers may attach over several carriers (same-host ones over shared memory, others over
//! MPI): the fan-in holds the carriers besides the consumer's own, takes producers up from
//! each, has each session watched by the carrier it came from, and waits on an epoll set of
//! every carrier's fd.

use std::time::{Duration, Instant};

use super::peers::Peer;
use super::transport::{ConsumerSession, ConsumerTransport, RawView};
use super::transports::{AnyConsumer, AnySession, MessageReleaser};
use super::wait::Waiter;
use super::WaitStrategy;
use crate::error::{Error, Result};
use crate::os::epoll::{Epoll, EventFlags};
use crate::os::eventfd::{poll, PollFd, PollFlags};
use std::os::fd::{AsFd, BorrowedFd};

/// The most messages one producer's turn takes when others have messages waiting: long enough
/// that the consumer reads a ring's slots in a row (its cache lines one after the other), short
/// enough that no producer waits long for its turn.
const TURN: u32 = 32;

/// How many spins of the fast scan between slow passes (which read what the fast scan leaves
/// aside: a producer's end, a new arena, an invalid slot).
const SLOW_PASS_EVERY: u32 = 64;

/// One slot of a fan-in.
#[derive(Default)]
struct Slot {
    /// The producer served in this slot.
    session: Option<AnySession>,
    /// A producer that took the slot while the last one's messages were still being read: it
    /// is served once the last one's end has been reported.
    waiting: Option<AnySession>,
}

/// A fan-in consumer's producers.
pub(super) struct FanIn {
    name: String,
    wait: WaitStrategy,
    slots: Vec<Slot>,
    /// The slot whose turn it is, and how many more messages its turn takes.
    turn: usize,
    left: u32,
    /// Sessions whose end was reported while the application still held their messages.
    retired: Vec<AnySession>,
    /// The slot whose end the last `PeerGone` reported.
    last_gone: Option<u32>,
    /// The carriers producers attach over besides the consumer's own.
    extra: Vec<AnyConsumer>,
    /// With `extra` carriers: an epoll set of every carrier's notification fd.
    notify: Option<Epoll>,
}

/// The carrier of `session` (which watches it): `primary` or one of `extra`.
fn owner<'a>(primary: &'a mut AnyConsumer, extra: &'a mut [AnyConsumer], session: &AnySession) -> &'a mut AnyConsumer {
    match extra.iter_mut().find(|c| c.owns(session)) {
        Some(carrier) => carrier,
        None => primary,
    }
}

impl FanIn {
    /// A fan-in of `max_peers` slots that serves `first` (which came from `carrier` or one
    /// of `extra`), and takes producers up from `carrier` and `extra`.
    pub(super) fn new(
        name: &str,
        wait: WaitStrategy,
        max_peers: u32,
        carrier: &mut AnyConsumer,
        extra: Vec<AnyConsumer>,
        first: AnySession,
    ) -> Result<FanIn> {
        let mut fan_in = FanIn {
            name: name.to_owned(),
            wait,
            slots: (0..max_peers).map(|_| Slot::default()).collect(),
            turn: 0,
            left: 0,
            retired: Vec::new(),
            last_gone: None,
            extra,
            notify: None,
        };
        carrier.notify_fd()?;
        if !fan_in.extra.is_empty() {
            let epoll = Epoll::new()?;
            let what = "the fan-in's notification fd";
            epoll.add(carrier.notify_fd()?, EventFlags::IN, 0, what)?;
            for (at, other) in fan_in.extra.iter_mut().enumerate() {
                epoll.add(other.notify_fd()?, EventFlags::IN, at as u64 + 1, what)?;
            }
            fan_in.notify = Some(epoll);
        }
        fan_in.take_up(carrier, first)?;
        Ok(fan_in)
    }

    /// The fd that is readable while a message, a producer's end or a new producer waits on
    /// any of the carriers.
    pub(super) fn notify_fd<'a>(&'a self, carrier: &'a mut AnyConsumer) -> Result<BorrowedFd<'a>> {
        match &self.notify {
            Some(epoll) => Ok(epoll.as_fd()),
            None => carrier.notify_fd(),
        }
    }

    /// Puts a producer that attached in its slot (or behind the slot's last producer, whose
    /// messages are still being read).
    fn take_up(&mut self, carrier: &mut AnyConsumer, mut session: AnySession) -> Result<()> {
        let slot = session.peer().slot as usize;
        let Some(entry) = self.slots.get_mut(slot) else {
            // The carrier refuses a slot past max_peers in the handshake; one that claims it
            // anyway is dropped, which ends its connection.
            log::warn!(
                "channel {:?} (fan-in consumer): a producer claimed slot {slot}, past the last; dropped",
                self.name
            );
            return Ok(());
        };
        if entry.session.is_some() && entry.waiting.is_some() {
            log::warn!(
                "channel {:?} (fan-in consumer): a third producer claimed slot {slot} while two hold it; dropped",
                self.name
            );
            return Ok(());
        }
        owner(carrier, &mut self.extra, &session).watch(&mut session)?;
        let peer = session.peer();
        if entry.session.is_none() {
            match peer.rank {
                Some(rank) => log::info!(
                    "channel {:?} (fan-in consumer): producer at MPI rank {rank} ({}) attached in slot {slot}",
                    self.name,
                    peer.host
                ),
                None => log::info!(
                    "channel {:?} (fan-in consumer): producer pid {} attached in slot {slot}",
                    self.name,
                    peer.pid
                ),
            }
            entry.session = Some(session);
        } else {
            entry.waiting = Some(session);
        }
        Ok(())
    }

    /// Takes up the producers waiting to attach, on every carrier.
    fn accept(&mut self, carrier: &mut AnyConsumer) -> Result<()> {
        while let Some(session) = carrier.try_accept()? {
            self.take_up(carrier, session)?;
        }
        for at in 0..self.extra.len() {
            while let Some(session) = self.extra[at].try_accept()? {
                self.take_up(carrier, session)?;
            }
        }
        Ok(())
    }

    /// A message from the slots in turn, starting after the one whose turn it was: the common
    /// case only (`ConsumerSession::recv_fast`), with the slot it came from.
    #[inline]
    fn scan_fast(&mut self) -> Option<(RawView, usize)> {
        // Two plain ranges: no division per slot.
        let next = self.after_turn();
        for at in (next..self.slots.len()).chain(0..next) {
            if let Some(view) = self.slots[at].session.as_mut().and_then(|s| s.recv_fast()) {
                return Some((view, at));
            }
        }
        None
    }

    /// Every slot's full receive, in turn: a message, `None` when none waits, or a slot's end
    /// (`PeerGone`, naming the slot) or error.
    fn scan_slow(&mut self, carrier: &mut AnyConsumer) -> Result<Option<(RawView, usize)>> {
        let next = self.after_turn();
        for at in (next..self.slots.len()).chain(0..next) {
            let Some(session) = self.slots[at].session.as_mut() else { continue };
            match session.try_recv() {
                Ok(view) => return Ok(Some((view, at))),
                Err(Error::WouldBlock(_)) => {}
                Err(Error::PeerGone(why)) => return Err(self.end_slot(carrier, at, why)),
                Err(Error::Corrupt(why)) => return Err(self.detach_corrupt(carrier, at, why)),
                Err(e) => {
                    (self.turn, self.left) = (at, 0);
                    return Err(e);
                }
            }
        }
        Ok(None)
    }

    /// Slot `at`'s producer has gone and its messages are read: frees the slot (for its
    /// waiting producer, if one attached) and returns the end to report.
    fn end_slot(&mut self, carrier: &mut AnyConsumer, at: usize, why: String) -> Error {
        let slot = &mut self.slots[at];
        if let Some(mut ended) = slot.session.take() {
            owner(carrier, &mut self.extra, &ended).unwatch(&mut ended);
            self.retired.retain(|s| s.holds_views());
            if ended.holds_views() {
                self.retired.push(ended);
            }
        }
        slot.session = slot.waiting.take();
        (self.turn, self.left) = (at, 0);
        self.last_gone = Some(at as u32);
        Error::PeerGone(format!("slot {at}: {why}; the other producers go on, and a new one may take the slot"))
    }

    /// Slot `at`'s producer wrote what fails validation (`why`): it is detached (its
    /// connection closed, its slot freed), so that it cannot stop the others.
    fn detach_corrupt(&mut self, carrier: &mut AnyConsumer, at: usize, why: String) -> Error {
        log::warn!("channel {:?} (fan-in consumer): detaching the producer in slot {at}: {why}", self.name);
        let _ = self.end_slot(carrier, at, String::new());
        Error::Corrupt(format!("slot {at}: {why}; that producer was detached, the others go on"))
    }

    /// The next message and its slot, or `WouldBlock` when none waits (`block`: wait up to
    /// `deadline` instead). A producer's end is reported as `PeerGone` once its messages
    /// have been read; the other producers go on.
    pub(super) fn recv(
        &mut self,
        carrier: &mut AnyConsumer,
        block: bool,
        deadline: Option<Instant>,
    ) -> Result<(RawView, u32)> {
        if self.left > 0 {
            if let Some(view) = self.slots[self.turn].session.as_mut().and_then(|s| s.recv_fast()) {
                self.left -= 1;
                return Ok((view, self.turn as u32));
            }
        }
        // A turn ends: producers that attached meanwhile join the round (one atomic load when
        // none did).
        self.accept(carrier)?;
        if let Some((view, at)) = self.scan_fast() {
            return Ok(self.served(view, at));
        }
        let mut waiter = Waiter::new(self.wait, deadline);
        let mut spins = 0u32;
        loop {
            if spins % SLOW_PASS_EVERY == 0 {
                self.accept(carrier)?;
                if let Some((view, at)) = self.scan_slow(carrier)? {
                    return Ok(self.served(view, at));
                }
                if !block {
                    return Err(Error::WouldBlock(format!("no message waiting on fan-in channel {:?}", self.name)));
                }
                let now = Instant::now();
                if waiter.timed_out(now) {
                    return Err(Error::Timeout(format!(
                        "no message arrived on fan-in channel {:?} before the deadline",
                        self.name
                    )));
                }
                if !waiter.spinning(now) {
                    // Every session asked its producer for a signal in the slow pass: the fd
                    // is readable for anything that arrives from now on.
                    self.sleep(carrier, deadline)?;
                    spins = 0;
                    continue;
                }
            } else if let Some((view, at)) = self.scan_fast() {
                return Ok(self.served(view, at));
            }
            spins = spins.wrapping_add(1);
            std::hint::spin_loop();
        }
    }

    /// Slot `at` served `view`: its turn starts (or goes on).
    #[inline]
    fn served(&mut self, view: RawView, at: usize) -> (RawView, u32) {
        (self.turn, self.left) = (at, TURN - 1);
        (view, at as u32)
    }

    /// Where a scan starts: the slot after the one whose turn it was.
    #[inline]
    fn after_turn(&self) -> usize {
        if self.turn + 1 == self.slots.len() {
            0
        } else {
            self.turn + 1
        }
    }

    /// Sleeps until a carrier's notification fd is readable or `deadline` passes.
    fn sleep(&self, carrier: &mut AnyConsumer, deadline: Option<Instant>) -> Result<()> {
        let fd = self.notify_fd(carrier)?;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The liveness of producers whose kernel cannot report their exit is polled at the
        // carrier's period by the slow pass.
        let timeout = Some(timeout.map_or(Duration::from_millis(15), |t| t.min(Duration::from_millis(15))));
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        poll(&mut fds, timeout)?;
        Ok(())
    }

    /// The releaser of messages from slot `at`.
    #[inline]
    pub(super) fn releaser(&self, at: u32) -> MessageReleaser {
        self.slots[at as usize].session.as_ref().expect("a message's slot has its session").message_releaser()
    }

    /// Releases `view`, received from one of the slots (or a retired session).
    ///
    /// # Safety
    /// `view` was received from this fan-in, is not released yet, and nothing uses it.
    #[inline]
    pub(super) unsafe fn release(&mut self, view: &RawView) -> Result<()> {
        // The slot the view names first (its session checked, its bits not trusted).
        let named = self.slots.get_mut(view.producer() as usize).and_then(|s| s.session.as_mut());
        if let Some(session) = named.filter(|s| s.id() == view.session) {
            // SAFETY: this function's contract.
            return unsafe { session.release(view) };
        }
        // SAFETY: as above.
        unsafe { self.release_elsewhere(view) }
    }

    /// [`release`](Self::release) of a view whose slot's session is not its own: a retired
    /// session's (or another slot's, where the caller's copy of the view lost its slot).
    ///
    /// # Safety
    /// As [`release`](Self::release).
    #[cold]
    unsafe fn release_elsewhere(&mut self, view: &RawView) -> Result<()> {
        let found = self
            .slots
            .iter_mut()
            .flat_map(|s| s.session.as_mut())
            .chain(self.retired.iter_mut())
            .find(|s| s.id() == view.session);
        let Some(session) = found else {
            return Err(Error::InvalidState(format!(
                "message {} is not held from fan-in channel {:?} (released twice, or from another channel?)",
                view.token, self.name
            )));
        };
        // SAFETY: this function's contract.
        let released = unsafe { session.release(view) };
        self.retired.retain(|s| s.holds_views());
        released
    }

    /// The slot whose end the last `PeerGone` reported.
    pub(super) fn last_gone(&self) -> Option<u32> {
        self.last_gone
    }

    /// Each slot's state.
    pub(super) fn peers(&self) -> Vec<Peer> {
        self.slots
            .iter()
            .enumerate()
            .map(|(at, slot)| match &slot.session {
                Some(session) => Peer { slot: at as u32, ..session.peer() },
                None => Peer::free(at as u32),
            })
            .collect()
    }

    /// How many producers are attached (gone ones whose messages are still read included).
    pub(super) fn attached(&self) -> usize {
        self.slots.iter().filter(|s| s.session.is_some()).count()
    }

    /// The arenas every session received (see `Consumer::arenas_received`).
    pub(super) fn arenas_received(&self) -> u64 {
        self.slots.iter().flat_map(|s| s.session.iter()).chain(self.retired.iter()).map(|s| s.arenas_received()).sum()
    }
}
