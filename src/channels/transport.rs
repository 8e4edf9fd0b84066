//! The interface between a channel and the transports that carry its messages.
//!
//! Two kinds of transport serve a channel:
//! - its **carrier** ([`ProducerTransport`], [`ConsumerTransport`]) moves every message one
//!   way, producer to consumer, in order and exactly once, and owns the connection to the peer.
//!   It is split in two halves because the two ends live in different processes.
//! - a **payload route** ([`RouteSender`], [`RouteReceiver`]) serves payloads the carrier
//!   cannot hold itself (GPU memory): it turns a buffer region into a small descriptor, which
//!   the carrier carries in the same order as every other message
//!   ([`ProducerTransport::send_routed`]), and the receiving half turns the descriptor back
//!   into a buffer. What a route must tell its peer once (a memory file, a semaphore) goes
//!   as an [`Attachment`]: in the rendezvous, or as an attachment the carrier passes before the
//!   message that needs it.
//!
//! Which transports serve a channel is decided from the scope between the two processes by
//! `channels::transports`, the one module that names the implementations; the channel core
//! sees only these traits. A channel may have several routes, even for one class of payload:
//! each message takes the one its memory's kind ([`MemoryKind`]) calls for (the core's route
//! table). A new transport plugs in there.
//!
//! Zero copy is expressed by *loans* and *views*: the producer asks its transport for room
//! ([`RawLoan`]), writes the payload there and publishes it; the consumer gets a [`RawView`] of
//! the bytes where they lie and hands it back with [`Release::release`], which is how the
//! producer learns completion. Messages whose bytes already lie in memory the peer can map
//! (a lava-flow buffer from Layer 1) go through [`ProducerTransport::send_region`], with the
//! region described by [`SharedRegion`].

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

pub use super::holds::{AtDeath, PeerHolds};
use super::peers::{Peer, PeerState};
pub use super::ready::{ReadyOffer, ReadyShare, SharedReady};
use crate::error::{Error, Result};
use crate::memory::Buffer;

/// What a route tells its peer once, outside the messages (a memory file, a semaphore): its
/// route's id, opaque bytes, and the OS handles that go with them, passed in order before the
/// message that needs it, or in the rendezvous. The carrier passes every route's attachments
/// without reading them; each route reads only those with its own id. A carrier that cannot
/// pass handles (one between hosts) serves no route that needs them.
#[derive(Debug)]
pub struct Attachment {
    pub route: u32,
    pub bytes: Vec<u8>,
    pub handles: Vec<OsHandle>,
}

/// An OS handle an attachment passes (a file descriptor on Linux).
pub type OsHandle = OwnedHandle;

impl Attachment {
    pub fn new(route: u32, bytes: Vec<u8>) -> Self {
        Attachment { route, bytes, handles: Vec::new() }
    }
}

/// A transport's name, as reports and `LF_TRANSPORTS` spell it. Each transport declares its
/// own; this interface knows none of them (`channels::transports` lists those built).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportId(&'static str);

impl TransportId {
    pub const fn new(name: &'static str) -> TransportId {
        TransportId(name)
    }

    /// The name used in `LF_TRANSPORTS` and reports.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What a message carries, which decides the route that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PayloadClass {
    /// Bytes in host memory: copies, loans, CPU buffers.
    Host,
    /// GPU memory (DEVICE_LOCAL, HOST_VISIBLE, GPU-pinned host memory imported into the
    /// device).
    Gpu,
    /// CUDA device memory another allocator made (a framework's tensor), registered with
    /// lava-flow.
    Cuda,
}

impl fmt::Display for PayloadClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PayloadClass::Host => "CPU payloads",
            PayloadClass::Gpu => "GPU buffers",
            PayloadClass::Cuda => "CUDA memory",
        })
    }
}

/// The transport that serves one payload class of a channel, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub class: PayloadClass,
    pub kind: TransportId,
    /// One sentence: why this transport, and how it synchronises where that matters.
    pub reason: String,
}

/// Which transports a channel uses and why they were chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportInfo {
    /// The carrier: the transport every message goes through, in order.
    pub kind: TransportId,
    /// Human-readable sentences: the scope, each route, the candidates and what restricted them.
    pub reason: String,
    /// Every route the channel uses, the carrier's first.
    pub routes: Vec<Route>,
}

