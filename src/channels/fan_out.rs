//! A fan-out's producer: one pair-like producer end per consumer slot, each message published to
//! every consumer attached when it was sent. The carriers' acceptors meet consumers on threads
//! of their own and hand each over in its slot (`Arrivals`); the producer takes them up at its
//! next send (one relaxed load per send).
//!
//! Sequence numbers are the fan-out's own: consumer `c`'s end holds messages `base_c ..` in its
//! own numbering from 0, so a message is complete once every end that got it released it.
//! Copied bytes are copied into each consumer's end. A buffer sent by reference is one memory
//! that every consumer maps: a CPU buffer's arena goes through each consumer's carrier once, a
//! GPU buffer is packed once per consumer by that consumer's own route (each consumer imports
//! the arena on its own device), or staged through that consumer's carrier where its device
//! differs. What a consumer's routes keep alive for it goes back when it dies (`PeerHolds`,
//! one per consumer's end).

use crate::os::OwnedHandle;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deadline_after;
use super::peers::{Arrivals, Peer};
use super::routes::SenderTable;
use super::transport::{
    MemoryKind, Packed, Payload, PayloadClass, PayloadMemory, ProducerTransport, RawLoan, Route, RouteSender,
    SharedRegion, TransportInfo,
};
use super::transports::{AnyProducer, AnyRouteSender, Arrival, FanOutListeners, FanOutParts};
use super::wait::Waiter;
use super::{ChannelConfig, WaitStrategy};
use crate::error::{Error, Result};

/// How long [`FanOut::poll_completed`] polls every consumer at once.
const POLL_ALL: Duration = Duration::from_micros(100);

/// One consumer's end.
struct Out {
    carrier: AnyProducer,
    /// The routes this consumer accepted: its own imports of the producer's GPU arenas.
    routes: SenderTable<AnyRouteSender>,
    /// This consumer's routed messages are packed here (attachments that did not go out wait
    /// for its next).
    packed: Packed,
    /// The fan-out's sequence number of this consumer's first message.
    base: u64,
    /// Since when the producer has found no room here (across calls), while it has not.
    blocked: Option<Instant>,
    /// The carrier's and routes' report, as a pair's producer has it.
    info: TransportInfo,
}

impl Out {
    /// When this consumer, out of room now, passes the slow-consumer `bound` (`None`: no
    /// bound); the first call without room starts its clock.
    fn blocked_since(&mut self, bound: Option<Duration>) -> Option<Instant> {
        let bound = bound?;
        Some(*self.blocked.get_or_insert_with(Instant::now) + bound)
    }

    /// Whether a route carries memory of `kind` to this consumer (else it is staged).
    fn routes_kind(&self, kind: MemoryKind) -> bool {
        self.routes.get(kind).is_some()
    }

    /// The room a payload takes in this consumer's carrier: a descriptor's slot where a route
    /// carries it, its bytes where they are staged.
    fn room_for(&self, payload: &Payload<'_>) -> usize {
        if self.routes_kind(payload.kind) {
            1
        } else {
            payload.len
        }
    }

    /// Packs `payload` for this consumer's route, where one carries it (staged payloads are
    /// copied at publish). Every consumer's descriptor is packed before any is published, so
    /// that the consumers' messages go out back to back.
    fn pack(&mut self, payload: &Payload<'_>) -> Result<()> {
        match self.routes.for_kind(payload.kind) {
            Some(route) => route.pack(payload, self.carrier.completed_hint(), &mut self.packed),
            None => Ok(()),
        }
    }

    /// Sends `payload` to this consumer (its carrier has room): its descriptor, packed by
    /// [`pack`](Self::pack), or its bytes staged. `passed`: a deadline already past, so that
    /// nothing waits (nor reads the clock) here.
    fn send_packed(&mut self, payload: &Payload<'_>, passed: Instant) -> Result<u64> {
        let Some(route) = self.routes.for_kind(payload.kind) else { return self.send_staged(payload) };
        let packed = &mut self.packed;
        let descriptor = &packed.descriptor[..packed.descriptor_len];
        // The fan-out waited for room: none is waited for here.
        let seq = self.carrier.send_routed(route.route_id(), descriptor, &mut packed.attachments, Some(passed))?;
        route.sent(seq);
        Ok(seq)
    }

