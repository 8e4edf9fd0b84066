//! The producer half of an MPI channel.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::{
    backoff, tags_for, BufferPool, Header, Hello, Kind, StreamPos, Streams, Tags, CHUNK, CLOSE_DETACHED, FLAG_REPORT,
    FLAG_SPLIT, FLAG_ZERO_COPY,
};
use crate::channels::transport::{ProducerTransport, RawLoan, SharedRegion, TransportInfo};
use crate::channels::{ChannelConfig, ChannelKind, Peer, PeerState, WaitStrategy};
use crate::error::{Error, Result};
use crate::mpi::{Endpoint, Request};

/// What an MPI send reads from, kept until the send is complete.
enum Keep {
    /// A loan's buffer (header and payload), returned to the pool afterwards.
    Buffer(Vec<u8>),
    /// A header sent alone, or what keeps a lava-flow buffer sent from where it lies.
    Hold(#[allow(dead_code)] Box<dyn Any + Send>),
    /// Nothing (a chunk of memory a later entry keeps).
    Nothing,
}

/// The producing end of an MPI channel.
pub(crate) struct MpiProducer {
    info: TransportInfo,
    name: String,
    ep: Endpoint,
    tags: Tags,
    capacity: u64,
    max_len: usize,
    busy: bool,
    /// The next message's sequence number, and how many the consumer released in order.
    head: u64,
    completed: u64,
    /// Why the consumer is gone, once it is.
    gone: Option<String>,
    /// Sends in flight, oldest first.
    sends: VecDeque<(Request, Keep)>,
    pool: BufferPool,
    /// The current loan's buffer.
    loan: Option<Vec<u8>>,
    /// A report was requested for every message below this.
    report_asked: u64,
    /// The slot a fan-in's consumer gave this producer (0 for a pair).
    slot: u32,
    /// A fan-out's: where its stream to the consumer's rank started, and what it sent since.
    stream: Option<StreamPos>,
    sent: StreamPos,
    /// This process's claim on the channel toward its consumer (dropped after the close).
    _claim: ProducerClaim,
}

/// The MPI producers of this process: (communicator, consumer's rank, channel). One at a
/// time per channel and consumer: a second would send on the first's tags, and its rendezvous
/// could take the first's credits.
static PRODUCERS: Mutex<Vec<(usize, u32, String)>> = Mutex::new(Vec::new());

/// Where each fan-out stream of this process's producers stands, for the next producer end
/// toward that rank.
static SENT: Streams = Streams::new();

/// A producer's entry in [`PRODUCERS`], removed when it drops.
struct ProducerClaim(usize, u32, String);

/// Whether this process has a producer of channel `name` toward `ep`'s peer.
pub(super) fn has_producer(name: &str, ep: &Endpoint) -> bool {
    let comm = Arc::as_ptr(&ep.comm) as usize;
    PRODUCERS.lock().iter().any(|(c, r, n)| (*c, *r) == (comm, ep.peer) && n == name)
}

impl ProducerClaim {
    fn take(name: &str, ep: &Endpoint, kind: ChannelKind) -> Result<ProducerClaim> {
        let key = (Arc::as_ptr(&ep.comm) as usize, ep.peer, name.to_owned());
        let mut producers = PRODUCERS.lock();
        if producers.contains(&key) {
            let rank = ep.rank;
            return Err(Error::InvalidState(match kind {
                ChannelKind::FanOut => format!(
                    "one consumer per MPI rank on a fan-out: this process (MPI rank {rank}) already sends fan-out \
                     channel {name:?} to a consumer at MPI rank {}",
                    ep.peer
                ),
                ChannelKind::FanIn => format!(
                    "one producer per MPI rank on a fan-in: this process (MPI rank {rank}) already has a producer of \
                     fan-in channel {name:?}, whose consumer is at MPI rank {}; a rank's producers would share its MPI \
                     tags. Close that one first, or send from one producer per rank",
                    ep.peer
                ),
                _ => format!(
                    "channel {name:?} already has a live producer in this process (MPI rank {rank}); a pair channel \
                     has one producer at a time: close that one first, use another channel name, or make the channel \
                     a fan-in"
                ),
            }));
        }
        producers.push(key.clone());
        Ok(ProducerClaim(key.0, key.1, key.2))
    }
}

impl Drop for ProducerClaim {
    fn drop(&mut self) {
        let mut producers = PRODUCERS.lock();
        if let Some(at) = producers.iter().position(|(c, r, n)| (*c, *r) == (self.0, self.1) && *n == self.2) {
            producers.swap_remove(at);
        }
    }
}

impl MpiProducer {
    /// Connects to the consumer of `name` at `ep`: hello, then its acknowledgement, waiting up
    /// to the config's rendezvous timeout.
    pub(crate) fn connect(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        ep: Endpoint,
    ) -> Result<MpiProducer> {
        let nonce = u64::from(std::process::id()) << 32 | u64::from(rand_u32());
        Self::connect_with(name, info, config, ep, nonce)
    }

