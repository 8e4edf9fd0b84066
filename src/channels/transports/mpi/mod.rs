//! The MPI carrier: a channel between processes on different hosts, over lava-flow's private
//! communicator (see `crate::mpi`).
//!
//! - **Addressing.** The peer's location comes from MPI discovery and carries its world and
//!   rank. A channel uses five tags derived from its name (checked against `MPI_TAG_UB`): one
//!   for the producer's messages, one for the consumer's answers, one for the chunks of large
//!   messages, one for hellos, one for a fan-out's joins (`Tags`).
//! - **Rendezvous.** The producer sends a hello (channel name and kind, capacity, largest
//!   message, a nonce) on the hello tag; the consumer checks it and answers with an
//!   acknowledgement (naming the producer's slot in a fan-in) or a refusal saying why. Either
//!   may start first: MPI holds the hello until the consumer looks. A pair's consumer looks
//!   for its one producer's rank; a fan-in's (`acceptor`) probes every rank, so that producers
//!   attach at any time without the probe matching the messages of those attached, which stay
//!   on the messages tag where each session receives from its own rank. A process keeps one
//!   producer of a channel toward a consumer: a second would share its tags. A fan-out's
//!   consumer on another host first sends a join to the producer's rank (`joins`), whose
//!   producer probes every rank for joins on a thread of its own (`fan_out`) and answers each
//!   with a hello of its own.
//! - **Messages.** Every message starts with a `Header` (sequence number, length, flags).
//!   Up to `CHUNK` bytes go in one MPI message with their header; longer ones, and buffer
//!   sends (sent from the buffer itself, not copied), go as the header alone followed by
//!   chunks of `CHUNK` bytes on a tag of their own, all posted at once, so that several are
//!   in flight. The consumer keeps a few receives posted ahead for the next headers, so that
//!   MPI puts messages straight where they are read. MPI keeps
//!   messages of one source and tag in order; the consumer checks every header (magic, kind,
//!   sequence number, length against the channel's largest message) and every chunk's
//!   length, so a malformed or short message is `Corrupt`, never an overflow. A message filled
//!   piece by piece (a staged GPU buffer) sends each chunk as soon as it is filled, so the
//!   GPU-to-host copy of one overlaps the transfer of the last.
//! - **Credits and completion.** The consumer receives into buffers of its own and releases
//!   them in any order; it reports how many messages it released in order (a *credit*), which
//!   is both the producer's completion (`completed`) and its room (at most `capacity`
//!   messages in flight). Credits go when the producer asks for one in a message's flags
//!   (buffer sends, and messages sent with half the capacity in flight), every quarter of the
//!   capacity, and when the producer waits for a completion (a report request in the stream,
//!   read at the consumer's next receive). Releases left unreported for a millisecond or two
//!   are reported by lava-flow's progress thread (a duty of the consumer's, `crate::mpi`), so
//!   that no completion waits for the consumer's application to call lava-flow again.
//! - **Progress.** Progress happens inside the calls of either side (sends, receives, waits,
//!   releases), and in a thread of lava-flow's that enters MPI's progress engine when those
//!   calls are quiet (`crate::mpi`): a
//!   process that waits for something else (another channel's shared memory, its own work)
//!   would otherwise stall its peer's large transfers, which need steps of both. The thread
//!   needs `MPI_THREAD_SERIALIZED` or `MULTIPLE`; lava-flow serialises its own MPI calls.
//!   A consumer whose [`ConsumerTransport::notify_fd`] watches the session starts a thread
//!   that probes for messages every 100 µs. A fan-in's sessions keep their receives posted
//!   ahead instead, and one thread for the whole carrier probes them only while the consumer
//!   sleeps on the fd, or for good once the application asked for it (`watch`).
//! - **Ends.** A producer that closes sends a close message after its last message: the
//!   consumer sees `PeerGone` once it has read everything. A consumer that closes tells the
//!   producer: once that has reached the producer's process, its next wait is `PeerGone`, and
//!   so is a send within 32 (it looks at the consumer's answers every 32 messages, twice: see
//!   `MpiProducer::poll_with`). A fan-out's producer that detaches a consumer too slow for its
//!   `slow_consumer_timeout` sends a close that says so: the consumer reads what it has, then
//!   learns that it was detached. A killed process is MPI's business: with
//!   mpirun, the job usually ends; errors MPI returns are reported as they come.
//!
//! [`ConsumerTransport::notify_fd`]: crate::channels::transport::ConsumerTransport::notify_fd

