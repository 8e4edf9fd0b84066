//! The transports lava-flow builds, and the choice among them: the one module of the channel
//! layer that names them. The channel core (`Producer`, `Consumer`) sees the traits of
//! `channels::transport` and the enums below, which call the built-in carriers statically so
//! that their hot paths inline.
//!
//! | transport    | role     | serves                                  | scope  |
//! |--------------|----------|-----------------------------------------|--------|
//! | `shm`        | carrier  | every message's order; CPU payloads     | local  |
//! | `vulkan_ipc` | route    | GPU buffers by reference                | local  |
//! | `mpi`        | carrier  | every message's order; CPU payloads     | remote |
//!
//! Adding a transport: a module here that implements the carrier traits
//! ([`ProducerTransport`], [`ConsumerTransport`]) or the route traits
//! ([`RouteSender`], [`RouteReceiver`]),
//! a variant in the enums below, and its case in `plan` and the connect
//! functions. Nothing in the channel core changes. A remote carrier brings its own
//! rendezvous (the peer's address comes from its location) and has no descriptors to pass:
//! GPU buffers to a remote peer are staged through host memory by the core, as to a local peer
//! on another GPU.

#[cfg(feature = "mpi")]
pub mod mpi;
pub mod shm;
#[cfg(feature = "vulkan")]
pub mod vulkan_ipc;

use std::any::Any;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Instant;

use super::transport::{
    ConsumerTransport, Packed, PayloadClass, PeerHolds, ProducerTransport, RawLoan, RawView, Release, Route,
    RouteReceiver, RouteSender, RoutedPayload, Section, SharedRegion, TransportInfo, TransportKind,
};
use super::ChannelConfig;
use crate::error::{Error, Result};
use crate::memory::{Buffer, Context};
use crate::types::{CommunicationScope, MpiAddress, ProcessLocation};

/// The shortest send that goes by reference by itself when its bytes lie in a lava-flow
/// buffer; shorter ones are copied into their ring slot, which costs less than mapping
/// anything.
pub const AUTO_ZERO_COPY_MIN: usize = shm::SHM_INLINE_MAX + 1;

/// Which transports serve a channel, decided before the rendezvous from the scope and what
/// the channel allows.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
pub(crate) struct Plan {
    pub(crate) carrier: TransportKind,
    /// The route for GPU buffers, when one is allowed and built; `None`: staged through the
    /// carrier.
    pub(crate) gpu_route: Option<TransportKind>,
    /// The sentences of the report so far.
    pub(crate) reasons: Vec<String>,
    /// Why GPU buffers have no route of their own, when they have none.
    pub(crate) gpu_refusal: Option<String>,
    /// The peer's MPI address, for the mpi carrier.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) peer_mpi: Option<MpiAddress>,
}

/// Whether `kind` is built and can carry a channel of `scope` to `peer`, or why not.
fn carrier_availability(
    kind: TransportKind,
    scope: CommunicationScope,
    peer: &ProcessLocation,
) -> std::result::Result<(), String> {
    match (kind, scope) {
        (TransportKind::Shm, CommunicationScope::Local) => Ok(()),
        (TransportKind::Shm, CommunicationScope::Remote) => Err("shm needs both processes on one host".into()),
        (TransportKind::VulkanIpc, _) => Err("vulkan_ipc carries GPU buffers only, not a channel's messages".into()),
        (TransportKind::Mpi, _) => mpi_availability(peer),
    }
}

/// Whether the peer can be reached through MPI, or why not.
fn mpi_availability(peer: &ProcessLocation) -> std::result::Result<(), String> {
    #[cfg(feature = "mpi")]
    {
        match peer.mpi {
            Some(address) => mpi_endpoint(address).map(|_| ()),
            None => {
                Err("mpi needs the peer's location from MPI discovery (lf_mpi_location), which carries its rank".into())
            }
        }
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = peer;
        Err("mpi is not in this build (cargo feature `mpi`, or cmake -DLAVA_FLOW_FEATURES=mpi)".into())
    }
}

#[cfg(feature = "mpi")]
fn mpi_endpoint(address: MpiAddress) -> std::result::Result<crate::mpi::Endpoint, String> {
    crate::mpi::endpoint(address)
}