    /// [`connect`](Self::connect) with a hello of `nonce` (a fan-out's answer to a consumer's
    /// join carries the join's).
    pub(super) fn connect_with(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        ep: Endpoint,
        nonce: u64,
    ) -> Result<MpiProducer> {
        let tags = tags_for(name, ep.tag_upper_bound)?;
        if config.capacity < 2 || !config.capacity.is_power_of_two() {
            return Err(Error::invalid(format!("capacity {} is not a power of two >= 2", config.capacity)));
        }
        let claim = ProducerClaim::take(name, &ep, config.kind)?;
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        // Read under the claim: the last end toward this rank has dropped, and said where it
        // left the stream.
        let stream = (config.kind == ChannelKind::FanOut).then(|| SENT.get(name, &ep));
        let hello = Hello {
            nonce,
            name: name.to_owned(),
            capacity: u64::from(config.capacity),
            max_len: config.pool_size,
            kind: config.kind,
            start: stream,
        };
        let mut p = MpiProducer {
            info,
            name: name.to_owned(),
            ep,
            tags,
            capacity: u64::from(config.capacity),
            max_len: config.pool_size,
            busy: matches!(config.wait, WaitStrategy::BusyPoll),
            head: 0,
            completed: 0,
            gone: None,
            sends: VecDeque::new(),
            pool: BufferPool::new(config.pool_size),
            loan: None,
            report_asked: 0,
            slot: 0,
            stream,
            sent: StreamPos::default(),
            _claim: claim,
        };
        // Until the consumer accepts it, nothing goes on the channel's messages tag (not even a
        // close when this fails): the consumer reads that tag only from producers it accepted.
        p.gone = Some(format!("channel {name:?} never met its consumer"));
        let bytes = hello.encode();
        let ptr = bytes.as_ptr();
        // SAFETY: the vector's heap memory is kept by the entry.
        unsafe { p.post_with(p.tags.hellos, ptr, bytes.len(), Keep::Buffer(bytes))? };
        let mut spins = 0;
        loop {
            p.reap()?;
            if let Some((_, header, body)) = p.next_control()? {
                match header.kind {
                    Kind::Ack if header.seq == nonce => {
                        p.slot = u32::try_from(header.len).unwrap_or(u32::MAX);
                        if config.kind == ChannelKind::FanIn {
                            log::info!(
                                "fan-in channel {name:?} (producer): attached in slot {} of the consumer at MPI rank {}",
                                p.slot,
                                p.ep.peer
                            );
                        }
                        p.gone = None;
                        return Ok(p);
                    }
                    Kind::Refuse if header.seq == nonce => {
                        return Err(Error::InvalidState(format!(
                            "the consumer of channel {name:?} (MPI rank {}) refused it: {}",
                            p.ep.peer,
                            String::from_utf8_lossy(&body)
                        )));
                    }
                    // An answer to an earlier producer of this name that gave up: not ours.
                    Kind::Ack | Kind::Refuse | Kind::Credit | Kind::Closed => {}
                    other => {
                        return Err(Error::Corrupt(format!(
                            "the consumer of channel {name:?} sent {other:?} before answering"
                        )))
                    }
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // The hello stays queued in MPI: a consumer that starts later answers it, and
                // the answer is dropped as stale by a later producer.
                return Err(Error::Timeout(format!(
                    "no consumer of channel {name:?} answered from MPI rank {} within the rendezvous timeout; start it, or raise rendezvous_timeout",
                    p.ep.peer
                )));
            }
            backoff(&mut spins, false);
        }
    }

    /// Starts sending `len` bytes at `ptr` to the consumer.
    ///
    /// # Safety
    /// The bytes stay valid and unwritten until the send completes: they lie in `keep` (heap
    /// memory, which does not move with it), or in memory a later entry of `sends` keeps.
    /// Entries are dropped only once complete and in order (reap), or leaked (Drop).
    unsafe fn post(&mut self, ptr: *const u8, len: usize, keep: Keep) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.post_with(self.tags.messages, ptr, len, keep) }
    }