impl TransportInfo {
    /// A report of `routes`, the carrier's first; the reason is theirs, sentence by sentence.
    pub fn new(routes: Vec<Route>) -> TransportInfo {
        let kind = routes.first().map_or(TransportId::new("none"), |r| r.kind);
        let reason = routes.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>().join(". ");
        TransportInfo { kind, reason, routes }
    }

    /// Replaces the route of `route.class` in its place, or adds it last (a new producer may
    /// bring another).
    pub fn set_route(&mut self, route: Route) {
        let mut routes = std::mem::take(&mut self.routes);
        match routes.iter_mut().find(|r| r.class == route.class) {
            Some(old) => *old = route,
            None => routes.push(route),
        }
        *self = TransportInfo::new(routes);
    }

    /// The carrier's name, with those of the routes that serve other payloads (`a+b`).
    pub fn names(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for route in &self.routes {
            if !names.contains(&route.kind.name()) {
                names.push(route.kind.name());
            }
        }
        if names.is_empty() {
            return self.kind.name().to_owned();
        }
        names.join("+")
    }
}

/// Room lent by a producer transport: `len` writable bytes at `ptr`, valid until published or
/// cancelled. `token` identifies the loan to the transport.
#[derive(Debug)]
pub struct RawLoan {
    pub ptr: *mut u8,
    pub len: usize,
    pub token: u64,
}

/// A received message where it lies: `len` readable bytes at `ptr`, valid until released.
/// `token` is the message's sequence number; `session` tells apart the producers a consumer
/// has had (a new producer may attach after the old one died). A routed message's bytes are
/// its route's descriptor ([`RawView::route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawView {
    pub ptr: *const u8,
    pub len: usize,
    pub token: u64,
    pub session: u64,
    /// [`RawView::ZERO_COPY`], [`RawView::ROUTED`] with the route id in bits 8-15, or 0; the
    /// producer's slot in a fan-in in bits 16-31 ([`RawView::producer`]). A whole word, so that the view has no padding bytes: copying a view with a `bool` here
    /// cost narrow, overlapping moves on the hot path.
    pub flags: u64,
}

impl RawView {
    /// The bytes lie in the sender's own buffer (a buffer send), not in the channel's pool.
    pub const ZERO_COPY: u64 = 1;
    /// The bytes are another route's descriptor of the payload.
    pub const ROUTED: u64 = 2;

    #[inline]
    pub fn is_zero_copy(&self) -> bool {
        self.flags & Self::ZERO_COPY != 0
    }

    /// The route whose descriptor this view holds.
    #[inline]
    pub fn route(&self) -> Option<u32> {
        (self.flags & Self::ROUTED != 0).then_some(((self.flags >> 8) & 0xff) as u32)
    }

    pub fn routed_flags(route: u32) -> u64 {
        Self::ROUTED | Self::ZERO_COPY | u64::from(route & 0xff) << 8
    }

    /// The slot of the fan-in producer that sent the message (0 for a pair channel).
    #[inline]
    pub fn producer(&self) -> u32 {
        ((self.flags >> 16) & 0xffff) as u32
    }

    /// Notes that the message came from the fan-in producer in `slot` (below `MAX_PEERS`).
    #[inline]
    pub fn set_producer(&mut self, slot: u32) {
        self.flags = (self.flags & !(0xffff << 16)) | u64::from(slot & 0xffff) << 16;
    }
}

/// Gives a received message's space back to its producer. Shared by all views of one
/// session, callable from any thread.
pub trait Release: Send + Sync {
    /// Releases `view`; a view that is not outstanding (already released, or never received
    /// from this session) is refused with `InvalidState`.
    fn release(&self, view: &RawView) -> Result<()>;

    /// Releases a view that this session handed out and that nobody has released yet (a
    /// Rust `Message`'s, released once when it drops), so nothing needs checking.
    fn release_held(&self, view: &RawView) {
        // Cannot fail for a held view.
        let _ = self.release(view);
    }
}

