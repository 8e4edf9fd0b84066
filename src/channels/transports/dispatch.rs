//! The channel core's handles on the built transports: one enum per half of a carrier and of a
//! route, whose trait methods call each variant statically, so that the built-in carriers' hot
//! paths inline into the core. The forwarding is generated from the methods' signatures.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use super::cuda_ipc;
#[cfg(feature = "mpi")]
use super::mpi;
#[cfg(feature = "vulkan")]
use super::vulkan_ipc;
use super::{loopback, shm};
use crate::channels::peers::Peer;
use crate::channels::ready::{ReadyOffer, SharedReady};
use crate::channels::transport::{
    Attachment, ConsumerSession, ConsumerTransport, MemoryKind, Packed, Payload, PeerHolds, ProducerTransport, RawLoan,
    RawView, Release, Route, RouteReceiver, RouteSender, RoutedPayload, SharedRegion, TransportId, TransportInfo,
};
use crate::error::Result;

/// Implements a trait for an enum of implementations by calling the variant's own method,
/// given the trait's method signatures (`&self`, `&mut self` or `unsafe ... &mut self`).
/// `$forward` is the macro that matches the enum's variants.
macro_rules! forward_impl {
    ($forward:ident: impl $trait:ident for $enum:ident { $($items:tt)* }) => {
        impl $trait for $enum {
            forward_impl!(@items $forward $($items)*);
        }
    };
    (@items $forward:ident) => {};
    (@items $forward:ident $(#[$attr:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
        $($rest:tt)*) => {
        $(#[$attr])*
        fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
            $forward!(self, t => t.$name($($arg),*))
        }
        forward_impl!(@items $forward $($rest)*);
    };
    (@items $forward:ident $(#[$attr:meta])* fn $name:ident(&mut self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
        $($rest:tt)*) => {
        $(#[$attr])*
        fn $name(&mut self $(, $arg: $ty)*) $(-> $ret)? {
            $forward!(self, t => t.$name($($arg),*))
        }
        forward_impl!(@items $forward $($rest)*);
    };
    (@items $forward:ident $(#[$attr:meta])* unsafe fn $name:ident(&mut self $(, $arg:ident: $ty:ty)* $(,)?)
        $(-> $ret:ty)?; $($rest:tt)*) => {
        $(#[$attr])*
        unsafe fn $name(&mut self $(, $arg: $ty)*) $(-> $ret)? {
            // SAFETY: the variant's method has the trait method's contract, which the caller keeps.
            $forward!(self, t => unsafe { t.$name($($arg),*) })
        }
        forward_impl!(@items $forward $($rest)*);
    };
    // `fast`: an inlined first try of the message path (`None` says nothing). Only the
    // shared-memory carrier's is tried here; the others' answer `None`, and their full path
    // (which tries theirs) follows: a fast try of several carriers cost every message its
    // answer kept in a register and tested twice.
    (@items $forward:ident fast fn $name:ident(&mut self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
        $($rest:tt)*) => {
        #[inline(always)]
        fn $name(&mut self $(, $arg: $ty)*) -> $ret {
            match self {
                Self::Shm(t) => t.$name($($arg),*),
                _ => None,
            }
        }
        forward_impl!(@items $forward $($rest)*);
    };
    // `hot`: a method of the message path. The shared-memory carrier's is inlined behind one
    // test of the variant; the others' are a call (a third variant in the match cost every
    // message a few instructions).
    (@items $forward:ident hot fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
        $($rest:tt)*) => {
        #[inline(always)]
        fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
            match self {
                Self::Shm(t) => t.$name($($arg),*),
                other => cold(move || $forward!(other, t => t.$name($($arg),*))),
            }
        }
        forward_impl!(@items $forward $($rest)*);
    };
    (@items $forward:ident hot fn $name:ident(&mut self $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?;
        $($rest:tt)*) => {
        #[inline(always)]
        fn $name(&mut self $(, $arg: $ty)*) $(-> $ret)? {
            match self {
                Self::Shm(t) => t.$name($($arg),*),
                other => cold(move || $forward!(other, t => t.$name($($arg),*))),
            }
        }
        forward_impl!(@items $forward $($rest)*);
    };
    (@items $forward:ident hot unsafe fn $name:ident(&mut self $(, $arg:ident: $ty:ty)* $(,)?)
        $(-> $ret:ty)?; $($rest:tt)*) => {
        #[inline(always)]
        unsafe fn $name(&mut self $(, $arg: $ty)*) $(-> $ret)? {
            match self {
                // SAFETY: the variant's method has the trait method's contract, which the
                // caller keeps.
                Self::Shm(t) => unsafe { t.$name($($arg),*) },
                // SAFETY: as above.
                other => cold(move || $forward!(other, t => unsafe { t.$name($($arg),*) })),
            }
        }
        forward_impl!(@items $forward $($rest)*);
    };
}

/// Runs `f` out of line: the carriers other than shared memory, off the message path's code.
#[cold]
#[inline(never)]
fn cold<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Matches every carrier of an enum of carriers.
macro_rules! forward_carrier {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            Self::Shm($t) => $call,
            Self::Loopback($t) => $call,
            #[cfg(feature = "mpi")]
            Self::Mpi($t) => $call,
        }
    };
}

/// Matches every producer half of a carrier.
macro_rules! forward_producer {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            Self::Shm($t) => $call,
            Self::Loopback($t) => $call,
            #[cfg(feature = "mpi")]
            Self::Mpi($t) => $call,
        }
    };
}

/// Matches every route of an enum of routes.
macro_rules! forward_route {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "vulkan")]
            Self::VulkanIpc($t) => $call,
            Self::CudaIpc($t) => $call,
            Self::Other($t) => $call,
        }
    };
}

