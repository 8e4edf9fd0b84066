//! The in-process carrier: both ends of a channel in one process, messages moved between
//! threads through the heap. It keeps every promise of a carrier (order, exactly once,
//! bounded capacity, completion, loans, buffer sends by reference, routed messages with their
//! attachments, a producer's end, a new producer after it, a pollable fd), with nothing of
//! another process in it, so that the channel core and its routes are tested without
//! processes, and so that threads of one application can use a channel too
//! (`LF_TRANSPORTS=loopback`).
//!
//! The ends meet by name in a table of this process (`MEETINGS`): the consumer registers the
//! name, its kind and how many producers it takes, and waits; a producer finds it (or waits
//! for it), refuses itself if another producer of a pair is live, if the consumer is of
//! another kind, or if a fan-in has no free slot, and hands the consumer a new
//! [`session::Session`], the state both ends share. A fan-out's producer registers a door
//! instead (`fan_out`), which each of its consumers goes through on its own thread: it claims a
//! slot, makes the session and the producer's end for it, and hands that end to the fan-out.
//! Each message is a heap allocation of its own (a copy, a loan's room), a pointer into
//! the sender's region (a buffer send), or a route's descriptor; it stays where it is until
//! the consumer releases it.

mod consumer;
mod fan_out;
mod producer;
mod session;

use crate::os::OwnedHandle;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

pub(crate) use consumer::{LoopbackConsumer, LoopbackSession};
pub(crate) use fan_out::{Joining, LoopbackFanOutAcceptor};
pub(crate) use producer::LoopbackProducer;
use session::Session;

use crate::channels::transport::{Attachment, TransportId};
use crate::channels::ChannelKind;
use crate::error::Error;
use crate::os::event;

pub(crate) const ID: TransportId = TransportId::new("loopback");

/// A consumer's side of the meeting table: sessions of producers that attached and that the
/// consumer has not taken up yet, and whether a producer is live.
#[derive(Default)]
struct Meeting {
    /// Sessions made by producers, in the order they attached, for the consumer to take.
    arrived: Vec<Arc<Session>>,
    /// A producer of the name is live (one at a time).
    producer_live: bool,
    /// The consumer is there (a producer waits for it otherwise), with its kind and, for a
    /// fan-in, how many producers it takes.
    consumer_live: bool,
    consumer_kind: ChannelKind,
    max_peers: u32,
    /// A fan-in's slots that live producers hold, a bit each.
    slots: u64,
    /// The consumer's notification fd once it asked for one: readable when a producer arrives.
    notify: Option<Arc<OwnedHandle>>,
    /// A fan-in consumer's answers for the routes, which each producer gets as it arrives.
    answers: Option<Vec<Attachment>>,
    /// A fan-out's producer, registered: the door its consumers join through.
    fan_out: Option<Arc<fan_out::Door>>,
}

impl Meeting {
    /// A producer's session arrived: the consumer takes it up (and its fd says so).
    fn arrive(&mut self, session: Arc<Session>) -> crate::error::Result<()> {
        if let Some(answers) = &self.answers {
            *session.answers.lock() = Some(duplicate(answers)?);
        }
        self.arrived.push(session);
        if let Some(fd) = &self.notify {
            event::signal(crate::os::borrow(&fd));
        }
        Ok(())
    }
}

/// A copy of `attachments` (their descriptors duplicated), for another producer.
fn duplicate(attachments: &[Attachment]) -> crate::error::Result<Vec<Attachment>> {
    attachments
        .iter()
        .map(|a| {
            let handles = a
                .handles
                .iter()
                .map(|fd| fd.try_clone().map_err(|e| Error::os("duplicating a route's answer descriptor", e)))
                .collect::<crate::error::Result<Vec<_>>>()?;
            Ok(Attachment { route: a.route, bytes: a.bytes.clone(), handles })
        })
        .collect()
}

/// The channels of this process, by name.
static MEETINGS: Mutex<Option<HashMap<String, Meeting>>> = Mutex::new(None);
/// Woken when a meeting changes.
static MET: Condvar = Condvar::new();

/// Runs `f` on the meeting of `name`, made if there is none, and wakes the ends that wait on
/// one; removes the meeting once nobody is in it.
fn with_meeting<T>(name: &str, f: impl FnOnce(&mut Meeting) -> T) -> T {
    let mut meetings = MEETINGS.lock();
    let table = meetings.get_or_insert_with(HashMap::new);
    let meeting = table.entry(name.to_owned()).or_default();
    let out = f(meeting);
    if !meeting.consumer_live
        && !meeting.producer_live
        && meeting.slots == 0
        && meeting.arrived.is_empty()
        && meeting.fan_out.is_none()
    {
        table.remove(name);
    }
    MET.notify_all();
    out
}

/// Waits until `ready` holds on the meeting of `name` (returning what it found), or the
/// deadline passes (`None`).
fn wait_for_meeting<T>(
    name: &str,
    deadline: Option<Instant>,
    mut ready: impl FnMut(&mut Meeting) -> Option<T>,
) -> Option<T> {
    let mut meetings = MEETINGS.lock();
    loop {
        let table = meetings.get_or_insert_with(HashMap::new);
        let meeting = table.entry(name.to_owned()).or_default();
        if let Some(found) = ready(meeting) {
            MET.notify_all();
            return Some(found);
        }
        match deadline {
            None => MET.wait(&mut meetings),
            Some(deadline) => {
                if Instant::now() >= deadline || MET.wait_until(&mut meetings, deadline).timed_out() {
                    let table = meetings.get_or_insert_with(HashMap::new);
                    let meeting = table.entry(name.to_owned()).or_default();
                    return ready(meeting);
                }
            }
        }
    }
}

/// What to tell a user whose loopback rendezvous timed out.
pub(crate) fn rendezvous_hint(peer: &str) -> String {
    format!(". The loopback transport meets ends of one process only: create the {peer} in this process, or allow another transport")
}

/// The error of an end that another live end of the same kind already holds.
fn taken(name: &str, what: &str) -> Error {
    Error::InvalidState(format!(
        "channel {name:?} already has a live {what} in this process (loopback transport); close it first, or use another name"
    ))
}