/// Memory the peer can map by itself, so a message can point into it instead of being
/// copied: a Layer 1 arena (a memfd, [`SharedArena`](crate::memory::SharedArena)) today.
///
/// The receiving side maps `fd()` once per arena and caches it; a message then carries
/// (arena, offset, len). The sender keeps [`keep_alive`](Self::keep_alive) until the receiver
/// releases the message.
///
/// # Safety
/// Transports trust an implementation: `base()` points at `arena_len()` bytes readable in this
/// process for as long as a clone of `keep_alive()` lives, and `fd()` is a memory file of at
/// least `arena_len()` bytes holding the same bytes.
pub unsafe trait SharedRegion {
    /// The file behind the region, passed to the peer over the rendezvous socket once.
    fn fd(&self) -> BorrowedHandle<'_>;
    /// The size of the file (the peer maps `[0, arena_len)`).
    fn arena_len(&self) -> usize;
    /// Identifies the arena in this process while a `Weak` of `keep_alive()` lives.
    fn identity(&self) -> usize;
    /// Keeps the memory alive while held.
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync>;
    /// The region's first byte in this process (for transports that send the bytes
    /// themselves, from where they lie).
    fn base(&self) -> *const u8;
}

/// The sending half of a transport.
pub trait ProducerTransport: Send {
    fn info(&self) -> &TransportInfo;

    /// The largest message this transport accepts.
    fn max_message_len(&self) -> usize;

    /// Lends room for a message of `len` bytes, or `WouldBlock` when there is none now
    /// (ring full or payload pool exhausted), or `PeerGone`.
    fn try_loan(&mut self, len: usize) -> Result<RawLoan>;

    /// Lends room if there is some now and nothing needs attention: the inlined first try of
    /// every loan. `None` says nothing (the channel may be full, closed or the length bad):
    /// ask [`try_loan`](Self::try_loan) or [`loan`](Self::loan).
    fn loan_fast(&mut self, len: usize) -> Option<RawLoan> {
        let _ = len;
        None
    }

    /// Copies `data` into the channel and publishes it as the next message when
    /// [`loan_fast`](Self::loan_fast) would lend room for it: the inlined first try of every
    /// copied send, without recording a loan. `None` says nothing (and sent nothing).
    fn send_fast(&mut self, data: &[u8]) -> Option<u64> {
        let _ = data;
        None
    }

    /// Lends room, waiting for it up to `deadline` (`None`: forever).
    fn loan(&mut self, len: usize, deadline: Option<Instant>) -> Result<RawLoan> {
        loop {
            match self.try_loan(len) {
                Err(Error::WouldBlock(_)) => self.wait_for_room(len, deadline)?,
                other => return other,
            }
        }
    }

    /// Waits until `try_loan(len)` may succeed, following the channel's wait strategy.
    /// `deadline` `None` waits forever; a passed deadline gives `Timeout`.
    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()>;

    /// Publishes the first `len` bytes of `loan` (`len` <= the loan's length) as the next
    /// message. Returns its sequence number (0, 1, 2, ...).
    ///
    /// # Safety
    /// `loan` is this transport's outstanding loan, as [`try_loan`](Self::try_loan),
    /// [`loan_fast`](Self::loan_fast) or [`loan`](Self::loan) made it, not published or
    /// cancelled yet. (Implementations check what they can, but the bytes of a forged loan
    /// may already have been written.)
    unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64>;

