//! Layer 2: ordered, bounded, one-way channels between two processes.
//!
//! A channel has a name, a [`Producer`] and a [`Consumer`]. Both ends call
//! [`Channel::create`] with the same name, in either order; they meet through a Unix socket
//! in a per-user directory (see `transports::shm::rendezvous`) and agree on transports chosen from the
//! scope between their [`ProcessLocation`]s, per class of payload:
//!
//! | scope  | every message, CPU payloads        | GPU buffers                              |
//! |--------|------------------------------------|------------------------------------------|
//! | local  | `shm`: memfd shared memory         | `vulkan_ipc` by reference, else staged    |
//! | remote | `mpi` (not built: `Unsupported`)   | staged through host memory               |
//!
//! The core (this module, [`producer`], [`consumer`]) knows transports only through the
//! traits of [`transport`]: a *carrier* keeps the order of every message, a *route* serves
//! payloads the carrier cannot hold (GPU memory) with descriptors the carrier carries in
//! order. [`transports`] is the one module that names the implementations and chooses among
//! them; a transport added there (MPI: a carrier with its own rendezvous) needs no change here.
//! `wait` is the wait protocol any same-host transport uses.
//!
//! `LF_TRANSPORTS` (like `UCX_TLS`) restricts the choice, e.g. `LF_TRANSPORTS=shm`; when none
//! of the listed transports can carry the channel, creation fails and says why for each.
//!
//! Messages are FIFO and delivered exactly once. The producer copies into the channel's
//! shared pool ([`Producer::send`]), writes in place ([`Producer::loan`]), or sends a region
//! of a lava-flow buffer by reference ([`Producer::send_buffer`]; `send` does so by itself
//! for bytes inside a buffer of the channel's [`Context`]): the
//! consumer maps the buffer's arena once per channel and reads the bytes where they lie. The
//! consumer reads a zero-copy [`Message`] view and releases it (on drop), which the producer
//! sees as completion ([`Producer::completed`]): then a sent buffer may be reused. A GPU
//! buffer's message holds a buffer over the producer's memory ([`Message::buffer`]).
//!
//! Waiting follows [`WaitStrategy`]. A blocked wait sleeps until it is woken by the peer, its
//! deadline or the peer's end, never periodically. Peer death (even `kill -9`) is noticed
//! within milliseconds in every strategy (each process's watcher thread sleeps on a pidfd of
//! every peer; where it cannot have one, blocked waits check every 15 ms, and the channel's
//! transport report says so) and reported as [`Error::PeerGone`] once the messages already
//! delivered have been read.

pub mod consumer;
pub mod producer;
// What tools need to see channels from outside (lf-info --channels): the runtime directory, the
// channels in it, whether each end is alive, and the removal of what dead ones left.
pub use transports::shm::rendezvous::{
    channels_in_runtime_dir, end_state, remove_leftovers, runtime_dir, runtime_dir_path, ChannelFiles, End, EndState,
    RUNTIME_DIR_ENV,
};
pub mod transport;
pub mod transports;
pub(crate) mod wait;

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::memory::Context;
use crate::types::{explain_scope, ProcessLocation};

#[cfg(feature = "async-io")]
pub use consumer::RecvFuture;
pub use consumer::{Consumer, Message};
pub use producer::{Loan, Producer};
pub use transport::{PayloadClass, Route, SharedRegion, TransportInfo, TransportKind};
pub use transports::AUTO_ZERO_COPY_MIN;

/// The environment variable that restricts transport choice: a comma-separated list of
/// transport names (`shm`, `vulkan_ipc`, `mpi`), tried in that order.
pub const TRANSPORTS_ENV: &str = crate::env::TRANSPORTS.name;

/// The longest channel name in bytes (it becomes a socket file name).
pub const MAX_CHANNEL_NAME_LEN: usize = 64;
/// The largest `pool_size` (1 TiB): a bound on what a peer can make the other end map.
pub const MAX_POOL_SIZE: u64 = 1 << 40;

/// Which end of a channel this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Producer,
    Consumer,
}

