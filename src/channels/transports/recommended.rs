//! The choice of transports: which are built, what each can serve, and which ones a channel
//! takes for the scope between its two processes and what the channel allows. The one place
//! that weighs the implementations against each other (iceoryx2 keeps its choices in a
//! `recommended` module the same way).

use std::fmt;

use super::shm;
use crate::channels::transport::TransportId;
use crate::channels::{ChannelConfig, ChannelKind};
use crate::error::{Error, Result};
use crate::memory::Context;
use crate::types::{CommunicationScope, MpiAddress, ProcessLocation};

/// The environment variable that restricts transport choice: a comma-separated list of
/// transport names (`shm`, `vulkan_ipc`, `cuda_ipc`, `mpi`, `loopback`), tried in that order.
pub const TRANSPORTS_ENV: &str = crate::env::TRANSPORTS.name;

/// The transports lava-flow knows, built or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportKind {
    /// CPU shared memory on one host (memfd + SPSC ring + payload pool).
    Shm,
    /// GPU memory shared through Vulkan external memory on one host.
    VulkanIpc,
    /// MPI between hosts.
    Mpi,
    /// Both ends in one process: messages move between threads through the heap. Chosen only
    /// when asked for (`LF_TRANSPORTS=loopback` or the channel's `transports`).
    Loopback,
    /// CUDA memory the application allocated, by CUDA IPC on one host.
    CudaIpc,
}

impl TransportKind {
    /// Every transport; without a list of its own, a channel may take any of the first three
    /// (loopback only where asked for by name).
    pub const ALL: [TransportKind; 5] = [
        TransportKind::Shm,
        TransportKind::VulkanIpc,
        TransportKind::Mpi,
        TransportKind::Loopback,
        TransportKind::CudaIpc,
    ];

    /// What a channel may use when nothing restricts it.
    const DEFAULT: [TransportKind; 4] =
        [TransportKind::Shm, TransportKind::VulkanIpc, TransportKind::Mpi, TransportKind::CudaIpc];

    /// The transport's name and identity in reports.
    pub fn id(self) -> TransportId {
        match self {
            TransportKind::Shm => shm::ID,
            TransportKind::VulkanIpc => super::VULKAN_IPC,
            TransportKind::Mpi => super::MPI,
            TransportKind::Loopback => super::loopback::ID,
            TransportKind::CudaIpc => super::CUDA_IPC,
        }
    }

    /// The name used in `LF_TRANSPORTS` and reports.
    pub fn name(self) -> &'static str {
        self.id().name()
    }

    /// Parses a name from `LF_TRANSPORTS` (`shm`, `vulkan_ipc` or `vulkan`, `mpi`, `loopback`,
    /// `cuda_ipc` or `cuda`).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "shm" | "sm" | "shared_memory" => Ok(TransportKind::Shm),
            "vulkan_ipc" | "vulkan" | "vk" => Ok(TransportKind::VulkanIpc),
            "mpi" => Ok(TransportKind::Mpi),
            "loopback" | "self" => Ok(TransportKind::Loopback),
            "cuda_ipc" | "cuda" => Ok(TransportKind::CudaIpc),
            other => Err(Error::invalid(format!(
                "unknown transport {other:?}; known transports are shm, vulkan_ipc, mpi, loopback, cuda_ipc"
            ))),
        }
    }

    /// Whether the transport serves payloads next to a carrier (a route), rather than carrying
    /// a channel's messages itself.
    fn is_route(self) -> bool {
        matches!(self, TransportKind::VulkanIpc | TransportKind::CudaIpc)
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq<TransportKind> for TransportId {
    fn eq(&self, other: &TransportKind) -> bool {
        *self == other.id()
    }
}

impl PartialEq<TransportId> for TransportKind {
    fn eq(&self, other: &TransportId) -> bool {
        self.id() == *other
    }
}

/// Which transports serve a channel, decided before the rendezvous from the scope and what
/// the channel allows.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) carrier: TransportKind,
    /// The routes for payloads the carrier cannot hold itself (GPU memory), allowed, built and
    /// possible here, in order of preference. None: GPU buffers are staged through the carrier.
    pub(crate) routes: Vec<TransportKind>,
    /// The sentences of the report so far.
    pub(crate) reasons: Vec<String>,
    /// Why GPU buffers have no route of their own, when they have none.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) route_refusal: Option<String>,
    /// The peer's MPI address, for the mpi carrier.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) peer_mpi: Option<MpiAddress>,
    /// The carriers a fan-in's consumer meets producers on (a fan-out's producer, consumers),
    /// the planned carrier among them: shared memory where allowed, and MPI where it is built,
    /// allowed and joined here (other peers than the first may come over either). Empty for a
    /// pair.
    pub(crate) listeners: Vec<TransportKind>,
}