    /// Fills the first `len` bytes of `loan` piece by piece with `fill(offset, piece)` and
    /// publishes them, as a transport that can send part of a message while the rest is being
    /// filled does (staged GPU buffers: the GPU-to-host copy of one piece overlaps the sending
    /// of the last). A failed fill cancels the loan, or, where part was already sent, cuts the
    /// message short, which the consumer sees as `Corrupt`.
    ///
    /// # Safety
    /// As [`publish`](Self::publish): `loan` is this transport's outstanding loan, so its `len`
    /// bytes at `ptr` are writable and nothing else touches them.
    unsafe fn publish_filled(
        &mut self,
        loan: RawLoan,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64> {
        if len > loan.len {
            let lent = loan.len;
            // SAFETY: the caller's loan, given back once.
            unsafe { self.cancel(loan) };
            return Err(Error::invalid(format!("{len} bytes do not fit a loan of {lent}")));
        }
        // SAFETY: the loan is at least `len` writable bytes that nothing else touches until it
        // is published or cancelled (this function's contract).
        let room = unsafe { std::slice::from_raw_parts_mut(loan.ptr, len) };
        if let Err(e) = fill(0, room) {
            // SAFETY: as above.
            unsafe { self.cancel(loan) };
            return Err(e);
        }
        // SAFETY: the same loan, as the caller promised.
        unsafe { self.publish(loan, len) }
    }

    /// Gives an unpublished loan back.
    ///
    /// # Safety
    /// As [`publish`](Self::publish). (Cancelling a loan that is not outstanding does nothing.)
    unsafe fn cancel(&mut self, loan: RawLoan);

    /// How many messages the consumer has released (all sequence numbers below it are done).
    fn completed(&mut self) -> Result<u64>;

    /// What the last look at the consumer's releases found, without looking again (no
    /// cross-core read): a lower bound of [`completed`](Self::completed).
    fn completed_hint(&self) -> u64;

    /// Waits until `completed() > seq`.
    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()>;

    /// Sends `len` bytes at `offset` of `region` without copying, waiting for room up to
    /// `deadline` (`None`: forever). The region must not be written until the message is
    /// complete.
    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        let _ = (region.arena_len(), offset, len, deadline);
        Err(Error::Unsupported(format!(
            "{} transport cannot send lava-flow buffers by reference yet; use send (copy) or loan",
            self.info().kind
        )))
    }

