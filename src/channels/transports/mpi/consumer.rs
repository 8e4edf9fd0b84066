//! The consumer half of an MPI channel: one producer's session (`MpiSession`), which reads
//! that producer's messages. The consumer's end that meets producers is `acceptor`'s.

use std::any::Any;
use std::collections::{BTreeSet, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use super::credits::{hold, Shared, State};
use super::watch::{Prober, Watch};
use super::{
    backoff, shape_refusal, tags_for, BufferPool, Header, Hello, Kind, StreamPos, Streams, Tags, CHUNK, CLOSE_DETACHED,
    FLAG_SPLIT,
};
use crate::channels::transport::{ConsumerSession, RawView, Release};
use crate::channels::{ChannelConfig, Peer, PeerState, WaitStrategy};
use crate::error::{Error, Result};
use crate::mpi::{register_duty, DutyRegistration, Endpoint, Request, ThreadLevel};
use crate::os::event;

/// The session of a pair's MPI consumer (a new producer does not attach to an MPI pair);
/// a fan-in's are numbered by its acceptor.
pub(super) const SESSION: u64 = 1;
/// Receives posted ahead for the producer's next messages: MPI puts a message straight into
/// one instead of holding it until asked for, and several in flight keep a window of
/// messages moving.
const LANDINGS: usize = 4;
/// Messages up to this long are copied out of their landing buffer (which is posted again);
/// longer ones keep it.
const COPY_OUT_MAX: usize = 16 << 10;

/// A message whose payload arrives in chunks: the receives of the chunks still due, newest
/// first, each with the length it must bring.
struct Partial {
    header: Header,
    buffer: Vec<u8>,
    requests: Vec<(Request, usize)>,
}

/// Probes for the producer's messages in a thread, so that a descriptor can say one waits.
struct Notifier {
    fd: Arc<OwnedFd>,
    probe: Arc<Probe>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What keeps the probing thread from making the descriptor readable for a message the
/// consumer has taken meanwhile: readable must mean that the next `try_recv` has something to
/// say.
#[derive(Default)]
struct Probe {
    /// Messages the consumer has taken off MPI's queue.
    taken: AtomicU64,
    /// Held while the thread signals, and while the consumer resets the descriptor.
    signalling: Mutex<()>,
}

/// What a fan-in's session holds for its producer while it is attached: its slot's claim
/// (the lock a same-host producer would take) and its rank's (one producer per rank). Let go
/// of once the producer's close is read.
pub(super) type Claims = Box<dyn Any + Send + Sync>;

/// Where a session's producer sits: a fan-in's slot and the claims held for it, and the
/// session's id; a fan-out's, where its stream started.
pub(super) struct Seat {
    pub(super) id: u64,
    pub(super) slot: u32,
    pub(super) claims: Option<Claims>,
    pub(super) stream: Option<StreamPos>,
}

/// Where each fan-out stream that this process's consumers received stands, for the next
/// consumer of that producer's rank.
pub(super) static RECEIVED: Streams = Streams::new();

/// One producer's session at an MPI consumer.
pub(crate) struct MpiSession {
    name: String,
    ep: Endpoint,
    /// The session's id, slot and claims.
    seat: Seat,
    tags: Tags,
    max_len: usize,
    /// The receives posted ahead, oldest first (MPI fills them in that order); none while a
    /// descriptor's probing thread looks for messages instead (see `notify_fd`).
    landings: VecDeque<(Request, Vec<u8>)>,
    /// Messages arrived and not read yet: their buffers and lengths.
    landed: VecDeque<(Vec<u8>, usize)>,
    /// Landing buffers of messages read, to be posted again at the next look for messages
    /// (not while a message is handed out: posting costs an MPI call).
    spare: Vec<Vec<u8>>,
    busy: bool,
    /// The next message's sequence number.
    next: u64,
    gone: Option<String>,
    /// A message arrived malformed: the channel is unusable, and says why.
    broken: Option<String>,
    shared: Arc<Shared>,
    partial: Option<Partial>,
    notifier: Option<Notifier>,
    /// The progress thread's duty of sending credits the application's calls leave unsent.
    duty: Option<DutyRegistration>,
    /// The MPI messages taken off the producer's messages and chunks tags.
    received: StreamPos,
    /// A fan-in's session: the carrier's thread probes it while it sleeps.
    watch: Option<Arc<Watch>>,
    /// It sleeps: its receives posted ahead are taken back, and the thread probes for it.
    asleep: bool,
}

impl MpiSession {
    /// Waits for the producer of `name` at `ep` (its hello), up to the config's rendezvous
    /// timeout, and answers it.
    pub(super) fn listen(name: &str, config: &ChannelConfig, ep: Endpoint) -> Result<MpiSession> {
        let tags = tags_for(name, ep.tag_upper_bound)?;
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let mut spins = 0;
        loop {
            if let Some(len) = ep.comm.iprobe(ep.peer, tags.hellos)? {
                let bytes = receive(&ep, tags.hellos, len, Hello::MAX_LEN, "producer")?;
                let hello = Hello::decode(&bytes, ep.peer)?;
                let why = if hello.name != name {
                    Some(format!(
                        "channels {:?} and {name:?} between MPI ranks {} and {} share MPI tag {}; rename one",
                        hello.name, ep.peer, ep.rank, tags.hellos
                    ))
                } else {
                    shape_refusal(name, config.kind, hello.kind)
                };
                if let Some(why) = why {
                    refuse(&ep, tags, hello.nonce, &why)?;
                    return Err(Error::InvalidState(why));
                }
                let seat = Seat { id: SESSION, slot: 0, claims: None, stream: None };
                return MpiSession::start(name, config, ep, tags, &hello, seat);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout(format!(
                    "no producer of channel {name:?} said hello from MPI rank {} within the rendezvous timeout; start it, or raise rendezvous_timeout",
                    ep.peer
                )));
            }
            backoff(&mut spins, false);
        }
    }

    /// Answers the producer's `hello` (received from `ep`'s peer) with an acknowledgement
    /// that names its slot, and starts its session in `seat`.
    pub(super) fn start(
        name: &str,
        config: &ChannelConfig,
        ep: Endpoint,
        tags: Tags,
        hello: &Hello,
        seat: Seat,
    ) -> Result<MpiSession> {
        let (capacity, max_len) = (hello.capacity, hello.max_len);
        let mut ack = Header::new(Kind::Ack, hello.nonce, u64::from(seat.slot));
        ack.extra = capacity;
        send_now(&ep, tags.answers, &ack.to_bytes())?;
        let shared = Arc::new(Shared {
            comm: Arc::clone(&ep.comm),
            peer: ep.peer,
            id: seat.id,
            control_tag: tags.answers,
            batch: (capacity / 4).max(1),
            state: Mutex::new(State {
                held: (0..capacity).map(|_| None).collect(),
                held_count: 0,
                released_below: 0,
                released: BTreeSet::new(),
                last_reported: 0,
                unreported_at_last_look: None,
                report_wanted: 0,
                pool: BufferPool::new(max_len),
                sends: VecDeque::new(),
                kept: Vec::new(),
                closed: false,
            }),
        });
        let mut consumer = MpiSession {
            name: name.to_owned(),
            ep,
            seat,
            tags,
            max_len,
            landings: VecDeque::with_capacity(LANDINGS),
            landed: VecDeque::new(),
            spare: Vec::with_capacity(LANDINGS),
            busy: matches!(config.wait, WaitStrategy::BusyPoll),
            next: 0,
            gone: None,
            broken: None,
            shared,
            partial: None,
            notifier: None,
            duty: None,
            received: StreamPos::default(),
            watch: None,
            asleep: false,
        };
        let duty: Weak<Shared> = Arc::downgrade(&consumer.shared);
        consumer.duty = Some(register_duty(duty));
        for _ in 0..LANDINGS {
            consumer.post_landing()?;
        }
        Ok(consumer)
    }

    /// The producer closed and its close is read: nothing more comes from its rank on this
    /// channel's tags, so the receives posted ahead are taken back and the claims let go of
    /// (its slot, and its rank for a new producer there).
    fn quiesce(&mut self) {
        for (request, buffer) in std::mem::take(&mut self.landings) {
            if self.ep.comm.cancel_recv(request).is_err() {
                // MPI may still write into it.
                std::mem::forget(buffer);
            }
        }
        if let Some(start) = self.seat.stream {
            // Before the claims go: the stream ended here, where a next consumer of this rank
            // starts.
            RECEIVED.set(&self.name, &self.ep, start.plus(self.received));
        }
        self.seat.claims = None;
        if let Some(n) = &self.notifier {
            n.stop.store(true, Ordering::Relaxed);
        }
        if let Some(watch) = self.watch.take() {
            watch.wake();
        }
    }

    /// The most bytes one MPI message of the producer's headers tag carries.
    fn landing_len(&self) -> usize {
        Header::LEN + CHUNK.min(self.max_len)
    }

    /// Posts one more receive ahead for the producer's next message.
    fn post_landing(&mut self) -> Result<()> {
        let buffer = self.buffer(self.landing_len());
        self.post_landing_in(buffer)
    }

    /// Posts a receive ahead into `buffer` (at least `landing_len` bytes).
    fn post_landing_in(&mut self, mut buffer: Vec<u8>) -> Result<()> {
        let len = self.landing_len();
        // SAFETY: `len` bytes of the buffer, whose heap memory stays in place in `landings`
        // until the receive completes (or is cancelled).
        let request = unsafe { self.ep.comm.irecv_ahead(buffer.as_mut_ptr(), len, self.ep.peer, self.tags.messages)? };
        self.landings.push_back((request, buffer));
        Ok(())
    }

    /// Whether receives are posted ahead (not while a thread probes instead: a descriptor's,
    /// or the fan-in's while this session sleeps).
    fn posting(&self) -> bool {
        self.notifier.is_none() && !self.asleep
    }

    /// A read message's landing buffer is free again: posted again at the next look for
    /// messages, or kept in the pool.
    fn recycle_landing(&mut self, buffer: Vec<u8>) {
        if self.posting() && self.landings.len() + self.spare.len() < LANDINGS && buffer.len() >= self.landing_len() {
            self.spare.push(buffer);
        } else {
            self.shared.state.lock().pool.put(buffer);
        }
    }

    /// Posts receives ahead until there are enough again: the spare landing buffers, then new
    /// ones (a landing buffer went with its message).
    fn refill_landings(&mut self) -> Result<()> {
        while self.posting() && self.landings.len() < LANDINGS {
            match self.spare.pop() {
                Some(buffer) => self.post_landing_in(buffer)?,
                None => self.post_landing()?,
            }
        }
        Ok(())
    }

    /// Whether a message has arrived (then it waits in `landed`): the oldest receive posted
    /// ahead, completed and posted again; or, without those, a message probed and received.
    fn arrive(&mut self) -> Result<bool> {
        if !self.landed.is_empty() {
            return Ok(true);
        }
        if self.landings.len() < LANDINGS {
            self.refill_landings()?;
        }
        if let Some((request, _)) = self.landings.front_mut() {
            let Some(len) = self.ep.comm.test_received(request)? else { return Ok(false) };
            let (_, buffer) = self.landings.pop_front().expect("tested above");
            // Posted again once read, or replaced (`recycle_landing`, `refill_landings`).
            self.landed.push_back((buffer, len));
            self.received.messages += 1;
            return Ok(true);
        }
        let Some(len) = self.ep.comm.iprobe(self.ep.peer, self.tags.messages)? else { return Ok(false) };
        if len > self.landing_len() {
            return Err(self.corrupt(format!("sent {len} bytes at once; at most {} are due", self.landing_len())));
        }
        let mut buffer = self.buffer(len);
        // SAFETY: the buffer has at least the `len` bytes the probe reported.
        unsafe { self.ep.comm.recv_probed(buffer.as_mut_ptr(), len, self.ep.peer, self.tags.messages)? };
        if let Some(n) = &self.notifier {
            n.probe.taken.fetch_add(1, Ordering::Release);
        }
        if let Some(watch) = self.watch.as_ref().filter(|_| self.asleep) {
            watch.took();
        }
        self.landed.push_back((buffer, len));
        self.received.messages += 1;
        Ok(true)
    }

    fn corrupt(&self, what: String) -> Error {
        Error::Corrupt(format!("the producer of channel {:?} (MPI rank {}) {what}", self.name, self.ep.peer))
    }

    /// A receive buffer of at least `len` bytes.
    fn buffer(&self, len: usize) -> Vec<u8> {
        self.shared.state.lock().pool.take(len)
    }

    /// Hands out a received message: held until released.
    fn deliver(&mut self, header: Header, buffer: Vec<u8>, start: usize) -> Result<RawView> {
        let mut state = self.shared.state.lock();
        hold(&mut state, self.seat.id, &mut self.next, header, buffer, start).map_err(|e| self.corrupt(e))
    }

    /// Completes a chunked message if all its chunks have arrived.
    fn finish_partial(&mut self) -> Result<Option<RawView>> {
        while self.partial.as_ref().is_some_and(|p| !p.requests.is_empty()) {
            if !self.test_chunk()? {
                return Ok(None);
            }
        }
        let Some(partial) = self.partial.take() else { return Ok(None) };
        self.deliver(partial.header, partial.buffer, 0).map(Some)
    }

    /// Whether the oldest chunk still due has arrived (whole: a short one is `Corrupt`, and
    /// the channel stays broken).
    fn test_chunk(&mut self) -> Result<bool> {
        if let Some(why) = &self.broken {
            return Err(Error::Corrupt(why.clone()));
        }
        let partial = self.partial.as_mut().expect("a chunked message");
        let (request, want) = partial.requests.last_mut().expect("a chunk due");
        let want = *want;
        let Some(got) = self.ep.comm.test_received(request)? else { return Ok(false) };
        partial.requests.pop();
        self.received.chunks += 1;
        if got != want {
            let seq = partial.header.seq;
            let why = format!(
                "the producer of channel {:?} (MPI rank {}) cut message {seq} short: a piece of {got} bytes where {want} were due",
                self.name, self.ep.peer
            );
            self.broken = Some(why.clone());
            self.cancel_partial();
            return Err(Error::Corrupt(why));
        }
        Ok(true)
    }

    /// Cancels the receives of a chunked message that will not complete.
    fn cancel_partial(&mut self) {
        if let Some(partial) = self.partial.take() {
            let mut cancelled = true;
            for (request, _) in partial.requests {
                match self.ep.comm.cancel_or_receive(request) {
                    Ok(None) => {}
                    Ok(Some(_)) => self.received.chunks += 1,
                    Err(_) => cancelled = false,
                }
            }
            if !cancelled {
                // MPI may still write into it.
                std::mem::forget(partial.buffer);
            }
        }
    }

    fn start_partial(&mut self, header: Header) -> Result<()> {
        let len = header.len as usize;
        let mut buffer = self.buffer(len);
        let mut requests = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut start = 0;
        while start < len {
            let n = CHUNK.min(len - start);
            // SAFETY: `n` bytes inside the buffer, whose heap memory stays in place in
            // `partial` until every request completes (or is cancelled, on drop).
            match unsafe { self.ep.comm.irecv(buffer.as_mut_ptr().add(start), n, self.ep.peer, self.tags.chunks) } {
                Ok(request) => requests.push((request, n)),
                Err(e) => {
                    for (request, _) in requests {
                        let _ = self.ep.comm.cancel_recv(request);
                    }
                    return Err(e);
                }
            }
            start += n;
        }
        // Completed newest first: they finish in order anyway.
        requests.reverse();
        self.partial = Some(Partial { header, buffer, requests });
        Ok(())
    }

    /// Reads the next message if one has arrived: data, or the producer's close and requests.
    fn poll_message(&mut self) -> Result<Option<RawView>> {
        if let Some(why) = &self.broken {
            return Err(Error::Corrupt(why.clone()));
        }
        loop {
            if self.partial.is_some() {
                return self.finish_partial();
            }
            if let Some(why) = &self.gone {
                return Err(Error::PeerGone(why.clone()));
            }
            if !self.arrive()? {
                return Ok(None);
            }
            let (buffer, len) = self.landed.pop_front().expect("arrived");
            let header = Header::decode(&buffer[..len], "producer")?;
            match header.kind {
                Kind::Data => {
                    if header.seq != self.next {
                        return Err(self.corrupt(format!("sent message {} where {} was next", header.seq, self.next)));
                    }
                    let payload = header.len as usize;
                    if payload == 0 || payload > self.max_len {
                        return Err(self.corrupt(format!(
                            "sent a message of {payload} bytes; the channel's are 1 to {}",
                            self.max_len
                        )));
                    }
                    if header.flags & FLAG_SPLIT != 0 {
                        if len != Header::LEN {
                            return Err(self.corrupt(format!("sent a chunked message's header of {len} bytes")));
                        }
                        self.recycle_landing(buffer);
                        self.start_partial(header)?;
                        continue;
                    }
                    if len != Header::LEN + payload {
                        return Err(self.corrupt(format!("sent {len} bytes for a message of {payload}")));
                    }
                    if payload <= COPY_OUT_MAX && buffer.len() > Header::LEN + COPY_OUT_MAX {
                        // A small message in a landing buffer: copied out, the buffer reused.
                        let view = {
                            let mut state = self.shared.state.lock();
                            let mut small = state.pool.take(payload);
                            small[..payload].copy_from_slice(&buffer[Header::LEN..len]);
                            hold(&mut state, self.seat.id, &mut self.next, header, small, 0)
                        };
                        self.recycle_landing(buffer);
                        return view.map(Some).map_err(|e| self.corrupt(e));
                    }
                    // The buffer goes with the message; another takes its place at the next look.
                    return self.deliver(header, buffer, Header::LEN).map(Some);
                }
                Kind::Close => {
                    self.recycle_landing(buffer);
                    log::info!(
                        "channel {:?} (consumer): the producer (MPI rank {}) closed its end; the channel reports that \
                         it has gone once its messages are read",
                        self.name,
                        self.ep.peer
                    );
                    self.gone = Some(if header.extra == CLOSE_DETACHED {
                        format!(
                            "the producer of fan-out channel {:?} (MPI rank {}) detached this consumer: it kept the \
                             producer waiting for room longer than slow_consumer_timeout; create it again to receive \
                             from the producer's next message on",
                            self.name, self.ep.peer
                        )
                    } else {
                        format!("the producer of channel {:?} (MPI rank {}) closed it", self.name, self.ep.peer)
                    });
                    self.quiesce();
                }
                Kind::ReportRequest => {
                    self.recycle_landing(buffer);
                    // Sent after the message it names, which has been read, then.
                    if header.seq >= self.next {
                        return Err(self.corrupt(format!(
                            "asked for a report on message {} before sending it ({} was next)",
                            header.seq, self.next
                        )));
                    }
                    let mut state = self.shared.state.lock();
                    state.report_wanted = state.report_wanted.max(header.seq + 1);
                    self.shared.report(&mut state, false)?;
                }
                other => return Err(self.corrupt(format!("sent {} in the middle of the channel", other.describe()))),
            }
        }
    }
}

/// Receives a probed message of `len` bytes (at most `max`).
pub(super) fn receive(ep: &Endpoint, tag: i32, len: usize, max: usize, whose: &str) -> Result<Vec<u8>> {
    if len > max {
        return Err(Error::Corrupt(format!("the {whose} sent {len} bytes where at most {max} were due")));
    }
    let mut bytes = vec![0u8; len];
    // SAFETY: `bytes` has the `len` bytes the probe reported.
    unsafe { ep.comm.recv_probed(bytes.as_mut_ptr(), len, ep.peer, tag)? };
    Ok(bytes)
}

/// Refuses the hello `nonce` of `ep`'s peer, saying why.
pub(super) fn refuse(ep: &Endpoint, tags: Tags, nonce: u64, why: &str) -> Result<()> {
    let mut refusal = Header::new(Kind::Refuse, nonce, 0).to_bytes().to_vec();
    refusal.extend_from_slice(why.as_bytes());
    send_now(ep, tags.answers, &refusal)
}

/// Sends a short message and waits until MPI has it (at most a second).
pub(super) fn send_now(ep: &Endpoint, tag: i32, bytes: &[u8]) -> Result<()> {
    let owned = bytes.to_vec();
    // SAFETY: `owned` lives until the request completes below, or is leaked with it.
    let mut request = unsafe { ep.comm.isend(owned.as_ptr(), owned.len(), ep.peer, tag)? };
    let deadline = Instant::now() + std::time::Duration::from_secs(1);
    while !ep.comm.test(&mut request)? {
        if Instant::now() >= deadline {
            ep.comm.abandon(request);
            std::mem::forget(owned);
            return Ok(());
        }
        std::thread::yield_now();
    }
    Ok(())
}

impl ConsumerSession for MpiSession {
    fn id(&self) -> u64 {
        self.seat.id
    }

    fn peer(&self) -> Peer {
        Peer {
            slot: self.seat.slot,
            state: if self.gone.is_some() { PeerState::Gone } else { PeerState::Alive },
            pid: 0,
            rank: Some(self.ep.peer as i32),
            host: self.ep.peer_host().to_owned(),
            route: Some(crate::channels::transports::MPI.name()),
        }
    }

    fn try_recv(&mut self) -> Result<RawView> {
        match self.poll_message()? {
            Some(view) => Ok(view),
            None => {
                if let Some(n) = &self.notifier {
                    let _signalling = n.probe.signalling.lock();
                    event::drain(n.fd.as_fd());
                    // A message that arrived meanwhile is signalled again by the thread.
                } else if let Some(watch) = self.watch.as_ref().filter(|_| self.asleep) {
                    watch.reset();
                }
                Err(Error::WouldBlock(format!("no message waits on channel {:?}", self.name)))
            }
        }
    }

    fn wait(&mut self, deadline: Option<Instant>) -> Result<()> {
        if deadline.is_none()
            && self.busy
            && self.ep.thread_level == ThreadLevel::Multiple
            && self.partial.is_none()
            && self.gone.is_none()
        {
            // A busy wait without end: inside MPI, as a blocking receive waits. Whatever the
            // producer sends next (a message, its close, a request) lands in the oldest
            // receive posted ahead.
            if self.arrive()? {
                return Ok(());
            }
            if let Some((request, _)) = self.landings.front_mut() {
                let len = self.ep.comm.wait_received(request)?;
                let (_, buffer) = self.landings.pop_front().expect("waited above");
                self.landed.push_back((buffer, len));
                self.received.messages += 1;
                return Ok(());
            }
        }
        let mut spins = 0;
        loop {
            if self.gone.is_some() {
                return Ok(());
            }
            if self.broken.is_some() {
                return Ok(());
            }
            match &self.partial {
                Some(partial) if partial.requests.is_empty() => return Ok(()),
                Some(_) => {
                    if self.test_chunk()? {
                        continue;
                    }
                }
                None => {
                    if self.arrive()? {
                        return Ok(());
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout(format!("no message on channel {:?} in time", self.name)));
            }
            backoff(&mut spins, self.busy);
        }
    }

    fn releaser(&self) -> Arc<dyn Release> {
        Arc::clone(&self.shared) as Arc<dyn Release>
    }

    unsafe fn release(&mut self, view: &RawView) -> Result<()> {
        self.shared.release(view)
    }

    fn released_below(&self) -> u64 {
        self.shared.state.lock().released_below
    }

    fn holds_views(&self) -> bool {
        self.shared.state.lock().held_count != 0
    }

    fn keep_while_held(&mut self, keep: Box<dyn Any + Send + Sync>) {
        let mut state = self.shared.state.lock();
        if state.held_count != 0 {
            state.kept.push(keep);
        }
    }

    fn sleep(&mut self) -> Result<bool> {
        let Some(watch) = self.watch.clone() else { return Ok(false) };
        if !self.asleep {
            self.take_landings_back()?;
            self.asleep = true;
            watch.sleep();
        }
        if !self.landed.is_empty() {
            watch.signal();
        }
        // A chunked message in flight completes without a message to probe: no sleep then.
        Ok(!self.landed.is_empty() || self.partial.is_some())
    }

    fn woke(&mut self) {
        if let Some(watch) = self.watch.as_ref().filter(|_| self.asleep) {
            watch.wake();
            self.asleep = false;
        }
    }
}

impl MpiSession {
    /// Starts the thread that signals `fd` while a message may wait (the consumer's
    /// notification fd).
    pub(super) fn start_notifier(&mut self, fd: Arc<OwnedFd>) -> Result<()> {
        if self.notifier.is_some() {
            return Ok(());
        }
        if self.ep.thread_level < ThreadLevel::Serialized {
            return Err(Error::Unsupported(format!(
                "a descriptor for channel {:?} needs a thread that probes MPI, and MPI runs at thread level {} here; \
                 initialise MPI with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (lava-flow asks for MULTIPLE when it \
                 initialises MPI itself), or poll with try_recv",
                self.name, self.ep.thread_level
            )));
        }
        // The thread probes for messages, which receives posted ahead would take unseen: take
        // those back first (keeping what they already received).
        self.take_landings_back()?;
        if !self.landed.is_empty() {
            event::signal(fd.as_fd());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let probe = Arc::new(Probe::default());
        let (comm, peer, tag) = (Arc::clone(&self.ep.comm), self.ep.peer, self.tags.messages);
        let (thread_fd, thread_stop, thread_probe) = (Arc::clone(&fd), Arc::clone(&stop), Arc::clone(&probe));
        let thread = std::thread::Builder::new()
            .name("lava-flow-mpi".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    let taken = thread_probe.taken.load(Ordering::Acquire);
                    // An error here shows again at the consumer's next receive.
                    if let Ok(Some(_)) = comm.iprobe(peer, tag) {
                        let _signalling = thread_probe.signalling.lock();
                        // A message taken since the probe may be the one it saw: the next look
                        // (100 µs on) signals one still waiting.
                        if thread_probe.taken.load(Ordering::Acquire) == taken {
                            event::signal(thread_fd.as_fd());
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            })
            .map_err(|e| Error::os("spawning the MPI probe thread", e))?;
        self.notifier = Some(Notifier { fd, probe, stop, thread: Some(thread) });
        Ok(())
    }

    /// Has the fan-in's probing thread (`watch`) look for this session's messages while it
    /// sleeps.
    pub(super) fn watch_lazily(&mut self, prober: &Prober) {
        if self.watch.is_none() && self.gone.is_none() {
            self.watch = Some(prober.watch(self.ep.peer, self.tags.messages));
        }
    }

    /// Stops the fan-in's probing for this session; it posts receives ahead again.
    pub(super) fn unwatch_lazily(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.wake();
        }
        self.asleep = false;
    }

    /// Takes the receives posted ahead back (keeping what they received), for a thread that
    /// probes instead.
    fn take_landings_back(&mut self) -> Result<()> {
        while let Some((request, buffer)) = self.landings.pop_front() {
            match self.ep.comm.cancel_or_receive(request)? {
                Some(len) => {
                    self.landed.push_back((buffer, len));
                    self.received.messages += 1;
                }
                None => self.shared.state.lock().pool.put(buffer),
            }
        }
        for buffer in self.spare.drain(..) {
            self.shared.state.lock().pool.put(buffer);
        }
        Ok(())
    }

    /// Stops the probing thread, if one runs.
    pub(super) fn stop_notifier(&mut self) {
        if let Some(mut n) = self.notifier.take() {
            n.stop.store(true, Ordering::Relaxed);
            if let Some(t) = n.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for MpiSession {
    fn drop(&mut self) {
        // First: the progress thread must not send credits while the channel closes.
        self.duty = None;
        self.stop_notifier();
        self.watch = None;
        self.cancel_partial();
        for (request, buffer) in std::mem::take(&mut self.landings) {
            match self.ep.comm.cancel_or_receive(request) {
                Ok(None) => {}
                Ok(Some(_)) => self.received.messages += 1,
                // MPI may still write into it.
                Err(_) => std::mem::forget(buffer),
            }
        }
        if let Some(start) = self.seat.stream {
            // The next consumer of this rank takes what this one left off the queues.
            RECEIVED.set(&self.name, &self.ep, start.plus(self.received));
        }
        let mut state = self.shared.state.lock();
        if self.gone.is_none() {
            // A last credit for what was released since the last one, before the close: a
            // producer waiting for their completion sees it, not only the close.
            let _ = self.shared.report(&mut state, true);
        }
        state.closed = true;
        // Credits still in flight are left to MPI, with their memory.
        for (request, credit) in state.sends.drain(..) {
            self.ep.comm.abandon(request);
            std::mem::forget(credit);
        }
        drop(state);
        if self.gone.is_none() {
            let _ = send_now(&self.ep, self.shared.control_tag, &Header::new(Kind::Closed, 0, 0).to_bytes());
        }
    }
}