    /// [`post`](Self::post) with `tag`.
    ///
    /// # Safety
    /// As for `post`.
    unsafe fn post_with(&mut self, tag: i32, ptr: *const u8, len: usize, keep: Keep) -> Result<()> {
        // SAFETY: the caller's contract.
        match unsafe { self.ep.comm.isend(ptr, len, self.ep.peer, tag) } {
            Ok(mut request) => {
                self.sent.count(&self.tags, tag);
                // Looked at once at once: some of MPI's transports (TCP) write a message out
                // only in a progress call, which this is; one already complete is done with
                // here, when no earlier send may still read what it keeps.
                if self.sends.is_empty() && self.ep.comm.test(&mut request).map_err(|e| self.failed(e))? {
                    if let Keep::Buffer(buffer) = keep {
                        self.pool.put(buffer);
                    }
                    return Ok(());
                }
                self.sends.push_back((request, keep));
                Ok(())
            }
            Err(e) => {
                // Earlier sends may read what `keep` holds (the chunks of one message): leak it.
                std::mem::forget(keep);
                Err(self.failed(e))
            }
        }
    }

    /// Sends the first `len` bytes of `buffer`, which goes to the pool once sent.
    fn post_buffer(&mut self, buffer: Vec<u8>, len: usize) -> Result<()> {
        let ptr = buffer.as_ptr();
        // SAFETY: the bytes are the buffer's heap memory, kept by its entry.
        unsafe { self.post(ptr, len, Keep::Buffer(buffer)) }
    }

    /// Sends a header alone.
    fn post_header(&mut self, header: Header) -> Result<()> {
        let boxed = Box::new(header.to_bytes());
        let ptr = boxed.as_ptr();
        // SAFETY: the bytes are the box's heap memory, kept by its entry.
        unsafe { self.post(ptr, Header::LEN, Keep::Hold(boxed)) }
    }

    fn failed(&self, error: Error) -> Error {
        Error::Io {
            context: format!("channel {:?} to MPI rank {}", self.name, self.ep.peer),
            source: std::io::Error::other(error.to_string()),
        }
    }

    /// Completes the sends that are done, oldest first, recycling their buffers.
    fn reap(&mut self) -> Result<()> {
        while let Some((request, _)) = self.sends.front_mut() {
            if !self.ep.comm.test(request).map_err(|e| self.failed(e))? {
                break;
            }
            if let Some((_, Keep::Buffer(buffer))) = self.sends.pop_front() {
                self.pool.put(buffer);
            }
        }
        Ok(())
    }

