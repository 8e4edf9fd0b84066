//! The producer half of a loopback channel.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;

use super::session::{Bytes, Entry, Session, State};
use super::{taken, wait_for_meeting, with_meeting, Meeting};
use crate::channels::peers::check_producer_place;
use crate::channels::transport::{Attachment, ProducerTransport, RawLoan, RawView, SharedRegion, TransportInfo};
use crate::channels::{ChannelConfig, ChannelKind, Peer, MAX_PEERS};
use crate::error::{Error, Result};

/// The producer half of a loopback channel.
pub(crate) struct LoopbackProducer {
    info: TransportInfo,
    session: Arc<Session>,
    kind: ChannelKind,
    /// The room of the loan not published yet, and its token.
    loan: Option<(u64, Box<[u8]>)>,
    loans: u64,
    /// The consumer's answers for the routes, until taken.
    answers: Vec<Attachment>,
    /// Completion as last seen.
    completed: u64,
    /// Whether the producer holds its end of a meeting (an ended placeholder holds none).
    met: bool,
}

impl LoopbackProducer {
    /// Attaches to the consumer of `name` in this process (waiting for it up to the config's
    /// rendezvous timeout), with the routes' sections that `offers` makes.
    pub(crate) fn connect(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
    ) -> Result<Self> {
        let capacity = checked_capacity(config)?;
        let kind = config.kind;
        if kind == ChannelKind::Pair {
            with_meeting(name, |m| match m.producer_live {
                true => Err(taken(name, "producer")),
                false => {
                    m.producer_live = true;
                    Ok(())
                }
            })?;
        }
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let met = wait_for_meeting(name, deadline, |m| match m.fan_out {
            // A fan-out's producer holds the name: its consumers join it.
            Some(_) => Some(Err(taken(name, "producer"))),
            None => m.consumer_live.then(|| take_place(m, name, kind)),
        });
        let slot = match met {
            Some(Ok(slot)) => slot,
            Some(Err(refused)) => {
                leave(name, kind, None);
                return Err(refused);
            }
            None => {
                leave(name, kind, None);
                return Err(Error::Timeout(format!(
                    "no consumer of channel {name:?} appeared in this process in time"
                )));
            }
        };
        let id = session_id();
        let offers = match offers() {
            Ok(offers) => offers,
            Err(e) => {
                leave(name, kind, Some(slot));
                return Err(e);
            }
        };
        let session = Arc::new(Session::new(id, name, slot, capacity, config.pool_size, offers));
        if let Err(e) = with_meeting(name, |m| m.arrive(Arc::clone(&session))) {
            leave(name, kind, Some(slot));
            return Err(e);
        }
        // The consumer answers when it takes the session up.
        let answered = wait_for_meeting(name, deadline, |_| session.answers.lock().take());
        let Some(answers) = answered else {
            session.close_producer();
            leave(name, kind, Some(slot));
            return Err(Error::Timeout(format!(
                "the consumer of channel {name:?} did not take the producer up in time"
            )));
        };
        Ok(LoopbackProducer { info, session, kind, loan: None, loans: 0, answers, completed: 0, met: true })
    }

    /// The producer's end for one consumer of a fan-out, over `session`, which that consumer
    /// made with its answers in it: the routes' sections that `offers` makes go into it.
    pub(super) fn fan_out_end(
        info: TransportInfo,
        session: Arc<Session>,
        offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
    ) -> Result<LoopbackProducer> {
        *session.offers.lock() = Some(offers()?);
        let answers = session.answers.lock().take().unwrap_or_default();
        // (Its slot is the fan-out's, freed there when it drops this end: nothing held here.)
        Ok(LoopbackProducer {
            info,
            session,
            kind: ChannelKind::FanOut,
            loan: None,
            loans: 0,
            answers,
            completed: 0,
            met: false,
        })
    }

    /// A producer whose consumer has closed, met nowhere: what a channel's producer holds as
    /// its carrier where its consumers' ends are elsewhere (a fan-out's are its slots'). Every
    /// send fails, without waiting.
    pub(crate) fn ended(name: &str, info: TransportInfo) -> LoopbackProducer {
        let session = Arc::new(Session::new(u64::MAX, name, 0, 1, 0, Vec::new()));
        session.close_consumer();
        LoopbackProducer {
            info,
            session,
            kind: ChannelKind::Pair,
            loan: None,
            loans: 0,
            answers: Vec::new(),
            completed: 0,
            met: false,
        }
    }