/// The producer half of a channel's carrier.
// One per channel end, made once: the shared-memory carrier's state inline (its ring and pool
// fields on the hot path) costs nothing worth a box on every access.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyProducer {
    Shm(shm::ShmProducer),
    Loopback(loopback::LoopbackProducer),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiProducer),
}

/// The consumer half of a channel's carrier.
pub(crate) enum AnyConsumer {
    Shm(shm::ShmConsumer),
    Loopback(loopback::LoopbackConsumer),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiConsumer),
}

/// One producer's session at a consumer (its hot path inlines).
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnySession {
    Shm(shm::ShmSession),
    Loopback(loopback::LoopbackSession),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiSession),
}

/// The sending half of a route (a routed message's hot path inlines for the built ones).
// A few per channel, made once: boxing the built ones would cost an indirection per message.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyRouteSender {
    #[cfg(feature = "vulkan")]
    VulkanIpc(vulkan_ipc::Sender),
    CudaIpc(cuda_ipc::Sender),
    /// A route this build does not list (the core's tests bring their own).
    #[allow(dead_code)]
    Other(Box<dyn RouteSender>),
}

/// The receiving half of a route.
// A few per channel, made once: boxing the built ones would cost an indirection per message.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyRouteReceiver {
    #[cfg(feature = "vulkan")]
    VulkanIpc(vulkan_ipc::Receiver),
    CudaIpc(cuda_ipc::Receiver),
    #[allow(dead_code)]
    Other(Box<dyn RouteReceiver>),
}

/// What a Rust `Message` releases its view through: the carrier's session directly (inlined,
/// no reference count per message: see the shared-memory session's `retire`).
pub(crate) enum MessageReleaser {
    /// Valid while the message's view is held (`shm::release_message`'s contract).
    Shm(NonNull<shm::Session>),
    /// A carrier's shared release side (one reference count per message).
    Shared(Arc<dyn Release>),
}

impl MessageReleaser {
    /// Releases `view`, which this releaser handed out and nobody released yet.
    #[inline]
    pub(crate) fn release_held(&self, view: &RawView) {
        match self {
            // SAFETY: a MessageReleaser::Shm is made (by AnyConsumer::message_releaser) for a
            // view just received from that session, and a Message releases its view once, in
            // its drop.
            MessageReleaser::Shm(session) => unsafe { shm::release_message(*session, view) },
            MessageReleaser::Shared(release) => release.release_held(view),
        }
    }
}

impl AnyConsumer {
    /// Whether `session` is one of this carrier's (the carrier that watches it).
    pub(crate) fn owns(&self, session: &AnySession) -> bool {
        matches!(
            (self, session),
            (AnyConsumer::Shm(_), AnySession::Shm(_)) | (AnyConsumer::Loopback(_), AnySession::Loopback(_))
        ) || self.owns_mpi(session)
    }