/// The transports a channel may use, in order of preference, and what said so: the config,
/// else `LF_TRANSPORTS`, else every transport but loopback.
pub(crate) fn allowed_transports(config: &ChannelConfig) -> Result<(Vec<TransportKind>, String)> {
    let (wanted, source) = match &config.transports {
        Some(list) => (list.clone(), "the channel's transports setting".to_owned()),
        None => match std::env::var(TRANSPORTS_ENV) {
            Ok(value) if !value.trim().is_empty() => {
                let list = value
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(TransportKind::parse)
                    .collect::<Result<Vec<_>>>()
                    .map_err(|e| Error::invalid(format!("{TRANSPORTS_ENV}={value:?}: {e}")))?;
                (list, format!("{TRANSPORTS_ENV}={value}"))
            }
            _ => (TransportKind::DEFAULT.to_vec(), String::new()),
        },
    };
    if wanted.is_empty() {
        return Err(Error::invalid(format!("{source} allows no transport")));
    }
    Ok((wanted, source))
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
        (TransportKind::Loopback, CommunicationScope::Local) => Ok(()),
        (TransportKind::Loopback, CommunicationScope::Remote) => Err("loopback needs both ends in one process".into()),
        (TransportKind::VulkanIpc, _) => Err("vulkan_ipc carries GPU buffers only, not a channel's messages".into()),
        (TransportKind::CudaIpc, _) => Err("cuda_ipc carries CUDA memory only, not a channel's messages".into()),
        (TransportKind::Mpi, _) => mpi_availability(peer),
    }
}

/// Whether the peer can be reached through MPI, or why not.
fn mpi_availability(peer: &ProcessLocation) -> std::result::Result<(), String> {
    #[cfg(feature = "mpi")]
    {
        match peer.mpi {
            Some(address) => crate::mpi::endpoint(address).map(|_| ()),
            None => Err(crate::mpi::unresolved_reason(peer)),
        }
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = peer;
        Err("mpi is not in this build (cargo feature `mpi`, or cmake -DLAVA_FLOW_MPI=ON)".into())
    }
}

/// The locations a channel uses: a peer's location read from a config file (it names the
/// process) becomes where MPI discovery found the process of that name, where this process
/// joined MPI (by itself under an MPI launcher, or by `lf_mpi_join`); with it, a location of
/// this process that does not say which host it is on (from a config file too) becomes where
/// discovery found this process. Both then carry host identities, and the peer its rank.
/// Without the `mpi` feature, the locations as they are.
pub(crate) fn resolve_locations(mine: &ProcessLocation, peer: &ProcessLocation) -> (ProcessLocation, ProcessLocation) {
    #[cfg(feature = "mpi")]
    {
        resolve_through_mpi(mine, peer)
    }
    #[cfg(not(feature = "mpi"))]
    {
        (mine.clone(), peer.clone())
    }
}

#[cfg(feature = "mpi")]
fn resolve_through_mpi(mine: &ProcessLocation, peer: &ProcessLocation) -> (ProcessLocation, ProcessLocation) {
    let Some(peer) = crate::mpi::resolve(peer) else {
        return (mine.clone(), peer.clone());
    };
    let mine = match crate::mpi::here_in_world_of(&peer) {
        Some(found) if mine.host_id.is_none() && mine.mpi.is_none() => ProcessLocation {
            node_id: mine.node_id.or(found.node_id),
            device_id: mine.device_id.or(found.device_id),
            name: mine.name.clone(),
            ..found
        },
        _ => mine.clone(),
    };
    (mine, peer)
}

/// Whether route `kind` can carry GPU buffers by reference for a channel of `scope`, or why
/// not.
fn route_availability(
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
        // Whether CUDA memory goes this way is the rendezvous's to say: the producer offers it
        // where its process has CUDA, the consumer accepts where it can open it.
        TransportKind::CudaIpc if scope == CommunicationScope::Local => Ok(()),
        _ => Err(format!("{kind} needs both processes on one host")),
    }
}

/// The carriers a fan-in's consumer (or a fan-out's producer) listens on besides `carrier`, in
/// the order of `allowed`: shared memory (peers on this host), and MPI (peers on other hosts)
/// where this process joined MPI at a thread level that lets lava-flow probe for them.
fn fan_listeners(carrier: TransportKind, allowed: &[TransportKind], peer: &ProcessLocation) -> Vec<TransportKind> {
    let mut listeners = vec![carrier];
    if carrier == TransportKind::Loopback {
        // Its producers are threads of this process.
        return listeners;
    }
    for kind in allowed.iter().copied().filter(|k| *k != carrier) {
        let listens = match kind {
            TransportKind::Shm => true,
            TransportKind::Mpi => mpi_listening(peer),
            _ => false,
        };
        if listens {
            listeners.push(kind);
        }
    }
    listeners
}

