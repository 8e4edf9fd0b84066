//! Connecting a channel's ends as planned: the carrier's rendezvous, with every planned
//! route's offer (producer) or answer (consumer) in it, and the report of what came of each.

use std::sync::Arc;

use super::cuda_ipc;
#[cfg(feature = "mpi")]
use super::mpi;
use super::recommended::{Plan, TransportKind};
#[cfg(feature = "vulkan")]
use super::vulkan_ipc;
use super::{loopback, shm, AnyConsumer, AnyProducer, AnyRouteReceiver, AnyRouteSender, AnySession};
use crate::channels::peers::Arrivals;
use crate::channels::transport::{
    Attachment, ConsumerSession, MemoryKind, PayloadClass, PeerHolds, ProducerTransport, Route, RouteReceiver,
    RouteSender, TransportInfo,
};
use crate::channels::{ChannelConfig, ChannelKind};
use crate::error::{Error, Result};
use crate::memory::Context;

/// The carrier and the routes of a producer.
pub(crate) struct ProducerParts {
    pub(crate) carrier: AnyProducer,
    /// The routes the consumer accepted, in the plan's order of preference.
    pub(crate) routes: Vec<AnyRouteSender>,
    pub(crate) info: TransportInfo,
}

/// The carrier, the first producer's session and the routes of a consumer.
pub(crate) struct ConsumerParts {
    pub(crate) carrier: AnyConsumer,
    /// A fan-in's other carriers, on which other producers attach (`Plan::listeners`).
    pub(crate) extra: Vec<AnyConsumer>,
    pub(crate) session: AnySession,
    /// A receiver for each planned route; each learns per producer session whether its
    /// producer sends by it.
    pub(crate) routes: Vec<AnyRouteReceiver>,
    /// Makes more such receivers: a fan-in gives each producer its own.
    pub(crate) receivers: ReceiverFactory,
    pub(crate) info: TransportInfo,
}

/// Makes a consumer's route receivers, one for each planned route. A fan-in makes a set for
/// each producer it serves, so that each producer's memory is imported and found through
/// receivers of its own: two producers' arenas never share a receiver's slot numbers.
pub(crate) struct ReceiverFactory {
    /// This process's memory context, where the plan has the Vulkan IPC route.
    #[cfg(feature = "vulkan")]
    vulkan: Option<Context>,
    /// This process's memory context, where the plan has the CUDA IPC route, and the CUDA
    /// device current on the thread that made the channel.
    cuda: Option<(Context, Option<i32>)>,
}

impl ReceiverFactory {
    fn new(plan: &Plan, context: &Context) -> ReceiverFactory {
        ReceiverFactory {
            #[cfg(feature = "vulkan")]
            vulkan: plan.routes.contains(&TransportKind::VulkanIpc).then(|| context.clone()),
            cuda: plan.routes.contains(&TransportKind::CudaIpc).then(|| (context.clone(), cuda_ipc::current_device())),
        }
    }

    /// A new receiver for each planned route, before any producer session.
    pub(crate) fn make(&self) -> Result<Vec<AnyRouteReceiver>> {
        let mut routes = Vec::new();
        #[cfg(feature = "vulkan")]
        if let Some(context) = &self.vulkan {
            routes.push(AnyRouteReceiver::VulkanIpc(vulkan_ipc::Receiver::new(context)?));
        }
        if let Some((context, current)) = &self.cuda {
            routes.push(AnyRouteReceiver::CudaIpc(cuda_ipc::receiver_for(context, *current)));
        }
        Ok(routes)
    }
}

/// Why the consumer declined what a route would have served, per class of payload.
type Refusals = Vec<(PayloadClass, String)>;

/// A route's offer before the peer answered.
enum AnyOffer {
    #[cfg(feature = "vulkan")]
    VulkanIpc(vulkan_ipc::Offer),
    CudaIpc(cuda_ipc::Offer),
    /// The CUDA route, not offered by a process that has CUDA: why (its report says so).
    CudaDeclined(String),
}

impl AnyOffer {
    /// The offer's sections of the producer's hello (new descriptors each time).
    fn sections(&mut self) -> Result<Vec<Attachment>> {
        match self {
            #[cfg(feature = "vulkan")]
            AnyOffer::VulkanIpc(offer) => offer.sections(),
            AnyOffer::CudaIpc(offer) => Ok(offer.sections()),
            AnyOffer::CudaDeclined(_) => Ok(Vec::new()),
        }
    }

