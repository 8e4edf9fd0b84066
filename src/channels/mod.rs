//! Layer 2: ordered, bounded, one-way channels between two processes.
//!
//! A channel has a name, a [`Producer`] and a [`Consumer`]. Both ends call
//! [`Channel::create`] with the same name, in either order; they meet through a Unix socket
//! in a per-user directory (see [`rendezvous`]) and agree on a transport chosen from the
//! scope between their [`ProcessLocation`]s:
//!
//! | scope  | transport                                   |
//! |--------|---------------------------------------------|
//! | local  | `shm`: memfd shared memory (built)          |
//! | local  | `vulkan_ipc`: GPU buffers (later)           |
//! | remote | `mpi` (later): until then, `Unsupported`    |
//!
//! `LF_TRANSPORTS` (like `UCX_TLS`) restricts the choice, e.g. `LF_TRANSPORTS=shm`; when none
//! of the listed transports can serve the channel, creation fails and says why for each.
//!
//! Messages are FIFO and delivered exactly once. The producer copies into the channel's
//! shared pool ([`Producer::send`]), writes in place ([`Producer::loan`]), or sends a region
//! of a lava-flow buffer by reference ([`Producer::send_buffer`]; `send` does so by itself
//! for bytes inside a buffer of the channel's [`Context`](crate::memory::Context)): the
//! consumer maps the buffer's arena once per channel and reads the bytes where they lie. The
//! consumer reads a zero-copy [`Message`] view and releases it (on drop), which the producer
//! sees as completion ([`Producer::completed`]): then a sent buffer may be reused.
//!
//! Waiting follows [`WaitStrategy`]. Peer death (even `kill -9`) is noticed within about 20 ms
//! in every strategy and reported as [`Error::PeerGone`] once the messages already delivered
//! have been read.

pub mod consumer;
pub mod producer;
pub mod rendezvous;
pub mod transport;
pub mod transports;

use std::time::Duration;

use crate::error::{Error, Result};
use crate::memory::Context;
use crate::types::{detect_scope, CommunicationScope, ProcessLocation};

pub use consumer::{Consumer, Message, RecvFuture};
pub use producer::{Loan, Producer};
pub use transport::{SharedRegion, TransportInfo, TransportKind};

/// The environment variable that restricts transport choice: a comma-separated list of
/// transport names (`shm`, `vulkan_ipc`, `mpi`), tried in that order.
pub const TRANSPORTS_ENV: &str = "LF_TRANSPORTS";

/// The shortest send that goes by reference by itself when its bytes lie in a lava-flow
/// buffer ([`Producer::send`]); shorter ones are copied into their ring slot, which costs
/// less than mapping anything.
pub const AUTO_ZERO_COPY_MIN: usize = transports::shm::SHM_INLINE_MAX + 1;

/// The longest channel name in bytes (it becomes a socket file name).
pub const MAX_CHANNEL_NAME_LEN: usize = 64;

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
    /// Spin for this long, then sleep on a futex.
    SpinThenBlock { spin: Duration },
    /// Sleep on a futex at once; no CPU used while waiting, a syscall on the sender's side
    /// per message that finds the receiver asleep.
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
    /// Bytes of shared payload pool for messages larger than the inline limit
    /// ([`transports::shm::SHM_INLINE_MAX`], 112 bytes); also the largest message. Rounded up to pages.
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
        }
    }
}

/// One end of a channel.
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

/// Whether a transport is built into this library and can serve `scope`, or why not.
fn availability(kind: TransportKind, scope: CommunicationScope) -> std::result::Result<(), String> {
    match (kind, scope) {
        (TransportKind::Shm, CommunicationScope::Local) => Ok(()),
        (TransportKind::Shm, CommunicationScope::Remote) => {
            Err("shm needs both processes on one host".into())
        }
        (TransportKind::VulkanIpc, _) => Err("vulkan_ipc is not built yet".into()),
        (TransportKind::Mpi, _) => Err("mpi is not built yet".into()),
    }
}

/// Picks the transport for a channel between `mine` and `peer`, and says why.
pub(crate) fn select_transport(
    mine: &ProcessLocation,
    peer: &ProcessLocation,
    config: &ChannelConfig,
) -> Result<TransportInfo> {
    let scope = detect_scope(mine, peer);
    let scope_text = match scope {
        CommunicationScope::Local => format!("same host ({}): scope local", mine.hostname),
        CommunicationScope::Remote => format!(
            "peer host {:?} differs from this host {:?}: scope remote",
            peer.hostname, mine.hostname
        ),
    };
    let (wanted, source) = match &config.transports {
        Some(list) => (list.clone(), "ChannelConfig::transports".to_owned()),
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
    let mut refused = Vec::new();
    for kind in &wanted {
        match availability(*kind, scope) {
            Ok(()) => {
                let mut reason = format!("{scope_text}; {kind} chosen");
                if !source.is_empty() {
                    reason.push_str(&format!(" (allowed by {source})"));
                }
                if !refused.is_empty() {
                    reason.push_str(&format!("; skipped: {}", refused.join("; ")));
                }
                return Ok(TransportInfo { kind: *kind, reason });
            }
            Err(why) => refused.push(why),
        }
    }
    if scope == CommunicationScope::Remote && source.is_empty() {
        return Err(Error::Unsupported(format!(
            "no remote transport available (the MPI transport is not built yet): {scope_text}. \
             Run both processes on one host for now, or check that both locations name the \
             same hostname if they do share one"
        )));
    }
    let what = if source.is_empty() { "no built transport".to_owned() } else { format!("none of the transports {source} allows") };
    Err(Error::Unsupported(format!(
        "{what} can serve this channel ({scope_text}): {}",
        refused.join("; ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> ProcessLocation {
        ProcessLocation::new("host-a", None, None).unwrap()
    }

    #[test]
    fn local_picks_shm_and_remote_is_unsupported() {
        let mut config = ChannelConfig { transports: Some(TransportKind::ALL.to_vec()), ..Default::default() };
        let info = select_transport(&here(), &here(), &config).unwrap();
        assert_eq!(info.kind, TransportKind::Shm);
        assert!(info.reason.contains("scope local"), "{}", info.reason);

        let far = ProcessLocation::new("host-b", None, None).unwrap();
        config.transports = None;
        // The env var is not set by this test binary's callers for this check.
        if std::env::var(TRANSPORTS_ENV).is_err() {
            let err = select_transport(&here(), &far, &config).unwrap_err();
            assert!(matches!(err, Error::Unsupported(ref m) if m.contains("no remote transport available")), "{err}");
        }
    }

    #[test]
    fn wanted_but_unavailable_fails_loudly() {
        let config = ChannelConfig { transports: Some(vec![TransportKind::Mpi]), ..Default::default() };
        let err = select_transport(&here(), &here(), &config).unwrap_err();
        assert!(matches!(err, Error::Unsupported(ref m) if m.contains("mpi is not built yet")), "{err}");
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
