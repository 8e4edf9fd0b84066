//! A fan-out over MPI: consumers on other hosts join the producer, which keeps one pair-like
//! MPI producer end per such consumer (one of the fan-out's outs).
//!
//! - **The consumer** ([`join`]) sends a join (the channel's name and a nonce) to the
//!   producer's rank on the channel's join tag (`Tags::joins`), then waits for the producer's
//!   answer on the hello tag: a hello that carries the join's nonce, which it acknowledges as a
//!   pair's consumer does, or a refusal saying why. A process has one consumer of a fan-out at
//!   a time.
//! - **The producer** ([`MpiJoins`], on a thread of its fan-out's: `fan_out`) probes the join tag with `MPI_ANY_SOURCE` (attached
//!   consumers' answers stay on the answers tag, where each out receives from its own rank),
//!   takes a slot of the fan-out for each joiner through a `ClaimSlot` (the fan-out's slot
//!   table), and connects an `MpiProducer` to it: the out it hands over. A full fan-out and a
//!   join of another channel's name are refused; a join from a rank whose last consumer's out
//!   is still open (its close not seen yet) waits for it to be dropped, up to `PARK_WAIT`.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::consumer::{receive, refuse, send_now, MpiSession, Seat, RECEIVED, SESSION};
use super::producer::{has_producer, MpiProducer};
use super::{backoff, ClaimSlot, Header, Hello, Join, Kind, StreamPos, Tags};
use crate::channels::transport::TransportInfo;
use crate::channels::{ChannelConfig, ChannelKind};
use crate::error::{Error, Result};
use crate::mpi::Endpoint;

/// How long a join from a rank waits for its last consumer's out to be dropped.
const PARK_WAIT: Duration = Duration::from_secs(5);

/// How long the producer waits for a joiner's acknowledgement (the joiner waits already).
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// A consumer met over MPI: its slot in the fan-out, the producer end toward it, and what
/// holds its slot (dropped with the out, the slot is free again).
pub(crate) struct Joined {
    pub(crate) slot: u32,
    pub(crate) producer: MpiProducer,
    pub(crate) claim: Box<dyn Any + Send + Sync>,
}

/// A fan-out producer's meeting point for consumers on other hosts.
pub(crate) struct MpiJoins {
    name: String,
    config: ChannelConfig,
    info: TransportInfo,
    /// This process in the world the consumers come from.
    here: Endpoint,
    tags: Tags,
    claim: ClaimSlot,
    /// Joins from ranks whose last consumer's out is still open, with when they came.
    parked: Vec<(Instant, u32, Join)>,
}

impl MpiJoins {
    /// Meets the consumers of fan-out `name` (`config`: the producer's) that join from any rank
    /// of `here`'s world; each out reports `info`. Returns at once.
    pub(crate) fn new(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        here: Endpoint,
        claim: ClaimSlot,
    ) -> Result<MpiJoins> {
        let tags = super::tags_for(name, here.tag_upper_bound)?;
        Ok(MpiJoins { name: name.to_owned(), config: config.clone(), info, here, tags, claim, parked: Vec::new() })
    }

    /// A consumer that joined, answered and connected; `None` when none waits (those refused
    /// were told why). Blocks at most `ANSWER_WAIT` for a joiner's acknowledgement.
    pub(crate) fn try_join(&mut self) -> Result<Option<Joined>> {
        if !self.parked.is_empty() {
            if let Some(joined) = self.unpark()? {
                return Ok(Some(joined));
            }
        }
        loop {
            let Some((rank, len)) = self.here.comm.iprobe_any(self.tags.joins)? else {
                return Ok(None);
            };
            // Received whole whatever it holds: one left in MPI would be probed for ever.
            let mut bytes = vec![0u8; len];
            // SAFETY: `bytes` has the `len` bytes the probe reported.
            unsafe { self.here.comm.recv_probed(bytes.as_mut_ptr(), len, rank, self.tags.joins)? };
            let join = match Join::decode(&bytes, rank) {
                Ok(join) => join,
                Err(e) => {
                    log::warn!("fan-out channel {:?} (producer): dropped a join over MPI: {e}", self.name);
                    continue;
                }
            };
            if join.name != self.name {
                let why = format!(
                    "channels {:?} and {:?} share MPI tag {} at MPI rank {}; rename one",
                    join.name, self.name, self.tags.joins, self.here.rank
                );
                self.refuse(rank, &join, &why)?;
                continue;
            }
            if has_producer(&self.name, &self.here.to(rank)) {
                self.parked.push((Instant::now(), rank, join));
                continue;
            }
            if let Some(joined) = self.seat(rank, &join)? {
                return Ok(Some(joined));
            }
        }
    }