mod acceptor;
mod consumer;
mod credits;
mod fan_out;
mod joins;
mod producer;
mod watch;

pub(crate) use acceptor::MpiConsumer;
pub(crate) use consumer::MpiSession;
pub(crate) use fan_out::MpiFanOutAcceptor;
pub(crate) use producer::MpiProducer;

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::channels::ChannelKind;
use crate::error::{Error, Result};
use crate::mpi::Endpoint;
use crate::os::event;

/// Takes slot `n` of a fan channel for a peer met over MPI, if it is free: what holds it
/// (dropped, the slot is free again), or `None` when another peer holds it.
pub(crate) type ClaimSlot = Box<dyn FnMut(u32) -> Result<Option<Box<dyn std::any::Any + Send + Sync>>> + Send>;

/// The longest message that goes as one MPI message with its header, and the size of the
/// chunks of longer ones.
pub(crate) const CHUNK: usize = 1 << 20;

const MAGIC: u32 = 0x4c46_4d31; // "LFM1"

/// What a header introduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    /// Producer to consumer: a channel's first words ([`Hello`]).
    Hello = 1,
    /// Producer to consumer: message `seq` of `len` bytes.
    Data = 2,
    /// Producer to consumer: the producer closed after its last message (`extra`:
    /// `CLOSE_DETACHED` where a fan-out's producer detached this consumer).
    Close = 3,
    /// Producer to consumer: answer with a credit once `seq + 1` messages are released.
    ReportRequest = 4,
    /// Consumer to producer: the hello `seq` (its nonce) is accepted, with capacity `extra`,
    /// in fan-in slot `len` (0 for a pair).
    Ack = 5,
    /// Consumer to producer: the hello `seq` is refused; the body says why.
    Refuse = 6,
    /// Consumer to producer: `seq` messages are released in order.
    Credit = 7,
    /// Consumer to producer: the consumer closed.
    Closed = 8,
    /// Consumer to producer: a fan-out's consumer joins (`seq`: a nonce, `len`: the name's
    /// length; the body: the name).
    Join = 9,
}

impl Kind {
    /// The kind in words, for messages.
    fn describe(self) -> &'static str {
        match self {
            Kind::Hello => "a hello",
            Kind::Data => "a data message",
            Kind::Close => "a close message",
            Kind::ReportRequest => "a report request",
            Kind::Ack => "an acknowledgement",
            Kind::Refuse => "a refusal",
            Kind::Credit => "a credit",
            Kind::Closed => "a closed message",
            Kind::Join => "a join",
        }
    }
}

/// A close's `extra` when a fan-out's producer detached its consumer for slowness.
const CLOSE_DETACHED: u64 = 1;

/// Header flag: answer with a credit as soon as this message is released.
const FLAG_REPORT: u32 = 1;
/// Header flag: the payload follows in chunks, not in this MPI message.
const FLAG_SPLIT: u32 = 2;
/// Header flag: the payload was sent from the producer's own buffer.
const FLAG_ZERO_COPY: u32 = 4;

/// The fixed start of every lava-flow MPI message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    kind: Kind,
    flags: u32,
    seq: u64,
    len: u64,
    extra: u64,
}

/// A [`Header`] on the wire.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HeaderWire {
    magic: U32,
    kind: U16,
    flags: U16,
    seq: U64,
    len: U64,
    extra: U64,
}

impl Header {
    const LEN: usize = std::mem::size_of::<HeaderWire>();

    fn new(kind: Kind, seq: u64, len: u64) -> Header {
        Header { kind, flags: 0, seq, len, extra: 0 }
    }

    fn encode(&self, out: &mut [u8]) {
        let wire = HeaderWire {
            magic: MAGIC.into(),
            kind: (self.kind as u16).into(),
            flags: (self.flags as u16).into(),
            seq: self.seq.into(),
            len: self.len.into(),
            extra: self.extra.into(),
        };
        out[..Header::LEN].copy_from_slice(wire.as_bytes());
    }

    fn to_bytes(self) -> [u8; Header::LEN] {
        let mut out = [0u8; Header::LEN];
        self.encode(&mut out);
        out
    }

