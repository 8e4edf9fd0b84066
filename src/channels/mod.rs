//! Layer 2: ordered, bounded, one-way channels between two processes.
//!
//! A channel has a name, a [`Producer`] and a [`Consumer`]. Both ends call
//! [`Channel::create`] with the same name, in either order; they meet through the rendezvous of
//! the transport chosen for the scope between their [`ProcessLocation`]s (processes of one
//! host, of two hosts, threads of one process: [`transports`] has the table and the choice).
//!
//! The core (this module, [`producer`], [`consumer`], `routes`) knows transports only through
//! the traits of [`transport`]: a *carrier* keeps the order of every message, *routes* serve
//! payloads the carrier cannot hold (GPU memory) with descriptors the carrier carries in
//! order, each message taking the route its memory's kind calls for. [`transports`] is the one
//! module that names the implementations and chooses among them; a transport added there
//! needs no change here. `wait` is the wait protocol any same-host transport uses.
//!
//! `LF_TRANSPORTS` (like `UCX_TLS`) restricts the choice, e.g. `LF_TRANSPORTS=shm`; when none
//! of the listed transports can carry the channel, creation fails and says why for each.
//!
//! Messages are FIFO and delivered exactly once. The producer copies into the channel
//! ([`Producer::send`]), writes in place ([`Producer::loan`]), or sends a region of a
//! lava-flow buffer by reference ([`Producer::send_buffer`]; `send` does so by itself for
//! bytes inside a buffer of the channel's [`Context`]): the consumer reads the bytes where
//! they lie. The consumer reads a zero-copy [`Message`] view and releases it (on drop), which
//! the producer sees as completion ([`Producer::completed`]): then a sent buffer may be
//! reused. A GPU buffer's message holds a buffer over the producer's memory
//! ([`Message::buffer`]).
//!
//! Waiting follows [`WaitStrategy`]. A blocked wait sleeps until it is woken by the peer, its
//! deadline or the peer's end, never periodically. Peer death (even `kill -9`) is noticed
//! within milliseconds in every strategy (where a transport cannot be told at once, blocked
//! waits check every 15 ms, and the channel's transport report says so) and reported as
//! [`Error::PeerGone`] once the messages already delivered have been read.

pub mod consumer;
mod fan_in;
mod fan_out;
mod holds;
pub mod peers;
pub mod producer;
pub mod raw;
mod ready;
mod routes;
// What tools need to see channels from outside (lf-info --channels): the runtime directory, the
// channels in it, whether each end is alive, and the removal of what dead ones left.
pub use transports::{
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
pub use peers::{ChannelKind, Peer, PeerState, MAX_PEERS};
pub use producer::{Loan, Producer};
pub use transport::{MemoryKind, PayloadClass, Route, SharedRegion, TransportId, TransportInfo};
pub use transports::{TransportKind, AUTO_ZERO_COPY_MIN, TRANSPORTS_ENV};

/// The longest channel name in bytes (it becomes a socket file name).
pub const MAX_CHANNEL_NAME_LEN: usize = 64;

/// Which end of a channel this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Producer,
    Consumer,
}

/// The largest `pool_size` (1 TiB): a bound on what a peer can make the other end map.
pub const MAX_POOL_SIZE: u64 = 1 << 40;