    /// As [`send_region`](Self::send_region), but `WouldBlock` at once when there is no room.
    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        self.send_region(region, offset, len, Some(Instant::now()))
    }

    /// Publishes route `route`'s `descriptor` as the next message, after passing
    /// `attachments` to the consumer (in order: before the message; taken from the vector
    /// only once there is room for the message, so that a send that found none leaves them
    /// for the next). Waits for room up to `deadline` (`Some(now)`: `WouldBlock` at once when
    /// full).
    fn send_routed(
        &mut self,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Attachment>,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        let _ = (route, descriptor, attachments, deadline);
        Err(Error::Unsupported(format!("the {} transport carries no other route's messages", self.info().kind)))
    }

    /// The consumer's rendezvous sections for routes other than the carrier's.
    fn peer_sections(&mut self) -> Vec<Attachment> {
        Vec::new()
    }

    /// How many arenas (memory files) this producer has passed to its consumer.
    fn arenas_sent(&self) -> u64 {
        0
    }

    /// Where the routes keep what they hold for this consumer, which the carrier lets go of
    /// as soon as it learns that the consumer died ([`PeerHolds`]); `None` where it cannot
    /// (the routes then keep theirs until the channel is freed).
    fn peer_holds(&self) -> Option<Arc<PeerHolds>> {
        None
    }

    /// The consumer: its process, host (empty: this host) and carrier, `Alive`. A fan-out's
    /// producer reports each consumer's end so.
    fn peer(&self) -> Peer {
        Peer { state: PeerState::Alive, route: Some(self.info().kind.name()), ..Peer::free(0) }
    }

    /// Whether a loan of `len` bytes would be granted now (`PeerGone` once the consumer has
    /// gone): what a fan-out asks of every consumer's end before it sends to all of them.
    fn has_room_for(&mut self, len: usize) -> Result<bool> {
        match self.try_loan(len) {
            Ok(loan) => {
                // SAFETY: the loan was just lent by this transport, and nothing wrote it.
                unsafe { self.cancel(loan) };
                Ok(true)
            }
            Err(Error::WouldBlock(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Asks for the memory that the next publish writes, for writing, without waiting for it:
    /// a fan-out publishes to several consumers in a row, and their lines, which each consumer
    /// last read, then come in parallel rather than one after the other.
    fn prefetch_publish(&self) {}

    /// Ends the connection to a consumer that a fan-out found too slow: the consumer reads
    /// the messages it has, then learns that it was detached. (Where the carrier cannot say
    /// so, dropping the end afterwards closes it as any producer closes.)
    fn detach(&mut self) {}
}

/// The receiving half of a carrier: where producers attach, each as a session of its own
/// ([`ConsumerSession`]). The channel core holds the sessions and chooses among them: a pair
/// channel has one at a time (a new producer is taken up once the last one's end was
/// reported), and the views of an earlier session stay valid while they are held.
pub trait ConsumerTransport: Send {
    /// One producer's session.
    type Session: ConsumerSession;

    fn info(&self) -> &TransportInfo;

    /// A producer that has attached since the last call, as a new session, if one waits;
    /// never blocks. (The first session comes with the carrier, from its rendezvous.)
    fn try_accept(&mut self) -> Result<Option<Self::Session>>;

    /// A file descriptor that polls readable while a watched session has a message waiting or
    /// its producer has gone; from the first call on, the sessions' producers signal it (a
    /// syscall per message only while the consumer sleeps on it). A fan-in's carrier also
    /// watches its rendezvous there: a producer waiting to attach keeps it readable until
    /// [`try_accept`](Self::try_accept) takes it up.
    fn notify_fd(&mut self) -> Result<BorrowedHandle<'_>>;

    /// Adds `session` to what [`notify_fd`](Self::notify_fd) watches, once it is set up.
    fn watch(&mut self, session: &mut Self::Session) -> Result<()>;

    /// Takes `session` out of what [`notify_fd`](Self::notify_fd) watches.
    fn unwatch(&mut self, session: &mut Self::Session);
}

/// One producer's session at a consumer: that producer's messages, in its order, and their
/// release, and what the producer brought for the other routes.
pub trait ConsumerSession: Send {
    /// Tells this session's views from those of the consumer's other sessions
    /// ([`RawView::session`]).
    fn id(&self) -> u64;

    /// The carrier's route for this session's producer, when it says more than the plan did
    /// (how it learns of the producer's end, say).
    fn route(&self) -> Option<Route> {
        None
    }

    /// The producer: its slot in a fan-in (0 otherwise), process, host (empty: this host) and
    /// carrier; `Alive`, or `Gone` once its end is known here (its messages may still wait).
    fn peer(&self) -> Peer;

    /// The next message, `WouldBlock` when none is waiting, `PeerGone` when none is waiting
    /// and the producer has gone (messages it sent before stay readable), every time after.
    fn try_recv(&mut self) -> Result<RawView>;

    /// The next message if one is waiting and needs no attention: the inlined first try of
    /// every receive (a routed view among them: check [`RawView::route`]). `None` says
    /// nothing (the channel may be empty, closed or corrupt): ask [`try_recv`](Self::try_recv)
    /// or [`recv`](Self::recv).
    fn recv_fast(&mut self) -> Option<RawView> {
        None
    }

    /// The next message, waiting for it up to `deadline` (`None`: forever).
    fn recv(&mut self, deadline: Option<Instant>) -> Result<RawView> {
        loop {
            match self.try_recv() {
                Err(Error::WouldBlock(_)) => self.wait(deadline)?,
                other => return other,
            }
        }
    }

    /// Waits until `try_recv` may succeed (a message, or the producer gone), following the
    /// channel's wait strategy. A passed deadline gives `Timeout`.
    fn wait(&mut self, deadline: Option<Instant>) -> Result<()>;

    /// The release side for this session's views, callable from any thread.
    fn releaser(&self) -> Arc<dyn Release>;

    /// Releases a view of this session by value (the C API keeps no per-view object).
    ///
    /// # Safety
    /// `view` was handed out by this session and nothing uses it, or anything resolved from
    /// it, any more: once released, its bytes (and any route's memory it kept alive) may be
    /// reused or unmapped. (Implementations refuse views they did not hand out or that were
    /// released already, but cannot tell a copy of a view that is still in use.)
    unsafe fn release(&mut self, view: &RawView) -> Result<()>;

    /// Whether a view of this session is still held.
    fn holds_views(&self) -> bool;

    /// How many messages of this session the consumer has released in order (every sequence
    /// number below it is released).
    fn released_below(&self) -> u64;

    /// Keeps `keep` (another route's memory) alive while any view of this session is held, and
    /// drops it at once when none is: what lets routed payloads point into memory without a
    /// reference count per message.
    fn keep_while_held(&mut self, keep: Box<dyn Any + Send + Sync>);

    /// The producer's rendezvous sections for routes other than the carrier's, once.
    fn take_offers(&mut self) -> Option<Vec<Attachment>> {
        None
    }

    /// The other routes' attachments that have arrived, in order, without waiting.
    fn take_attachments(&mut self) -> Result<Vec<Attachment>> {
        Ok(Vec::new())
    }

    /// How many arenas (memory files) this session's producer has passed to the consumer.
    fn arenas_received(&self) -> u64 {
        0
    }

    /// The consumer is about to sleep on the notification fd of the carrier that watches this
    /// session (or, its application having asked for that fd, sleeps outside lava-flow from
    /// now on): until [`woke`](Self::woke), the fd is readable while a message of this
    /// session waits. `true` where one waits already, or arrives without the fd's knowing
    /// (then the consumer does not sleep). A carrier whose fd watches its sessions at all
    /// times has nothing to do.
    fn sleep(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// The consumer woke from the sleep that [`sleep`](Self::sleep) began.
    fn woke(&mut self) {}
}

/// A route's descriptor of one payload, with what the consumer must learn before it (an
/// arena's memory file the first time). The producer keeps one and packs every message into
/// it: attachments of a message that did not go out (no room, timeout) stay at the front and
/// go with the next, so the consumer still learns what they say before anything needs it.
pub struct Packed {
    /// The descriptor's first `descriptor_len` bytes (no allocation per message).
    pub descriptor: [u8; Packed::MAX_DESCRIPTOR],
    pub descriptor_len: usize,
    pub attachments: Vec<Attachment>,
}

impl Default for Packed {
    fn default() -> Packed {
        Packed { descriptor: [0; Packed::MAX_DESCRIPTOR], descriptor_len: 0, attachments: Vec::new() }
    }
}

impl Packed {
    /// The longest descriptor a route may pack.
    pub const MAX_DESCRIPTOR: usize = 64;
}

/// The kinds of memory a payload can lie in. A route serves some of them; the producer asks
/// the owner of each message's memory which kind it is, and the kind picks the route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// GPU memory lava-flow allocated through Vulkan (Layer 1), exportable to local peers.
    Vulkan,
    /// Device memory of the CUDA driver that another allocator made (a framework's tensor).
    Cuda,
}

impl MemoryKind {
    /// Every kind, in the order of a route table's slots.
    pub const ALL: [MemoryKind; 2] = [MemoryKind::Vulkan, MemoryKind::Cuda];

    /// The kind's slot in a route table.
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// The class of payload the kind belongs to, for reports.
    pub fn class(self) -> PayloadClass {
        match self {
            MemoryKind::Vulkan => PayloadClass::Gpu,
            MemoryKind::Cuda => PayloadClass::Cuda,
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryKind::Vulkan => "lava-flow's Vulkan memory",
            MemoryKind::Cuda => "CUDA device memory",
        })
    }
}

/// The memory a payload lies in, as the producer hands it to a route.
#[derive(Clone, Copy)]
pub enum PayloadMemory<'a> {
    /// A buffer of lava-flow's own (Layer 1).
    Buffer(&'a Buffer),
    /// Memory another allocator made, described by the object its route knows (the route
    /// downcasts it): nothing here needs a lava-flow buffer over it.
    Foreign(&'a (dyn Any + Send + Sync)),
}

/// What a route is asked to carry: `len` bytes at `offset` of `memory`, which is of `kind`,
/// in place once the route's ready semaphore reaches `ready_value` (0: now).
#[derive(Clone, Copy)]
pub struct Payload<'a> {
    pub memory: PayloadMemory<'a>,
    pub kind: MemoryKind,
    pub offset: usize,
    pub len: usize,
    pub ready_value: u64,
}

/// The sending half of a payload route.
pub trait RouteSender: Send {
    /// The route's id in descriptors, sections and attachments.
    fn route_id(&self) -> u32;

    /// Which transport, and how it synchronises, for the channel's report.
    fn route(&self) -> &Route;

    /// The report's line for a second class of payload the route serves, if it serves one.
    fn second_route(&self) -> Option<&Route> {
        None
    }

    /// Whether the route carries payloads in memory of `kind` (to this peer: a route the peer
    /// declined is not in the channel's table at all).
    fn serves(&self, kind: MemoryKind) -> bool;

    /// Packs `payload` into `out`: its descriptor, and attachments appended to those already
    /// there. `completed`: how many messages the consumer is known to have released, so that
    /// the route may let go of memory no message needs.
    fn pack(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()>;

    /// A new descriptor of the route's released semaphore, which the consumer signals to
    /// `seq + 1` once it let go of message `seq` and every GPU message before it
    /// (`Unsupported`, saying why, where the channel has none).
    fn released_semaphore(&self) -> Result<crate::os::OwnedHandle>;

    /// The message just packed went out as `seq`: the route keeps its memory alive until the
    /// consumer has released it.
    fn sent(&mut self, seq: u64);

    /// A new descriptor of the route's ready semaphore, for the producer's own GPU work to
    /// signal (`Unsupported` where the route synchronises on the host).
    fn ready_semaphore(&self) -> Result<crate::os::OwnedHandle>;

    /// The ready semaphore this route shares with the consumer, for the channel's other routes.
    fn ready_share(&self) -> ReadyOffer {
        None
    }

    /// The channel's ready semaphore as the route that owns it shares it, or why none is.
    fn share_ready(&mut self, _share: &SharedReady) {}
}

/// Memory a route received from its peer (an imported arena), shared by every message into it.
pub trait RoutedMemory: Send + Sync {
    /// Byte 0 in this process where the host maps the memory, else null.
    fn host_base(&self) -> *mut u8;
    /// A lava-flow buffer over `len` bytes at `offset`, whose GPU work waits for `ready_value`
    /// (0: none), which holds the memory itself; `None` for memory Layer 1 cannot wrap (a
    /// route's own kind of memory). The route checked the range when it resolved the message.
    fn view(&self, offset: u64, len: usize, ready_value: u64) -> Option<Buffer>;
    /// The consumer let go of message `seq`, a payload in this memory (the route may tell
    /// the producer's GPU work).
    fn released(&self, seq: u64);
    /// Where CUDA device memory: byte 0's CUDA address in this process, and this process's
    /// ordinal of the device that holds it.
    fn cuda(&self) -> Option<(u64, i32)> {
        None
    }
    /// The consumer lets go of message `seq` and signals the producer's released semaphore
    /// itself, on its GPU after its own work on the message: the value to signal (0: none is
    /// due yet, an earlier message is still held). From then on the route leaves every signal
    /// to the caller (see [`RoutedPayload::released_by_caller`]). `Err`, saying why, where the
    /// route has no released semaphore; then nothing changed.
    fn released_by_caller(&self, _seq: u64) -> std::result::Result<u64, String> {
        Err("this route has no released semaphore".to_owned())
    }
}

/// A payload as a route hands it to the consumer: `len` bytes at `offset` of the producer's
/// memory, ready for use once `ready_value` is reached (0: now), carried by message `seq`.
/// Made with no reference count and no allocation: the route keeps the memory alive while the
/// message's view is held (through [`ConsumerSession::keep_while_held`] once the route lets
/// go of it). The [`Buffer`] over it is made when asked for. Dropping it, which must happen
/// before the view is released, tells the route that the consumer let go of the payload.
pub struct RoutedPayload {
    memory: NonNull<dyn RoutedMemory>,
    pub offset: u64,
    pub len: usize,
    pub ready_value: u64,
    pub seq: u64,
}

// SAFETY: the memory is Send + Sync (RoutedMemory's bounds) and outlives the payload (new's
// contract); the payload only reads through the pointer.
unsafe impl Send for RoutedPayload {}
// SAFETY: as above.
unsafe impl Sync for RoutedPayload {}

impl Drop for RoutedPayload {
    #[inline]
    fn drop(&mut self) {
        self.memory().released(self.seq);
    }
}

impl RoutedPayload {
    /// # Safety
    /// `memory` stays alive and in place until the payload is dropped: the route keeps it
    /// while message `seq`'s view is held, and the payload is dropped before the view is
    /// released.
    pub unsafe fn new(
        memory: &(dyn RoutedMemory + 'static),
        offset: u64,
        len: usize,
        ready_value: u64,
        seq: u64,
    ) -> RoutedPayload {
        RoutedPayload { memory: NonNull::from(memory), offset, len, ready_value, seq }
    }

    #[inline]
    fn memory(&self) -> &dyn RoutedMemory {
        // SAFETY: alive until the payload is dropped (new's contract).
        unsafe { self.memory.as_ref() }
    }

    /// The first byte in this process, or null where the host cannot map the memory.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        let base = self.memory().host_base();
        if base.is_null() {
            return std::ptr::null();
        }
        // SAFETY: the route checked offset + len against the memory's size, and the memory
        // is mapped from byte 0 (`host_base`).
        unsafe { base.add(self.offset as usize) }
    }

    /// For CUDA memory: the payload's first byte as a CUDA device address in this process, and
    /// this process's ordinal of the device that holds it. `None` for other memory.
    pub fn cuda_ptr(&self) -> Option<(u64, i32)> {
        let (base, device) = self.memory().cuda()?;
        Some((base + self.offset, device))
    }

    /// A lava-flow buffer over the payload, which holds the memory itself (`None` where Layer 1
    /// cannot wrap the memory).
    pub fn to_buffer(&self) -> Option<Buffer> {
        self.memory().view(self.offset, self.len, self.ready_value)
    }

    /// Tells the route that the consumer lets go of the payload and signals the producer's
    /// released semaphore itself, on its GPU once its work on the message is done: the value
    /// to signal there, 0 where none is due yet. The value covers every message let go of
    /// before it too, so the caller signals it after the work on those as well, and signals
    /// values in the order they are returned (one stream, or streams ordered one after the
    /// other): a timeline semaphore's value must only grow. Once a route handed a value to the
    /// caller, it signals nothing itself: a payload dropped without this call leaves its value
    /// to the next one. Dropping the payload afterwards changes nothing. `Err`, saying why,
    /// where the route has no released semaphore (nothing changed: drop the payload as usual).
    pub fn released_by_caller(&self) -> std::result::Result<u64, String> {
        self.memory().released_by_caller(self.seq)
    }
}

/// The receiving half of a payload route.
pub trait RouteReceiver: Send {
    fn route_id(&self) -> u32;

    /// A new producer attached: its rendezvous section for this route (or none). The earlier
    /// session was ended first ([`end_session`](Self::end_session)).
    fn new_session(&mut self, session: u64, offer: Option<Attachment>) -> Result<()>;

    /// How the current producer's payloads arrive (by this route, or staged through the
    /// carrier), for the channel's report.
    fn route(&self, carrier: TransportId) -> Route;

    /// The report's line for a second class of payload the current producer sends this way,
    /// if it sends one.
    fn second_route(&self, _carrier: TransportId) -> Option<Route> {
        None
    }

    /// Whether the channel's report has a line for this route with the current producer (a
    /// route for memory the producer's process has none of says nothing).
    fn reported(&self) -> bool {
        true
    }

    /// The current session ended (its producer has gone, or another attached, or the consumer
    /// closes): everything its messages may still use, for the carrier to keep while they are
    /// held ([`ConsumerSession::keep_while_held`]), and the session's id.
    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>);

    /// An attachment the producer passed before the messages that need it. `released_below`:
    /// the carrier's [`ConsumerSession::released_below`], below which no message holds
    /// memory any more.
    fn attach(&mut self, attachment: Attachment, released_below: u64) -> Result<()>;

    /// The payload that message `seq`'s descriptor names; `Ok(None)` when it names an
    /// attachment not arrived yet. Everything in the descriptor is checked: `Corrupt` for a
    /// hostile one.
    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> Result<Option<RoutedPayload>>;

    /// A new descriptor of the ready semaphore of the current producer, for the consumer's
    /// own GPU work to wait on (`Unsupported` where the route synchronises on the host).
    fn ready_semaphore(&self) -> Result<crate::os::OwnedHandle>;

    /// A new descriptor of the current producer's released semaphore, for the consumer's own
    /// GPU work to signal ([`RoutedPayload::released_by_caller`]); `Unsupported`, saying why,
    /// where the producer has none.
    fn released_semaphore(&self) -> Result<crate::os::OwnedHandle> {
        Err(Error::Unsupported("this route has no released semaphore".to_owned()))
    }

    /// The current producer's ready semaphore as this route imported it, for the other routes.
    fn ready_share(&self) -> ReadyOffer {
        None
    }

    /// The current producer's ready semaphore as the route that imported it shares it, or why
    /// the producer shares none (after every route's `new_session`).
    fn share_ready(&mut self, _share: &SharedReady) {}
}