    /// The same offer to one more consumer of a fan-out.
    fn another(&mut self) -> AnyOffer {
        match self {
            #[cfg(feature = "vulkan")]
            AnyOffer::VulkanIpc(offer) => AnyOffer::VulkanIpc(offer.another()),
            AnyOffer::CudaIpc(offer) => AnyOffer::CudaIpc(offer.clone()),
            AnyOffer::CudaDeclined(why) => AnyOffer::CudaDeclined(why.clone()),
        }
    }

    /// The route, from the consumer's answer among `answers`, where it takes anything by it,
    /// and why it declined what it does not take (with the class of payload the route would
    /// have served).
    #[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
    #[allow(clippy::ptr_arg)] // (its route's answer is taken out)
    fn accept(
        self,
        name: &str,
        answers: &mut Vec<Attachment>,
        holds: &Arc<PeerHolds>,
    ) -> Result<(Option<AnyRouteSender>, Refusals)> {
        match self {
            #[cfg(feature = "vulkan")]
            AnyOffer::VulkanIpc(offer) => {
                let answer = take_section(answers, vulkan_ipc::ROUTE_ID);
                Ok(match offer.accept(name, answer, Arc::clone(holds))? {
                    Ok(sender) => (Some(AnyRouteSender::VulkanIpc(sender)), Vec::new()),
                    Err(why) => (None, vec![(PayloadClass::Gpu, why)]),
                })
            }
            AnyOffer::CudaIpc(offer) => {
                let answer = take_section(answers, cuda_ipc::ROUTE_ID);
                let accepted = offer.accept(answer, Arc::clone(holds))?;
                Ok((accepted.sender.map(AnyRouteSender::CudaIpc), accepted.refused))
            }
            AnyOffer::CudaDeclined(why) => Ok((None, vec![(PayloadClass::Cuda, why)])),
        }
    }
}

/// The report of a channel: the carrier's route first, then `routes`, or, where no route
/// serves GPU buffers, a sentence that they are staged through the carrier (the plan's last).
pub(crate) fn report(plan: &Plan, carrier: &Route, routes: Vec<Route>) -> TransportInfo {
    let mut all = vec![carrier.clone()];
    if !routes.iter().any(|r| r.class == PayloadClass::Gpu) {
        all.push(Route {
            class: PayloadClass::Gpu,
            kind: plan.carrier.id(),
            reason: plan.reasons.last().cloned().unwrap_or_default(),
        });
    }
    all.extend(routes);
    TransportInfo::new(all)
}

/// The carrier's route as the plan describes it.
fn planned_carrier(plan: &Plan) -> Route {
    Route { class: PayloadClass::Host, kind: plan.carrier.id(), reason: plan.reasons[0].clone() }
}

/// The report a channel planned as `plan` would give, as far as this side can tell before
/// meeting its peer (whether GPU buffers go by reference is the peer's answer).
#[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
pub(crate) fn preview(plan: &Plan, context: &Context) -> TransportInfo {
    let mut routes: Vec<Route> = Vec::new();
    for kind in &plan.routes {
        #[cfg(feature = "vulkan")]
        if *kind == TransportKind::VulkanIpc {
            routes.extend(vulkan_ipc::preview(context, plan.carrier.id()));
        }
        if *kind == TransportKind::CudaIpc {
            routes.extend(cuda_ipc::preview(plan.carrier.id()));
        }
        let _ = (kind, context);
    }
    report(plan, &planned_carrier(plan), routes)
}

/// The endpoint to the peer of an mpi plan.
#[cfg(feature = "mpi")]
fn mpi_peer(plan: &Plan) -> Result<crate::mpi::Endpoint> {
    let address = plan.peer_mpi.ok_or_else(|| Error::Unsupported("the peer's location has no MPI rank".into()))?;
    crate::mpi::endpoint(address).map_err(Error::Unsupported)
}

/// Takes route `id`'s section out of `sections`.
#[allow(clippy::ptr_arg)] // (it removes one)
fn take_section(sections: &mut Vec<Attachment>, id: u32) -> Option<Attachment> {
    let at = sections.iter().position(|s| s.route == id)?;
    Some(sections.remove(at))
}