    /// Parses a header that `whose` sent; anything else is `Corrupt`.
    fn decode(bytes: &[u8], whose: &str) -> Result<Header> {
        let bad = |what: String| Error::Corrupt(format!("a message from the {whose} over MPI {what}"));
        let Ok((wire, _)) = HeaderWire::read_from_prefix(bytes) else {
            return Err(bad(format!("has {} bytes, fewer than a header's {}", bytes.len(), Header::LEN)));
        };
        let magic = wire.magic.get();
        if magic != MAGIC {
            return Err(bad(format!(
                "starts with {magic:#x}, not lava-flow's {MAGIC:#x}: is another program using lava-flow's communicator, or another lava-flow version?"
            )));
        }
        let kind = match wire.kind.get() {
            1 => Kind::Hello,
            2 => Kind::Data,
            3 => Kind::Close,
            4 => Kind::ReportRequest,
            5 => Kind::Ack,
            6 => Kind::Refuse,
            7 => Kind::Credit,
            8 => Kind::Closed,
            9 => Kind::Join,
            other => return Err(bad(format!("has kind {other}, which lava-flow does not send"))),
        };
        let flags = u32::from(wire.flags.get());
        if flags & !(FLAG_REPORT | FLAG_SPLIT | FLAG_ZERO_COPY) != 0 {
            return Err(bad(format!("has unknown flags {flags:#x}")));
        }
        Ok(Header { kind, flags, seq: wire.seq.get(), len: wire.len.get(), extra: wire.extra.get() })
    }
}

/// A channel's tags on lava-flow's communicator, derived from its name (FNV-1a) so that both
/// ends find them alone; names that meet on one set are told apart at the hello. Five
/// consecutive tags, so that two channels of one name in opposite directions never meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tags {
    /// Producer to consumer: headers and the messages that fit with them.
    messages: i32,
    /// Consumer to producer: answers and credits.
    answers: i32,
    /// Producer to consumer: the chunks of larger messages (a tag of their own, so that the
    /// consumer's receives posted ahead for headers never take one).
    chunks: i32,
    /// Producer to consumer: hellos (a tag of their own, so that a fan-in's consumer can
    /// probe every rank for new producers without matching the messages of those attached).
    hellos: i32,
    /// Consumer to producer: a fan-out's consumers' joins (a tag of their own, so that the
    /// producer can probe every rank for them without matching attached consumers' answers).
    joins: i32,
}

/// How many tags a channel takes.
const TAGS_PER_CHANNEL: i64 = 5;

fn tags_for(name: &str, tag_upper_bound: i32) -> Result<Tags> {
    // Tags 0 and 1 are left to discovery and future use.
    let sets = (i64::from(tag_upper_bound) - 1) / TAGS_PER_CHANNEL;
    if sets < 1 {
        return Err(Error::Unsupported(format!("MPI_TAG_UB is {tag_upper_bound}: too small for lava-flow's channels")));
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let messages = 2 + (TAGS_PER_CHANNEL as i32) * (hash % sets as u64) as i32;
    Ok(Tags { messages, answers: messages + 1, chunks: messages + 2, hellos: messages + 3, joins: messages + 4 })
}

/// A producer's hello: who it is and what it asks for. On the wire: a [`Header`] (`seq`: a
/// nonce, `len`: the name's length, `extra`: the capacity), then the name, the largest
/// message (8 bytes) and the channel's kind (4 bytes, `ChannelKind::code`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hello {
    nonce: u64,
    name: String,
    capacity: u64,
    max_len: usize,
    kind: ChannelKind,
    /// A fan-out's: where this producer's stream to the consumer's rank starts (16 more bytes
    /// on the wire, after the kind).
    start: Option<StreamPos>,
}

/// How many MPI messages one process has sent another on a channel's messages tag and on its
/// chunks tag, over every producer end of a fan-out toward that rank (or received, over every
/// session of that rank's consumers). A fan-out's consumer that closes leaves what was sent
/// after its last receive in MPI's queues, where the next consumer of its rank would find it:
/// the producer's hello says where its own stream starts, and the consumer takes what lies
/// before that off the queues unread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StreamPos {
    messages: u64,
    chunks: u64,
}