/// Whether a fan-in's consumer (a fan-out's producer) can meet its peers over MPI: this
/// process joined MPI (the world of the peer's location, or the last one joined), at a thread
/// level that allows the thread that probes for them.
fn mpi_listening(peer: &ProcessLocation) -> bool {
    #[cfg(feature = "mpi")]
    {
        crate::mpi::here(peer.mpi.map(|a| a.world))
            .is_ok_and(|here| here.thread_level >= crate::mpi::ThreadLevel::Serialized)
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = peer;
        false
    }
}

/// Chooses the carrier (the first allowed transport that can serve the scope) and the routes
/// (each allowed route that is built and possible here), saying why.
pub(crate) fn plan(
    scope: CommunicationScope,
    peer: &ProcessLocation,
    scope_text: &str,
    allowed: &[TransportKind],
    source: &str,
    config: &ChannelConfig,
    context: &Context,
) -> Result<Plan> {
    let (strict_gpu, shape) = (config.strict_gpu, config.kind);
    let mut refused = Vec::new();
    let mut carrier = None;
    // Routes are not carriers: they are weighed for GPU buffers below (a list of routes alone
    // is refused, saying so).
    for kind in allowed.iter().filter(|k| !k.is_route() || allowed.len() == 1) {
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
    let mut routes = Vec::new();
    let mut routes_refused = Vec::new();
    for kind in allowed.iter().filter(|k| k.is_route()) {
        // CUDA IPC handles do not open in the process that made them, and threads of one
        // process share the pointer itself.
        if *kind == TransportKind::CudaIpc && carrier == TransportKind::Loopback {
            continue;
        }
        match route_availability(*kind, scope, context) {
            Ok(()) => routes.push(*kind),
            // CUDA memory is never staged: its refusal is said at send.
            Err(_) if *kind == TransportKind::CudaIpc => {}
            Err(why) => routes_refused.push(why),
        }
    }
    // The routes for lava-flow's GPU buffers, without which they are staged.
    let gpu_routes = routes.iter().any(|k| *k != TransportKind::CudaIpc);
    if !gpu_routes {
        let not_allowed: Vec<String> = TransportKind::ALL
            .iter()
            .filter(|k| k.is_route() && **k != TransportKind::CudaIpc && !allowed.contains(k))
            .map(|k| {
                format!("{k} is not allowed{}", if source.is_empty() { String::new() } else { format!(" by {source}") })
            })
            .collect();
        routes_refused.extend(not_allowed);
        if strict_gpu {
            return Err(Error::Unsupported(format!(
                "GPU buffers would be staged through {carrier} (copied to host memory), which strict_gpu forbids: {}",
                routes_refused.join("; ")
            )));
        }
        reasons.push(format!(
            "GPU buffers: staged through {carrier} (copied to host memory): {}",
            routes_refused.join("; ")
        ));
    }
    let route_refusal = (!gpu_routes).then(|| routes_refused.join("; "));
    let listeners = match shape {
        ChannelKind::FanIn | ChannelKind::FanOut => fan_listeners(carrier, allowed, peer),
        ChannelKind::Pair => Vec::new(),
    };
    Ok(Plan { carrier, routes, reasons, route_refusal, peer_mpi: peer.mpi, listeners })
}

/// What to tell a user whose rendezvous over `carrier` timed out, as the `role` end
/// (`"producer"` or `"consumer"`) waiting for `peer`; empty where the carrier has nothing to add.
pub(crate) fn rendezvous_hint(carrier: TransportKind, peer: &str) -> String {
    match carrier {
        TransportKind::Shm => shm::rendezvous_hint(peer),
        TransportKind::Loopback => super::loopback::rendezvous_hint(peer),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::{plan_routes, preview_transports, PayloadClass};

    fn here() -> ProcessLocation {
        ProcessLocation::new("host-a", None, None).unwrap()
    }

    fn no_gpu() -> Context {
        Context::new(crate::memory::ContextConfig { gpu: crate::memory::GpuPolicy::Disabled, ..Default::default() })
            .unwrap()
    }

    #[test]
    fn local_picks_shm_and_remote_is_unsupported() {
        let mut config = ChannelConfig { transports: Some(TransportKind::DEFAULT.to_vec()), ..Default::default() };
        let plan = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap();
        assert_eq!(plan.carrier, TransportKind::Shm);
        assert!(plan.reasons[0].contains("scope local"), "{:?}", plan.reasons);
        assert_eq!(plan.routes, [TransportKind::CudaIpc], "no GPU in this context; CUDA's is the rendezvous's to say");
        assert!(plan.reasons[1].contains("GPU buffers: staged through shm"), "{:?}", plan.reasons);

        let far = ProcessLocation::new("host-b", None, None).unwrap();
        config.transports = None;
        // The env var is not set by this test binary's callers for this check.
        if std::env::var(TRANSPORTS_ENV).is_err() {
            let err = plan_routes(&here(), &far, &config, &no_gpu()).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported(ref m) if m.contains("no remote transport can reach the peer") && m.contains("lf_mpi_location")),
                "{err}"
            );
        }
    }

    #[test]
    fn loopback_is_taken_only_when_asked_for() {
        let config = ChannelConfig::default();
        if std::env::var(TRANSPORTS_ENV).is_err() {
            let plan = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap();
            assert_eq!(plan.carrier, TransportKind::Shm);
        }
        let config = ChannelConfig { transports: Some(vec![TransportKind::Loopback]), ..Default::default() };
        let plan = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap();
        assert_eq!(plan.carrier, TransportKind::Loopback);
        let far = ProcessLocation::new("host-b", None, None).unwrap();
        let err = plan_routes(&here(), &far, &config, &no_gpu()).unwrap_err();
        assert!(matches!(err, Error::Unsupported(ref m) if m.contains("both ends in one process")), "{err}");
    }

    #[test]
    fn a_preview_says_the_scope_and_each_route() {
        let config = ChannelConfig { transports: Some(TransportKind::DEFAULT.to_vec()), ..Default::default() };
        let info = preview_transports(&here(), &here(), &config, &no_gpu()).unwrap();
        assert_eq!((info.kind, info.routes.len()), (TransportKind::Shm.id(), 2));
        assert_eq!((info.routes[1].class, info.routes[1].kind), (PayloadClass::Gpu, TransportKind::Shm.id()));
        assert!(info.reason.contains("same host (host-a): scope local"), "{}", info.reason);
        assert!(info.routes[1].reason.contains("staged through shm"), "{}", info.routes[1].reason);
        let far = ProcessLocation::new("host-b", None, None).unwrap();
        let config = ChannelConfig { transports: Some(vec![TransportKind::Shm]), ..Default::default() };
        let err = preview_transports(&here(), &far, &config, &no_gpu()).unwrap_err();
        assert!(
            matches!(err, Error::Unsupported(ref m) if m.contains("shm needs both processes on one host")),
            "{err}"
        );
    }

    #[test]
    fn wanted_but_unavailable_fails_loudly() {
        let config = ChannelConfig { transports: Some(vec![TransportKind::Mpi]), ..Default::default() };
        let err = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap_err();
        // Built with MPI, the peer's location lacks an MPI rank; built without, MPI is missing.
        assert!(
            matches!(err, Error::Unsupported(ref m) if m.contains("MPI discovery") || m.contains("mpi is not in this build")),
            "{err}"
        );
        let config = ChannelConfig { transports: Some(vec![TransportKind::VulkanIpc]), ..Default::default() };
        let err = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap_err();
        assert!(matches!(err, Error::Unsupported(ref m) if m.contains("carries GPU buffers only")), "{err}");
    }

    #[test]
    fn a_fan_in_s_listeners_follow_what_is_allowed() {
        // A local fan-in's consumer listens on shared memory, and on MPI only where this
        // process joined it (the unit tests never do).
        let config = ChannelConfig { kind: ChannelKind::FanIn, ..Default::default() };
        let allowed = [TransportKind::Shm, TransportKind::Mpi];
        let plan = plan(CommunicationScope::Local, &here(), "here", &allowed, "", &config, &no_gpu()).unwrap();
        assert_eq!(plan.listeners, [TransportKind::Shm]);
        let fan_out = ChannelConfig { kind: ChannelKind::FanOut, ..Default::default() };
        let plan = super::plan(CommunicationScope::Local, &here(), "here", &allowed, "", &fan_out, &no_gpu()).unwrap();
        assert_eq!(plan.listeners, [TransportKind::Shm], "a fan-out's producer listens as a fan-in's consumer");
        let pair = ChannelConfig::default();
        let plan = super::plan(CommunicationScope::Local, &here(), "here", &allowed, "", &pair, &no_gpu()).unwrap();
        assert!(plan.listeners.is_empty(), "a pair listens on its carrier alone");
    }

    #[test]
    fn names_parse() {
        assert!(TransportKind::parse("bogus").is_err());
        assert_eq!(TransportKind::parse(" SHM ").unwrap(), TransportKind::Shm);
        assert_eq!(TransportKind::parse("loopback").unwrap(), TransportKind::Loopback);
        for kind in TransportKind::ALL {
            assert_eq!(TransportKind::parse(kind.name()).unwrap(), kind);
            assert_eq!(kind.id(), kind);
        }
    }
}