/// The offers of `plan`'s routes, made on `context`'s device. `released`: whether the consumer
/// is asked for a released semaphore.
#[cfg_attr(not(feature = "vulkan"), allow(unused_variables))]
fn planned_offers(plan: &Plan, config: &ChannelConfig, context: &Context, released: bool) -> Result<Vec<AnyOffer>> {
    let mut offers: Vec<AnyOffer> = Vec::new();
    for kind in &plan.routes {
        #[cfg(feature = "vulkan")]
        if *kind == TransportKind::VulkanIpc {
            offers.push(AnyOffer::VulkanIpc(vulkan_ipc::Offer::new(context, config.strict_gpu, released)?));
        }
        if *kind == TransportKind::CudaIpc {
            match cuda_ipc::Offer::new(context) {
                Ok(offer) => offers.push(AnyOffer::CudaIpc(offer)),
                // A process without the driver loaded has no CUDA memory to report on.
                Err(why) if lava_flow_cuda::is_loaded() => offers.push(AnyOffer::CudaDeclined(why)),
                Err(_) => {}
            }
        }
    }
    Ok(offers)
}

/// The sections of every offer, for one hello.
fn sections_of(offers: &mut [AnyOffer]) -> Result<Vec<Attachment>> {
    let mut all = Vec::new();
    for offer in offers.iter_mut() {
        all.extend(offer.sections()?);
    }
    Ok(all)
}

/// The routes the consumer that `carrier` met accepted, from its answers to `offers`, and the
/// report of the carrier and routes.
fn accept_routes(
    name: &str,
    plan: &Plan,
    carrier: &mut AnyProducer,
    offers: Vec<AnyOffer>,
) -> Result<(Vec<AnyRouteSender>, TransportInfo)> {
    let carrier_route = carrier.info().routes.first().cloned().unwrap_or_else(|| planned_carrier(plan));
    let mut answers = carrier.peer_sections();
    // Where the routes keep what they hold for the consumer: the carrier's, which lets go of
    // it when the consumer dies, else the routes' own until the channel is freed.
    let holds = carrier.peer_holds().unwrap_or_default();
    let mut routes: Vec<AnyRouteSender> = Vec::new();
    let mut refusals: Vec<String> = Vec::new();
    let mut declined: Vec<Route> = Vec::new();
    for offer in offers {
        let (sender, refused) = offer.accept(name, &mut answers, &holds)?;
        routes.extend(sender);
        for (class, why) in refused {
            match class {
                PayloadClass::Cuda => declined.push(Route {
                    class: PayloadClass::Cuda,
                    kind: carrier_route.kind,
                    reason: format!("CUDA memory: refused at send (no copy is made): {why}"),
                }),
                _ => refusals.push(why),
            }
        }
    }
    // GPU buffers go by vulkan_ipc where it was accepted (the same GPU), and only elsewhere by
    // cuda_ipc, which then keeps to CUDA memory (or goes, where the producer has none).
    if routes.iter().any(|r| r.route_id() != cuda_ipc::ROUTE_ID && r.serves(MemoryKind::Vulkan)) {
        routes = routes
            .into_iter()
            .filter_map(|r| match r {
                AnyRouteSender::CudaIpc(sender) => sender.without_gpu_buffers().map(AnyRouteSender::CudaIpc),
                other => Some(other),
            })
            .collect();
    }
    let mut lines: Vec<Route> = Vec::new();
    for route in &routes {
        lines.push(route.route().clone());
        lines.extend(route.second_route().cloned());
    }
    let gpu_routed = lines.iter().any(|r| r.class == PayloadClass::Gpu);
    let mut plan = plan.clone();
    if !gpu_routed && !refusals.is_empty() {
        plan.reasons.push(format!(
            "GPU buffers: staged through {} (copied to host memory): {}",
            plan.carrier,
            refusals.join("; ")
        ));
    }
    let reports = lines.into_iter().chain(declined).collect();
    let info = report(&plan, &carrier_route, reports);
    Ok((routes, info))
}