/// How a blocking call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// Spin on the shared cache line; lowest latency, one core busy while waiting.
    BusyPoll,
    /// Spin for this long, then sleep on a futex. The sender publishes without a memory
    /// fence; a wait that does sleep pays a `membarrier` (it interrupts the cores that run
    /// lava-flow processes) before it does.
    SpinThenBlock { spin: Duration },
    /// Sleep on a futex at once; no CPU used while waiting, a syscall on the sender's side
    /// per message that finds the receiver asleep, and a memory fence per message (cheaper
    /// than a `membarrier` per sleep for a side that sleeps on nearly every wait).
    Block,
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::SpinThenBlock { spin: Duration::from_micros(50) }
    }
}

/// Channel options. The producer's sizes decide the shared region; the consumer's are
/// ignored (it takes what the producer offers, after checking it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    pub wait: WaitStrategy,
    /// Ring slots, a power of two from 2 to 2^20: how many messages may lie between the
    /// oldest one not yet released and the newest sent. Views may be released in any order,
    /// but space is reclaimed in order, so a view held while `capacity` more messages arrive
    /// makes the producer wait (or `WouldBlock`).
    pub capacity: u32,
    /// Bytes of shared payload pool for messages larger than the inline limit (112 bytes);
    /// also the largest message. Rounded up to pages.
    pub pool_size: usize,
    /// How long `create` waits for the peer; `None` waits forever.
    pub rendezvous_timeout: Option<Duration>,
    /// Allowed transports in order of preference; `None` reads `LF_TRANSPORTS`, and when that
    /// is unset too, every built transport is allowed.
    pub transports: Option<Vec<TransportKind>>,
    /// Whether `Producer::send` of bytes that lie inside a lava-flow buffer sends them by
    /// reference (zero copy; the sender must not rewrite them until the message completes).
    /// Off: `send` always copies, and the bytes may be reused as soon as it returns.
    pub auto_zero_copy: bool,
    /// GPU buffers must go by reference with GPU-side synchronisation: where they would be
    /// staged through host memory (the consumer on another GPU, or without one) or
    /// synchronised on the host (the driver cannot share semaphores), creating the channel
    /// fails instead, saying why.
    pub strict_gpu: bool,
    /// Producer: the consumer signals a Vulkan timeline semaphore of the producer's (the
    /// *released* semaphore, [`Producer::released_semaphore`]) to `seq + 1` once it let go of
    /// GPU message `seq` and every GPU message before it, so that the producer's GPU work can
    /// wait on the GPU before rewriting a buffer it sent. Off by default: it costs a host-side
    /// semaphore signal per GPU message. Where semaphores cannot be shared, the report says so
    /// (strict_gpu: creating the channel fails).
    pub released_semaphore: bool,
    /// Producer: fault the shared-memory pool and slots in when the channel is made (and the
    /// consumer maps them in whole), so that first touches do not fault in the message path.
    /// Skipped where the pool is over a quarter of the memory the kernel calls available.
    /// On by default.
    pub prefault: bool,
}

impl ChannelConfig {
    /// Refuses sizes no channel can have, at once and on either end, naming the field: a pool
    /// of 0 bytes or more than 1 TiB. (The capacity is the producer's to choose; its
    /// transport checks it.)
    pub fn validate(&self) -> Result<()> {
        if self.pool_size == 0 || self.pool_size as u64 > MAX_POOL_SIZE {
            return Err(Error::invalid(format!(
                "pool_size {} must be from 1 to {MAX_POOL_SIZE} bytes (1 TiB); it is also the largest message",
                self.pool_size
            )));
        }
        Ok(())
    }
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            wait: WaitStrategy::default(),
            capacity: 256,
            pool_size: 16 << 20,
            rendezvous_timeout: Some(Duration::from_secs(10)),
            transports: None,
            auto_zero_copy: true,
            strict_gpu: false,
            released_semaphore: false,
            prefault: true,
        }
    }
}

/// One end of a channel.
// One per channel end, made once: the producer's size (its pool and ring state inline) costs
// nothing worth a box on every access.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Channel {
    Producer(Producer),
    Consumer(Consumer),
}

