//! The interface between a channel and the transport that carries its messages.
//!
//! A transport moves messages one way, producer to consumer, in order and exactly once. It is
//! split in two halves because the two ends live in different processes. The shared-memory
//! transport (`transports::shm`) is the first; Vulkan IPC (GPU buffers on one host) and MPI
//! (other hosts) implement the same traits later.
//!
//! Zero copy is expressed by *loans* and *views*: the producer asks its transport for room
//! ([`RawLoan`]), writes the payload there and publishes it; the consumer gets a [`RawView`] of
//! the bytes where they lie and hands it back with [`Release::release`], which is how the
//! producer learns completion. Messages whose bytes already lie in memory the peer can map
//! (a lava-flow buffer from Layer 1) go through [`ProducerTransport::send_region`], with the
//! region described by [`SharedRegion`].

use std::any::Any;
use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::memory::SharedArena;

/// The transports lava-flow knows, built or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// CPU shared memory on one host (memfd + SPSC ring + payload pool).
    Shm,
    /// GPU memory shared through Vulkan external memory on one host (not built yet).
    VulkanIpc,
    /// MPI between hosts (not built yet).
    Mpi,
}

impl TransportKind {
    pub const ALL: [TransportKind; 3] = [TransportKind::Shm, TransportKind::VulkanIpc, TransportKind::Mpi];

    /// The name used in `LF_TRANSPORTS` and reports.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::VulkanIpc => "vulkan_ipc",
            TransportKind::Mpi => "mpi",
        }
    }

    /// Parses a name from `LF_TRANSPORTS` (`shm`, `vulkan_ipc` or `vulkan`, `mpi`).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "shm" | "sm" | "shared_memory" => Ok(TransportKind::Shm),
            "vulkan_ipc" | "vulkan" | "vk" => Ok(TransportKind::VulkanIpc),
            "mpi" => Ok(TransportKind::Mpi),
            other => Err(Error::invalid(format!(
                "unknown transport {other:?}; known transports are shm, vulkan_ipc, mpi"
            ))),
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which transport a channel uses and why it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportInfo {
    pub kind: TransportKind,
    /// One human-readable sentence: the scope, the candidates and what restricted them.
    pub reason: String,
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
/// has had (a new producer may attach after the old one died).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawView {
    pub ptr: *const u8,
    pub len: usize,
    pub token: u64,
    pub session: u64,
    /// [`RawView::ZERO_COPY`] or 0. A whole word, so that the view has no padding bytes:
    /// copying a view with a `bool` here cost narrow, overlapping moves on the hot path.
    pub flags: u64,
}

impl RawView {
    /// The bytes lie in the sender's own buffer (a buffer send), not in the channel's pool.
    pub const ZERO_COPY: u64 = 1;

    #[inline]
    pub fn is_zero_copy(&self) -> bool {
        self.flags & Self::ZERO_COPY != 0
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

/// What a Rust `Message` releases its view through: the built-in shared-memory session
/// directly (inlined, no reference count per message: see `shm::Session::retire`), any other
/// transport through [`Release`].
pub(crate) enum Releaser {
    /// Valid while the message's view is held (`shm::release_message`'s contract).
    Shm(std::ptr::NonNull<super::transports::shm::Session>),
    #[allow(dead_code)]
    Other(Arc<dyn Release>),
}

impl Releaser {
    /// Releases `view`, which this releaser handed out and nobody released yet.
    #[inline]
    pub(crate) fn release_held(&self, view: &RawView) {
        match self {
            // SAFETY: a Releaser::Shm is made (by AnyConsumer::message_releaser) for a view just
            // received from that session, and a Message releases its view once, in its drop.
            Releaser::Shm(session) => unsafe { super::transports::shm::release_message(*session, view) },
            Releaser::Other(release) => release.release_held(view),
        }
    }
}

/// Memory the peer can map by itself, so a message can point into it instead of being
/// copied: a Layer 1 arena (a memfd, [`SharedArena`]) today, a Vulkan allocation later.
///
/// The receiving side maps `fd()` once per arena and caches it; a message then carries
/// (arena, offset, len). The sender keeps [`keep_alive`](Self::keep_alive) until the receiver
/// releases the message.
pub trait SharedRegion {
    /// The file behind the region, passed to the peer over the rendezvous socket once.
    fn fd(&self) -> BorrowedFd<'_>;
    /// The size of the file (the peer maps `[0, arena_len)`).
    fn arena_len(&self) -> usize;
    /// Identifies the arena in this process while a `Weak` of `keep_alive()` lives.
    fn identity(&self) -> usize;
    /// Keeps the memory alive while held.
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync>;
}

impl SharedRegion for SharedArena {
    fn fd(&self) -> BorrowedFd<'_> {
        SharedArena::fd(self)
    }
    fn arena_len(&self) -> usize {
        self.len()
    }
    fn identity(&self) -> usize {
        SharedArena::identity(self)
    }
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        SharedArena::keep_alive(self)
    }
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
    fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64>;

    /// Gives an unpublished loan back.
    fn cancel(&mut self, loan: RawLoan);

    /// How many messages the consumer has released (all sequence numbers below it are done).
    fn completed(&mut self) -> Result<u64>;

    /// Waits until `completed() > seq`.
    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()>;

    /// Sends `len` bytes at `offset` of `region` without copying, waiting for room up to
    /// `deadline` (`None`: forever). The region must not be written until the message is
    /// complete.
    fn send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize, deadline: Option<Instant>) -> Result<u64> {
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

    /// How many arenas (memory files) this producer has passed to its consumer.
    fn arenas_sent(&self) -> u64 {
        0
    }

    /// The shared region, for tests that play a hostile peer.
    #[doc(hidden)]
    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        None
    }
}

