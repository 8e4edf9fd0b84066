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
//!
//! Each slot has its own route receivers (GPU buffers by reference), made when its producer
//! is taken up and fed that producer's offers: a routed message resolves through the imports
//! of the producer that sent it, never another's. They go with the slot's end; what held
//! messages still use stays with the retired session until they are released.

use crate::os::BorrowedHandle;
use std::time::{Duration, Instant};

use super::peers::Peer;
use super::routes::ReceiverTable;
use super::transport::{
    ConsumerSession, ConsumerTransport, PayloadClass, RawView, Route, RouteReceiver, RoutedPayload, TransportId,
    TransportInfo,
};
use super::transports::{AnyConsumer, AnyRouteReceiver, AnySession, ConsumerParts, MessageReleaser, ReceiverFactory};
use super::wait::Waiter;
use super::{ChannelConfig, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::poller::{EventFlags, Poller};

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
    /// That producer's route receivers: its GPU buffers resolve through them.
    routes: ReceiverTable<AnyRouteReceiver>,
    /// How they serve that producer (by reference, or staged and why), for the report.
    gpu: Vec<Route>,
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
    notify: Option<Poller>,
    /// The application asked for the notification fd: every session is watched for it at all
    /// times (not only while the consumer sleeps in a receive).
    app_fd: bool,
    /// Makes each producer's route receivers.
    receivers: ReceiverFactory,
    /// The channel's report: the carrier's route, then how GPU buffers come from the
    /// producers attached, slot by slot.
    info: TransportInfo,
}

/// The carrier of `session` (which watches it): `primary` or one of `extra`.
fn owner<'a>(primary: &'a mut AnyConsumer, extra: &'a mut [AnyConsumer], session: &AnySession) -> &'a mut AnyConsumer {
    match extra.iter_mut().find(|c| c.owns(session)) {
        Some(carrier) => carrier,
        None => primary,
    }
}

impl FanIn {
    /// A fan-in of `max_peers` slots over what the consumer's rendezvous gave: its carrier
    /// (returned, the consumer's to keep) and the other carriers producers attach over, the
    /// first producer's session, whose route receivers have started it, the factory of the
    /// other producers' receivers, and the report as the first producer made it.
    pub(super) fn new(name: &str, config: &ChannelConfig, parts: ConsumerParts) -> Result<(FanIn, AnyConsumer)> {
        let ConsumerParts { carrier: mut own, extra, session: mut first, routes, receivers, info } = parts;
        let carrier = &mut own;
        let max_peers = config.max_peers;
        let mut fan_in = FanIn {
            name: name.to_owned(),
            wait: config.wait,
            slots: (0..max_peers).map(|_| Slot::default()).collect(),
            turn: 0,
            left: 0,
            retired: Vec::new(),
            last_gone: None,
            extra,
            notify: None,
            app_fd: false,
            receivers,
            info,
        };
        carrier.notify_fd()?;
        if !fan_in.extra.is_empty() {
            let epoll = Poller::new()?;
            let what = "the fan-in's notification fd";
            epoll.add(carrier.notify_fd()?, EventFlags::IN, 0, what)?;
            for (at, other) in fan_in.extra.iter_mut().enumerate() {
                epoll.add(other.notify_fd()?, EventFlags::IN, at as u64 + 1, what)?;
            }
            fan_in.notify = Some(epoll);
        }
        let slot = first.peer().slot as usize;
        if slot >= fan_in.slots.len() {
            return Err(Error::Corrupt(format!(
                "the first producer of fan-in channel {name:?} claimed slot {slot}, past max_peers = {max_peers}"
            )));
        }
        let over = owner(carrier, &mut fan_in.extra, &first);
        over.watch(&mut first)?;
        let kind = over.info().kind;
        fan_in.log_attached(&first, slot);
        let routes = ReceiverTable::new(routes);
        let gpu = routes.iter().map(|r| r.route(kind)).collect();
        fan_in.slots[slot] = Slot { session: Some(first), routes, gpu, waiting: None };
        fan_in.refresh_report();
        Ok((fan_in, own))
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
        if entry.session.is_some() {
            owner(carrier, &mut self.extra, &session).watch(&mut session)?;
            if self.app_fd {
                session.sleep()?;
            }
            self.slots[slot].waiting = Some(session);
            return Ok(());
        }
        let over = owner(carrier, &mut self.extra, &session);
        let kind = over.info().kind;
        let Some((routes, gpu)) = self.routes_for(kind, slot, &mut session) else { return Ok(()) };
        owner(carrier, &mut self.extra, &session).watch(&mut session)?;
        if self.app_fd {
            session.sleep()?;
        }
        self.log_attached(&session, slot);
        self.slots[slot] = Slot { session: Some(session), routes, gpu, waiting: None };
        self.refresh_report();
        Ok(())
    }