    /// Whether a message of `len` bytes may be sent now: `WouldBlock` when the ring is full,
    /// `PeerGone` when the consumer has closed.
    fn check_room(&self, state: &State, len: usize) -> Result<()> {
        if len == 0 || len > self.session.max_len {
            return Err(Error::invalid(format!(
                "a message of {len} bytes does not fit channel {:?}: messages are 1 to {} bytes (pool_size)",
                self.session.name, self.session.max_len
            )));
        }
        if state.consumer_closed {
            return Err(self.gone());
        }
        if !self.session.has_room(state) {
            return Err(Error::WouldBlock(format!(
                "channel {:?} is full: {} messages are unreleased",
                self.session.name, self.session.capacity
            )));
        }
        Ok(())
    }

    fn gone(&self) -> Error {
        Error::PeerGone(format!("the consumer of channel {:?} closed it", self.session.name))
    }

    /// Waits for room for a message of `len` bytes up to `deadline`: `WouldBlock` when there
    /// is none and the deadline had passed at the first look (a try), `Timeout` when it passed
    /// while waiting.
    fn await_room(&self, state: &mut MutexGuard<'_, State>, len: usize, deadline: Option<Instant>) -> Result<()> {
        let mut waited = false;
        loop {
            match self.check_room(state, len) {
                Err(Error::WouldBlock(why)) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(if waited { Error::Timeout(why) } else { Error::WouldBlock(why) });
                    }
                    self.session.wait(state, false, deadline);
                    waited = true;
                }
                other => return other,
            }
        }
    }

    /// Publishes `entry`, waiting for room up to `deadline`.
    fn send_entry(&mut self, entry: Entry, deadline: Option<Instant>) -> Result<u64> {
        let mut state = self.session.lock();
        self.await_room(&mut state, entry.len, deadline)?;
        Ok(self.session.publish(state, entry))
    }
}