/// Connects the producer's end: the carrier's rendezvous, with the routes' offers in it.
pub(crate) fn connect_producer(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
) -> Result<ProducerParts> {
    let mut offers = planned_offers(plan, config, context, config.released_semaphore)?;
    let mut sections = || sections_of(&mut offers);
    let provisional = report(plan, &planned_carrier(plan), Vec::new());
    let mut carrier = match plan.carrier {
        TransportKind::Shm => AnyProducer::Shm(shm::ShmProducer::connect(name, provisional, config, &mut sections)?),
        TransportKind::Loopback => {
            AnyProducer::Loopback(loopback::LoopbackProducer::connect(name, provisional, config, &mut sections)?)
        }
        #[cfg(feature = "mpi")]
        TransportKind::Mpi => AnyProducer::Mpi(mpi::MpiProducer::connect(name, provisional, config, mpi_peer(plan)?)?),
        other => return Err(Error::Unsupported(format!("transport {other} is not built"))),
    };
    let (routes, info) = accept_routes(name, plan, &mut carrier, offers)?;
    Ok(ProducerParts { carrier, routes, info })
}

/// A consumer of a fan-out, met by one of the carriers' acceptors: its end (the carrier's
/// producer half), the routes it accepted, and their report, as a pair's producer has them.
pub(crate) struct Arrival {
    pub(crate) carrier: AnyProducer,
    pub(crate) routes: Vec<AnyRouteSender>,
    pub(crate) info: TransportInfo,
}

/// A fan-out producer's acceptors, one per carrier it listens on; dropping them stops the
/// meeting of consumers.
pub(crate) struct FanOutListeners {
    _shm: Option<shm::FanOutAcceptor>,
    _loopback: Option<loopback::LoopbackFanOutAcceptor>,
    #[cfg(feature = "mpi")]
    _mpi: Option<mpi::MpiFanOutAcceptor>,
}

/// What a fan-out's producer listens with: its acceptors, the slot table they take slots from
/// and hand consumers over in, the largest message, and the report before any consumer came.
pub(crate) struct FanOutParts {
    pub(crate) listeners: FanOutListeners,
    pub(crate) arrivals: Arc<Arrivals<Arrival>>,
    pub(crate) max_len: usize,
    pub(crate) info: TransportInfo,
    /// What the report adds to the carrier's reason where consumers come over several
    /// carriers (empty otherwise).
    pub(crate) listening: String,
}

/// Listens for a fan-out's consumers on each of the plan's listeners (shared memory for those
/// on this host, MPI for those on others), all taking slots of one table. A consumer on this
/// host is met with offers of its own of the planned routes (one more of the first offer, so
/// that every consumer imports the same ready semaphore); one over MPI gets GPU buffers staged.
pub(crate) fn listen_fan_out(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
) -> Result<FanOutParts> {
    let arrivals = Arc::new(Arrivals::new(config.max_peers));
    let mut listeners = FanOutListeners {
        _shm: None,
        _loopback: None,
        #[cfg(feature = "mpi")]
        _mpi: None,
    };
    let mut max_len = config.pool_size;
    for kind in &plan.listeners {
        match kind {
            TransportKind::Shm => {
                let shm = listen_fan_out_shm(name, plan, config, context, &arrivals)?;
                max_len = max_len.min(shm.max_len());
                listeners._shm = Some(shm);
            }
            TransportKind::Loopback => {
                listeners._loopback = Some(listen_fan_out_loopback(name, plan, config, context, &arrivals)?)
            }
            #[cfg(feature = "mpi")]
            TransportKind::Mpi => listeners._mpi = Some(listen_fan_out_mpi(name, plan, config, &arrivals)?),
            other => {
                return Err(Error::Unsupported(format!("transport {other} does not listen for a fan-out's consumers")))
            }
        }
    }
    let over: Vec<&str> = plan.listeners.iter().map(|k| k.name()).collect();
    let listening = match over.len() {
        0 | 1 => String::new(),
        _ => format!(
            "; a fan-out's producer takes consumers over {} (each consumer over the carrier of its own scope to this \
             one: see peers())",
            over.join(" and ")
        ),
    };
    let mut info = preview(plan, context);
    info.reason.push_str(&listening);
    Ok(FanOutParts { max_len, listeners, arrivals, info, listening })
}