    /// Says in the log which producer attached in `slot`.
    fn log_attached(&self, session: &AnySession, slot: usize) {
        let peer = session.peer();
        match peer.rank {
            Some(rank) => log::info!(
                "channel {:?} (fan-in consumer): producer at MPI rank {rank} ({}) attached in slot {slot}",
                self.name,
                peer.host
            ),
            None => {
                log::info!(
                    "channel {:?} (fan-in consumer): producer pid {} attached in slot {slot}",
                    self.name,
                    peer.pid
                )
            }
        }
    }

    /// New route receivers for `session`, the producer of slot `at` over carrier `kind`, with
    /// its offers: `None` (said in the log) where they cannot be made or refuse its offer, and
    /// then the producer is dropped, which ends its connection; the others go on.
    fn routes_for(
        &self,
        kind: TransportId,
        at: usize,
        session: &mut AnySession,
    ) -> Option<(ReceiverTable<AnyRouteReceiver>, Vec<Route>)> {
        let made = self.receivers.make().and_then(|routes| {
            let mut routes = ReceiverTable::new(routes);
            let gpu = routes.new_sessions(session, kind)?;
            Ok((routes, gpu))
        });
        match made {
            Ok(made) => Some(made),
            Err(e) => {
                log::warn!(
                    "channel {:?} (fan-in consumer): dropped the producer (pid {}) that claimed slot {at}: {e}",
                    self.name,
                    session.peer().pid
                );
                None
            }
        }
    }

    /// Rebuilds the report from the producers attached: the carrier's route, then, for each
    /// way GPU buffers and CUDA memory come (by reference, or staged or refused and why), the
    /// slots whose producers send them so. With no producer attached it stays as it was.
    fn refresh_report(&mut self) {
        let mut ways: Vec<(&Route, Vec<usize>)> = Vec::new();
        for (at, slot) in self.slots.iter().enumerate().filter(|(_, s)| s.session.is_some()) {
            for route in &slot.gpu {
                match ways.iter_mut().find(|(way, _)| *way == route) {
                    Some((_, slots)) => slots.push(at),
                    None => ways.push((route, vec![at])),
                }
            }
        }
        if ways.is_empty() {
            return;
        }
        let mut routes: Vec<Route> =
            self.info.routes.iter().filter(|r| r.class == PayloadClass::Host).cloned().collect();
        for (way, slots) in ways {
            let list = slots.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ");
            let whose = if slots.len() == 1 { "slot" } else { "slots" };
            routes.push(Route {
                class: way.class,
                kind: way.kind,
                reason: format!("{} (the producers in {whose} {list})", way.reason),
            });
        }
        self.info = TransportInfo::new(routes);
    }