impl Channel {
    /// Creates this process's end of channel `name` and waits (up to
    /// `config.rendezvous_timeout`) for the other end. `context` is this process's memory
    /// context: bytes sent from its buffers travel by reference.
    pub fn create(
        context: &Context,
        name: &str,
        role: Role,
        my_location: &ProcessLocation,
        peer_location: &ProcessLocation,
        config: &ChannelConfig,
    ) -> Result<Channel> {
        Ok(match role {
            Role::Producer => Channel::Producer(Producer::create(context, name, my_location, peer_location, config)?),
            Role::Consumer => Channel::Consumer(Consumer::create(context, name, my_location, peer_location, config)?),
        })
    }

    pub fn role(&self) -> Role {
        match self {
            Channel::Producer(_) => Role::Producer,
            Channel::Consumer(_) => Role::Consumer,
        }
    }

    /// The transport and why it was chosen.
    pub fn transport(&self) -> &TransportInfo {
        match self {
            Channel::Producer(p) => p.transport(),
            Channel::Consumer(c) => c.transport(),
        }
    }

    pub fn into_producer(self) -> Result<Producer> {
        match self {
            Channel::Producer(p) => Ok(p),
            Channel::Consumer(_) => Err(Error::InvalidState("this channel end is a consumer".into())),
        }
    }

    pub fn into_consumer(self) -> Result<Consumer> {
        match self {
            Channel::Consumer(c) => Ok(c),
            Channel::Producer(_) => Err(Error::InvalidState("this channel end is a producer".into())),
        }
    }
}

/// Says that `role`'s end of channel `name` is about to meet its peer through `carrier`.
pub(crate) fn log_creating(name: &str, role: Role, carrier: TransportKind, timeout: Option<Duration>) {
    let peer = match role {
        Role::Producer => "consumer",
        Role::Consumer => "producer",
    };
    let wait = match timeout {
        Some(t) => format!("up to {t:?}"),
        None => "as long as it takes".to_owned(),
    };
    log::debug!("channel {name:?} ({}): creating over {carrier}, waiting {wait} for the {peer}", role_name(role));
}

/// Says which transports a new end of channel `name` uses, and why.
pub(crate) fn log_created(name: &str, role: Role, info: &TransportInfo) {
    log::info!("channel {name:?} ({}): transport {}: {}", role_name(role), info.names(), info.reason);
}

/// Warns of a rendezvous of channel `name` that timed out (the error is returned as it is).
pub(crate) fn log_failed(name: &str, role: Role, carrier: TransportKind, error: &Error) {
    let Error::Timeout(why) = error else {
        log::debug!("channel {name:?} ({}): not created: {error}", role_name(role));
        return;
    };
    let peer = match role {
        Role::Producer => "consumer",
        Role::Consumer => "producer",
    };
    let hint = match carrier {
        TransportKind::Shm => {
            let dir = transports::shm::rendezvous::runtime_dir()
                .map_or_else(|e| format!("unusable: {e}"), |d| d.display().to_string());
            format!(
                ". Start the {peer} with the same channel name, as the same user and with the same runtime dir ({dir}; \
                 {} sets it), or raise rendezvous_timeout",
                transports::shm::rendezvous::RUNTIME_DIR_ENV
            )
        }
        _ => String::new(),
    };
    log::warn!("channel {name:?} ({}): the rendezvous timed out: {why}{hint}", role_name(role));
}

/// Says that an end of channel `name` closes.
pub(crate) fn log_closed(name: &str, role: Role) {
    log::debug!("channel {name:?} ({}): closed", role_name(role));
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Producer => "producer",
        Role::Consumer => "consumer",
    }
}

/// Checks a channel name: 1 to 64 bytes of ASCII letters, digits, `-`, `_`, `.`, not
/// starting with `.` (it becomes a file name).
/// The instant a wait of `timeout` (`None`: forever) ends, read from the clock now. Called
/// only where a wait begins, so that a timeout costs nothing when nobody has to wait.
#[cold]
pub(crate) fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

