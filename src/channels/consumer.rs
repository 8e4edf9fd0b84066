//! The receiving end of a channel: blocking, non-blocking, pollable-fd and async receives of
//! zero-copy [`Message`] views.

use crate::os::BorrowedHandle;
#[cfg(feature = "async-io")]
use crate::os::OwnedHandle;
#[cfg(feature = "async-io")]
use std::future::Future;
use std::ops::Deref;
#[cfg(feature = "async-io")]
use std::pin::Pin;
use std::sync::OnceLock;
#[cfg(feature = "async-io")]
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::fan_in::FanIn;
use super::peers::{ChannelKind, Peer};
use super::routes::ReceiverTable;
use super::transport::{
    ConsumerSession, ConsumerTransport, RawView, Route, RouteReceiver, RoutedPayload, TransportInfo,
};
use super::transports::{self, AnyConsumer, AnyRouteReceiver, AnySession, MessageReleaser};
use super::{
    log_closed, log_created, log_creating, log_failed, plan_routes, validate_channel_name, ChannelConfig, Role,
};
use crate::error::{Error, Result};
use crate::memory::{Buffer, Context as MemoryContext};
use crate::types::ProcessLocation;

/// The receiving end of a channel. `&mut self` everywhere; it may move between threads.
pub struct Consumer {
    /// Where producers attach (dropped first: a closing consumer lets go of its name before
    /// it tells its producer).
    carrier: AnyConsumer,
    /// The current producer's session: its messages, in its order. A fan-in's are in
    /// `fan_in`, and this one is an ended session that never has a message.
    session: AnySession,
    /// A fan-in's producers, one session per slot.
    fan_in: Option<Box<FanIn>>,
    /// This process's host, which same-host peers share.
    host: String,
    /// Sessions of earlier producers whose messages are still held.
    old: Vec<AnySession>,
    /// The current producer's end was reported (`PeerGone`): the next producer that attached
    /// is taken up at the next receive, its messages starting again at 0.
    gone_reported: bool,
    /// Whether the carrier's notification fd watches the sessions (set up by `notify_fd`).
    watching: bool,
    /// Arenas received by the sessions before the current one.
    arenas_before: u64,
    /// The routes of payloads the carrier cannot hold (GPU memory), found by the id each
    /// routed message names.
    routes: ReceiverTable<AnyRouteReceiver>,
    info: TransportInfo,
    name: String,
    context: MemoryContext,
    /// The notification fd (a duplicate of the transport's), registered with async-io's
    /// reactor by the first [`recv_async`](Self::recv_async) that has to wait.
    #[cfg(feature = "async-io")]
    notify_async: Option<async_io::Async<OwnedHandle>>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer").field("name", &self.name).field("transport", &self.info).finish()
    }
}