impl StreamPos {
    /// Counts one MPI message of `tags` sent or received on `tag`.
    #[inline]
    fn count(&mut self, tags: &Tags, tag: i32) {
        if tag == tags.messages {
            self.messages += 1;
        } else if tag == tags.chunks {
            self.chunks += 1;
        }
    }

    fn plus(self, other: StreamPos) -> StreamPos {
        StreamPos { messages: self.messages + other.messages, chunks: self.chunks + other.chunks }
    }
}

/// The stream positions of this process's fan-out ends, one per (communicator, peer rank,
/// channel): what each side's next end starts from.
struct Streams(Mutex<Vec<(StreamKey, StreamPos)>>);

/// A stream's communicator, peer rank and channel.
type StreamKey = (usize, u32, String);

impl Streams {
    const fn new() -> Streams {
        Streams(Mutex::new(Vec::new()))
    }

    fn key(name: &str, ep: &Endpoint) -> StreamKey {
        (Arc::as_ptr(&ep.comm) as usize, ep.peer, name.to_owned())
    }

    /// Where the stream of `name` with `ep`'s peer stands (0 before any end).
    fn get(&self, name: &str, ep: &Endpoint) -> StreamPos {
        let key = Streams::key(name, ep);
        self.0.lock().iter().find(|(k, _)| *k == key).map(|(_, pos)| *pos).unwrap_or_default()
    }

    fn set(&self, name: &str, ep: &Endpoint, pos: StreamPos) {
        let key = Streams::key(name, ep);
        let mut all = self.0.lock();
        match all.iter_mut().find(|(k, _)| *k == key) {
            Some((_, at)) => *at = pos,
            None => all.push((key, pos)),
        }
    }
}

impl Hello {
    /// The longest hello a consumer receives (a channel name is far shorter).
    const MAX_LEN: usize = Header::LEN + 4096 + 12;

    fn encode(&self) -> Vec<u8> {
        let mut header = Header::new(Kind::Hello, self.nonce, self.name.len() as u64);
        header.extra = self.capacity;
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(self.name.as_bytes());
        bytes.extend_from_slice(&(self.max_len as u64).to_le_bytes());
        bytes.extend_from_slice(&self.kind.code().to_le_bytes());
        if let Some(start) = self.start {
            bytes.extend_from_slice(&start.messages.to_le_bytes());
            bytes.extend_from_slice(&start.chunks.to_le_bytes());
        }
        bytes
    }

    /// Parses and checks a hello from the producer at MPI rank `rank`; anything else is
    /// `Corrupt`. Pure, so that it can be fuzzed.
    fn decode(bytes: &[u8], rank: u32) -> Result<Hello> {
        let whose = format!("producer at MPI rank {rank}");
        let header = Header::decode(bytes, &whose)?;
        let bad = |what: String| Error::Corrupt(format!("the hello of the {whose} {what}"));
        if header.kind != Kind::Hello {
            return Err(bad(format!("is {}", header.kind.describe())));
        }
        let body = &bytes[Header::LEN..];
        let name_len = usize::try_from(header.len).unwrap_or(usize::MAX);
        if name_len > 4096 || (body.len() != name_len + 12 && body.len() != name_len + 28) {
            return Err(bad(format!("has {} bytes of body for a name of {} bytes", body.len(), header.len)));
        }
        let name = String::from_utf8(body[..name_len].to_vec()).map_err(|_| bad("names no UTF-8 channel".into()))?;
        let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let max_len = word(name_len);
        let code = u32::from_le_bytes(body[name_len + 8..name_len + 12].try_into().expect("4 bytes"));
        let start = (body.len() == name_len + 28)
            .then(|| StreamPos { messages: word(name_len + 12), chunks: word(name_len + 20) });
        let Some(kind) = ChannelKind::from_code(code) else {
            return Err(bad(format!("names channel kind {code}, which this lava-flow does not know")));
        };
        let capacity = header.extra;
        if !(2..=1 << 20).contains(&capacity) || max_len == 0 || max_len > 1 << 40 {
            return Err(bad(format!("asks for capacity {capacity} and messages of {max_len} bytes")));
        }
        Ok(Hello { nonce: header.seq, name, capacity, max_len: max_len as usize, kind, start })
    }
}