/// How a blocking call waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// Spin on the word the peer writes; lowest latency, one core busy while waiting.
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
    /// How many messages may be in flight: between the oldest one not yet released and the
    /// newest sent, a power of two from 2 to 2^20. Views may be released in any order, but
    /// space is reclaimed in order, so a view held while `capacity` more messages arrive makes
    /// the producer wait (or `WouldBlock`).
    pub capacity: u32,
    /// Bytes of payload memory the channel sets aside for messages in flight (each carrier
    /// rounds it as its memory needs); also the largest message.
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
    /// Producer: fault in the memory the channel sets aside for messages when it is made (and
    /// have the consumer do so), so that first touches do not fault in the message path.
    /// Skipped where it is over a quarter of the memory the kernel calls available. On by
    /// default.
    pub prefault: bool,
    /// How many processes share the channel: a pair (the default), a fan-in (up to
    /// `max_peers` producers, one consumer) or a fan-out (one producer, up to `max_peers`
    /// consumers). Every end of a channel names the same kind.
    pub kind: ChannelKind,
    /// A fan-in's most producers, or a fan-out's most consumers, from 1 to [`MAX_PEERS`];
    /// the value of the end there is one of rules. A pair ignores it.
    pub max_peers: u32,
    /// Fan-out: a consumer that keeps the producer waiting for room longer than this is
    /// detached (its next receive says so) and the producer goes on. `None` (the default):
    /// a slow consumer holds the producer back, as a full pair channel does.
    pub slow_consumer_timeout: Option<Duration>,
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
        if self.max_peers == 0 || self.max_peers > MAX_PEERS {
            return Err(Error::invalid(format!(
                "max_peers {} must be from 1 to {MAX_PEERS}: how many producers a fan-in takes, or consumers a fan-out",
                self.max_peers
            )));
        }
        if self.slow_consumer_timeout.is_some() && self.kind != ChannelKind::FanOut {
            return Err(Error::invalid(format!(
                "slow_consumer_timeout is a fan-out setting, and this channel is a {}; leave it unset, or make the \
                 channel a fan-out",
                self.kind
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
            kind: ChannelKind::Pair,
            max_peers: 8,
            slow_consumer_timeout: None,
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
pub(crate) fn log_creating(name: &str, role: Role, carrier: TransportId, timeout: Option<Duration>) {
    let wait = match timeout {
        Some(t) => format!("up to {t:?}"),
        None => "as long as it takes".to_owned(),
    };
    log::debug!(
        "channel {name:?} ({}): creating over {carrier}, waiting {wait} for the {}",
        role_name(role),
        peer_name(role)
    );
}

/// Says which transports a new end of channel `name` uses, and why.
pub(crate) fn log_created(name: &str, role: Role, info: &TransportInfo) {
    log::info!("channel {name:?} ({}): transport {}: {}", role_name(role), info.names(), info.reason);
}

/// Warns of a rendezvous of channel `name` that timed out, with the carrier's `hint` of what
/// to check (the error is returned as it is).
pub(crate) fn log_failed(name: &str, role: Role, hint: impl FnOnce(&str) -> String, error: &Error) {
    let Error::Timeout(why) = error else {
        log::debug!("channel {name:?} ({}): not created: {error}", role_name(role));
        return;
    };
    log::warn!("channel {name:?} ({}): the rendezvous timed out: {why}{}", role_name(role), hint(peer_name(role)));
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

/// The other end's name.
fn peer_name(role: Role) -> &'static str {
    match role {
        Role::Producer => "consumer",
        Role::Consumer => "producer",
    }
}

/// The instant a wait of `timeout` (`None`: forever) ends, read from the clock now. Called
/// only where a wait begins, so that a timeout costs nothing when nobody has to wait.
#[cold]
pub(crate) fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// Checks a channel name: 1 to 64 bytes of ASCII letters, digits, `-`, `_`, `.`, not
/// starting with `.` (it becomes a file name).
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

/// Decides which transports serve a channel between `mine` and `peer`, and says why.
pub(crate) fn plan_routes(
    mine: &ProcessLocation,
    peer: &ProcessLocation,
    config: &ChannelConfig,
    context: &Context,
) -> Result<transports::Plan> {
    let (mine, peer) = &transports::resolve_locations(mine, peer);
    let (scope, scope_text) = explain_scope(mine, peer);
    let (allowed, source) = transports::allowed_transports(config)?;
    transports::plan(scope, peer, &scope_text, &allowed, &source, config, context)
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

// Unix's descriptors and sockets throughout.
#[cfg(all(unix, test))]
mod tests;
#[cfg(all(windows, test))]
mod windows_tests;