/// A fan-out's acceptor over shared memory: consumers of this host, each with offers of its
/// own of the planned routes.
fn listen_fan_out_shm(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
    arrivals: &Arc<Arrivals<Arrival>>,
) -> Result<shm::FanOutAcceptor> {
    // Each consumer signals a released semaphore of its own, which no one GPU wait could
    // cover: the producer waits for every consumer's release on the host.
    let mut plan = plan.clone();
    if plan.carrier != TransportKind::Shm {
        // The first consumer was expected on another host: those of this host are met over
        // shared memory all the same, with the routes planned for that scope.
        plan.carrier = TransportKind::Shm;
        plan.reasons[0] = "shm carries the messages and CPU payloads of this fan-out's consumers on this host".into();
        if plan.routes.is_empty() {
            let last = plan.reasons.len() - 1;
            plan.reasons[last] = "GPU buffers: staged through shm (copied to host memory): the fan-out's first \
                                  consumer was expected on another host, so no GPU route was planned"
                .into();
        }
    }
    let mut first = planned_offers(&plan, config, context, false)?;
    let provisional = report(&plan, &planned_carrier(&plan), Vec::new());
    let (channel, plan_met) = (name.to_owned(), plan);
    let meet = move |meeting: shm::Meeting<'_>| -> Result<Arrival> {
        let mut offers: Vec<AnyOffer> = first.iter_mut().map(AnyOffer::another).collect();
        let mut carrier = AnyProducer::Shm(meeting.handshake(&mut || sections_of(&mut offers))?);
        let (routes, info) = accept_routes(&channel, &plan_met, &mut carrier, offers)?;
        Ok(Arrival { carrier, routes, info })
    };
    shm::FanOutAcceptor::start(name, provisional, config, Arc::clone(arrivals), meet)
}

/// A fan-out's acceptor over loopback: consumers that are threads of this process, each with
/// offers of its own of the planned routes, met on the consumer's thread.
fn listen_fan_out_loopback(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
    arrivals: &Arc<Arrivals<Arrival>>,
) -> Result<loopback::LoopbackFanOutAcceptor> {
    // As over shared memory: each consumer signals a released semaphore of its own.
    let mut first = planned_offers(plan, config, context, false)?;
    let provisional = report(plan, &planned_carrier(plan), Vec::new());
    let (channel, plan_met) = (name.to_owned(), plan.clone());
    let meet = move |joining: loopback::Joining| -> Result<Arrival> {
        let mut offers: Vec<AnyOffer> = first.iter_mut().map(AnyOffer::another).collect();
        let mut carrier = AnyProducer::Loopback(joining.handshake(&mut || sections_of(&mut offers))?);
        let (routes, info) = accept_routes(&channel, &plan_met, &mut carrier, offers)?;
        Ok(Arrival { carrier, routes, info })
    };
    loopback::LoopbackFanOutAcceptor::start(name, provisional, config, Arc::clone(arrivals), meet)
}

/// A fan-out's acceptor over MPI: consumers of other hosts, which join from any rank of this
/// process's world; GPU buffers are staged to them through MPI.
#[cfg(feature = "mpi")]
fn listen_fan_out_mpi(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    arrivals: &Arc<Arrivals<Arrival>>,
) -> Result<mpi::MpiFanOutAcceptor> {
    let reason = if plan.carrier == TransportKind::Mpi {
        plan.reasons[0].clone()
    } else {
        "mpi carries the messages and CPU payloads of this fan-out's consumers on other hosts".to_owned()
    };
    let carrier = Route { class: PayloadClass::Host, kind: TransportKind::Mpi.id(), reason };
    let staged = Route {
        class: PayloadClass::Gpu,
        kind: TransportKind::Mpi.id(),
        reason: "GPU buffers: staged through mpi (copied to host memory): vulkan_ipc needs both processes on one host"
            .to_owned(),
    };
    let info = TransportInfo::new(vec![carrier, staged]);
    let meet = |producer: mpi::MpiProducer| -> Result<Arrival> {
        let info = producer.info().clone();
        Ok(Arrival { carrier: AnyProducer::Mpi(producer), routes: Vec::new(), info })
    };
    mpi::MpiFanOutAcceptor::start(name, info, config, mpi_here(plan)?, Arc::clone(arrivals), meet)
}