    /// The parked join whose rank has no out any more, connected; those that waited too long
    /// refused.
    fn unpark(&mut self) -> Result<Option<Joined>> {
        let mut at = 0;
        while at < self.parked.len() {
            let (since, rank, _) = self.parked[at];
            if !has_producer(&self.name, &self.here.to(rank)) {
                let (_, rank, join) = self.parked.remove(at);
                match self.seat(rank, &join)? {
                    Some(joined) => return Ok(Some(joined)),
                    None => continue,
                }
            }
            if since.elapsed() >= PARK_WAIT {
                let (_, rank, join) = self.parked.remove(at);
                let why = format!(
                    "one consumer per MPI rank on a fan-out: the last consumer of MPI rank {rank} on fan-out channel \
                     {:?} is still attached (its producer has not seen it close within {} s); try again once it has",
                    self.name,
                    PARK_WAIT.as_secs()
                );
                self.refuse(rank, &join, &why)?;
                continue;
            }
            at += 1;
        }
        Ok(None)
    }

    /// Gives `join`'s consumer the lowest free slot and connects an out to it; a full fan-out
    /// refuses it. A joiner that does not answer in time is dropped (`None`).
    fn seat(&mut self, rank: u32, join: &Join) -> Result<Option<Joined>> {
        let mut claimed = None;
        for slot in 0..self.config.max_peers {
            if let Some(claim) = (self.claim)(slot)? {
                claimed = Some((slot, claim));
                break;
            }
        }
        let Some((slot, claim)) = claimed else {
            let why = format!(
                "fan-out channel {:?} is full: it takes max_peers = {} consumers and all of them are attached; wait \
                 for one to close, or create the producer with a larger max_peers",
                self.name, self.config.max_peers
            );
            self.refuse(rank, join, &why)?;
            return Ok(None);
        };
        let config = ChannelConfig {
            kind: ChannelKind::FanOut,
            rendezvous_timeout: Some(self.config.rendezvous_timeout.map_or(ANSWER_WAIT, |t| t.min(ANSWER_WAIT))),
            ..self.config.clone()
        };
        match MpiProducer::connect_with(&self.name, self.info.clone(), &config, self.here.to(rank), join.nonce) {
            Ok(producer) => {
                log::info!(
                    "fan-out channel {:?} (producer): a consumer at MPI rank {rank} ({}) joined in slot {slot}",
                    self.name,
                    self.here.to(rank).peer_host()
                );
                Ok(Some(Joined { slot, producer, claim }))
            }
            Err(e @ (Error::Timeout(_) | Error::InvalidState(_))) => {
                log::info!(
                    "fan-out channel {:?} (producer): a consumer at MPI rank {rank} did not attach: {e}",
                    self.name
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Tells the joiner at `rank` why it is refused (on the hello tag, where it waits).
    fn refuse(&self, rank: u32, join: &Join, why: &str) -> Result<()> {
        log::info!("fan-out channel {:?} (producer): refused a consumer at MPI rank {rank}: {why}", self.name);
        let mut refusal = Header::new(Kind::Refuse, join.nonce, 0).to_bytes().to_vec();
        refusal.extend_from_slice(why.as_bytes());
        send_now(&self.here.to(rank), self.tags.hellos, &refusal)
    }
}

impl Drop for MpiJoins {
    fn drop(&mut self) {
        // Parked joiners would otherwise wait for their rendezvous timeout.
        for (_, rank, join) in std::mem::take(&mut self.parked) {
            let why = format!("the producer of fan-out channel {:?} closed", self.name);
            let _ = self.refuse(rank, &join, &why);
        }
    }
}

/// The MPI consumers of fan-outs in this process: (communicator, producer's rank, channel).
static CONSUMERS: Mutex<Vec<(usize, u32, String)>> = Mutex::new(Vec::new());

/// A consumer's entry in [`CONSUMERS`], removed when it drops.
struct ConsumerClaim(usize, u32, String);

impl Drop for ConsumerClaim {
    fn drop(&mut self) {
        let mut consumers = CONSUMERS.lock();
        if let Some(at) = consumers.iter().position(|(c, r, n)| (*c, *r) == (self.0, self.1) && *n == self.2) {
            consumers.swap_remove(at);
        }
    }
}

/// Joins fan-out channel `name` whose producer is at `ep`'s peer: sends the join and waits
/// (up to the config's rendezvous timeout) for the producer's hello, which it acknowledges; the
/// session of the producer's messages from its next one on.
pub(crate) fn join(name: &str, config: &ChannelConfig, ep: Endpoint) -> Result<MpiSession> {
    let tags = super::tags_for(name, ep.tag_upper_bound)?;
    let key = (Arc::as_ptr(&ep.comm) as usize, ep.peer, name.to_owned());
    let claim = {
        let mut consumers = CONSUMERS.lock();
        if consumers.contains(&key) {
            return Err(Error::InvalidState(format!(
                "one consumer per MPI rank on a fan-out: this process (MPI rank {}) already has a consumer of fan-out \
                 channel {name:?}, whose producer is at MPI rank {}; close that one first",
                ep.rank, ep.peer
            )));
        }
        consumers.push(key.clone());
        ConsumerClaim(key.0, key.1, key.2)
    };
    let nonce = u64::from(std::process::id()) << 32 | u64::from(ep.rank) << 16 ^ u64::from(rand_u16());
    send_now(&ep, tags.joins, &Join { nonce, name: name.to_owned() }.encode())?;
    let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
    let mut spins = 0;
    loop {
        if let Some(len) = ep.comm.iprobe(ep.peer, tags.hellos)? {
            let bytes = receive(&ep, tags.hellos, len, Hello::MAX_LEN, "producer")?;
            let header = Header::decode(&bytes, "producer")?;
            match header.kind {
                Kind::Refuse if header.seq == nonce => {
                    return Err(Error::InvalidState(format!(
                        "the producer of fan-out channel {name:?} (MPI rank {}) refused it: {}",
                        ep.peer,
                        String::from_utf8_lossy(&bytes[Header::LEN..])
                    )));
                }
                Kind::Hello => {
                    let hello = Hello::decode(&bytes, ep.peer)?;
                    // A hello that answers an earlier join of this rank is not ours.
                    if hello.nonce == nonce {
                        if let Some(why) = super::shape_refusal(name, ChannelKind::FanOut, hello.kind) {
                            refuse(&ep, tags, nonce, &why)?;
                            return Err(Error::InvalidState(why));
                        }
                        let start = hello.start.unwrap_or_default();
                        skip_stale(name, &ep, tags, start, deadline)?;
                        let claims = Some(Box::new(claim) as Box<dyn Any + Send + Sync>);
                        let seat = Seat { id: SESSION, slot: 0, claims, stream: Some(start) };
                        return MpiSession::start(name, config, ep, tags, &hello, seat);
                    }
                }
                // An answer to an earlier join: not ours.
                _ => {}
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::Timeout(format!(
                "the producer of fan-out channel {name:?} at MPI rank {} did not answer within the rendezvous timeout; \
                 start it, or raise rendezvous_timeout",
                ep.peer
            )));
        }
        backoff(&mut spins, false);
    }
}

/// Takes off MPI's queues, unread, what the producer at `ep`'s peer sent an earlier consumer
/// of this rank after it closed: what lies before `start`, the producer's new stream, beyond
/// what this process's consumers received.
fn skip_stale(name: &str, ep: &Endpoint, tags: Tags, start: StreamPos, deadline: Option<Instant>) -> Result<()> {
    let mut at = RECEIVED.get(name, ep);
    if at.messages > start.messages || at.chunks > start.chunks {
        return Err(Error::Corrupt(format!(
            "the producer of fan-out channel {name:?} (MPI rank {}) starts its stream at {start:?}, and this process's \
             consumers received {at:?} already",
            ep.peer
        )));
    }
    if at != start {
        log::info!(
            "fan-out channel {name:?} (consumer): taking what an earlier consumer of this rank left unread off MPI's \
             queues (from {at:?} to {start:?})"
        );
    }
    let mut spins = 0;
    while at != start {
        let (tag, count) = if at.messages < start.messages {
            (tags.messages, &mut at.messages)
        } else {
            (tags.chunks, &mut at.chunks)
        };
        match ep.comm.iprobe(ep.peer, tag) {
            Ok(Some(len)) => {
                let mut bytes = vec![0u8; len];
                // SAFETY: `bytes` has the `len` bytes the probe reported.
                let received = unsafe { ep.comm.recv_probed(bytes.as_mut_ptr(), len, ep.peer, tag) };
                if let Err(e) = received {
                    RECEIVED.set(name, ep, at);
                    return Err(e);
                }
                *count += 1;
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                RECEIVED.set(name, ep, at);
                return Err(e);
            }
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            RECEIVED.set(name, ep, at);
            return Err(Error::Timeout(format!(
                "what the producer of fan-out channel {name:?} (MPI rank {}) sent an earlier consumer of this rank \
                 did not arrive within the rendezvous timeout; raise rendezvous_timeout",
                ep.peer
            )));
        }
        backoff(&mut spins, false);
    }
    Ok(())
}

/// A little randomness for nonces, without a dependency.
fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u16
}

#[cfg(test)]
#[path = "joins_tests.rs"]
mod tests;
