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

mod config;
pub mod consumer;
pub mod producer;
pub mod raw;
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
pub use producer::{Loan, Producer};
pub use config::{ChannelConfig, WaitStrategy, MAX_POOL_SIZE};
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
    let (scope, scope_text) = explain_scope(mine, peer);
    let (allowed, source) = transports::allowed_transports(config)?;
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

    #[test]
    fn names_are_checked() {
        assert!(validate_channel_name("cam-0.frames_x").is_ok());
        for bad in ["", ".hidden", "a/b", "with space", &"x".repeat(65)] {
            assert!(validate_channel_name(bad).is_err(), "{bad:?}");
        }
    }
}