/// The receiving half of a transport.
pub trait ConsumerTransport: Send {
    fn info(&self) -> &TransportInfo;

    /// The next message, `WouldBlock` when none is waiting, `PeerGone` when none is waiting
    /// and the producer has gone (messages it sent before stay readable).
    fn try_recv(&mut self) -> Result<RawView>;

    /// The next message if one is waiting and needs no attention: the inlined first try of
    /// every receive. `None` says nothing (the channel may be empty, closed or corrupt): ask
    /// [`try_recv`](Self::try_recv) or [`recv`](Self::recv).
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

    /// The release side for views of the current session.
    fn releaser(&self) -> Arc<dyn Release>;

    /// Releases a view by value (the C API keeps no per-view object). Views of an earlier
    /// producer's session are accepted too.
    fn release(&mut self, view: &RawView) -> Result<()>;

    /// How many arenas (memory files) the producers of this consumer have passed to it.
    fn arenas_received(&self) -> u64 {
        0
    }

    /// A file descriptor that polls readable while a message waits or the producer has gone;
    /// from the first call on, the producer signals it (a syscall per message only while the
    /// consumer sleeps on it).
    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>>;

    /// The shared region, for tests that play a hostile peer.
    #[doc(hidden)]
    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        None
    }
}

/// Forwards every trait method of an enum of transports to its variants, so that a built-in
/// transport is called statically (and its hot path inlined) while others plug in as trait
/// objects.
macro_rules! forward {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            Self::Shm($t) => $call,
            Self::Other($t) => $call,
        }
    };
}

/// The producer transports of a channel: shm statically, anything else dynamically.
// The shm variant is held inline on purpose: it is the hot path.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyProducer {
    Shm(super::transports::shm::ShmProducer),
    #[allow(dead_code)]
    Other(Box<dyn ProducerTransport>),
}

impl ProducerTransport for AnyProducer {
    #[inline]
    fn info(&self) -> &TransportInfo {
        forward!(self, t => t.info())
    }
    #[inline]
    fn max_message_len(&self) -> usize {
        forward!(self, t => t.max_message_len())
    }
    #[inline]
    fn try_loan(&mut self, len: usize) -> Result<RawLoan> {
        forward!(self, t => t.try_loan(len))
    }
    #[inline(always)]
    fn loan_fast(&mut self, len: usize) -> Option<RawLoan> {
        forward!(self, t => t.loan_fast(len))
    }
    fn loan(&mut self, len: usize, deadline: Option<Instant>) -> Result<RawLoan> {
        forward!(self, t => t.loan(len, deadline))
    }
    #[inline]
    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()> {
        forward!(self, t => t.wait_for_room(len, deadline))
    }
    #[inline]
    fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64> {
        forward!(self, t => t.publish(loan, len))
    }
    #[inline]
    fn cancel(&mut self, loan: RawLoan) {
        forward!(self, t => t.cancel(loan))
    }
    fn completed(&mut self) -> Result<u64> {
        forward!(self, t => t.completed())
    }
    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        forward!(self, t => t.wait_completed(seq, deadline))
    }
    #[inline]
    fn send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize, deadline: Option<Instant>) -> Result<u64> {
        forward!(self, t => t.send_region(region, offset, len, deadline))
    }
    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        forward!(self, t => t.try_send_region(region, offset, len))
    }
    fn arenas_sent(&self) -> u64 {
        forward!(self, t => t.arenas_sent())
    }
    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        forward!(self, t => t.raw_region())
    }
}

/// The consumer transports of a channel: shm statically, anything else dynamically.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyConsumer {
    Shm(super::transports::shm::ShmConsumer),
    #[allow(dead_code)]
    Other(Box<dyn ConsumerTransport>),
}

impl AnyConsumer {
    /// The releaser of the current session, statically typed for the shm transport.
    #[inline]
    pub(crate) fn message_releaser(&self) -> Releaser {
        match self {
            Self::Shm(t) => Releaser::Shm(t.session_ptr()),
            Self::Other(t) => Releaser::Other(t.releaser()),
        }
    }
}

impl ConsumerTransport for AnyConsumer {
    #[inline]
    fn info(&self) -> &TransportInfo {
        forward!(self, t => t.info())
    }
    fn try_recv(&mut self) -> Result<RawView> {
        forward!(self, t => t.try_recv())
    }
    #[inline(always)]
    fn recv_fast(&mut self) -> Option<RawView> {
        forward!(self, t => t.recv_fast())
    }
    fn recv(&mut self, deadline: Option<Instant>) -> Result<RawView> {
        forward!(self, t => t.recv(deadline))
    }
    fn wait(&mut self, deadline: Option<Instant>) -> Result<()> {
        forward!(self, t => t.wait(deadline))
    }
    fn releaser(&self) -> Arc<dyn Release> {
        forward!(self, t => t.releaser())
    }
    #[inline]
    fn release(&mut self, view: &RawView) -> Result<()> {
        forward!(self, t => t.release(view))
    }
    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>> {
        forward!(self, t => t.notify_fd())
    }
    fn arenas_received(&self) -> u64 {
        forward!(self, t => t.arenas_received())
    }
    fn raw_region(&self) -> Option<(*mut u8, usize)> {
        forward!(self, t => t.raw_region())
    }
}