    #[cfg(feature = "mpi")]
    fn owns_mpi(&self, session: &AnySession) -> bool {
        matches!((self, session), (AnyConsumer::Mpi(_), AnySession::Mpi(_)))
    }

    #[cfg(not(feature = "mpi"))]
    fn owns_mpi(&self, _session: &AnySession) -> bool {
        false
    }
}

impl AnySession {
    /// A session whose producer has ended without a message: a consumer's current session
    /// where it has none (a fan-in's sessions are its slots').
    pub(crate) fn ended(name: &str) -> AnySession {
        AnySession::Loopback(loopback::LoopbackSession::ended(name))
    }

    /// The releaser of the session's messages, statically typed.
    #[inline]
    pub(crate) fn message_releaser(&self) -> MessageReleaser {
        match self {
            Self::Shm(t) => MessageReleaser::Shm(t.session_ptr()),
            Self::Loopback(t) => MessageReleaser::Shared(t.releaser()),
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => MessageReleaser::Shared(t.releaser()),
        }
    }
}

/// Calls `$call` with the carrier's and the session's halves when they are of one carrier (a
/// carrier's sessions are its own).
macro_rules! with_session {
    ($carrier:expr, $session:expr, ($c:ident, $s:ident) => $call:expr) => {
        match ($carrier, $session) {
            (AnyConsumer::Shm($c), AnySession::Shm($s)) => $call,
            (AnyConsumer::Loopback($c), AnySession::Loopback($s)) => $call,
            #[cfg(feature = "mpi")]
            (AnyConsumer::Mpi($c), AnySession::Mpi($s)) => $call,
            #[allow(unreachable_patterns)]
            _ => unreachable!("a carrier is given sessions of its own only"),
        }
    };
}

impl ConsumerTransport for AnyConsumer {
    type Session = AnySession;

    #[inline]
    fn info(&self) -> &TransportInfo {
        forward_carrier!(self, t => t.info())
    }

    fn try_accept(&mut self) -> Result<Option<AnySession>> {
        Ok(match self {
            Self::Shm(t) => t.try_accept()?.map(AnySession::Shm),
            Self::Loopback(t) => t.try_accept()?.map(AnySession::Loopback),
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => t.try_accept()?.map(AnySession::Mpi),
        })
    }

    fn notify_fd(&mut self) -> Result<BorrowedHandle<'_>> {
        forward_carrier!(self, t => t.notify_fd())
    }

    fn watch(&mut self, session: &mut AnySession) -> Result<()> {
        with_session!(self, session, (c, s) => c.watch(s))
    }

    fn unwatch(&mut self, session: &mut AnySession) {
        with_session!(self, session, (c, s) => c.unwatch(s))
    }
}

impl AnyProducer {
    /// A producer end that is connected nowhere and refuses every send: a channel's carrier
    /// where its consumers' ends are elsewhere (a fan-out's, one per slot).
    pub(crate) fn ended(name: &str, info: TransportInfo) -> AnyProducer {
        AnyProducer::Loopback(loopback::LoopbackProducer::ended(name, info))
    }

    /// Publishes `loan` as [`ProducerTransport::publish`] does, the shared-memory carrier's
    /// inline, or hands it to `elsewhere` out of line with the carrier (where the loan may be
    /// another end's: a fan-out's, whose carrier is connected nowhere), so that a pair's
    /// publish keeps its one test of the carrier.
    ///
    /// # Safety
    /// As [`ProducerTransport::publish`], for this carrier or for what `elsewhere` publishes
    /// it on.
    #[inline(always)]
    pub(crate) unsafe fn publish_else(
        &mut self,
        loan: RawLoan,
        len: usize,
        elsewhere: impl FnOnce(&mut AnyProducer, RawLoan, usize) -> Result<u64>,
    ) -> Result<u64> {
        match self {
            // SAFETY: this function's contract.
            Self::Shm(t) => unsafe { t.publish(loan, len) },
            other => cold(move || elsewhere(other, loan, len)),
        }
    }

    /// Sends a malformed message, for tests that play a hostile peer (see the MPI carrier's
    /// `send_malformed`); `Unsupported` on carriers that cannot.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn send_malformed(&mut self, how: u32) -> Result<()> {
        match self {
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => t.send_malformed(how),
            _ => Err(crate::error::Error::Unsupported(format!(
                "the {} carrier cannot send malformed message {how}",
                self.info().kind
            ))),
        }
    }
}