    /// Copies a buffer's bytes into this consumer's carrier (it gets host memory).
    fn send_staged(&mut self, payload: &Payload<'_>) -> Result<u64> {
        let PayloadMemory::Buffer(buffer) = payload.memory else {
            return Err(Error::Unsupported(format!("only lava-flow buffers can be staged, not {}", payload.kind)));
        };
        let (offset, len) = (payload.offset, payload.len);
        let loan = self.carrier.try_loan(len)?;
        // SAFETY: the loan was just lent by this carrier and is outstanding.
        unsafe { self.carrier.publish_filled(loan, len, &mut |start, piece| buffer.read_at(offset + start, piece)) }
    }

    /// How this consumer gets GPU buffers, from its report.
    fn gpu_route(&self) -> Option<&Route> {
        self.info.routes.iter().find(|r| r.class == PayloadClass::Gpu)
    }
}

/// A consumer, for the log: its pid on this host, or its MPI rank.
fn who(peer: &Peer) -> String {
    match peer.rank {
        Some(rank) => format!("at MPI rank {rank}"),
        None => format!("pid {}", peer.pid),
    }
}

/// The producer's side of a fan-out.
pub(super) struct FanOut {
    /// Where consumers are met (dropped first: nobody is met while the fan-out closes).
    _listeners: FanOutListeners,
    name: String,
    slow_consumer_timeout: Option<Duration>,
    /// How the producer waits for its consumers' releases.
    wait: WaitStrategy,
    /// The largest message: each consumer's pool.
    max_len: usize,
    /// The consumers met and not taken up yet, and the slot table.
    arrivals: Arc<Arrivals<Arrival>>,
    outs: Vec<Option<Out>>,
    /// The next message's sequence number.
    next: u64,
    /// A loan's bytes, copied into every consumer's end at its publish.
    staging: Vec<u8>,
    loaned: Option<u64>,
    /// The carrier and GPU route, over every consumer (the plan's until the first came).
    info: TransportInfo,
    /// When the fan-out was made: a deadline always past, for sends to consumers that have
    /// room (no clock read per consumer and message).
    made: Instant,
    /// The carriers consumers come over, for the carrier's reason (empty where one).
    listening: String,
}