impl Consumer {
    /// Creates the consuming end of channel `name` and waits for a producer (up to
    /// `config.rendezvous_timeout`; the producer may start before or after). The consumer
    /// keeps the name: when its producer has gone, a new producer can attach, and the next
    /// receive after the old producer's messages picks it up. `context` is the process's
    /// memory context.
    ///
    /// A fan-in's consumer (`config.kind`) returns once its first producer attached; the others
    /// attach at any time, met by a thread of the consumer's, and are served from the next
    /// receive on. A fan-out's consumer connects to the fan-out's producer and receives from
    /// its next message on.
    pub fn create(
        context: &MemoryContext,
        name: &str,
        my_location: &ProcessLocation,
        peer_location: &ProcessLocation,
        config: &ChannelConfig,
    ) -> Result<Consumer> {
        crate::logging::init();
        validate_channel_name(name)?;
        config.validate()?;
        let plan = plan_routes(my_location, peer_location, config, context)?;
        log_creating(name, Role::Consumer, plan.carrier.id(), config.rendezvous_timeout);
        let parts = transports::listen_consumer(name, &plan, config, context).inspect_err(|e| {
            log_failed(name, Role::Consumer, |peer| transports::rendezvous_hint(plan.carrier, peer), e)
        })?;
        log_created(name, Role::Consumer, &parts.info);
        let info = parts.info.clone();
        let (carrier, session, fan_in, routes) = match config.kind {
            ChannelKind::FanIn => {
                // Each producer's routes are its slot's.
                let (fan_in, carrier) = FanIn::new(name, config, parts)?;
                (carrier, AnySession::ended(name), Some(Box::new(fan_in)), Vec::new())
            }
            _ => (parts.carrier, parts.session, None, parts.routes),
        };
        Ok(Consumer {
            carrier,
            session,
            fan_in,
            host: my_location.hostname.clone(),
            old: Vec::new(),
            gone_reported: false,
            watching: false,
            arenas_before: 0,
            routes: ReceiverTable::new(routes),
            info,
            name: name.to_owned(),
            context: context.clone(),
            #[cfg(feature = "async-io")]
            notify_async: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds `route` after the routes the channel has (the core's tests bring routes of their
    /// own).
    #[cfg(test)]
    pub(crate) fn add_route(&mut self, route: AnyRouteReceiver) {
        self.routes.push(route);
    }

    /// The memory context the channel was created with.
    pub fn context(&self) -> &MemoryContext {
        &self.context
    }

    /// How many arenas (memory files) producers have passed to this consumer for buffer
    /// sends; each is mapped once per channel and cached.
    pub fn arenas_received(&self) -> u64 {
        let fan_in = self.fan_in.as_ref().map_or(0, |f| f.arenas_received());
        self.arenas_before + self.session.arenas_received() + fan_in
    }

    /// The producers, slot by slot: a pair channel's one, or each of a fan-in's `max_peers`
    /// slots (free, alive, or gone with messages still to read).
    pub fn peers(&self) -> Vec<Peer> {
        let mut peers = match &self.fan_in {
            Some(fan_in) => fan_in.peers(),
            None => vec![self.session.peer()],
        };
        for peer in peers.iter_mut().filter(|p| p.host.is_empty() && p.route.is_some()) {
            peer.host.clone_from(&self.host);
        }
        peers
    }

    /// The fan-in slot whose producer's end the last `PeerGone` reported (`None` before the
    /// first, and for a pair channel).
    pub fn last_gone(&self) -> Option<u32> {
        self.fan_in.as_ref().and_then(|f| f.last_gone())
    }

    /// How many producers are attached now (for a fan-in, those whose end was not reported
    /// yet; for a pair, 1 until its producer's end was reported).
    pub fn producers(&self) -> usize {
        match &self.fan_in {
            Some(fan_in) => fan_in.attached(),
            None => usize::from(!self.gone_reported),
        }
    }

    /// The transports (every route) and why they were chosen. A fan-in's says, for each way
    /// GPU buffers come (by reference, or staged and why), the slots of the producers that
    /// send them so.
    pub fn transport(&self) -> &TransportInfo {
        match &self.fan_in {
            Some(fan_in) => fan_in.info(),
            None => &self.info,
        }
    }

    /// A new descriptor of the current producer's ready semaphore (a Vulkan timeline
    /// semaphore exported as an opaque fd), for the consumer's own GPU work to wait on
    /// [`Message::ready_value`]; `Unsupported` where GPU buffers are synchronised on the host
    /// or staged. A fan-in's producers each have their own: `InvalidState`, saying to ask for
    /// the message's producer's with [`producer_ready_semaphore`](Self::producer_ready_semaphore).
    pub fn ready_semaphore(&mut self) -> Result<crate::os::OwnedHandle> {
        if self.fan_in.is_some() {
            return Err(Error::InvalidState(format!(
                "channel {:?} is a fan-in, whose producers each have their own ready semaphore: ask for the one of \
                 the message's producer, by its slot (Message::producer), with Consumer::producer_ready_semaphore \
                 (C: lf_channel_producer_ready_semaphore)",
                self.name
            )));
        }
        // The semaphore of the route of lava-flow's own GPU memory, which this build's
        // Vulkan routes share; where none has one, the first route's reason (the GPU route's,
        // before routes of other memory, which synchronise on the host).
        let mut why = None;
        for route in self.routes.iter() {
            match route.ready_semaphore() {
                Ok(fd) => return Ok(fd),
                Err(e) => {
                    why.get_or_insert(e);
                }
            }
        }
        Err(why.unwrap_or_else(|| {
            Error::Unsupported(format!(
                "channel {:?} has no GPU route with a shared semaphore: {}",
                self.name, self.info.reason
            ))
        }))
    }

    /// Whether this is a fan-in's consumer (several producers, each with its own semaphores).
    pub fn is_fan_in(&self) -> bool {
        self.fan_in.is_some()
    }

    /// A new descriptor of the producer's released semaphore (where it set
    /// [`ChannelConfig::released_semaphore`](super::ChannelConfig::released_semaphore)), for
    /// this process's GPU work to signal as it lets go of GPU messages
    /// ([`RoutedPayload::released_by_caller`](super::transport::RoutedPayload::released_by_caller)).
    /// Pair channels only; `Unsupported`, saying why, where the producer has none.
    pub fn released_semaphore(&mut self) -> Result<crate::os::OwnedHandle> {
        if self.fan_in.is_some() {
            return Err(Error::Unsupported(format!(
                "channel {:?} is a fan-in: its producers have no released semaphore (pair channels only)",
                self.name
            )));
        }
        // As the ready semaphore: the first route's reason where none has one.
        let mut why = None;
        for route in self.routes.iter() {
            match route.released_semaphore() {
                Ok(fd) => return Ok(fd),
                Err(e) => {
                    why.get_or_insert(e);
                }
            }
        }
        Err(why.unwrap_or_else(|| {
            Error::Unsupported(format!("channel {:?} has no GPU route: {}", self.name, self.info.reason))
        }))
    }

    /// A new descriptor of the ready semaphore of the producer in fan-in slot `slot`
    /// ([`Message::producer`]), which [`Message::ready_value`] of that producer's messages
    /// counts on; on a pair channel, slot 0 is its producer ([`ready_semaphore`](Self::ready_semaphore)).
    /// `Unsupported` where that producer's GPU buffers are synchronised on the host or staged;
    /// `InvalidState` for a slot with no producer.
    pub fn producer_ready_semaphore(&mut self, slot: u32) -> Result<crate::os::OwnedHandle> {
        match &self.fan_in {
            Some(fan_in) => fan_in.ready_semaphore(slot),
            None if slot == 0 => self.ready_semaphore(),
            None => Err(Error::InvalidState(format!(
                "channel {:?} is a pair channel: its producer is slot 0, not {slot}",
                self.name
            ))),
        }
    }

    /// The next message, waiting as long as needed. `PeerGone` once the producer has gone and
    /// everything it sent has been received.
    #[inline]
    pub fn recv(&mut self) -> Result<Message> {
        match self.session.recv_fast() {
            Some(view) => self.wrap_fast(view),
            None => self.recv_until(None),
        }
    }

    /// As [`recv`](Self::recv), giving up with `Timeout` after `timeout`.
    #[inline]
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message> {
        match self.session.recv_fast() {
            Some(view) => self.wrap_fast(view),
            None => self.recv_until(Some(Instant::now() + timeout)),
        }
    }

    /// The next message if one is waiting, else `WouldBlock` (or `PeerGone`).
    #[inline]
    pub fn try_recv(&mut self) -> Result<Message> {
        match self.session.recv_fast() {
            Some(view) => self.wrap_fast(view),
            None => self.try_recv_slow(),
        }
    }

    #[inline(never)]
    fn recv_until(&mut self, deadline: Option<Instant>) -> Result<Message> {
        if self.fan_in.is_some() {
            return self.recv_fan_in(true, deadline);
        }
        let view = self.recv_raw(deadline)?;
        self.wrap_fast(view)
    }

    #[inline(never)]
    fn try_recv_slow(&mut self) -> Result<Message> {
        if self.fan_in.is_some() {
            return self.recv_fan_in(false, None);
        }
        let view = self.try_recv_raw()?;
        self.wrap_fast(view)
    }

    /// A fan-in's next message, from the producers in turn (`block`: waiting up to
    /// `deadline`).
    fn recv_fan_in(&mut self, block: bool, deadline: Option<Instant>) -> Result<Message> {
        let fan_in = self.fan_in.as_deref_mut().expect("a fan-in");
        let (mut view, slot) = fan_in.recv(&mut self.carrier, block, deadline)?;
        view.set_producer(slot);
        if view.flags & RawView::ROUTED != 0 {
            return self.wrap_fan_in_routed(view);
        }
        Ok(Message { view, releaser: fan_in.releaser(slot), routed: None })
    }

    /// A fan-in's routed message, resolved through its producer's own routes.
    #[inline(never)]
    fn wrap_fan_in_routed(&mut self, view: RawView) -> Result<Message> {
        // SAFETY: the view was just received; the Message drops the payload before it releases
        // the view.
        let payload = unsafe { self.resolve(&view)? };
        let releaser = self.fan_in.as_deref().expect("a fan-in").releaser(view.producer());
        Ok(Message { view, releaser, routed: Some(Routed { payload, buffer: OnceLock::new() }) })
    }

    /// The current producer has gone and its messages are read (`error` says so): takes up the
    /// next producer if one attached, once the end was reported (the application learns of it
    /// first: the new producer's messages start again at sequence number 0); `Ok` when it did.
    #[cold]
    #[inline(never)]
    fn after_gone(&mut self, error: Error) -> Result<()> {
        if !matches!(error, Error::PeerGone(_)) {
            return Err(error);
        }
        if !self.gone_reported {
            self.end_route_sessions();
            self.gone_reported = true;
            return Err(error);
        }
        match self.carrier.try_accept()? {
            Some(session) => self.take_up(session),
            None => Err(error),
        }
    }

    /// Makes `session` the current one: the routes learn what its producer brings, and the
    /// report what its transport is.
    fn take_up(&mut self, session: AnySession) -> Result<()> {
        let mut old = std::mem::replace(&mut self.session, session);
        if self.watching {
            self.carrier.unwatch(&mut old);
            self.carrier.watch(&mut self.session)?;
        }
        self.arenas_before += old.arenas_received();
        self.old.retain(|s| s.holds_views());
        if old.holds_views() {
            self.old.push(old);
        }
        self.gone_reported = false;
        log::info!(
            "channel {:?} (consumer): a new producer attached after the last one had gone; its messages start again \
             at sequence number 0",
            self.name
        );
        self.sync_routes()
    }

    /// Ends the routes' sessions: what their messages may still use stays with the carrier's
    /// session while they are held.
    fn end_route_sessions(&mut self) {
        self.routes.end_sessions(&mut self.session);
    }

    /// A message of any kind: routed views are resolved into their payload.
    #[inline]
    fn wrap_fast(&mut self, view: RawView) -> Result<Message> {
        if view.flags & RawView::ROUTED == 0 {
            return Ok(self.wrap(view));
        }
        self.wrap_routed(view)
    }

    #[inline(never)]
    fn wrap_routed(&mut self, view: RawView) -> Result<Message> {
        // SAFETY: the view was just received; the Message drops the payload before it releases
        // the view.
        let payload = unsafe { self.resolve(&view)? };
        Ok(Message {
            view,
            releaser: self.session.message_releaser(),
            routed: Some(Routed { payload, buffer: OnceLock::new() }),
        })
    }

    /// Hands each route the current producer's rendezvous section, and refreshes the report.
    fn sync_routes(&mut self) -> Result<()> {
        let before = self.info.reason.clone();
        // The carrier's account of its route may change with the producer.
        let carrier = self.session.route().or_else(|| self.info.routes.first().cloned());
        let mut routes: Vec<Route> = carrier.into_iter().collect();
        routes.extend(self.routes.new_sessions(&mut self.session, self.info.kind)?);
        // Routes the report had besides the carrier and the receivers (staged GPU buffers).
        let kept: Vec<Route> =
            self.info.routes.iter().skip(1).filter(|r| !routes.iter().any(|n| n.class == r.class)).cloned().collect();
        routes.extend(kept);
        self.info = TransportInfo::new(routes);
        // A new producer whose transport differs from the last one's.
        if self.info.reason != before {
            log_created(&self.name, Role::Consumer, &self.info);
        }
        Ok(())
    }

    /// The payload a routed view names, reading the attachments that came before it. A view
    /// that cannot be resolved is released before the error is returned; on a fan-in, a
    /// producer whose descriptor fails validation is detached (`Corrupt` naming its slot).
    ///
    /// # Safety
    /// `view` was received from this consumer and is not released yet; the payload is dropped
    /// before the view is released.
    #[inline]
    pub(crate) unsafe fn resolve(&mut self, view: &RawView) -> Result<RoutedPayload> {
        if let Some(fan_in) = self.fan_in.as_deref_mut() {
            // SAFETY: this function's contract; a fan-in's views carry their slot.
            return unsafe { fan_in.resolve(&mut self.carrier, view) };
        }
        let result = self.routes.resolve(&mut self.session, view, &self.name);
        if result.is_err() {
            // SAFETY: the view is held and nothing was resolved from it (this function's contract).
            let _ = unsafe { self.release_raw(view) };
        }
        result
    }

    /// Receives asynchronously, under any executor: the future waits for
    /// [`notify_fd`](Self::notify_fd) to become readable through async-io's reactor (no thread
    /// of lava-flow's). Needs the `async-io` feature (on by default).
    #[cfg(feature = "async-io")]
    pub fn recv_async(&mut self) -> RecvFuture<'_> {
        RecvFuture { consumer: self }
    }

    /// A file descriptor for `poll`/`epoll`/event loops: readable while a message waits or
    /// after the producer has gone. Owned by the consumer. From this call on, the producer
    /// makes a syscall per message that finds the consumer waiting on the fd; call
    /// [`try_recv`](Self::try_recv) until `WouldBlock` after each wake-up.
    pub fn notify_fd(&mut self) -> Result<BorrowedHandle<'_>> {
        if let Some(fan_in) = self.fan_in.as_deref_mut() {
            return fan_in.app_notify_fd(&mut self.carrier);
        }
        if !self.watching {
            self.carrier.notify_fd()?;
            self.carrier.watch(&mut self.session)?;
            self.watching = true;
        }
        self.carrier.notify_fd()
    }
    /// A message in host memory.
    #[inline]
    fn wrap(&self, view: RawView) -> Message {
        Message { view, releaser: self.session.message_releaser(), routed: None }
    }
    pub(crate) fn recv_raw(&mut self, deadline: Option<Instant>) -> Result<RawView> {
        if let Some(fan_in) = self.fan_in.as_deref_mut() {
            return Self::fan_in_view(fan_in.recv(&mut self.carrier, true, deadline));
        }
        loop {
            match self.session.recv(deadline) {
                Err(e) => self.after_gone(e)?,
                view => return view,
            }
        }
    }

    /// [`recv_raw`](Self::recv_raw) waiting up to `timeout` (`None`: forever), reading the
    /// clock only when no message is waiting.
    #[inline]
    pub(crate) fn recv_raw_within(&mut self, timeout: Option<Duration>) -> Result<RawView> {
        match self.session.recv_fast() {
            Some(view) => Ok(view),
            None => self.recv_raw(super::deadline_after(timeout)),
        }
    }

    pub(crate) fn try_recv_raw(&mut self) -> Result<RawView> {
        if let Some(fan_in) = self.fan_in.as_deref_mut() {
            return Self::fan_in_view(fan_in.recv(&mut self.carrier, false, None));
        }
        loop {
            match self.session.try_recv() {
                Err(e) => self.after_gone(e)?,
                view => return view,
            }
        }
    }

    /// A view from a fan-in's slot, marked with that slot.
    #[inline]
    fn fan_in_view(received: Result<(RawView, u32)>) -> Result<RawView> {
        let (mut view, slot) = received?;
        view.set_producer(slot);
        Ok(view)
    }

    /// Releases a view received with `recv_raw` (views are plain values there).
    ///
    /// # Safety
    /// `view` was received from this consumer, is not released yet, and nothing uses it (or a
    /// payload resolved from it) any more.
    #[inline(always)]
    pub(crate) unsafe fn release_raw(&mut self, view: &RawView) -> Result<()> {
        if let Some(fan_in) = self.fan_in.as_deref_mut() {
            // SAFETY: this function's contract.
            return unsafe { fan_in.release(view) };
        }
        // SAFETY: this function's contract. The current session refuses a view of another.
        match unsafe { self.session.release(view) } {
            Ok(()) => Ok(()),
            // SAFETY: as above.
            Err(refused) => unsafe { self.release_old(view, refused) },
        }
    }

    /// [`release_raw`](Self::release_raw) of a view the current session refused (`refused`
    /// says why): one of an earlier producer's session, else that refusal.
    ///
    /// # Safety
    /// As [`release_raw`](Self::release_raw).
    #[cold]
    #[inline(never)]
    unsafe fn release_old(&mut self, view: &RawView, refused: Error) -> Result<()> {
        let Some(session) = self.old.iter_mut().find(|s| s.id() == view.session) else {
            return Err(refused);
        };
        // SAFETY: this function's contract.
        let released = unsafe { session.release(view) };
        self.old.retain(|s| s.holds_views());
        released
    }

    /// The notification fd in async-io's reactor, registered on first use.
    #[cfg(feature = "async-io")]
    fn notify_async(&mut self) -> Result<&async_io::Async<OwnedHandle>> {
        if self.notify_async.is_none() {
            let fd = self
                .notify_fd()?
                .try_clone_to_owned()
                .map_err(|e| Error::os("duplicating the channel's notification fd for recv_async", e))?;
            // The fd is non-blocking already (an epoll or a non-blocking eventfd).
            let registered = async_io::Async::new_nonblocking(fd)
                .map_err(|e| Error::os("registering the channel's notification fd with async-io's reactor", e))?;
            self.notify_async = Some(registered);
        }
        Ok(self.notify_async.as_ref().expect("registered above"))
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Messages still held may point into the routes' memory.
        self.end_route_sessions();
        log_closed(&self.name, Role::Consumer);
    }
}

/// A received message, read where it lies in shared memory. Dropping it releases the space,
/// which the producer sees as completion.
///
/// The bytes live in memory the producer's process can also write. A well-behaved producer
/// does not touch a message after publishing it; lava-flow's own bounds never depend on the
/// contents, so a misbehaving one can change what you read but not where.
pub struct Message {
    view: RawView,
    releaser: MessageReleaser,
    /// A GPU buffer's payload.
    routed: Option<Routed>,
}

/// A GPU buffer's payload, and the buffer over it once asked for (boxed: the hot path moves
/// CPU messages, and many GPU messages are handed on without one).
struct Routed {
    payload: RoutedPayload,
    buffer: OnceLock<Option<Box<Buffer>>>,
}

// SAFETY: the view points into a mapping that its session keeps alive until the view is
// released (for shm, the session outlives its consumer while views are held: see
// `shm::Session::retire`). Sessions are Send + Sync, their release takes a lock, so reading
// and releasing from another thread is as safe as from this one.
unsafe impl Send for Message {}
// SAFETY: &Message only gives read access to the bytes.
unsafe impl Sync for Message {}

impl Message {
    /// The message's sequence number in its channel (0, 1, 2, ... per producer).
    #[inline]
    pub fn sequence(&self) -> u64 {
        self.view.token
    }

    /// The slot of the fan-in producer that sent the message (0 for a pair channel): see
    /// [`Consumer::peers`].
    #[inline]
    pub fn producer(&self) -> u32 {
        self.view.producer()
    }
    /// Whether the bytes lie in the sender's own buffer (a buffer send, or a send of bytes
    /// inside a lava-flow buffer): no copy was made anywhere. False for bytes the sender
    /// copied (or wrote in place) into the channel's pool.
    #[inline]
    pub fn is_zero_copy(&self) -> bool {
        self.view.is_zero_copy()
    }
    /// The payload's bytes in host memory. A GPU buffer's ([`Message::buffer`]) are its host
    /// mapping where the host can map it, else empty: move its data with
    /// [`Buffer::read_at`] or `Context::copy`.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        if let Some(routed) = &self.routed {
            let ptr = routed.payload.as_ptr();
            if ptr.is_null() {
                return &[];
            }
            // SAFETY: the payload is `len` bytes mapped in this process, kept alive (and
            // unwritten by a well-behaved producer) by its memory until the release.
            return unsafe { std::slice::from_raw_parts(ptr, routed.payload.len) };
        }
        // SAFETY: the transport validated that view.len bytes at view.ptr lie inside its
        // mapping, which `releaser` keeps alive; the producer does not reuse them before the
        // release in Drop.
        unsafe { std::slice::from_raw_parts(self.view.ptr, self.view.len) }
    }

