//! A fan-out's producer: one ring per consumer, each message published to every consumer
//! attached when it was sent. Consumers connect to the producer's socket (it listens in a
//! fan-out) and are met as a pair's producer meets its consumer, over that connection, by a
//! thread of the producer's (so that a consumer attaches while the producer is busy elsewhere);
//! the producer takes the rings it made up at its next send (one relaxed load per send).
//!
//! Sequence numbers are the fan-out's own: consumer `c`'s ring holds messages `base_c ..` in
//! its own numbering from 0, so a message is complete once every ring that got it released
//! it. Copied bytes are copied into each ring; a buffer sent by reference is one memory that
//! every consumer maps.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::handshake::Place;
use super::producer::ShmProducer;
use super::rendezvous::{self, End, EndLock, Listener};
use super::ring::Geometry;
use crate::channels::peers::{ChannelKind, Peer, PeerState};
use crate::channels::transport::{Attachment, PeerHolds, ProducerTransport, RawLoan, SharedRegion, TransportInfo};
use crate::channels::ChannelConfig;
use crate::error::{Error, Result};
use crate::os::eventfd::{eventfd, eventfd_signal, poll, PollFd, PollFlags};

/// One consumer's ring.
struct Out {
    ring: ShmProducer,
    /// The fan-out's sequence number of the ring's first message.
    base: u64,
    /// Since when the producer has found no room in this ring (across calls), while it has not.
    blocked: Option<Instant>,
}

impl Out {
    /// When this consumer, out of room now, passes the slow-consumer `bound` (`None`: no
    /// bound); the first call without room starts its clock.
    fn blocked_since(&mut self, bound: Option<Duration>) -> Option<Instant> {
        let bound = bound?;
        Some(*self.blocked.get_or_insert_with(Instant::now) + bound)
    }
}

/// The producer of a fan-out over shared memory.
pub(crate) struct ShmFanOut {
    info: TransportInfo,
    name: String,
    config: ChannelConfig,
    /// The largest message: each ring's pool.
    max_len: usize,
    /// The consumers the acceptor met, and the slots taken.
    arrivals: Arc<Arrivals>,
    /// Stops the acceptor, which owns the socket consumers connect to.
    acceptor: Option<(OwnedFd, std::thread::JoinHandle<()>)>,
    _lock: EndLock,
    outs: Vec<Option<Out>>,
    /// The next message's sequence number.
    next: u64,
    /// A loan's bytes, copied into every ring at its publish.
    staging: Vec<u8>,
    loaned: Option<u64>,
}

/// What the acceptor thread hands the producer.
struct Arrivals {
    /// Consumers met, by slot, not taken up yet.
    met: Mutex<Vec<(usize, ShmProducer)>>,
    /// Something waits in `met`.
    waiting: AtomicBool,
    /// Whether each slot is taken (by a ring, or a consumer met).
    taken: Mutex<Vec<bool>>,
}

// SAFETY: the rings are Send (see ShmProducer); the staging buffer is owned.
unsafe impl Send for ShmFanOut {}