pub(crate) fn validate_channel_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_CHANNEL_NAME_LEN {
        return Err(Error::invalid(format!(
            "channel name {name:?} is {} bytes long; use 1 to {MAX_CHANNEL_NAME_LEN}",
            name.len()
        )));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(Error::invalid(format!(
            "channel name {name:?} contains {bad:?}; use ASCII letters, digits, '-', '_' and '.'"
        )));
    }
    if name.starts_with('.') {
        return Err(Error::invalid(format!("channel name {name:?} starts with '.'")));
    }
    Ok(())
}

/// The transports a channel may use, in order of preference, and what said so: the config,
/// else `LF_TRANSPORTS`, else every transport.
fn allowed_transports(config: &ChannelConfig) -> Result<(Vec<TransportKind>, String)> {
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
            _ => (TransportKind::ALL.to_vec(), String::new()),
        },
    };
    if wanted.is_empty() {
        return Err(Error::invalid(format!("{source} allows no transport")));
    }
    Ok((wanted, source))
}

/// Decides which transports serve a channel between `mine` and `peer`, and says why.
pub(crate) fn plan_routes(
    mine: &ProcessLocation,
    peer: &ProcessLocation,
    config: &ChannelConfig,
    context: &Context,
) -> Result<transports::Plan> {
    let (scope, scope_text) = explain_scope(mine, peer);
    let (allowed, source) = allowed_transports(config)?;
    transports::plan(scope, peer, &scope_text, &allowed, &source, config.strict_gpu, context)
}

/// The transports a channel between `mine` and `peer` would take with `config` on
/// `context`, and why, without creating it or meeting the peer: the scope (host identities or
/// hostnames compared), the carrier of the messages and CPU payloads, and the route of GPU
/// buffers as far as this side can tell (whether they go by reference is settled with the
/// peer). Fails as [`Channel::create`] would before its rendezvous: no transport can reach the
/// peer, `LF_TRANSPORTS` is malformed or rules every candidate out, `strict_gpu` refuses.
pub fn preview_transports(
    mine: &ProcessLocation,
    peer: &ProcessLocation,
    config: &ChannelConfig,
    context: &Context,
) -> Result<TransportInfo> {
    let plan = plan_routes(mine, peer, config, context)?;
    Ok(transports::preview(&plan, context))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> ProcessLocation {
        ProcessLocation::new("host-a", None, None).unwrap()
    }

    fn no_gpu() -> Context {
        Context::new(crate::memory::ContextConfig { gpu: crate::memory::GpuPolicy::Disabled, ..Default::default() })
            .unwrap()
    }

    #[test]
    fn local_picks_shm_and_remote_is_unsupported() {
        let mut config = ChannelConfig { transports: Some(TransportKind::ALL.to_vec()), ..Default::default() };
        let plan = plan_routes(&here(), &here(), &config, &no_gpu()).unwrap();
        assert_eq!(plan.carrier, TransportKind::Shm);
        assert!(plan.reasons[0].contains("scope local"), "{:?}", plan.reasons);
        assert_eq!(plan.gpu_route, None, "no GPU in this context");
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
    fn a_preview_says_the_scope_and_each_route() {
        let config = ChannelConfig { transports: Some(TransportKind::ALL.to_vec()), ..Default::default() };
        let info = preview_transports(&here(), &here(), &config, &no_gpu()).unwrap();
        assert_eq!((info.kind, info.routes.len()), (TransportKind::Shm, 2));
        assert_eq!((info.routes[1].class, info.routes[1].kind), (PayloadClass::Gpu, TransportKind::Shm));
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
    fn names_are_checked() {
        assert!(validate_channel_name("cam-0.frames_x").is_ok());
        for bad in ["", ".hidden", "a/b", "with space", &"x".repeat(65)] {
            assert!(validate_channel_name(bad).is_err(), "{bad:?}");
        }
        assert!(TransportKind::parse("bogus").is_err());
        assert_eq!(TransportKind::parse(" SHM ").unwrap(), TransportKind::Shm);
    }
}