    /// The channel's report (see `Consumer::transport`).
    pub(super) fn info(&self) -> &TransportInfo {
        &self.info
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

    /// The fd that is readable while a message, a producer's end or a new producer waits on
    /// any of the carriers, for the application: every session is watched for it from now on.
    pub(super) fn app_notify_fd<'a>(&'a mut self, carrier: &'a mut AnyConsumer) -> Result<BorrowedHandle<'a>> {
        if !self.app_fd {
            self.app_fd = true;
            for slot in self.slots.iter_mut() {
                for session in slot.session.iter_mut().chain(slot.waiting.iter_mut()) {
                    session.sleep()?;
                }
            }
        }
        self.notify_fd(carrier)
    }

    /// The fd that is readable while a message, a producer's end or a new producer waits on
    /// any of the carriers (for a session that sleeps: see `sleep`).
    fn notify_fd<'a>(&'a self, carrier: &'a mut AnyConsumer) -> Result<BorrowedHandle<'a>> {
        match &self.notify {
            Some(epoll) => Ok(crate::os::borrow(epoll)),
            None => carrier.notify_fd(),
        }
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
    /// waiting producer, if one attached) and returns the end to report. Its route receivers
    /// go; what its held messages still use stays with its session until they are released.
    fn end_slot(&mut self, carrier: &mut AnyConsumer, at: usize, why: String) -> Error {
        let slot = std::mem::take(&mut self.slots[at]);
        let Slot { session, mut routes, waiting, .. } = slot;
        if let Some(mut ended) = session {
            owner(carrier, &mut self.extra, &ended).unwatch(&mut ended);
            routes.end_sessions(&mut ended);
            self.retired.retain(|s| s.holds_views());
            if ended.holds_views() {
                self.retired.push(ended);
            }
        }
        drop(routes);
        if let Some(mut next) = waiting {
            let kind = owner(carrier, &mut self.extra, &next).info().kind;
            match self.routes_for(kind, at, &mut next) {
                Some((routes, gpu)) => {
                    log::info!(
                        "channel {:?} (fan-in consumer): producer pid {}, which waited for slot {at}, attached",
                        self.name,
                        next.peer().pid
                    );
                    self.slots[at] = Slot { session: Some(next), routes, gpu, waiting: None };
                }
                None => owner(carrier, &mut self.extra, &next).unwatch(&mut next),
            }
        }
        self.refresh_report();
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

    /// Sleeps until the carrier's notification fd is readable or `deadline` passes. Sessions
    /// whose carrier's fd watches them only while they sleep (which keeps their receives
    /// going on while awake) are told, and may say that a message came meanwhile.
    fn sleep(&mut self, carrier: &mut AnyConsumer, deadline: Option<Instant>) -> Result<()> {
        if !self.app_fd {
            let mut arrived = false;
            for slot in self.slots.iter_mut() {
                for session in slot.session.iter_mut().chain(slot.waiting.iter_mut()) {
                    arrived |= session.sleep()?;
                }
            }
            let slept = if arrived { Ok(()) } else { self.poll_fd(carrier, deadline) };
            for slot in self.slots.iter_mut() {
                for session in slot.session.iter_mut().chain(slot.waiting.iter_mut()) {
                    session.woke();
                }
            }
            return slept;
        }
        self.poll_fd(carrier, deadline)
    }

    /// Waits until the carrier's notification fd is readable or `deadline` passes.
    fn poll_fd(&self, carrier: &mut AnyConsumer, deadline: Option<Instant>) -> Result<()> {
        let fd = self.notify_fd(carrier)?;
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The liveness of producers whose kernel cannot report their exit is polled at the
        // carrier's period by the slow pass.
        let timeout = Some(timeout.map_or(Duration::from_millis(15), |t| t.min(Duration::from_millis(15))));
        crate::os::ready::wait_readable(&[fd], timeout)?;
        Ok(())
    }

    /// The payload routed view `view` names, through the route receivers of the slot that
    /// sent it (`view.producer()`). On an error the view has been released; a producer whose
    /// descriptor or memory fails validation is detached (`Corrupt` naming its slot), and the
    /// others go on.
    ///
    /// # Safety
    /// `view` was received from this fan-in (marked with its slot) and is not released yet;
    /// the payload is dropped before the view is released.
    #[cold]
    pub(super) unsafe fn resolve(&mut self, carrier: &mut AnyConsumer, view: &RawView) -> Result<RoutedPayload> {
        let at = view.producer() as usize;
        let Some(slot) = self.slots.get_mut(at).filter(|s| s.session.as_ref().is_some_and(|s| s.id() == view.session))
        else {
            // SAFETY: this function's contract; nothing was resolved from the view.
            let _ = unsafe { self.release(view) };
            return Err(Error::InvalidState(format!(
                "message {} is not one of fan-in channel {:?}'s producer in slot {at} (released, or from another channel?)",
                view.token, self.name
            )));
        };
        let session = slot.session.as_mut().expect("checked above");
        let resolved = slot.routes.resolve(session, view, &self.name);
        if resolved.is_err() {
            // SAFETY: the view is held and nothing was resolved from it (this function's contract).
            let _ = unsafe { session.release(view) };
        }
        match resolved {
            Err(Error::Corrupt(why)) => Err(self.detach_corrupt(carrier, at, why)),
            other => other,
        }
    }

    /// A new descriptor of the ready semaphore of the producer in slot `slot` (see
    /// `Consumer::producer_ready_semaphore`).
    pub(super) fn ready_semaphore(&self, slot: u32) -> Result<crate::os::OwnedHandle> {
        let Some(entry) = self.slots.get(slot as usize).filter(|s| s.session.is_some()) else {
            return Err(Error::InvalidState(format!(
                "fan-in channel {:?} has no producer in slot {slot}: see Consumer::peers for the slots taken",
                self.name
            )));
        };
        // Where no route has one, the first route's reason (the GPU route's, before routes of
        // other memory, which synchronise on the host).
        let mut why = None;
        for route in entry.routes.iter() {
            match route.ready_semaphore() {
                Ok(fd) => return Ok(fd),
                Err(e) => {
                    why.get_or_insert(e);
                }
            }
        }
        Err(why.unwrap_or_else(|| {
            Error::Unsupported(format!(
                "the producer in slot {slot} of fan-in channel {:?} shares no semaphore: its GPU buffers are staged \
                 or this channel has no GPU route",
                self.name
            ))
        }))
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