/// Whether `kind` can carry GPU buffers by reference for a channel of `scope`, or why not.
fn gpu_route_availability(
    kind: TransportKind,
    scope: CommunicationScope,
    context: &Context,
) -> std::result::Result<(), String> {
    match kind {
        TransportKind::VulkanIpc if scope == CommunicationScope::Local => {
            #[cfg(feature = "vulkan")]
            {
                match context.gpu_device() {
                    Some(_) => Ok(()),
                    None => Err(format!(
                        "vulkan_ipc needs a Vulkan device in this process: {}",
                        context.gpu_unavailable_reason().unwrap_or("none was opened")
                    )),
                }
            }
            #[cfg(not(feature = "vulkan"))]
            {
                let _ = context;
                Err("vulkan_ipc is not in this build (cargo feature `vulkan`)".into())
            }
        }
        _ => Err(format!("{kind} needs both processes on one host")),
    }
}

/// Chooses the carrier (the first allowed transport that can serve the scope) and the GPU
/// route (vulkan_ipc where allowed, local and possible), saying why.
pub(crate) fn plan(
    scope: CommunicationScope,
    peer: &ProcessLocation,
    scope_text: &str,
    allowed: &[TransportKind],
    source: &str,
    strict_gpu: bool,
    context: &Context,
) -> Result<Plan> {
    let mut refused = Vec::new();
    let mut carrier = None;
    // Routes (vulkan_ipc) are not carriers: they are weighed for GPU buffers below.
    for kind in allowed.iter().filter(|k| **k != TransportKind::VulkanIpc || allowed.len() == 1) {
        match carrier_availability(*kind, scope, peer) {
            Ok(()) => {
                carrier = Some(*kind);
                break;
            }
            Err(why) => refused.push(why),
        }
    }
    let Some(carrier) = carrier else {
        if scope == CommunicationScope::Remote && source.is_empty() {
            return Err(Error::Unsupported(format!(
                "no remote transport can reach the peer: {scope_text}; {}. Join MPI on both sides \
                 (lf_mpi_join) and take the peer's location from it (lf_mpi_location), or check \
                 that both locations name the same host if they do share one",
                refused.join("; ")
            )));
        }
        let what = if source.is_empty() {
            "no built transport".to_owned()
        } else {
            format!("none of the transports {source} allows")
        };
        return Err(Error::Unsupported(format!(
            "{what} can carry this channel ({scope_text}): {}",
            refused.join("; ")
        )));
    };
    let mut reasons = vec![format!("{scope_text}; {carrier} carries the messages and CPU payloads")];
    if !source.is_empty() {
        reasons[0].push_str(&format!(" (allowed by {source})"));
    }
    if !refused.is_empty() {
        reasons[0].push_str(&format!("; skipped: {}", refused.join("; ")));
    }
    let mut gpu_route = None;
    let mut gpu_refused = Vec::new();
    for kind in allowed.iter().filter(|k| **k == TransportKind::VulkanIpc) {
        match gpu_route_availability(*kind, scope, context) {
            Ok(()) => {
                gpu_route = Some(*kind);
                break;
            }
            Err(why) => gpu_refused.push(why),
        }
    }
    if gpu_route.is_none() {
        if !allowed.contains(&TransportKind::VulkanIpc) {
            gpu_refused.push(format!(
                "vulkan_ipc is not allowed{}",
                if source.is_empty() { String::new() } else { format!(" by {source}") }
            ));
        }
        if strict_gpu {
            return Err(Error::Unsupported(format!(
                "GPU buffers would be staged through {carrier} (copied to host memory), which strict_gpu forbids: {}",
                gpu_refused.join("; ")
            )));
        }
        reasons
            .push(format!("GPU buffers: staged through {carrier} (copied to host memory): {}", gpu_refused.join("; ")));
    }
    let gpu_refusal = gpu_route.is_none().then(|| gpu_refused.join("; "));
    Ok(Plan { carrier, gpu_route, reasons, gpu_refusal, peer_mpi: peer.mpi })
}

/// Forwards every trait method of an enum of carriers to its variants, statically.
macro_rules! forward {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            Self::Shm($t) => $call,
            #[cfg(feature = "mpi")]
            Self::Mpi($t) => $call,
        }
    };
}

/// The producer half of a channel's carrier.
pub(crate) enum AnyProducer {
    Shm(shm::ShmProducer),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiProducer),
}

/// The consumer half of a channel's carrier.
pub(crate) enum AnyConsumer {
    Shm(shm::ShmConsumer),
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiConsumer),
}

