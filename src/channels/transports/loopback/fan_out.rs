//! A fan-out over loopback: the producer registers a door in the meeting of its name, and each
//! consumer, on its own thread, goes through it: it claims a slot of the fan-out's slot table,
//! makes the session both ends share, and the producer's end for it ([`LoopbackProducer`]) goes
//! to the fan-out in the channel core, which takes it up at its next send. The consumer holds
//! a session as a pair's does; when it closes, the fan-out drops its end at its next send and
//! frees the slot.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::producer::{checked_capacity, session_id, LoopbackProducer};
use super::session::Session;
use super::{wait_for_meeting, with_meeting};
use crate::channels::peers::{kind_mismatch, Arrivals};
use crate::channels::transport::{Attachment, TransportInfo};
use crate::channels::{ChannelConfig, ChannelKind};
use crate::error::{Error, Result};

/// What a consumer that joins runs, with its answers for the routes: its session, met.
pub(super) type Door = Mutex<Box<dyn FnMut(Vec<Attachment>) -> Result<Arc<Session>> + Send>>;

/// One consumer that joined, in the slot it was given: the producer's end still to make.
pub(crate) struct Joining {
    info: TransportInfo,
    session: Arc<Session>,
}

impl Joining {
    /// The producer's end for this consumer, with the other routes' sections that `offers`
    /// makes (the consumer's own sections for those routes stay with the end:
    /// `peer_sections`).
    pub(crate) fn handshake(self, offers: &mut dyn FnMut() -> Result<Vec<Attachment>>) -> Result<LoopbackProducer> {
        LoopbackProducer::fan_out_end(self.info, self.session, offers)
    }
}

/// A fan-out producer's registration; dropping it closes the door (consumers that joined keep
/// their sessions until the fan-out drops their ends).
pub(crate) struct LoopbackFanOutAcceptor {
    name: String,
}

impl LoopbackFanOutAcceptor {
    /// Registers as the fan-out producer of `name` in this process: each consumer that joins
    /// takes the lowest free slot of `arrivals` (one past `max_peers` is refused, saying so),
    /// is met by `meet`, and is handed over in its slot.
    pub(crate) fn start<T: Send + 'static>(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        arrivals: Arc<Arrivals<T>>,
        mut meet: impl FnMut(Joining) -> Result<T> + Send + 'static,
    ) -> Result<LoopbackFanOutAcceptor> {
        let capacity = checked_capacity(config)?;
        let (channel, max_len) = (name.to_owned(), config.pool_size);
        let door = move |answers: Vec<Attachment>| -> Result<Arc<Session>> {
            let Some(slot) = arrivals.claim(|_| true) else {
                return Err(Error::InvalidState(format!(
                    "fan-out channel {channel:?} is full: it takes max_peers = {} consumers and all of them are \
                     attached; wait for one to close, or create the producer with a larger max_peers",
                    arrivals.max_peers()
                )));
            };
            let session = Arc::new(Session::new(session_id(), &channel, slot as u32, capacity, max_len, Vec::new()));
            *session.answers.lock() = Some(answers);
            match meet(Joining { info: info.clone(), session: Arc::clone(&session) }) {
                Ok(end) => {
                    arrivals.arrive(slot, end);
                    Ok(session)
                }
                Err(e) => {
                    arrivals.free(slot);
                    Err(e)
                }
            }
        };
        let door: Arc<Door> = Arc::new(Mutex::new(Box::new(door)));
        with_meeting(name, |m| {
            if m.fan_out.is_some() || m.producer_live || m.slots != 0 {
                return Err(Error::InvalidState(format!(
                    "channel {name:?} already has a live producer in this process (loopback transport); a fan-out \
                     has one producer: close that one first, or use another channel name"
                )));
            }
            if m.consumer_live {
                return Err(Error::InvalidState(kind_mismatch(name, m.consumer_kind, ChannelKind::FanOut)));
            }
            m.fan_out = Some(door);
            Ok(())
        })?;
        Ok(LoopbackFanOutAcceptor { name: name.to_owned() })
    }
}

impl Drop for LoopbackFanOutAcceptor {
    fn drop(&mut self) {
        // Dropped out of the table's lock: the door holds the routes' offers.
        let door = with_meeting(&self.name, |m| m.fan_out.take());
        drop(door);
    }
}

/// Joins the fan-out producer of `name` in this process (waiting for it up to the config's
/// rendezvous timeout) with `answers` for its routes: the session it made for this consumer.
pub(super) fn join(name: &str, config: &ChannelConfig, answers: Vec<Attachment>) -> Result<Arc<Session>> {
    let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
    let found = wait_for_meeting(name, deadline, |m| {
        if let Some(door) = &m.fan_out {
            return Some(Ok(Arc::clone(door)));
        }
        // A pair's or fan-in's producer waits for a consumer of its own kind.
        let theirs = match (m.producer_live, m.slots != 0) {
            (true, _) => ChannelKind::Pair,
            (_, true) => ChannelKind::FanIn,
            _ => return None,
        };
        Some(Err(Error::InvalidState(kind_mismatch(name, ChannelKind::FanOut, theirs))))
    });
    let door = match found {
        Some(found) => found?,
        None => {
            // (The wait made an empty meeting: gone again.)
            with_meeting(name, |_| ());
            return Err(Error::Timeout(format!(
                "no producer of fan-out channel {name:?} appeared in this process in time"
            )));
        }
    };
    // Consumers join one at a time, each on its own thread; the producer is not waited for.
    let mut door = door.lock();
    (door)(answers)
}