impl ShmFanOut {
    /// Listens on `name` as a fan-out's producer and waits (up to the config's rendezvous
    /// timeout) for its first consumer.
    pub(crate) fn listen(name: &str, info: TransportInfo, config: &ChannelConfig) -> Result<ShmFanOut> {
        // Every ring's shape, checked before anyone is met.
        let geometry = Geometry::new(config.capacity, config.pool_size as u64)?;
        let lock = match EndLock::take(name, End::Producer)? {
            Ok(lock) => lock,
            Err(pid) => {
                return Err(Error::InvalidState(format!(
                    "channel {name:?} already has a live producer{}; a fan-out has one producer: close that one \
                     first, or use another channel name",
                    rendezvous::holder(pid)
                )))
            }
        };
        let listener = Listener::bind(name)?;
        let arrivals = Arc::new(Arrivals {
            met: Mutex::new(Vec::new()),
            waiting: AtomicBool::new(false),
            taken: Mutex::new(vec![false; config.max_peers as usize]),
        });
        let stop = eventfd()?;
        let acceptor = {
            let (name, info, config) = (name.to_owned(), info.clone(), config.clone());
            let (arrivals, stop) = (Arc::clone(&arrivals), stop.try_clone().map_err(|e| Error::os("eventfd", e))?);
            std::thread::Builder::new()
                .name("lava-flow-fan-out".into())
                .spawn(move || accept_consumers(listener, &name, &info, &config, &arrivals, &stop))
                .map_err(|e| Error::os("starting the fan-out's acceptor thread", e))?
        };
        let mut fan_out = ShmFanOut {
            info,
            name: name.to_owned(),
            config: config.clone(),
            max_len: geometry.pool_size as usize,
            arrivals,
            acceptor: Some((stop, acceptor)),
            _lock: lock,
            outs: (0..config.max_peers).map(|_| None).collect(),
            next: 0,
            staging: Vec::new(),
            loaned: None,
        };
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        loop {
            fan_out.take_up();
            if fan_out.attached() > 0 {
                return Ok(fan_out);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout(format!("no consumer of fan-out channel {name:?} connected in time")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn attached(&self) -> usize {
        self.outs.iter().flatten().count()
    }

    /// Takes up the consumers the acceptor met: each receives from the next message on.
    #[inline]
    fn take_up(&mut self) {
        if !self.arrivals.waiting.load(Ordering::Relaxed) {
            return;
        }
        self.arrivals.waiting.store(false, Ordering::Relaxed);
        let met = std::mem::take(&mut *self.arrivals.met.lock());
        for (slot, ring) in met {
            log::info!(
                "channel {:?} (fan-out producer): consumer pid {} attached in slot {slot}; it receives from message {} \
                 on",
                self.name,
                ring.consumer_pid(),
                self.next
            );
            self.outs[slot] = Some(Out { ring, base: self.next, blocked: None });
        }
    }

    /// Drops consumer `slot`: it has gone (`why`), or was too slow for its bound.
    fn drop_out(&mut self, slot: usize, why: &Error, detach: bool) {
        let Some(out) = self.outs[slot].take() else { return };
        self.arrivals.taken.lock()[slot] = false;
        if detach {
            log::warn!(
                "channel {:?} (fan-out producer): detached the consumer in slot {slot} (pid {}): it kept the producer \
                 waiting longer than slow_consumer_timeout",
                self.name,
                out.ring.consumer_pid()
            );
            out.ring.detach();
        } else {
            log::info!("channel {:?} (fan-out producer): the consumer in slot {slot} has gone: {why}", self.name);
        }
    }

    /// Waits until every consumer has room for a message of `len` bytes, up to `deadline`;
    /// a consumer that has gone is dropped, one slower than the slow-consumer bound detached.
    fn wait_for_rooms(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            let slow = out.blocked_since(self.config.slow_consumer_timeout);
            let until = match (deadline, slow) {
                (Some(d), Some(s)) => Some(d.min(s)),
                (d, s) => d.or(s),
            };
            let waited = match out.ring.has_room(len) {
                Ok(true) => {
                    out.blocked = None;
                    continue;
                }
                Ok(false) => out.ring.wait_for_room(len, until),
                Err(e) => Err(e),
            };
            match waited {
                Ok(()) => out.blocked = None,
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e @ Error::Timeout(_)) if slow.is_some() && until == slow => self.drop_out(slot, &e, true),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether every consumer has room now (consumers that have gone are dropped, and one
    /// that has had none for longer than the slow-consumer bound is detached).
    fn rooms_now(&mut self, len: usize) -> Result<bool> {
        let mut all = true;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            match out.ring.has_room(len) {
                Ok(true) => out.blocked = None,
                Ok(false) => match out.blocked_since(self.config.slow_consumer_timeout) {
                    Some(bound) if Instant::now() >= bound => {
                        let e = Error::Timeout(String::new());
                        self.drop_out(slot, &e, true);
                    }
                    _ => all = false,
                },
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    /// Publishes one message to every consumer with `send` (each has room), and numbers it.
    /// A failure before any consumer got the message is the caller's (a bad region, say) and
    /// is returned; a consumer that fails after others got it is dropped, so that every
    /// consumer left has every message.
    fn publish_each(&mut self, mut send: impl FnMut(&mut ShmProducer) -> Result<u64>) -> Result<u64> {
        let mut published = false;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            match send(&mut out.ring) {
                Ok(_) => published = true,
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) if !published => return Err(e),
                Err(e) => {
                    log::warn!(
                        "channel {:?} (fan-out producer): dropping the consumer in slot {slot}, which could not take \
                         a message the others have: {e}",
                        self.name
                    );
                    self.drop_out(slot, &e, false);
                }
            }
        }
        let seq = self.next;
        self.next += 1;
        Ok(seq)
    }

    fn would_block(&self, len: usize) -> Error {
        Error::WouldBlock(format!("a consumer of fan-out channel {:?} has no room for {len} bytes now", self.name))
    }

    /// The consumers, slot by slot (those met and not yet taken up included).
    pub(crate) fn peers(&self) -> Vec<Peer> {
        let alive = |slot: usize, ring: &ShmProducer| Peer {
            slot: slot as u32,
            state: PeerState::Alive,
            pid: ring.consumer_pid(),
            rank: None,
            host: String::new(),
            route: Some(super::ID.name()),
        };
        let mut peers: Vec<Peer> = self
            .outs
            .iter()
            .enumerate()
            .map(|(slot, out)| out.as_ref().map_or_else(|| Peer::free(slot as u32), |o| alive(slot, &o.ring)))
            .collect();
        for (slot, ring) in self.arrivals.met.lock().iter() {
            peers[*slot] = alive(*slot, ring);
        }
        peers
    }
}

impl ProducerTransport for ShmFanOut {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn max_message_len(&self) -> usize {
        self.max_len
    }

    fn try_loan(&mut self, len: usize) -> Result<RawLoan> {
        if len == 0 || len > self.max_len {
            return Err(Error::invalid(format!(
                "a message of {len} bytes does not fit fan-out channel {:?}: 1 to {} bytes (its pool_size)",
                self.name, self.max_len
            )));
        }
        self.take_up();
        if !self.rooms_now(len)? {
            return Err(self.would_block(len));
        }
        self.staging.resize(len, 0);
        self.loaned = Some(self.next);
        Ok(RawLoan { ptr: self.staging.as_mut_ptr(), len, token: self.next })
    }

    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        self.wait_for_rooms(len, deadline)?;
        if !self.rooms_now(len)? {
            return Err(Error::Timeout(format!(
                "a consumer of fan-out channel {:?} had no room for {len} bytes before the deadline",
                self.name
            )));
        }
        Ok(())
    }

    unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        if self.loaned != Some(loan.token) || loan.ptr != self.staging.as_mut_ptr() || len == 0 || len > loan.len {
            return Err(Error::InvalidState(format!(
                "fan-out channel {:?}: publish of a loan that is not the outstanding one, or of {len} bytes",
                self.name
            )));
        }
        self.loaned = None;
        // Every ring had room when the loan was made, and only this producer takes room.
        let staging = std::mem::take(&mut self.staging);
        let bytes = &staging[..len];
        let published = self.publish_each(|ring| {
            // The ring's own inlined copy where it can; else a loan, as any sender's.
            if let Some(seq) = ring.send_fast(bytes) {
                return Ok(seq);
            }
            let room = ring.try_loan(len)?;
            // SAFETY: the ring's loan is `len` writable bytes of its region that nothing else
            // touches until published; `bytes` is the fan-out's own buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), room.ptr, len) };
            // SAFETY: the ring's outstanding loan, just made.
            unsafe { ring.publish(room, len) }
        });
        self.staging = staging;
        published
    }

    unsafe fn cancel(&mut self, loan: RawLoan) {
        if self.loaned == Some(loan.token) {
            self.loaned = None;
        }
    }

    fn completed(&mut self) -> Result<u64> {
        let mut done = self.next;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            match out.ring.completed() {
                Ok(c) if c < out.ring.sent() => done = done.min(out.base + c),
                Ok(_) => {}
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn completed_hint(&self) -> u64 {
        self.outs
            .iter()
            .flatten()
            .filter(|o| o.ring.completed_hint() < o.ring.sent())
            .map(|o| o.base + o.ring.completed_hint())
            .min()
            .unwrap_or(self.next)
    }

    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        if seq >= self.next {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.name)));
        }
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            if seq < out.base {
                continue;
            }
            match out.ring.wait_completed(seq - out.base, deadline) {
                Ok(()) => {}
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        self.take_up();
        // A buffer send takes a slot and no pool room: room for one byte is that.
        self.wait_for_room(1, deadline)?;
        self.publish_each(|ring| ring.try_send_region(region, offset, len))
    }

    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        self.take_up();
        if !self.rooms_now(1)? {
            return Err(self.would_block(len));
        }
        self.publish_each(|ring| ring.try_send_region(region, offset, len))
    }

    fn send_routed(
        &mut self,
        _route: u32,
        _descriptor: &[u8],
        _attachments: &mut Vec<Attachment>,
        _deadline: Option<Instant>,
    ) -> Result<u64> {
        Err(Error::Unsupported(format!(
            "fan-out channel {:?}: GPU buffers go by reference on pair channels only in this version",
            self.name
        )))
    }

    fn peer_sections(&mut self) -> Vec<Attachment> {
        Vec::new()
    }

    fn arenas_sent(&self) -> u64 {
        self.outs.iter().flatten().map(|o| o.ring.arenas_sent()).sum()
    }

    fn peer_holds(&self) -> Option<std::sync::Arc<PeerHolds>> {
        None
    }
}

impl Drop for ShmFanOut {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.acceptor.take() {
            eventfd_signal(stop.as_fd());
            let _ = thread.join();
        }
    }
}

/// The acceptor thread: meets each consumer that connects, in the lowest free slot (one past
/// `max_peers` is refused, saying so), until `stop` is signalled; then closes the socket.
fn accept_consumers(
    mut listener: Listener,
    name: &str,
    info: &TransportInfo,
    config: &ChannelConfig,
    arrivals: &Arrivals,
    stop: &OwnedFd,
) {
    loop {
        let mut fds = [PollFd::new(stop, PollFlags::IN), PollFd::from_borrowed_fd(listener.as_fd(), PollFlags::IN)];
        if poll(&mut fds, None).is_err() || !fds[0].revents().is_empty() {
            break;
        }
        let mut refused = Vec::new();
        let Ok(Some((sock, cred))) = listener.accept(Some(Instant::now()), &mut refused, name) else { continue };
        let slot = {
            let mut taken = arrivals.taken.lock();
            let slot = taken.iter().position(|t| !t);
            if let Some(slot) = slot {
                taken[slot] = true;
            }
            slot
        };
        let Some(slot) = slot else {
            let why = format!(
                "fan-out channel {name:?} is full: it takes max_peers = {} consumers and all of them are attached; \
                 wait for one to close, or create the producer with a larger max_peers",
                config.max_peers
            );
            let _ = rendezvous::send_ack(&sock, rendezvous::ACK_REFUSED, &why, &[]);
            continue;
        };
        let place = Place { kind: ChannelKind::FanOut, slot: slot as u32 };
        match ShmProducer::accepted(name, sock, cred, info.clone(), config, place) {
            Ok(ring) => {
                arrivals.met.lock().push((slot, ring));
                arrivals.waiting.store(true, Ordering::Release);
            }
            Err(e) => {
                arrivals.taken.lock()[slot] = false;
                log::warn!("channel {name:?} (fan-out producer): a consumer failed to attach: {e}");
            }
        }
    }
    listener.close();
}