/// Why a consumer of `kind` taking `max_peers` producers refuses a producer of `theirs` on
/// channel `name`: in the words of the shared-memory carrier's refusals, so that an
/// application reads the same whichever carrier refused it.
fn shape_refusal(name: &str, kind: ChannelKind, theirs: ChannelKind) -> Option<String> {
    (kind != theirs).then(|| crate::channels::peers::kind_mismatch(name, kind, theirs))
}

/// The refusal of a producer of a full fan-in.
fn full_refusal(name: &str, max_peers: u32) -> String {
    crate::channels::peers::fan_in_full(name, max_peers)
}

/// A fan-out consumer's join: which channel it joins. On the wire: a [`Header`] (`seq`: a
/// nonce, which the producer's hello answers with; `len`: the name's length), then the name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Join {
    nonce: u64,
    name: String,
}

impl Join {
    fn encode(&self) -> Vec<u8> {
        let mut bytes = Header::new(Kind::Join, self.nonce, self.name.len() as u64).to_bytes().to_vec();
        bytes.extend_from_slice(self.name.as_bytes());
        bytes
    }

    /// Parses a join from the consumer at MPI rank `rank`; anything else is `Corrupt`.
    fn decode(bytes: &[u8], rank: u32) -> Result<Join> {
        let whose = format!("consumer at MPI rank {rank}");
        let header = Header::decode(bytes, &whose)?;
        let bad = |what: String| Error::Corrupt(format!("the join of the {whose} {what}"));
        if header.kind != Kind::Join {
            return Err(bad(format!("is {}", header.kind.describe())));
        }
        let body = &bytes[Header::LEN..];
        if body.len() > 4096 || header.len != body.len() as u64 {
            return Err(bad(format!("has {} bytes of body for a name of {} bytes", body.len(), header.len)));
        }
        let name = String::from_utf8(body.to_vec()).map_err(|_| bad("names no UTF-8 channel".into()))?;
        Ok(Join { nonce: header.seq, name })
    }
}

/// A thread that probes one tag of a channel from every rank, for a notification fd: it
/// makes the fd readable, and notes that something waits, while a message with the tag has
/// arrived and is not received. Stopped when dropped.
struct TagProbe {
    /// Something was seen since the owner last found nothing.
    seen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TagProbe {
    /// How often the thread looks: what it looks for (a peer that attaches) is rare.
    const PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

    /// Starts probing `tag` on `here`'s communicator, signalling `fd`; `what` names it.
    fn start(here: &Endpoint, tag: i32, fd: Arc<OwnedFd>, what: &str) -> Result<TagProbe> {
        let seen = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let comm = Arc::clone(&here.comm);
        let (thread_seen, thread_stop) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name(format!("lava-flow-mpi-{what}"))
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    // An error here shows again at the owner's next look.
                    if let Ok(Some(_)) = comm.iprobe_any(tag) {
                        thread_seen.store(true, Ordering::Release);
                        event::signal(fd.as_fd());
                    }
                    std::thread::sleep(TagProbe::PERIOD);
                }
            })
            .map_err(|e| Error::os(format!("spawning the thread that probes for MPI {what}"), e))?;
        Ok(TagProbe { seen, stop, thread: Some(thread) })
    }

    /// Whether something may wait (one atomic load).
    fn seen(&self) -> bool {
        self.seen.load(Ordering::Acquire)
    }

    /// The owner looked and found nothing: what arrives from now on, the thread's next look
    /// sees.
    fn looked(&self) {
        self.seen.store(false, Ordering::Release);
    }
}

impl Drop for TagProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Buffers one end of a channel keeps for reuse: at most [`BufferPool::MAX_BUFFERS`], and at
/// most four of the channel's largest messages in bytes (8 MiB at least), the largest kept
/// first (a large message's buffer is costly to make again: the allocation zeroes it, a pass
/// over the whole message).
struct BufferPool {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
    max_bytes: usize,
}

impl BufferPool {
    /// Enough for a window of small messages in flight.
    const MAX_BUFFERS: usize = 512;

    fn new(max_len: usize) -> BufferPool {
        let max_bytes = max_len.saturating_add(Header::LEN).saturating_mul(4).max(8 << 20);
        BufferPool { buffers: Vec::new(), bytes: 0, max_bytes }
    }