/// What a Rust `Message` releases its view through: the carrier's session directly (inlined,
/// no reference count per message: see `shm::Session::retire`).
pub(crate) enum MessageReleaser {
    /// Valid while the message's view is held (`shm::release_message`'s contract).
    Shm(NonNull<shm::Session>),
    /// A carrier's shared release side (one reference count per message).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
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

/// Forwards every trait method of an enum of routes to its variants, statically.
macro_rules! forward_route {
    ($self:ident, $t:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "vulkan")]
            Self::VulkanIpc($t) => $call,
            #[cfg(not(feature = "vulkan"))]
            Self::None(never) => match *never {},
        }
    };
}

/// The sending half of a channel's GPU route (a routed message's hot path inlines).
pub(crate) enum AnyRouteSender {
    #[cfg(feature = "vulkan")]
    VulkanIpc(vulkan_ipc::Sender),
    /// No route is built without the `vulkan` feature.
    #[cfg(not(feature = "vulkan"))]
    #[allow(dead_code)]
    None(std::convert::Infallible),
}

/// The receiving half of a channel's GPU route.
pub(crate) enum AnyRouteReceiver {
    #[cfg(feature = "vulkan")]
    VulkanIpc(vulkan_ipc::Receiver),
    #[cfg(not(feature = "vulkan"))]
    #[allow(dead_code)]
    None(std::convert::Infallible),
}

#[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
impl RouteSender for AnyRouteSender {
    #[inline]
    fn route_id(&self) -> u32 {
        forward_route!(self, r => r.route_id())
    }
    fn route(&self) -> &Route {
        forward_route!(self, r => r.route())
    }
    #[inline]
    fn pack(
        &mut self,
        buffer: &Buffer,
        offset: usize,
        len: usize,
        ready_value: u64,
        completed: u64,
        out: &mut Packed,
    ) -> Result<()> {
        forward_route!(self, r => r.pack(buffer, offset, len, ready_value, completed, out))
    }
    fn released_semaphore(&self) -> Result<OwnedFd> {
        forward_route!(self, r => r.released_semaphore())
    }
    #[inline]
    fn sent(&mut self, seq: u64) {
        forward_route!(self, r => r.sent(seq))
    }
    fn ready_semaphore(&self) -> Result<OwnedFd> {
        forward_route!(self, r => r.ready_semaphore())
    }
}

#[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
impl RouteReceiver for AnyRouteReceiver {
    #[inline]
    fn route_id(&self) -> u32 {
        forward_route!(self, r => r.route_id())
    }
    fn new_session(&mut self, session: u64, offer: Option<Section>) -> Result<()> {
        forward_route!(self, r => r.new_session(session, offer))
    }
    fn route(&self, carrier: TransportKind) -> Route {
        forward_route!(self, r => r.route(carrier))
    }
    fn end_session(&mut self) -> (u64, Box<dyn Any + Send + Sync>) {
        forward_route!(self, r => r.end_session())
    }
    fn attach(&mut self, attachment: Section, released_below: u64) -> Result<()> {
        forward_route!(self, r => r.attach(attachment, released_below))
    }
    #[inline(always)]
    fn resolve(&mut self, seq: u64, descriptor: &[u8]) -> Result<Option<RoutedPayload>> {
        forward_route!(self, r => r.resolve(seq, descriptor))
    }
    fn ready_semaphore(&self) -> Result<OwnedFd> {
        forward_route!(self, r => r.ready_semaphore())
    }
}

/// The carrier and the GPU route of a producer.
pub(crate) struct ProducerParts {
    pub(crate) carrier: AnyProducer,
    pub(crate) gpu: Option<AnyRouteSender>,
    pub(crate) info: TransportInfo,
}

/// The carrier and the GPU route of a consumer.
pub(crate) struct ConsumerParts {
    pub(crate) carrier: AnyConsumer,
    pub(crate) gpu: Option<AnyRouteReceiver>,
    pub(crate) info: TransportInfo,
}

/// The report of a plan: the carrier's route, and the GPU route (`None`: staged through the
/// carrier, for the plan's last reason).
fn report(plan: &Plan, gpu: Option<Route>) -> TransportInfo {
    let carrier = Route { class: PayloadClass::Host, kind: plan.carrier, reason: plan.reasons[0].clone() };
    let gpu = gpu.unwrap_or_else(|| Route {
        class: PayloadClass::Gpu,
        kind: plan.carrier,
        reason: plan.reasons.last().cloned().unwrap_or_default(),
    });
    TransportInfo::new(vec![carrier, gpu])
}