    /// The consumer's next answer, if one has arrived: (length, header, body).
    fn next_control(&mut self) -> Result<Option<(usize, Header, Vec<u8>)>> {
        let Some(len) = self.ep.comm.iprobe(self.ep.peer, self.tags.answers).map_err(|e| self.failed(e))? else {
            return Ok(None);
        };
        if len > Header::LEN + 4096 {
            return Err(Error::Corrupt(format!(
                "the consumer of channel {:?} sent an answer of {len} bytes",
                self.name
            )));
        }
        let mut bytes = vec![0u8; len];
        // SAFETY: `bytes` has the `len` bytes the probe reported.
        unsafe { self.ep.comm.recv_probed(bytes.as_mut_ptr(), len, self.ep.peer, self.tags.answers) }
            .map_err(|e| self.failed(e))?;
        let header = Header::decode(&bytes, "consumer")?;
        Ok(Some((len, header, bytes.split_off(Header::LEN))))
    }

    /// Reads the consumer's answers: credits and its close.
    fn poll(&mut self) -> Result<()> {
        self.poll_with(false)
    }

    /// [`poll`](Self::poll), `thorough`ly: an answer that had reached this process when it
    /// began is read. A probe looks at what MPI has taken in, and only then, finding nothing,
    /// lets MPI take in more (Open MPI reads its sockets there): what the last probe took in,
    /// one more probe sees. Without that, a producer whose sends complete at once (which call
    /// nothing else that takes messages in) would miss the consumer's close at one look and
    /// send 32 more messages before the next.
    fn poll_with(&mut self, thorough: bool) -> Result<()> {
        self.reap()?;
        let mut again = thorough;
        loop {
            let Some((_, header, _)) = self.next_control()? else {
                if std::mem::take(&mut again) {
                    continue;
                }
                return Ok(());
            };
            match header.kind {
                Kind::Credit => {
                    if header.seq > self.head {
                        return Err(Error::Corrupt(format!(
                            "the consumer of channel {:?} reports {} messages released, but only {} were sent",
                            self.name, header.seq, self.head
                        )));
                    }
                    self.completed = self.completed.max(header.seq);
                }
                Kind::Closed => {
                    log::info!(
                        "channel {:?} (producer): the consumer (MPI rank {}) closed its end; sends fail from now on",
                        self.name,
                        self.ep.peer
                    );
                    self.gone =
                        Some(format!("the consumer of channel {:?} (MPI rank {}) closed it", self.name, self.ep.peer));
                }
                Kind::Ack | Kind::Refuse => {}
                other => {
                    return Err(Error::Corrupt(format!(
                        "the consumer of channel {:?} sent {}",
                        self.name,
                        other.describe()
                    )))
                }
            }
        }
    }

    fn check_gone(&self) -> Result<()> {
        match &self.gone {
            Some(why) => Err(Error::PeerGone(why.clone())),
            None => Ok(()),
        }
    }

    fn has_room(&self) -> bool {
        self.head - self.completed < self.capacity
    }

    /// What a wait for room waits for: room, with the consumer there (room left by a consumer
    /// that closed is no reason to send).
    fn may_send(&self) -> bool {
        self.has_room() && self.gone.is_none()
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len == 0 || len > self.max_len {
            return Err(Error::invalid(format!(
                "a message of {len} bytes on channel {:?}: it must have 1 to {} bytes (the channel's pool_size)",
                self.name, self.max_len
            )));
        }
        Ok(())
    }

    /// The header of the next message, asking for a credit when half the capacity is in
    /// flight (so that a full channel never waits for one).
    fn next_header(&self, len: usize, flags: u32) -> Header {
        let mut header = Header::new(Kind::Data, self.head, len as u64);
        header.flags = flags;
        if self.head + 1 - self.completed >= self.capacity / 2 {
            header.flags |= FLAG_REPORT;
        }
        header
    }

    fn wait_until(&mut self, deadline: Option<Instant>, mut done: impl FnMut(&Self) -> bool, what: &str) -> Result<()> {
        let mut spins = 0;
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            self.check_gone()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout(format!("channel {:?}: {what}", self.name)));
            }
            backoff(&mut spins, self.busy);
        }
    }
}