    /// A buffer of at least `len` bytes: the one put back last when it fits without wasting
    /// much (cache-hot, found at once), else the smallest kept one that fits (a small message
    /// must not take the buffer a large one will need), or a new one (zeroed).
    fn take(&mut self, len: usize) -> Vec<u8> {
        if self.last_fits(len) {
            let buffer = self.buffers.pop().expect("last_fits");
            self.bytes -= buffer.len();
            return buffer;
        }
        let fitting = self.buffers.iter().enumerate().filter(|(_, b)| b.len() >= len);
        match fitting.min_by_key(|(_, b)| b.len()).map(|(i, _)| i) {
            Some(i) => {
                let buffer = self.buffers.swap_remove(i);
                self.bytes -= buffer.len();
                buffer
            }
            None => vec![0u8; len],
        }
    }

    /// Whether the buffer put back last holds `len` bytes and at most twice as many (or 4 KiB).
    fn last_fits(&self, len: usize) -> bool {
        self.buffers.last().is_some_and(|b| b.len() >= len && b.len() <= len.max(4096).saturating_mul(2))
    }

    fn has(&self, len: usize) -> bool {
        self.last_fits(len) || self.buffers.iter().any(|b| b.len() >= len)
    }

    fn put(&mut self, buffer: Vec<u8>) {
        if buffer.len() > self.max_bytes {
            return;
        }
        self.bytes += buffer.len();
        self.buffers.push(buffer);
        while self.buffers.len() > Self::MAX_BUFFERS || self.bytes > self.max_bytes {
            let smallest = (0..self.buffers.len()).min_by_key(|&i| self.buffers[i].len()).expect("not empty");
            self.bytes -= self.buffers.swap_remove(smallest).len();
        }
    }
}