impl ProducerTransport for LoopbackProducer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn max_message_len(&self) -> usize {
        self.session.max_len
    }

    fn has_room_for(&mut self, len: usize) -> Result<bool> {
        match self.check_room(&self.session.lock(), len) {
            Ok(()) => Ok(true),
            Err(Error::WouldBlock(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn peer(&self) -> Peer {
        let gone = self.session.lock().consumer_closed;
        self.session.peer(gone)
    }

    fn try_loan(&mut self, len: usize) -> Result<RawLoan> {
        self.check_room(&self.session.lock(), len)?;
        self.loans += 1;
        let mut room = vec![0u8; len].into_boxed_slice();
        let loan = RawLoan { ptr: room.as_mut_ptr(), len, token: self.loans };
        self.loan = Some((self.loans, room));
        Ok(loan)
    }

    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        match self.await_room(&mut self.session.lock(), len, deadline) {
            Err(Error::WouldBlock(why)) => Err(Error::Timeout(why)),
            other => other,
        }
    }

    unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        let Some((token, mut room)) = self.loan.take() else {
            return Err(Error::invalid("this loan is not outstanding (published or cancelled already)"));
        };
        if token != loan.token || room.as_mut_ptr() != loan.ptr || len == 0 || len > room.len() {
            let lent = room.len();
            self.loan = Some((token, room));
            return Err(Error::invalid(format!(
                "loan {} is not this channel's outstanding loan, or {len} bytes is not 1 to its {lent}",
                loan.token
            )));
        }
        let state = self.session.lock();
        if state.consumer_closed {
            return Err(self.gone());
        }
        // (The loan was lent with room, which only grows while it is out.)
        Ok(self.session.publish(state, Entry::new(Bytes::Owned(room), len, 0)))
    }

    unsafe fn cancel(&mut self, loan: RawLoan) {
        if self.loan.as_ref().is_some_and(|(token, _)| *token == loan.token) {
            self.loan = None;
        }
    }

    unsafe fn publish_filled(
        &mut self,
        loan: RawLoan,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64> {
        let filled = match self.loan.as_mut() {
            Some((token, room)) if *token == loan.token && len <= room.len() => fill(0, &mut room[..len]),
            _ => return Err(Error::invalid(format!("loan {} is not this channel's outstanding loan", loan.token))),
        };
        if let Err(e) = filled {
            self.loan = None;
            return Err(e);
        }
        // SAFETY: the loan is this producer's outstanding one (checked above); publish checks again.
        unsafe { self.publish(loan, len) }
    }

    fn completed(&mut self) -> Result<u64> {
        self.completed = self.session.released_below();
        Ok(self.completed)
    }

    fn completed_hint(&self) -> u64 {
        self.completed
    }

    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        let mut state = self.session.lock();
        if seq >= state.head {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.session.name)));
        }
        loop {
            if state.reclaimed > seq {
                self.completed = state.reclaimed;
                return Ok(());
            }
            if state.consumer_closed {
                return Err(self.gone());
            }
            if !self.session.wait(&mut state, false, deadline) {
                return Err(Error::Timeout(format!(
                    "message {seq} of channel {:?} was not released before the deadline",
                    self.session.name
                )));
            }
        }
    }

    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        if offset.checked_add(len).map_or(true, |end| end > region.arena_len()) {
            return Err(Error::invalid(format!(
                "{len} bytes at offset {offset} do not lie in the region of {} bytes",
                region.arena_len()
            )));
        }
        // SAFETY: offset + len <= the region's length (checked above), which `base` maps from
        // byte 0 (SharedRegion's contract); `keep_alive` keeps it mapped until the release.
        let ptr = unsafe { region.base().add(offset) };
        let entry = Entry::new(Bytes::Region { ptr, _keep: region.keep_alive() }, len, RawView::ZERO_COPY);
        self.send_entry(entry, deadline)
    }

    fn send_routed(
        &mut self,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Attachment>,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        let mut state = self.session.lock();
        self.await_room(&mut state, descriptor.len(), deadline)?;
        // The attachments go first, in order, taken only now that the message has room.
        state.attachments.append(attachments);
        let entry = Entry::new(Bytes::Owned(descriptor.into()), descriptor.len(), RawView::routed_flags(route));
        Ok(self.session.publish(state, entry))
    }

    fn peer_sections(&mut self) -> Vec<Attachment> {
        std::mem::take(&mut self.answers)
    }
}

impl Drop for LoopbackProducer {
    fn drop(&mut self) {
        self.session.close_producer();
        if !self.met {
            return;
        }
        leave(&self.session.name, self.kind, Some(self.session.slot));
    }
}

/// The producer's place at the consumer of `m`: refused if the consumer is of another kind, or
/// a full fan-in; else slot 0 of a pair or the lowest free slot of a fan-in, taken.
fn take_place(m: &mut Meeting, name: &str, kind: ChannelKind) -> Result<u32> {
    let slot = match kind {
        ChannelKind::FanIn => (!m.slots).trailing_zeros().min(MAX_PEERS),
        _ => 0,
    };
    check_producer_place(name, m.consumer_kind, m.max_peers, kind, slot)?;
    if kind == ChannelKind::FanIn {
        m.slots |= 1 << slot;
    }
    Ok(slot)
}

/// Lets go of the producer's claim on `name`: a pair's, or a fan-in's `slot` where it took one.
fn leave(name: &str, kind: ChannelKind, slot: Option<u32>) {
    with_meeting(name, |m| match (kind, slot) {
        (ChannelKind::FanIn, Some(slot)) => m.slots &= !(1 << slot),
        (ChannelKind::FanIn, None) => {}
        _ => m.producer_live = false,
    });
}

/// The config's capacity, which a loopback session's ring takes: a power of two from 2 to 2^20.
pub(super) fn checked_capacity(config: &ChannelConfig) -> Result<u64> {
    let capacity = u64::from(config.capacity);
    if !(2..=1 << 20).contains(&capacity) || !capacity.is_power_of_two() {
        return Err(Error::invalid(format!("capacity {capacity} must be a power of two from 2 to 2^20")));
    }
    Ok(capacity)
}

/// A new session's id, unique in this process.
pub(super) fn session_id() -> u64 {
    static SESSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