/// The report a channel planned as `plan` would give, as far as this side can tell before
/// meeting its peer (the GPU route's answer comes from the peer).
pub(crate) fn preview(plan: &Plan, context: &Context) -> TransportInfo {
    #[cfg(feature = "vulkan")]
    if plan.gpu_route == Some(TransportKind::VulkanIpc) {
        if let Some(route) = vulkan_ipc::preview(context, plan.carrier) {
            return report(plan, Some(route));
        }
    }
    let _ = context;
    report(plan, None)
}

/// `plan` with the carrier's own account of its route, which may add to the plan's (how it
/// learns of its peer's end, say).
fn as_carrier_tells(plan: &Plan, carrier: &TransportInfo) -> Plan {
    let mut plan = plan.clone();
    if let (Some(route), Some(reason)) = (carrier.routes.first(), plan.reasons.first_mut()) {
        reason.clone_from(&route.reason);
    }
    plan
}

/// The endpoint to the peer of an mpi plan.
#[cfg(feature = "mpi")]
fn mpi_peer(plan: &Plan) -> Result<crate::mpi::Endpoint> {
    let address = plan.peer_mpi.ok_or_else(|| Error::Unsupported("the peer's location has no MPI rank".into()))?;
    mpi_endpoint(address).map_err(Error::Unsupported)
}

/// Connects the producer's end: the carrier's rendezvous, with the GPU route's offer in it.
pub(crate) fn connect_producer(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
) -> Result<ProducerParts> {
    #[cfg(feature = "vulkan")]
    let mut gpu = match plan.gpu_route {
        Some(TransportKind::VulkanIpc) => {
            Some(vulkan_ipc::Offer::new(context, config.strict_gpu, config.released_semaphore)?)
        }
        _ => None,
    };
    #[cfg(not(feature = "vulkan"))]
    let _ = context;
    let provisional = report(plan, None);
    let carrier = match plan.carrier {
        TransportKind::Shm => {
            #[cfg(feature = "vulkan")]
            let mut offers = || gpu.as_mut().map_or(Ok(Vec::new()), |g| g.sections());
            #[cfg(not(feature = "vulkan"))]
            let mut offers = || Ok(Vec::new());
            AnyProducer::Shm(shm::ShmProducer::connect(name, provisional, config, &mut offers)?)
        }
        #[cfg(feature = "mpi")]
        TransportKind::Mpi => AnyProducer::Mpi(mpi::MpiProducer::connect(name, provisional, config, mpi_peer(plan)?)?),
        other => return Err(Error::Unsupported(format!("transport {other} is not built yet"))),
    };
    let mut carrier = carrier;
    let plan = &as_carrier_tells(plan, carrier.info());
    let answers = carrier.peer_sections();
    #[cfg(feature = "vulkan")]
    if let Some(offer) = gpu.take() {
        return match offer.accept(name, answers, carrier.peer_holds().unwrap_or_default())? {
            Ok(sender) => {
                let info = report(plan, Some(sender.route().clone()));
                Ok(ProducerParts { carrier, gpu: Some(AnyRouteSender::VulkanIpc(sender)), info })
            }
            Err(why) => {
                let mut plan = plan.clone();
                plan.reasons
                    .push(format!("GPU buffers: staged through {} (copied to host memory): {why}", plan.carrier));
                Ok(ProducerParts { carrier, gpu: None, info: report(&plan, None) })
            }
        };
    }
    let _ = answers;
    Ok(ProducerParts { carrier, gpu: None, info: report(plan, None) })
}