/// Sleeps a little when a wait has spun long enough: MPI progress needs calls, so waits poll.
/// Busy waits go straight back to MPI (each look is a call into its progress engine, longer
/// than a pause).
fn backoff(spins: &mut u32, busy: bool) {
    *spins = spins.saturating_add(1);
    if busy {
        return;
    }
    if *spins < 2000 {
        std::hint::spin_loop();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(if *spins < 20_000 { 5 } else { 50 }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip_and_garbage_is_corrupt() {
        let mut h = Header::new(Kind::Data, 7, 1 << 20);
        h.flags = FLAG_SPLIT | FLAG_REPORT;
        h.extra = 3;
        assert_eq!(Header::decode(&h.to_bytes(), "producer").unwrap(), h);
        assert!(matches!(Header::decode(&h.to_bytes()[..31], "producer"), Err(Error::Corrupt(_))));
        let mut bad = h.to_bytes();
        bad[0] ^= 1;
        assert!(matches!(Header::decode(&bad, "producer"), Err(Error::Corrupt(m)) if m.contains("lava-flow's")));
        let mut bad = h.to_bytes();
        bad[4] = 99;
        assert!(matches!(Header::decode(&bad, "producer"), Err(Error::Corrupt(m)) if m.contains("kind 99")));
        let mut bad = h.to_bytes();
        bad[6] = 0x80;
        assert!(matches!(Header::decode(&bad, "producer"), Err(Error::Corrupt(m)) if m.contains("flags")));
    }

    #[test]
    fn the_pool_keeps_the_largest_buffers_within_its_bounds() {
        let mut pool = BufferPool::new(1 << 20);
        assert_eq!(pool.max_bytes, 8 << 20);
        for _ in 0..BufferPool::MAX_BUFFERS {
            pool.put(vec![0; 10]);
        }
        pool.put(vec![0; 1000]);
        assert_eq!(pool.buffers.len(), BufferPool::MAX_BUFFERS);
        assert!(pool.has(1000), "a large buffer displaces a small one");
        pool.put(vec![0; 9 << 20]);
        assert!(!pool.has(9 << 20), "nothing above the byte bound is kept");
        assert_eq!(pool.bytes, pool.buffers.iter().map(Vec::len).sum::<usize>());
        pool.put(vec![0; 5000]);
        assert_eq!(pool.take(900).len(), 1000, "the smallest buffer that fits");
        assert_eq!(pool.take(2000).len(), 5000);
        assert_eq!(pool.take(2000).len(), 2000, "a new buffer when none fits");
        assert_eq!(pool.bytes, pool.buffers.iter().map(Vec::len).sum::<usize>());
    }

    #[test]
    fn tags_are_consecutive_sets_within_the_bound() {
        for name in ["a", "b", "a-much-longer-channel-name", ""] {
            let t = tags_for(name, 32767).unwrap();
            assert!(t.messages >= 2 && (t.messages - 2) % 5 == 0, "{name}: {t:?}");
            assert_eq!((t.answers, t.chunks, t.hellos), (t.messages + 1, t.messages + 2, t.messages + 3));
            assert_eq!(t.joins, t.messages + 4);
            assert!(t.joins <= 32767);
        }
        assert_eq!(tags_for("x", 32767).unwrap(), tags_for("x", 32767).unwrap());
        assert_ne!(tags_for("x", 1 << 30).unwrap(), tags_for("y", 1 << 30).unwrap());
        assert!(tags_for("x", 5).is_err());
        let smallest = tags_for("x", 6).unwrap();
        assert_eq!((smallest.messages, smallest.joins), (2, 6), "the five tags fit under MPI_TAG_UB = 6");
    }

    fn hello() -> Hello {
        Hello { nonce: 7, name: "fan".into(), capacity: 64, max_len: 1 << 20, kind: ChannelKind::FanIn, start: None }
    }

    #[test]
    fn hellos_round_trip_and_say_what_is_wrong() {
        assert_eq!(Hello::decode(&hello().encode(), 3).unwrap(), hello());
        let fan_out = Hello { kind: ChannelKind::FanOut, start: Some(StreamPos { messages: 9, chunks: 2 }), ..hello() };
        assert_eq!(Hello::decode(&fan_out.encode(), 3).unwrap(), fan_out);
        let mut bytes = hello().encode();
        let at = bytes.len() - 4;
        bytes[at] = 9;
        let err = Hello::decode(&bytes, 3).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(m) if m.contains("kind 9") && m.contains("rank 3")), "{err}");
        let err = Hello::decode(&hello().encode()[..Header::LEN + 5], 3).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(m) if m.contains("bytes of body")), "{err}");
        let err = Hello::decode(&Hello { capacity: 1, ..hello() }.encode(), 3).unwrap_err();
        assert!(matches!(&err, Error::Corrupt(m) if m.contains("capacity 1")), "{err}");
    }

    #[test]
    fn refusals_speak_as_the_shared_memory_ones() {
        assert_eq!(shape_refusal("x", ChannelKind::FanIn, ChannelKind::FanIn), None);
        let why = shape_refusal("x", ChannelKind::FanIn, ChannelKind::Pair).unwrap();
        assert!(why.contains("is a fan-in channel and this producer created a pair one"), "{why}");
        assert!(full_refusal("x", 3).contains("is full: it takes max_peers = 3 producers"));
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(4000))]

        /// A hello from any rank: accepted only whole and within bounds, and then exactly
        /// what its bytes say.
        #[test]
        fn fuzz_hellos(bytes in crate::fuzz::bytes_near(hello().encode(), 64)) {
            if let Ok(h) = Hello::decode(&bytes, 1) {
                prop_assert!((2..=1 << 20).contains(&h.capacity) && h.max_len > 0);
                let start = if h.start.is_some() { 16 } else { 0 };
                prop_assert_eq!(bytes.len(), Header::LEN + h.name.len() + 12 + start);
                prop_assert_eq!(Hello::decode(&h.encode(), 1).unwrap(), h);
            }
        }

        /// Every MPI message starts with a header from the peer: accepted only with
        /// lava-flow's magic, a known kind and known flags, and then exactly what its first
        /// 32 bytes say (the rest of the message is its payload).
        #[test]
        fn fuzz_headers(bytes in crate::fuzz::bytes_near(
            {
                let mut h = Header::new(Kind::Data, 7, 1 << 20);
                h.flags = FLAG_SPLIT;
                h.to_bytes().to_vec()
            },
            64,
        )) {
            if let Ok(h) = Header::decode(&bytes, "producer") {
                prop_assert!(bytes.len() >= Header::LEN);
                prop_assert_eq!(h.flags & !(FLAG_REPORT | FLAG_SPLIT | FLAG_ZERO_COPY), 0);
                prop_assert_eq!(&h.to_bytes()[..], &bytes[..Header::LEN]);
            }
        }
    }
}