impl ProducerTransport for MpiProducer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn max_message_len(&self) -> usize {
        self.max_len
    }

    fn try_loan(&mut self, len: usize) -> Result<RawLoan> {
        self.check_len(len)?;
        if self.loan.is_some() {
            return Err(Error::InvalidState(format!(
                "channel {:?} already lends room for a message; publish or cancel it first",
                self.name
            )));
        }
        let want = Header::LEN + len;
        // The consumer's answers and finished sends are looked at when they matter (half the
        // capacity in flight, which asks for a credit; no buffer to reuse) and every 32
        // messages, thoroughly (a consumer that closed): each look is an MPI call or two.
        let every_32 = self.head % 32 == 0;
        if every_32 || self.head - self.completed >= self.capacity / 2 || !self.pool.has(want) {
            self.poll_with(every_32)?;
        }
        self.check_gone()?;
        if !self.has_room() {
            return Err(Error::WouldBlock(format!(
                "channel {:?} is full ({} messages in flight)",
                self.name,
                self.head - self.completed
            )));
        }
        let mut buffer = self.pool.take(want);
        let ptr = buffer[Header::LEN..].as_mut_ptr();
        self.loan = Some(buffer);
        Ok(RawLoan { ptr, len, token: self.head })
    }

    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        self.check_len(len)?;
        self.wait_until(deadline, |p| p.may_send(), "no room: the consumer has not released enough messages")
    }

    unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        let Some(mut buffer) = self.loan.take().filter(|_| loan.token == self.head) else {
            return Err(Error::InvalidState(format!("that loan is not channel {:?}'s current one", self.name)));
        };
        if len == 0 || len > loan.len {
            self.loan = Some(buffer);
            return Err(Error::invalid(format!("publishing {len} bytes of a loan of {}", loan.len)));
        }
        let seq = self.head;
        if len <= CHUNK {
            self.next_header(len, 0).encode(&mut buffer[..Header::LEN]);
            self.post_buffer(buffer, Header::LEN + len)?;
        } else {
            let header = self.next_header(len, FLAG_SPLIT);
            let payload = buffer[Header::LEN..].as_ptr();
            // SAFETY: `len` bytes of the buffer's heap memory, which the last chunk's entry keeps.
            unsafe { self.send_split(header, payload, len, Keep::Buffer(buffer))? };
        }
        self.head += 1;
        Ok(seq)
    }

    unsafe fn publish_filled(
        &mut self,
        loan: RawLoan,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64> {
        let Some(mut buffer) = self.loan.take().filter(|_| loan.token == self.head) else {
            return Err(Error::InvalidState(format!("that loan is not channel {:?}'s current one", self.name)));
        };
        if len == 0 || len > loan.len {
            self.loan = Some(buffer);
            return Err(Error::invalid(format!("publishing {len} bytes of a loan of {}", loan.len)));
        }
        // The first piece is filled before anything goes: a failure there only cancels.
        let first = CHUNK.min(len);
        if let Err(e) = fill(0, &mut buffer[Header::LEN..Header::LEN + first]) {
            self.pool.put(buffer);
            return Err(e);
        }
        self.loan = Some(buffer);
        if len == first {
            // SAFETY: the caller's outstanding loan (this function's contract).
            return unsafe { self.publish(loan, len) };
        }
        let mut buffer = self.loan.take().expect("put back above");
        let seq = self.head;
        self.post_header(self.next_header(len, FLAG_SPLIT))?;
        let payload = buffer[Header::LEN..].as_mut_ptr();
        let mut start = 0;
        while start < len {
            let n = CHUNK.min(len - start);
            if start > 0 {
                // SAFETY: `n` bytes of the buffer's payload that no posted send reads (each
                // send reads only its own piece).
                let piece = unsafe { std::slice::from_raw_parts_mut(payload.add(start), n) };
                if let Err(e) = fill(start, piece) {
                    // The message cannot be completed: a close header where its next piece was
                    // due cuts it short (the consumer sees Corrupt), and the channel ends. The
                    // buffer stays with it: the pieces sent read it.
                    let close = Box::new(Header::new(Kind::Close, seq, 0).to_bytes());
                    let ptr = close.as_ptr();
                    // SAFETY: the box's heap memory is kept by the entry.
                    let _ = unsafe {
                        self.post_with(self.tags.chunks, ptr, Header::LEN, Keep::Hold(Box::new((close, buffer))))
                    };
                    self.gone =
                        Some(format!("channel {:?} was cut short: filling message {seq} failed: {e}", self.name));
                    return Err(e);
                }
            }
            let keep = if start + n == len { Keep::Buffer(std::mem::take(&mut buffer)) } else { Keep::Nothing };
            // SAFETY: the piece lies in the buffer's heap memory, which the last piece's entry
            // keeps (entries complete and drop in order).
            if let Err(e) = unsafe { self.post_with(self.tags.chunks, payload.add(start), n, keep) } {
                // Pieces already posted read the buffer: leak it (post leaked the last one's).
                std::mem::forget(std::mem::take(&mut buffer));
                return Err(e);
            }
            start += n;
        }
        self.head += 1;
        Ok(seq)
    }

    unsafe fn cancel(&mut self, loan: RawLoan) {
        if loan.token == self.head {
            if let Some(buffer) = self.loan.take() {
                self.pool.put(buffer);
            }
        }
    }

    fn completed(&mut self) -> Result<u64> {
        self.poll()?;
        Ok(self.completed)
    }

    fn completed_hint(&self) -> u64 {
        self.completed
    }

    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        if seq >= self.head {
            return Err(Error::invalid(format!("message {seq} has not been sent on channel {:?}", self.name)));
        }
        self.poll()?;
        if self.completed > seq {
            return Ok(());
        }
        if self.report_asked <= seq && self.gone.is_none() {
            self.post_header(Header::new(Kind::ReportRequest, seq, 0))?;
            self.report_asked = seq + 1;
        }
        self.wait_until(
            deadline,
            |p| p.completed > seq,
            &format!("message {seq} was not released by the consumer in time"),
        )
    }

    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        self.check_len(len)?;
        if offset.checked_add(len).map_or(true, |end| end > region.arena_len()) {
            return Err(Error::invalid(format!(
                "{len} bytes at offset {offset} overrun a region of {} bytes",
                region.arena_len()
            )));
        }
        self.wait_until(deadline, |p| p.may_send(), "no room: the consumer has not released enough messages")?;
        let header = self.next_header(len, FLAG_SPLIT | FLAG_ZERO_COPY | FLAG_REPORT);
        // SAFETY: offset + len lies in the region (checked), which `keep_alive` keeps mapped
        // until the last chunk's send completes; the producer's user does not write it until
        // the message is complete (the buffer send contract).
        unsafe { self.send_split(header, region.base().add(offset), len, Keep::Hold(Box::new(region.keep_alive())))? };
        let seq = self.head;
        self.head += 1;
        Ok(seq)
    }

    fn peer(&self) -> Peer {
        Peer {
            slot: 0,
            state: PeerState::Alive,
            pid: 0,
            rank: Some(self.ep.peer as i32),
            host: self.ep.peer_host().to_owned(),
            route: Some(super::super::MPI.name()),
        }
    }

    fn has_room_for(&mut self, len: usize) -> Result<bool> {
        self.check_len(len)?;
        // The consumer's answers are read where they matter (no room left); its close, at the
        // loan's look every 32 messages, as for any send.
        if !self.has_room() {
            self.poll()?;
        }
        self.check_gone()?;
        Ok(self.has_room())
    }

    fn detach(&mut self) {
        if self.gone.is_some() {
            return;
        }
        let mut close = Header::new(Kind::Close, self.head, 0);
        close.extra = CLOSE_DETACHED;
        // An MPI failure here leaves the consumer to see the producer close when it drops.
        if self.post_header(close).is_ok() {
            self.gone = Some(format!(
                "the consumer of fan-out channel {:?} (MPI rank {}) was detached for slowness",
                self.name, self.ep.peer
            ));
        }
    }

    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        self.poll()?;
        self.check_gone()?;
        if !self.has_room() {
            return Err(Error::WouldBlock(format!(
                "channel {:?} is full ({} messages in flight)",
                self.name,
                self.head - self.completed
            )));
        }
        self.send_region(region, offset, len, None)
    }
}