/// Listens for the producer's end: the carrier's rendezvous, answering the routes' offers.
#[cfg_attr(not(feature = "vulkan"), allow(unused_mut))]
pub(crate) fn listen_consumer(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    context: &Context,
) -> Result<ConsumerParts> {
    let receivers = ReceiverFactory::new(plan, context);
    let mut routes = receivers.make()?;
    // Every producer gets the same answers: they say what this process's device is, which
    // each producer's receivers share.
    let mut answers: Vec<Attachment> = Vec::new();
    #[cfg(feature = "vulkan")]
    {
        match routes.iter().find_map(|r| match r {
            AnyRouteReceiver::VulkanIpc(receiver) => Some(receiver),
            _ => None,
        }) {
            Some(receiver) => answers.push(receiver.answer()),
            None => answers.push(vulkan_ipc::Receiver::decline(plan.route_refusal.as_deref().unwrap_or_default())),
        }
    }
    match routes.iter().find_map(|r| match r {
        AnyRouteReceiver::CudaIpc(receiver) => Some(receiver),
        _ => None,
    }) {
        Some(receiver) => answers.push(receiver.answer()),
        None => answers.push(cuda_ipc::decline("cuda_ipc is not among the transports the consumer allows")),
    }
    let provisional = report(plan, &planned_carrier(plan), Vec::new());
    // A fan-in's consumer that meets producers over one carrier alone listens as that carrier
    // does; over several (or over MPI, whose fan-in consumer has an acceptor of its own), it
    // listens on each and takes the first producer from any.
    if config.kind == ChannelKind::FanIn && (plan.listeners.len() > 1 || plan.carrier == TransportKind::Mpi) {
        return listen_fan_in(name, plan, config, provisional, routes, receivers, answers);
    }
    let (carrier, mut session) = match plan.carrier {
        TransportKind::Shm if config.kind == ChannelKind::FanOut => {
            let (c, s) = shm::ShmConsumer::join(name, provisional, config, answers)?;
            (AnyConsumer::Shm(c), AnySession::Shm(s))
        }
        TransportKind::Shm => {
            let (c, s) = shm::ShmConsumer::listen(name, provisional, config, answers)?;
            (AnyConsumer::Shm(c), AnySession::Shm(s))
        }
        TransportKind::Loopback if config.kind == ChannelKind::FanOut => {
            let (c, s) = loopback::LoopbackConsumer::join(name, provisional, config, answers)?;
            (AnyConsumer::Loopback(c), AnySession::Loopback(s))
        }
        TransportKind::Loopback => {
            let (c, s) = loopback::LoopbackConsumer::listen(name, provisional, config, answers)?;
            (AnyConsumer::Loopback(c), AnySession::Loopback(s))
        }
        #[cfg(feature = "mpi")]
        TransportKind::Mpi if config.kind == ChannelKind::FanOut => {
            let (c, s) = mpi::MpiConsumer::join(name, provisional, config, mpi_peer(plan)?)?;
            (AnyConsumer::Mpi(c), AnySession::Mpi(s))
        }
        #[cfg(feature = "mpi")]
        TransportKind::Mpi => {
            let (c, s) = mpi::MpiConsumer::listen(name, provisional, config, mpi_peer(plan)?)?;
            (AnyConsumer::Mpi(c), AnySession::Mpi(s))
        }
        other => return Err(Error::Unsupported(format!("transport {other} is not built"))),
    };
    let carrier_route = session.route().unwrap_or_else(|| planned_carrier(plan));
    let info = start_routes(plan, &carrier_route, &mut session, &mut routes)?;
    Ok(ConsumerParts { carrier, extra: Vec::new(), session, routes, receivers, info })
}

/// A fan-in's consumer: listens on each of the plan's listeners and waits for the first
/// producer from any of them (up to the rendezvous timeout).
fn listen_fan_in(
    name: &str,
    plan: &Plan,
    config: &ChannelConfig,
    provisional: TransportInfo,
    mut routes: Vec<AnyRouteReceiver>,
    receivers: ReceiverFactory,
    answers: Vec<Attachment>,
) -> Result<ConsumerParts> {
    let deadline = config.rendezvous_timeout.map(|t| std::time::Instant::now() + t);
    let mut answers = Some(answers);
    let mut carriers = Vec::new();
    for kind in &plan.listeners {
        // Each carrier's sessions report its own route.
        let mut info = provisional.clone();
        if *kind != plan.carrier {
            let reason = format!(
                "{kind} carries the messages and CPU payloads of this fan-in's {}",
                match kind {
                    TransportKind::Shm => "producers on this host",
                    _ => "producers on other hosts",
                }
            );
            info.set_route(Route { class: PayloadClass::Host, kind: kind.id(), reason });
        }
        carriers.push(match kind {
            TransportKind::Shm => {
                AnyConsumer::Shm(shm::ShmConsumer::fan_in(name, info, config, answers.take().unwrap_or_default())?)
            }
            #[cfg(feature = "mpi")]
            TransportKind::Mpi => {
                AnyConsumer::Mpi(mpi::MpiConsumer::fan_in(name, info, config, mpi_here(plan)?, claim_slots(name))?)
            }
            other => return Err(Error::Unsupported(format!("transport {other} does not listen for fan-in producers"))),
        });
    }
    let session = first_producer(name, plan, &mut carriers, deadline)?;
    let at = carriers.iter().position(|c| c.owns(&session)).expect("a session comes from one of the carriers");
    let carrier = carriers.remove(at);
    let carrier_route = match plan.listeners.len() {
        1 => session.route().unwrap_or_else(|| planned_carrier(plan)),
        _ => {
            let over: Vec<&str> = plan.listeners.iter().map(|k| k.name()).collect();
            let mut route = planned_carrier(plan);
            route.reason.push_str(&format!(
                "; a fan-in's consumer takes producers over {} (each producer over the carrier of its own scope to \
                 this one: see peers())",
                over.join(" and ")
            ));
            route
        }
    };
    let mut session = session;
    let info = start_routes(plan, &carrier_route, &mut session, &mut routes)?;
    Ok(ConsumerParts { carrier, extra: carriers, session, routes, receivers, info })
}