/// Listens for the producer's end: the carrier's rendezvous, answering the GPU route's offer.
pub(crate) fn listen_consumer(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
) -> Result<ConsumerParts> {
    #[cfg(feature = "vulkan")]
    let gpu = match plan.gpu_route {
        Some(TransportKind::VulkanIpc) => Some(vulkan_ipc::Receiver::new(context)?),
        _ => None,
    };
    #[cfg(not(feature = "vulkan"))]
    let _ = context;
    #[cfg(feature = "vulkan")]
    let answers = match (&gpu, &plan.gpu_refusal) {
        (Some(g), _) => vec![g.answer()],
        (None, why) => vec![vulkan_ipc::Receiver::decline(why.as_deref().unwrap_or_default())],
    };
    #[cfg(not(feature = "vulkan"))]
    let answers = Vec::new();
    let info = report(plan, None);
    let carrier = match plan.carrier {
        TransportKind::Shm => AnyConsumer::Shm(shm::ShmConsumer::listen(name, info.clone(), config, answers)?),
        #[cfg(feature = "mpi")]
        TransportKind::Mpi => AnyConsumer::Mpi(mpi::MpiConsumer::listen(name, info.clone(), config, mpi_peer(plan)?)?),
        other => return Err(Error::Unsupported(format!("transport {other} is not built yet"))),
    };
    let plan = &as_carrier_tells(plan, carrier.info());
    let info = report(plan, None);
    #[cfg(feature = "vulkan")]
    if let Some(mut receiver) = gpu {
        // The producer's offer arrived with its hello: the report says what it brings.
        let mut carrier = carrier;
        if let Some((session, sections)) = carrier.take_peer_sections() {
            let id = receiver.route_id();
            receiver.new_session(session, sections.into_iter().find(|s| s.route == id))?;
        }
        let info = report(plan, Some(receiver.route(plan.carrier)));
        return Ok(ConsumerParts { carrier, info, gpu: Some(AnyRouteReceiver::VulkanIpc(receiver)) });
    }
    Ok(ConsumerParts { carrier, gpu: None, info })
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
    #[inline(always)]
    fn send_fast(&mut self, data: &[u8]) -> Option<u64> {
        forward!(self, t => t.send_fast(data))
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
    fn publish_filled(
        &mut self,
        loan: RawLoan,
        len: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
    ) -> Result<u64> {
        forward!(self, t => t.publish_filled(loan, len, fill))
    }
    fn completed(&mut self) -> Result<u64> {
        forward!(self, t => t.completed())
    }
    #[inline]
    fn completed_hint(&self) -> u64 {
        forward!(self, t => t.completed_hint())
    }
    fn wait_completed(&mut self, seq: u64, deadline: Option<Instant>) -> Result<()> {
        forward!(self, t => t.wait_completed(seq, deadline))
    }
    #[inline]
    fn send_region(
        &mut self,
        region: &dyn SharedRegion,
        offset: usize,
        len: usize,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        forward!(self, t => t.send_region(region, offset, len, deadline))
    }
    fn try_send_region(&mut self, region: &dyn SharedRegion, offset: usize, len: usize) -> Result<u64> {
        forward!(self, t => t.try_send_region(region, offset, len))
    }
    fn send_routed(
        &mut self,
        route: u32,
        descriptor: &[u8],
        attachments: &mut Vec<Section>,
        deadline: Option<Instant>,
    ) -> Result<u64> {
        forward!(self, t => t.send_routed(route, descriptor, attachments, deadline))
    }
    fn peer_sections(&mut self) -> Vec<Section> {
        forward!(self, t => t.peer_sections())
    }
    fn arenas_sent(&self) -> u64 {
        forward!(self, t => t.arenas_sent())
    }
    fn peer_holds(&self) -> Option<Arc<PeerHolds>> {
        forward!(self, t => t.peer_holds())
    }
    fn send_malformed(&mut self, how: u32) -> Result<()> {
        forward!(self, t => t.send_malformed(how))
    }
}

impl AnyConsumer {
    /// The releaser of the current session, statically typed.
    #[inline]
    pub(crate) fn message_releaser(&self) -> MessageReleaser {
        match self {
            Self::Shm(t) => MessageReleaser::Shm(t.session_ptr()),
            #[cfg(feature = "mpi")]
            Self::Mpi(t) => MessageReleaser::Shared(t.releaser()),
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
    fn take_peer_sections(&mut self) -> Option<(u64, Vec<Section>)> {
        forward!(self, t => t.take_peer_sections())
    }
    fn take_attachments(&mut self) -> Result<Vec<Section>> {
        forward!(self, t => t.take_attachments())
    }
    fn released_below(&self) -> u64 {
        forward!(self, t => t.released_below())
    }
    fn keep_while_held(&mut self, session: u64, keep: Box<dyn Any + Send + Sync>) {
        forward!(self, t => t.keep_while_held(session, keep))
    }
}