impl MpiProducer {
    /// The consumer's MPI rank.
    pub(crate) fn peer_rank(&self) -> u32 {
        self.ep.peer
    }

    /// Sends a malformed message, for tests that play a hostile peer over a carrier that has
    /// no shared region: 0, a chunked message cut short; 1, a sequence number out of order;
    /// 2, more bytes than the header says; 3, a report request for a message never sent.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn send_malformed(&mut self, how: u32) -> Result<()> {
        let (tag, bytes) = match how {
            0 => {
                // A header for three chunks, then one short chunk.
                self.post_header(self.next_header(3 * CHUNK, FLAG_SPLIT))?;
                (self.tags.chunks, vec![0u8; 100])
            }
            1 => {
                let mut bytes = Header::new(Kind::Data, self.head + 5, 8).to_bytes().to_vec();
                bytes.extend_from_slice(&[0u8; 8]);
                (self.tags.messages, bytes)
            }
            2 => {
                let mut bytes = self.next_header(8, 0).to_bytes().to_vec();
                bytes.extend_from_slice(&[0u8; 100]);
                (self.tags.messages, bytes)
            }
            3 => (self.tags.messages, Header::new(Kind::ReportRequest, u64::MAX, 0).to_bytes().to_vec()),
            other => return Err(Error::invalid(format!("no malformed message {other}"))),
        };
        let ptr = bytes.as_ptr();
        // SAFETY: the vector's heap memory is kept by the entry.
        unsafe { self.post_with(tag, ptr, bytes.len(), Keep::Buffer(bytes)) }
    }

    /// Sends a header alone, then the `len` bytes at `payload` in chunks, all posted at once.
    ///
    /// # Safety
    /// `keep` keeps the payload valid and unwritten until its sends complete; it goes with the
    /// last chunk.
    unsafe fn send_split(&mut self, header: Header, payload: *const u8, len: usize, keep: Keep) -> Result<()> {
        self.post_header(header)?;
        let mut keep = Some(keep);
        let mut start = 0;
        while start < len {
            let n = CHUNK.min(len - start);
            let k = if start + n == len { keep.take().expect("the last chunk") } else { Keep::Nothing };
            // SAFETY: inside the payload, which the caller keeps (through the last entry).
            if let Err(e) = unsafe { self.post_with(self.tags.chunks, payload.add(start), n, k) } {
                // Chunks already posted read the payload: leak what keeps it.
                std::mem::forget(keep);
                return Err(e);
            }
            start += n;
        }
        Ok(())
    }
}

impl Drop for MpiProducer {
    fn drop(&mut self) {
        if self.gone.is_none() {
            let _ = self.post_header(Header::new(Kind::Close, self.head, 0));
        }
        // Sends complete once the consumer receives them; one that is gone never will: give
        // them a moment, then leave them to MPI with their memory.
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while !self.sends.is_empty() && Instant::now() < deadline {
            if self.reap().is_err() {
                break;
            }
            if self.gone.is_some() {
                break;
            }
            let _ = self.poll();
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        for (request, keep) in self.sends.drain(..) {
            self.ep.comm.abandon(request);
            std::mem::forget(keep);
        }
        // Before the claim goes: the next end toward this rank starts where this one ended.
        if let Some(start) = self.stream {
            SENT.set(&self.name, &self.ep, start.plus(self.sent));
        }
    }
}

/// A little randomness for nonces, without a dependency.
fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}