    /// The payload's length in bytes (a GPU buffer's too).
    pub fn len(&self) -> usize {
        self.routed.as_ref().map_or(self.view.len, |r| r.payload.len)
    }

    /// Always false: a message has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GPU buffer a message carries by reference: usable with `Context::copy`,
    /// [`Buffer::read_at`] and [`Buffer::export`] while the message is held. `None` for
    /// messages in host memory (and for memory of a kind lava-flow's buffers cannot wrap).
    pub fn buffer(&self) -> Option<&Buffer> {
        let routed = self.routed.as_ref()?;
        routed.buffer.get_or_init(|| routed.payload.to_buffer().map(Box::new)).as_deref()
    }

    /// For CUDA memory (a producer's tensor sent by reference): the payload's first byte as a
    /// CUDA device address in this process, and this process's ordinal of the device that
    /// holds it, valid while the message is held. `InvalidState`, saying what the message
    /// is, for any other message. Such a message has no host bytes: [`Message::as_slice`]
    /// is empty.
    pub fn cuda_ptr(&self) -> Result<(u64, i32)> {
        match self.routed.as_ref().map(|r| r.payload.cuda_ptr()) {
            Some(Some(found)) => Ok(found),
            Some(None) => Err(Error::InvalidState(format!(
                "message {} is a lava-flow GPU buffer, not CUDA memory: use Message::buffer",
                self.view.token
            ))),
            None => Err(Error::InvalidState(format!(
                "message {} is {} bytes in host memory, not CUDA memory: use Message::as_slice",
                self.view.token, self.view.len
            ))),
        }
    }