/// Starts the first producer's `session` on the consumer's `routes` (the producer's offers
/// arrived with its hello: each route learns what its producer brings), and the report.
fn start_routes(
    plan: &Plan,
    carrier_route: &Route,
    session: &mut AnySession,
    routes: &mut [AnyRouteReceiver],
) -> Result<TransportInfo> {
    let mut offers = session.take_offers().unwrap_or_default();
    for route in routes.iter_mut() {
        let id = route.route_id();
        route.new_session(session.id(), take_section(&mut offers, id))?;
    }
    let carrier = plan.carrier.id();
    let mut reports = Vec::new();
    for route in routes.iter().filter(|r| r.reported()) {
        reports.push(route.route(carrier));
        reports.extend(route.second_route(carrier));
    }
    crate::channels::routes::settle_gpu_lines(&mut reports, carrier);
    Ok(report(plan, carrier_route, reports))
}

/// The first producer that attaches to any of `carriers`, by `deadline`.
fn first_producer(
    name: &str,
    plan: &Plan,
    carriers: &mut [AnyConsumer],
    deadline: Option<std::time::Instant>,
) -> Result<AnySession> {
    use crate::channels::transport::ConsumerTransport;
    // Each carrier's fd is readable while a producer it met waits (its acceptor's thread).
    let mut fds = Vec::new();
    for carrier in carriers.iter_mut() {
        let fd = carrier.notify_fd()?.try_clone_to_owned().map_err(|e| Error::os("duplicating a carrier's fd", e))?;
        fds.push(fd);
    }
    loop {
        for carrier in carriers.iter_mut() {
            if let Some(session) = carrier.try_accept()? {
                return Ok(session);
            }
        }
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        if left == Some(std::time::Duration::ZERO) {
            let over: Vec<&str> = plan.listeners.iter().map(|k| k.name()).collect();
            return Err(Error::Timeout(format!(
                "no producer of fan-in channel {name:?} attached in time (over {})",
                over.join(" or ")
            )));
        }
        // A slice at most: a carrier without a thread of its own is looked at again.
        let slice = left.map_or(std::time::Duration::from_millis(15), |l| l.min(std::time::Duration::from_millis(15)));
        let handles: Vec<_> = fds.iter().map(crate::os::borrow).collect();
        crate::os::ready::wait_readable(&handles, Some(slice))?;
    }
}

/// This process in the MPI world of the plan's peer (or the last joined), for a fan-in's
/// consumer that meets producers from any rank (a fan-out's producer, consumers).
#[cfg(feature = "mpi")]
fn mpi_here(plan: &Plan) -> Result<crate::mpi::Endpoint> {
    crate::mpi::here(plan.peer_mpi.map(|a| a.world)).map_err(Error::Unsupported)
}

/// The slots of fan-in `name` for producers met over MPI: the same lock files a same-host
/// producer takes, held by the consumer for the remote one.
#[cfg(feature = "mpi")]
fn claim_slots(name: &str) -> mpi::ClaimSlot {
    let name = name.to_owned();
    Box::new(move |slot| {
        use shm::rendezvous::{End, EndLock};
        Ok(EndLock::try_take(&name, End::FanInProducer(slot))?
            .ok()
            .map(|lock| Box::new(lock) as Box<dyn std::any::Any + Send + Sync>))
    })
}