impl FanOut {
    /// The fan-out of `parts`, once its first consumer attached (waiting for it up to the
    /// config's rendezvous timeout).
    pub(super) fn new(name: &str, config: &ChannelConfig, parts: FanOutParts) -> Result<FanOut> {
        let mut fan_out = FanOut {
            _listeners: parts.listeners,
            name: name.to_owned(),
            slow_consumer_timeout: config.slow_consumer_timeout,
            wait: config.wait,
            max_len: parts.max_len,
            arrivals: parts.arrivals,
            outs: (0..config.max_peers).map(|_| None).collect(),
            next: 0,
            staging: Vec::new(),
            loaned: None,
            info: parts.info,
            made: Instant::now(),
            listening: parts.listening,
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

    pub(super) fn info(&self) -> &TransportInfo {
        &self.info
    }

    pub(super) fn max_message_len(&self) -> usize {
        self.max_len
    }

    fn attached(&self) -> usize {
        self.outs.iter().flatten().count()
    }

    /// Takes up the consumers met since the last send: each receives from the next message on.
    #[inline]
    fn take_up(&mut self) {
        if let Some(met) = self.arrivals.take() {
            self.take_up_met(met);
        }
    }

    #[cold]
    fn take_up_met(&mut self, met: Vec<(usize, Arrival)>) {
        if met.is_empty() {
            return;
        }
        for (slot, mut arrival) in met {
            let Some(entry) = self.outs.get_mut(slot) else { continue };
            log::info!(
                "channel {:?} (fan-out producer): consumer {} attached in slot {slot}; it receives from message {} on \
                 ({})",
                self.name,
                who(&arrival.carrier.peer()),
                self.next,
                arrival.info.names()
            );
            let routes = SenderTable::new(arrival.routes);
            routes.report_into(&mut arrival.info);
            *entry = Some(Out {
                carrier: arrival.carrier,
                routes,
                packed: Packed::default(),
                base: self.next,
                blocked: None,
                info: arrival.info,
            });
        }
        self.refresh_info();
    }

    /// The report over every consumer: the carrier, and GPU buffers by reference where any
    /// consumer takes them so (naming the consumers they are staged to), else staged.
    fn refresh_info(&mut self) {
        let mut carrier: Option<Route> = None;
        let mut by_reference: Option<Route> = None;
        let mut staged: Vec<(usize, Route)> = Vec::new();
        for (slot, out) in self.outs.iter().enumerate() {
            let Some(out) = out else { continue };
            let Some(own) = out.info.routes.first() else { continue };
            carrier.get_or_insert_with(|| own.clone());
            match out.gpu_route() {
                Some(gpu) if gpu.kind != own.kind => {
                    by_reference.get_or_insert_with(|| gpu.clone());
                }
                Some(gpu) => staged.push((slot, gpu.clone())),
                None => {}
            }
        }
        let Some(mut carrier) = carrier else { return };
        if !carrier.reason.ends_with(&self.listening) {
            carrier.reason.push_str(&self.listening);
        }
        let gpu = match by_reference {
            Some(mut route) => {
                for (slot, why) in &staged {
                    route.reason.push_str(&format!("; to the consumer in slot {slot}: {}", why.reason));
                }
                Some(route)
            }
            None => staged.into_iter().next().map(|(_, route)| route),
        };
        self.info = TransportInfo::new(std::iter::once(carrier).chain(gpu).collect());
    }

    /// Drops consumer `slot`: it has gone (`why`), or was too slow for its bound (`detach`).
    fn drop_out(&mut self, slot: usize, why: &Error, detach: bool) {
        let Some(mut out) = self.outs[slot].take() else { return };
        self.arrivals.free(slot);
        if detach {
            log::warn!(
                "channel {:?} (fan-out producer): detached the consumer in slot {slot} ({}): it kept the producer \
                 waiting longer than slow_consumer_timeout",
                self.name,
                who(&out.carrier.peer())
            );
            out.carrier.detach();
        } else {
            log::info!("channel {:?} (fan-out producer): the consumer in slot {slot} has gone: {why}", self.name);
        }
        // What its routes held for it (GPU arenas it may have read) goes back with its end.
        drop(out);
        self.refresh_info();
    }

    /// Waits until every consumer has the room `need` says, up to `deadline`; a consumer that
    /// has gone is dropped, one slower than the slow-consumer bound detached.
    fn wait_for_rooms(&mut self, need: impl Fn(&Out) -> usize, deadline: Option<Instant>) -> Result<()> {
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            let len = need(out);
            let slow = out.blocked_since(self.slow_consumer_timeout);
            let until = match (deadline, slow) {
                (Some(d), Some(s)) => Some(d.min(s)),
                (d, s) => d.or(s),
            };
            let waited = match out.carrier.has_room_for(len) {
                Ok(true) => {
                    out.blocked = None;
                    continue;
                }
                Ok(false) => out.carrier.wait_for_room(len, until),
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

    /// Whether every consumer has the room `need` says now (consumers that have gone are
    /// dropped, and one that has had none for longer than the slow-consumer bound detached).
    fn rooms_now(&mut self, need: impl Fn(&Out) -> usize) -> Result<bool> {
        let mut all = true;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            let len = need(out);
            match out.carrier.has_room_for(len) {
                Ok(true) => out.blocked = None,
                Ok(false) => match out.blocked_since(self.slow_consumer_timeout) {
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

    /// Takes up the consumers met, and waits until every consumer has the room `need` says:
    /// `timeout` zero, not at all (`WouldBlock`); `None`, as long as needed; else `Timeout`
    /// after it.
    fn make_room(&mut self, need: impl Fn(&Out) -> usize + Copy, len: usize, timeout: Option<Duration>) -> Result<()> {
        self.take_up();
        if self.rooms_now(need)? {
            return Ok(());
        }
        if timeout == Some(Duration::ZERO) {
            return Err(Error::WouldBlock(format!(
                "a consumer of fan-out channel {:?} has no room for {len} bytes now",
                self.name
            )));
        }
        self.wait_for_rooms(need, deadline_after(timeout))?;
        if !self.rooms_now(need)? {
            return Err(Error::Timeout(format!(
                "a consumer of fan-out channel {:?} had no room for {len} bytes before the deadline",
                self.name
            )));
        }
        Ok(())
    }

    /// Asks for every consumer's next slot at once: each is a line its consumer last read, and
    /// they then come in parallel rather than one after the other as each is written.
    fn prefetch_publish(&self) {
        for out in self.outs.iter().flatten() {
            out.carrier.prefetch_publish();
        }
    }

    /// Drops consumer `slot`, which failed (`why`) to take a message that others have.
    #[cold]
    fn drop_failed(&mut self, slot: usize, why: &Error) {
        log::warn!(
            "channel {:?} (fan-out producer): dropping the consumer in slot {slot}, which could not take a message \
             the others have: {why}",
            self.name
        );
        self.drop_out(slot, why, false);
    }

    /// Publishes one message to every consumer with `send` (each has room), and numbers it.
    /// A failure before any consumer got the message is the caller's (a bad region, say) and
    /// is returned; a consumer that fails after others got it is dropped, so that every
    /// consumer left has every message.
    fn publish_each(&mut self, mut send: impl FnMut(&mut Out) -> Result<u64>) -> Result<u64> {
        let mut published = false;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            match send(out) {
                Ok(_) => published = true,
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) if !published => return Err(e),
                Err(e) => self.drop_failed(slot, &e),
            }
        }
        let seq = self.next;
        self.next += 1;
        Ok(seq)
    }

    /// The consumers, slot by slot (those met and not yet taken up included).
    pub(super) fn peers(&self) -> Vec<Peer> {
        let mut peers: Vec<Peer> = self
            .outs
            .iter()
            .enumerate()
            .map(|(slot, out)| match out {
                Some(out) => Peer { slot: slot as u32, ..out.carrier.peer() },
                None => Peer::free(slot as u32),
            })
            .collect();
        self.arrivals.each_met(|slot, arrival| {
            if let Some(peer) = peers.get_mut(slot) {
                *peer = Peer { slot: slot as u32, ..arrival.carrier.peer() };
            }
        });
        peers
    }

    /// Lends room for a message of `len` bytes, once every consumer has it (waiting up to
    /// `timeout`, as [`make_room`](Self::make_room)).
    pub(super) fn loan(&mut self, len: usize, timeout: Option<Duration>) -> Result<RawLoan> {
        if len == 0 || len > self.max_len {
            return Err(Error::invalid(format!(
                "a message of {len} bytes does not fit fan-out channel {:?}: 1 to {} bytes (its pool_size)",
                self.name, self.max_len
            )));
        }
        self.make_room(|_| len, len, timeout)?;
        self.staging.resize(len, 0);
        self.loaned = Some(self.next);
        Ok(RawLoan { ptr: self.staging.as_mut_ptr(), len, token: self.next })
    }

    /// Publishes the first `len` bytes of `loan` to every consumer.
    ///
    /// # Safety
    /// `loan` is this fan-out's outstanding loan, and nothing writes its bytes any more.
    pub(super) unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        if self.loaned != Some(loan.token) || loan.ptr != self.staging.as_mut_ptr() || len == 0 || len > loan.len {
            return Err(Error::InvalidState(format!(
                "fan-out channel {:?}: publish of a loan that is not the outstanding one, or of {len} bytes",
                self.name
            )));
        }
        self.loaned = None;
        self.prefetch_publish();
        // Every consumer had room when the loan was made, and only this producer takes room.
        let staging = std::mem::take(&mut self.staging);
        let bytes = &staging[..len];
        let published = self.publish_each(|out| {
            // The carrier's own inlined copy where it can; else a loan, as any sender's.
            if let Some(seq) = out.carrier.send_fast(bytes) {
                return Ok(seq);
            }
            let room = out.carrier.try_loan(len)?;
            // SAFETY: the carrier's loan is `len` writable bytes that nothing else touches
            // until published; `bytes` is the fan-out's own buffer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), room.ptr, len) };
            // SAFETY: the carrier's outstanding loan, just made.
            unsafe { out.carrier.publish(room, len) }
        });
        self.staging = staging;
        published
    }

    /// Gives the outstanding loan back unpublished (another loan is ignored).
    pub(super) fn cancel(&mut self, loan: &RawLoan) {
        if self.loaned == Some(loan.token) {
            self.loaned = None;
        }
    }

    /// How many messages every consumer that got them released.
    pub(super) fn completed(&mut self) -> Result<u64> {
        let mut done = self.next;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            let sent = self.next - out.base;
            match out.carrier.completed() {
                Ok(c) if c < sent => done = done.min(out.base + c),
                Ok(_) => {}
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Waits until every consumer that got message `seq` released it (one that has gone is
    /// dropped instead).
    pub(super) fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        if seq >= self.next {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.name)));
        }
        if self.poll_completed(seq, deadline)? {
            return Ok(());
        }
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            if seq < out.base {
                continue;
            }
            match out.carrier.wait_completed(seq - out.base, deadline) {
                Ok(()) => {}
                Err(e @ Error::PeerGone(_)) => self.drop_out(slot, &e, false),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether every consumer that got message `seq` released it, polling them all at once
    /// while the wait strategy spins: consumers release in parallel, so the last release is
    /// then seen one line transfer after it is made, not one transfer per consumer after the
    /// first. `false` once spinning is over (the caller then waits consumer by consumer,
    /// which also watches for consumers that died).
    fn poll_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<bool> {
        let mut waiter = Waiter::new(self.wait, deadline);
        if !waiter.spins() {
            return Ok(false);
        }
        let mut polls = 0u32;
        let mut since: Option<Instant> = None;
        loop {
            if self.completed()? > seq {
                return Ok(true);
            }
            polls = polls.wrapping_add(1);
            // The clock every 64 polls. Past `POLL_ALL`, a release that long in coming is not
            // worth the polls: the wait consumer by consumer also watches their liveness.
            if polls % 64 == 0 {
                let now = Instant::now();
                let start = *since.get_or_insert(now);
                if !waiter.spinning(now) || waiter.timed_out(now) || now.duration_since(start) >= POLL_ALL {
                    return Ok(false);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Sends `len` bytes at `offset` of `region` by reference to every consumer: one memory,
    /// whose arena each consumer's carrier passes once.
    pub(super) fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        timeout: Option<Duration>,
    ) -> Result<u64> {
        self.prefetch_publish();
        // A buffer send takes a slot and no pool room: room for one byte is that.
        self.make_room(|_| 1, len, timeout)?;
        self.publish_each(|out| out.carrier.try_send_region(region, offset, len))
    }

    /// Sends `payload` to every consumer: by reference through each consumer's own route for
    /// its memory, or staged through the carrier to a consumer that no route serves.
    pub(super) fn send_payload(&mut self, payload: &Payload<'_>, timeout: Option<Duration>) -> Result<u64> {
        self.take_up();
        // What would fail at a staged consumer fails before anyone got the message.
        if let Some(staged) = self.outs.iter().flatten().find(|o| !o.routes_kind(payload.kind)) {
            let why = staged.gpu_route().map_or("", |r| r.reason.as_str());
            if payload.kind == MemoryKind::Cuda {
                return Err(Error::Unsupported(format!(
                    "fan-out channel {:?} has a consumer that cannot open CUDA memory, and copies none: {}",
                    self.name, staged.info.reason
                )));
            }
            if !matches!(payload.memory, PayloadMemory::Buffer(_)) {
                return Err(Error::Unsupported(format!(
                    "fan-out channel {:?} stages {} to a consumer, and only lava-flow buffers can be staged: {why}",
                    self.name, payload.kind
                )));
            }
            if payload.ready_value != 0 {
                return Err(Error::Unsupported(format!(
                    "fan-out channel {:?} stages GPU buffers through host memory to a consumer, so it cannot wait for \
                     a ready value: {why}",
                    self.name
                )));
            }
            if payload.len > self.max_len {
                return Err(Error::invalid(format!(
                    "a GPU buffer of {} bytes staged to a consumer does not fit fan-out channel {:?}: 1 to {} bytes \
                     (its pool_size)",
                    payload.len, self.name, self.max_len
                )));
            }
        }
        self.prefetch_publish();
        self.make_room(|out: &Out| out.room_for(payload), payload.len, timeout)?;
        // A payload no route can pack fails before anyone got it; a consumer whose own route
        // fails is dropped, as at publish.
        let mut packed_any = false;
        for slot in 0..self.outs.len() {
            let Some(out) = self.outs[slot].as_mut() else { continue };
            match out.pack(payload) {
                Ok(()) => packed_any = true,
                Err(e) if !packed_any => return Err(e),
                Err(e) => self.drop_failed(slot, &e),
            }
        }
        let passed = self.made;
        self.publish_each(|out| out.send_packed(payload, passed))
    }

    /// Whether any consumer takes memory of `kind` through a route (others get it staged).
    pub(super) fn serves(&mut self, kind: MemoryKind) -> bool {
        self.take_up();
        self.outs.iter().flatten().any(|o| o.routes_kind(kind))
    }

    /// A descriptor of the ready semaphore that every consumer's GPU route shares.
    pub(super) fn ready_semaphore(&self) -> Result<OwnedHandle> {
        match self.outs.iter().flatten().find_map(|o| o.routes.get(MemoryKind::Vulkan)) {
            Some(gpu) => gpu.ready_semaphore(),
            None => Err(Error::Unsupported(format!(
                "fan-out channel {:?} has no consumer with a GPU route: {}",
                self.name, self.info.reason
            ))),
        }
    }

    /// The arenas every consumer's carrier passed.
    pub(super) fn arenas_sent(&self) -> u64 {
        self.outs.iter().flatten().map(|o| o.carrier.arenas_sent()).sum()
    }
}