    /// For a GPU buffer or CUDA memory: the value of the channel's ready semaphore at which its
    /// contents are in place (0: now). lava-flow's own GPU work on [`Message::buffer`] waits for
    /// it; CUDA work on [`Message::cuda_ptr`] waits for it on its stream (the semaphore of
    /// [`Consumer::ready_semaphore`] imported into CUDA).
    pub fn ready_value(&self) -> u64 {
        self.routed.as_ref().map_or(0, |r| r.payload.ready_value)
    }
}

impl Deref for Message {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("sequence", &self.view.token)
            .field("len", &self.len())
            .field("gpu", &self.routed.is_some())
            .field("zero_copy", &self.view.is_zero_copy())
            .finish()
    }
}

impl Drop for Message {
    #[inline]
    fn drop(&mut self) {
        // The payload's view goes first: the producer may reuse the memory once released.
        self.routed = None;
        self.releaser.release_held(&self.view);
    }
}

/// The future of [`Consumer::recv_async`].
#[cfg(feature = "async-io")]
pub struct RecvFuture<'a> {
    consumer: &'a mut Consumer,
}

#[cfg(feature = "async-io")]
impl Future for RecvFuture<'_> {
    type Output = Result<Message>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let consumer = &mut *self.consumer;
        loop {
            match consumer.try_recv() {
                Err(Error::WouldBlock(_)) => {}
                other => return Poll::Ready(other),
            }
            let notify = match consumer.notify_async() {
                Ok(notify) => notify,
                Err(e) => return Poll::Ready(Err(e)),
            };
            // A message that arrived after the try_recv has made the fd readable, so the
            // reactor reports it; no lost wake-up. Readable: receive again.
            match notify.poll_readable(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(Error::os("waiting on the channel's notification fd", e)))
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