forward_impl!(forward_producer: impl ProducerTransport for AnyProducer {
    #[inline]
    fn info(&self) -> &TransportInfo;
    #[inline]
    fn max_message_len(&self) -> usize;
    #[inline]
    fn try_loan(&mut self, len: usize) -> Result<RawLoan>;
    fast fn loan_fast(&mut self, len: usize) -> Option<RawLoan>;
    fast fn send_fast(&mut self, data: &[u8]) -> Option<u64>;
    fn loan(&mut self, len: usize, deadline: Option<Instant>) -> Result<RawLoan>;
    #[inline]
    fn wait_for_room(&mut self, len: usize, deadline: Option<Instant>) -> Result<()>;
    hot unsafe fn publish(&mut self, loan: RawLoan, len: usize) -> Result<u64>;
    #[inline]
    unsafe fn cancel(&mut self, loan: RawLoan);
    unsafe fn publish_filled(
        &mut self,
        loan: RawLoan,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64>;
    hot fn completed(&mut self) -> Result<u64>;
    hot fn completed_hint(&self) -> u64;
    hot fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()>;
    hot fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64>;
    hot fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64>;
    fn send_routed(
        &mut self,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Attachment>,
        deadline: Option<Instant>,
    ) -> Result<u64>;
    fn peer_sections(&mut self) -> Vec<Attachment>;
    fn arenas_sent(&self) -> u64;
    fn peer_holds(&self) -> Option<Arc<PeerHolds>>;
    fn peer(&self) -> Peer;
    fn has_room_for(&mut self, len: usize) -> Result<bool>;
    hot fn prefetch_publish(&self);
    fn detach(&mut self);
});

forward_impl!(forward_carrier: impl ConsumerSession for AnySession {
    hot fn id(&self) -> u64;
    fn route(&self) -> Option<Route>;
    fn peer(&self) -> Peer;
    fn try_recv(&mut self) -> Result<RawView>;
    fast fn recv_fast(&mut self) -> Option<RawView>;
    fn recv(&mut self, deadline: Option<Instant>) -> Result<RawView>;
    fn wait(&mut self, deadline: Option<Instant>) -> Result<()>;
    fn releaser(&self) -> Arc<dyn Release>;
    hot unsafe fn release(&mut self, view: &RawView) -> Result<()>;
    fn holds_views(&self) -> bool;
    fn released_below(&self) -> u64;
    fn keep_while_held(&mut self, keep: Box<dyn Any + Send + Sync>);
    fn take_offers(&mut self) -> Option<Vec<Attachment>>;
    fn take_attachments(&mut self) -> Result<Vec<Attachment>>;
    fn arenas_received(&self) -> u64;
    fn sleep(&mut self) -> Result<bool>;
    fn woke(&mut self);
});

forward_impl!(forward_route: impl RouteSender for AnyRouteSender {
    #[inline]
    fn route_id(&self) -> u32;
    fn route(&self) -> &Route;
    fn second_route(&self) -> Option<&Route>;
    #[inline]
    fn serves(&self, kind: MemoryKind) -> bool;
    #[inline]
    fn pack(&mut self, payload: &Payload<'_>, completed: u64, out: &mut Packed) -> Result<()>;
    fn released_semaphore(&self) -> Result<OwnedHandle>;
    #[inline]
    fn sent(&mut self, seq: u64);
    fn ready_semaphore(&self) -> Result<OwnedHandle>;
    fn ready_share(&self) -> ReadyOffer;
    fn share_ready(&mut self, share: &SharedReady);
});

forward_impl!(forward_route: impl RouteReceiver for AnyRouteReceiver {
    #[inline]
    fn route_id(&self) -> u32;
    fn new_session(&mut self, session: u64, offer: Option<Attachment>) -> Result<()>;
    fn route(&self, carrier: TransportId) -> Route;
    fn second_route(&self, carrier: TransportId) -> Option<Route>;
    fn reported(&self) -> bool;
    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>);
    fn attach(&mut self, attachment: Attachment, released_below: u64) -> Result<()>;
    #[inline(always)]
    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> Result<Option<RoutedPayload>>;
    fn ready_semaphore(&self) -> Result<OwnedHandle>;
    fn released_semaphore(&self) -> Result<OwnedHandle>;
    fn ready_share(&self) -> ReadyOffer;
    fn share_ready(&mut self, share: &SharedReady);
});
