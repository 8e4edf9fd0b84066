//! The shared-memory transport's part of the rendezvous: the producer offers a fresh region
//! (two sealed memfds: the control part and the data part) and its end of a notification
//! socket pair in this transport's [`Attachment`] of the hello, next to the other routes' sections; the
//! consumer checks and maps them and answers with its own routes' sections, or refuses. A
//! producer first claims its end of the channel (a pair's one lock, or a fan-in's slot), and
//! its section names the channel's kind and that slot.

use crate::os::OwnedHandle;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::arenas::ReceivedArenas;
use super::rendezvous::{self, End, EndLock, PeerWatch, MAX_HELLO_LEN};
use super::ring::{Geometry, Region, RegionFds, WaitWords, VERSION, WAKE_REGISTERED, WAKE_SLEEPER_BARRIER};
use super::session::{OwnedSession, Session};
use super::ROUTE_ID;
use crate::channels::peers::check_producer_place;
use crate::channels::transport::{Attachment, PeerHolds};
use crate::channels::wait::{sleeps_rarely, wake_all};
use crate::channels::{ChannelConfig, ChannelKind, WaitStrategy, MAX_PEERS};
use crate::error::{Error, Result};
use crate::os::membarrier;
use crate::os::notify::{check_end, notify_pair};
use crate::os::stream::{recv_with_handles, PeerIdentity, Stream};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The consumer's connection to its current producer.
pub(super) struct Link {
    pub(super) session: OwnedSession,
    pub(super) watch: PeerWatch,
    /// The consumer's end of the producer's notification pair: readable once the producer
    /// signalled a message (or its close) that the consumer asked for (`fd_waiting`).
    pub(super) signals: OwnedHandle,
    pub(super) next: u64,
    pub(super) gone: Option<String>,
    /// The producer's slot in a fan-in, 0 otherwise.
    pub(super) slot: u32,
    /// The producer's end as its lock file names it.
    pub(super) producer_end: rendezvous::End,
    /// A fan-out's producer also holds the socket consumers connect to, and that end's lock
    /// file, when it connected.
    pub(super) producer_socket_lock: Option<rendezvous::FileId>,
    /// The producer's lock file when it connected (see `rendezvous::clean_after_peer`).
    pub(super) producer_lock: Option<rendezvous::FileId>,
    /// A fan-out consumer's claim on its slot, `<name>.consumer.<slot>.lock`, while the
    /// session lives (what `lf-info --channels` lists a fan-out's consumers by).
    pub(super) _slot_lock: Option<EndLock>,
    /// The producer's arenas mapped here (boxed: cold).
    pub(super) arenas: Box<ReceivedArenas>,
    /// The producer's rendezvous sections for the other routes, until taken.
    pub(super) peer_sections: Option<Vec<Attachment>>,
    /// The other routes' attachments read from the socket, until taken.
    pub(super) attachments: Vec<Attachment>,
}

/// This transport's section: the region's geometry (its two memfds and the consumer's end of
/// the producer's notification pair go as the section's descriptors).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SectionWire {
    version: U32,
    slot_count: U32,
    pool_size: U64,
    total_len: U64,
    /// The channel's kind as the producer created it (`ChannelKind::code`).
    kind: U32,
    /// The producer's slot in a fan-in (the lock it holds), 0 otherwise.
    slot: U32,
}
const SECTION_LEN: usize = std::mem::size_of::<SectionWire>();

fn encode_section(geometry: &Geometry, place: Place, fds: RegionFds, signals: OwnedHandle) -> Attachment {
    let wire = SectionWire {
        version: VERSION.into(),
        slot_count: geometry.slot_count.into(),
        pool_size: geometry.pool_size.into(),
        total_len: (geometry.total_len as u64).into(),
        kind: place.kind.code().into(),
        slot: place.slot.into(),
    };
    Attachment { route: ROUTE_ID, bytes: wire.as_bytes().to_vec(), handles: vec![fds.control, fds.data, signals] }
}

/// This side's fast-wake flags: [`WAKE_REGISTERED`] where it could register for global
/// membarriers, and [`WAKE_SLEEPER_BARRIER`] too where it also spins before it sleeps.
fn wake_flags(registered: bool, wait: WaitStrategy) -> u32 {
    match (registered, sleeps_rarely(wait)) {
        (false, _) => 0,
        (true, false) => WAKE_REGISTERED,
        (true, true) => WAKE_REGISTERED | WAKE_SLEEPER_BARRIER,
    }
}

/// Which of a side's two directions skip the publisher's fence, from its own flags and its
/// peer's (see the wait protocol): (what it publishes, what it sleeps for). Both sides
/// compute the same answer for each direction. A peer that lies about its flags only loses
/// wake-ups of waits that it could as well leave unanswered (its own sleeps, or its
/// publishes to us), which the waiting side's deadline still bounds.
fn fast_wake(own: u32, peer: u32) -> (bool, bool) {
    let publish = own & WAKE_REGISTERED != 0 && peer & WAKE_SLEEPER_BARRIER != 0;
    let sleep = own & WAKE_SLEEPER_BARRIER != 0 && peer & WAKE_REGISTERED != 0;
    (publish, sleep)
}

/// Where a producer stands in its channel: the kind it created, and its slot in a fan-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Place {
    pub(super) kind: ChannelKind,
    pub(super) slot: u32,
}

/// What the producer has once the consumer accepted it.
pub(super) struct Connected {
    /// The consumer's process and socket, armed to wake the producer's sleeps on its end.
    pub(super) watch: PeerWatch,
    pub(super) region: Region,
    /// The producer's end of the notification pair, never shared: a consumer cannot make its
    /// notifications block.
    pub(super) signal: OwnedHandle,
    /// Messages are published without a fence (the consumer's sleeps pay a membarrier).
    pub(super) fast_wake: bool,
    /// Releases are published without a fence (the producer's sleeps pay a membarrier).
    pub(super) room_fast_wake: bool,
    /// The consumer's sections for the other routes.
    pub(super) answers: Vec<Attachment>,
    /// What the routes hold for the consumer, let go of by the watcher if it dies.
    pub(super) holds: Arc<PeerHolds>,
}

/// The producer's side: connects to the consumer of `name` (retrying until it listens or
/// `deadline`), offers a fresh region of `geometry` with `offers()` (the other routes'
/// sections, made anew for each attempt), and reads the answer. The producer's wait strategy
/// and prefault choice come from `config`.
pub(super) fn offer(
    name: &str,
    geometry: Geometry,
    place: Place,
    config: &ChannelConfig,
    deadline: Option<Instant>,
    offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
) -> Result<Connected> {
    // A consumer that is closing may still accept our connection and then drop it; such a
    // refusal by disappearance is retried until the deadline.
    loop {
        let (sock, peer) = rendezvous::connect(name, deadline)?;
        match offer_on(sock, peer, name, geometry, place, config, deadline, offers) {
            Err(Error::PeerGone(_)) | Err(Error::Io { .. }) if deadline.map_or(true, |d| Instant::now() < d) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

/// The producer's side of one meeting over `sock`, connected either way (a fan-out's producer
/// accepts its consumers): offers a fresh region and reads the answer.
#[allow(clippy::too_many_arguments)]
pub(super) fn offer_on(
    sock: Stream,
    peer: PeerIdentity,
    name: &str,
    geometry: Geometry,
    place: Place,
    config: &ChannelConfig,
    deadline: Option<Instant>,
    offers: &mut dyn FnMut() -> Result<Vec<Attachment>>,
) -> Result<Connected> {
    let flags = wake_flags(membarrier::register(), config.wait);
    let (region, fds) = Region::create(name, geometry, config.prefault)?;
    let words = WaitWords::map(&fds.control, &geometry)?;
    // Before the hello: the consumer reads it during the handshake.
    region.producer_fast_wake().store(flags, Ordering::Release);
    let (signals, signal) = notify_pair()?;
    let mut sections = vec![encode_section(&geometry, place, fds, signals)];
    sections.extend(offers()?);
    rendezvous::send_hello(&sock, name, &sections)?;
    drop(sections);
    sock.set_read_timeout(rendezvous::remaining(deadline))
        .map_err(|e| Error::os("setting the rendezvous timeout", e))?;
    let answers = rendezvous::recv_ack(&sock, name)?;
    sock.set_read_timeout(None).map_err(|e| Error::os("clearing the rendezvous timeout", e))?;
    // The consumer wrote its flags before its answer.
    let (fast_wake, room_fast_wake) = fast_wake(flags, region.consumer_fast_wake().load(Ordering::Acquire));
    let mut watch = PeerWatch::new(sock, peer.pid);
    let holds = Arc::new(PeerHolds::default());
    let held = Arc::clone(&holds);
    // The consumer's end wakes the producer's sleeps for room and completions. One that did
    // not close its end died (or dropped its connection): what the routes hold for it goes
    // back now, not with the channel.
    watch.arm(move || {
        wake_all(words.room_futex());
        if words.consumer_closed().load(Ordering::SeqCst) == 0 {
            held.consumer_died();
        }
    });
    Ok(Connected { watch, region, signal, fast_wake, room_fast_wake, answers, holds })
}

/// What the consumer's end is: its kind, and how many producers a fan-in takes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) kind: ChannelKind,
    pub(super) max_peers: u32,
}

impl Shape {
    /// Refuses a producer whose place does not fit this end, saying why.
    fn check(&self, name: &str, place: Place) -> Result<()> {
        check_producer_place(name, self.kind, self.max_peers, place.kind, place.slot)
    }
}

/// The consumer's side: receive the hello and its descriptors, check everything, map the
/// region, answer with `answers` (the other routes' sections). Session `id` starts. `wait`:
/// the consumer's wait strategy; `shape`: what producers it takes.
#[allow(clippy::too_many_arguments)]
pub(super) fn accept(
    sock: Stream,
    peer: PeerIdentity,
    name: &str,
    wait: WaitStrategy,
    shape: Shape,
    deadline: Option<Instant>,
    id: u64,
    answers: &[Attachment],
) -> Result<Link> {
    sock.set_read_timeout(rendezvous::remaining(deadline))
        .map_err(|e| Error::os("setting the rendezvous timeout", e))?;
    let mut buf = vec![0u8; MAX_HELLO_LEN];
    let (n, fds) = recv_with_handles(&sock, &mut buf).map_err(|e| match e {
        Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::WouldBlock => {
            Error::Timeout(format!("producer pid {} sent no hello in time", peer.pid))
        }
        other => other,
    })?;
    if n == 0 {
        return Err(Error::PeerGone(format!("process {} connected and closed without a hello", peer.pid)));
    }
    if let Some(refusal) = rendezvous::refusal_in(&buf[..n], name) {
        // A fan-out's producer that takes no more consumers.
        return Err(refusal);
    }
    let checked = (|| {
        let (hello_name, sections) = rendezvous::decode_hello(&buf[..n], fds)?;
        if hello_name != name {
            return Err(Error::Corrupt(format!("producer asked for channel {hello_name:?}, this is {name:?}")));
        }
        let (mine, others): (Vec<Attachment>, Vec<Attachment>) =
            sections.into_iter().partition(|s| s.route == ROUTE_ID);
        let Some(section) = mine.into_iter().next() else {
            return Err(Error::Unsupported("the producer offers no shared-memory region".into()));
        };
        let (geometry, place) = decode_section(&section.bytes)?;
        shape.check(name, place)?;
        let mut fds = section.handles.into_iter();
        let (Some(control), Some(data), Some(signals), None) = (fds.next(), fds.next(), fds.next(), fds.next()) else {
            return Err(Error::Corrupt(
                "the producer's shared-memory section must carry exactly three fds (control memfd, data memfd, the \
                 consumer's end of a notification socket pair)"
                    .into(),
            ));
        };
        let region = Region::attach(&control, &data, geometry)?;
        let words = WaitWords::map(&control, &geometry)?;
        check_end(&signals, "the producer's third fd")?;
        // A fan-out's consumer claims its slot before it answers, so that the producer finds
        // the claim's lock file when the answer comes.
        let slot_lock = match place.kind {
            ChannelKind::FanOut => Some(claim_consumer_slot(name, place.slot)?),
            _ => None,
        };
        Ok((region, words, signals, others, place, slot_lock))
    })();
    match checked {
        Ok((region, words, signals, peer_sections, place, slot_lock)) => {
            // Before the answer: the producer reads it once the answer arrives.
            let flags = wake_flags(membarrier::register(), wait);
            region.consumer_fast_wake().store(flags, Ordering::Release);
            let (room_fast_wake, data_fast_wake) =
                fast_wake(flags, region.producer_fast_wake().load(Ordering::Acquire));
            rendezvous::send_ack(&sock, rendezvous::ACK_OK, "", answers)?;
            sock.set_read_timeout(None).map_err(|e| Error::os("clearing the rendezvous timeout", e))?;
            let mut watch = PeerWatch::new(sock, peer.pid);
            // The producer's end wakes the consumer's sleep for messages.
            watch.arm(move || wake_all(words.data_futex()));
            Ok(Link {
                session: OwnedSession(Some(Arc::new(Session::new(id, region, data_fast_wake, room_fast_wake)))),
                watch,
                signals,
                next: 0,
                gone: None,
                producer_lock: rendezvous::lock_file_id(name, producer_end(place)),
                slot: place.slot,
                producer_end: producer_end(place),
                producer_socket_lock: (place.kind == ChannelKind::FanOut)
                    .then(|| rendezvous::lock_file_id(name, rendezvous::End::Consumer))
                    .flatten(),
                _slot_lock: slot_lock,
                arenas: Box::default(),
                peer_sections: Some(peer_sections),
                attachments: Vec::new(),
            })
        }
        Err(e) => {
            let _ = rendezvous::send_ack(&sock, rendezvous::ACK_REFUSED, &e.to_string(), &[]);
            Err(e)
        }
    }
}

/// This producer's claim on its end of channel `name`: the pair's one producer lock (a second
/// producer is refused here, not left waiting for a consumer that will never answer it while
/// the first lives), or a fan-in's lowest free slot.
pub(super) fn claim_producer_end(name: &str, kind: ChannelKind) -> Result<(EndLock, Place)> {
    if kind != ChannelKind::FanIn {
        return match EndLock::take(name, End::Producer)? {
            Ok(lock) => Ok((lock, Place { kind, slot: 0 })),
            Err(pid) => Err(Error::InvalidState(format!(
                "channel {name:?} already has a live producer{}; a pair channel has one producer at a time: close \
                 that one first, use another channel name, or make the channel a fan-in",
                rendezvous::holder(pid)
            ))),
        };
    }
    for slot in 0..MAX_PEERS {
        if let Ok(lock) = EndLock::try_take(name, End::FanInProducer(slot))? {
            return Ok((lock, Place { kind, slot }));
        }
    }
    Err(Error::InvalidState(format!(
        "fan-in channel {name:?} is full: {MAX_PEERS} producers, the most any fan-in takes, are attached"
    )))
}

/// A fan-out consumer's claim on `slot`, which its producer gave it as free: refused (saying
/// whose it is) only if a consumer it detached still lives and holds it.
fn claim_consumer_slot(name: &str, slot: u32) -> Result<EndLock> {
    EndLock::try_take(name, End::FanOutConsumer(slot))?.map_err(|pid| {
        Error::InvalidState(format!(
            "slot {slot} of fan-out channel {name:?} is still held by a consumer{}; try again",
            rendezvous::holder(pid)
        ))
    })
}

/// The lock a producer in `place` holds.
pub(super) fn producer_end(place: Place) -> rendezvous::End {
    match place.kind {
        ChannelKind::FanIn => rendezvous::End::FanInProducer(place.slot),
        _ => rendezvous::End::Producer,
    }
}

/// Parses and checks the producer's section: this layout's version, a geometry that
/// `Geometry::new` accepts and that agrees with the sizes the producer states, and a kind
/// this build knows with a slot below [`MAX_PEERS`]. Pure, so that it can be fuzzed.
pub(super) fn decode_section(b: &[u8]) -> Result<(Geometry, Place)> {
    let Ok(wire) = SectionWire::read_from_bytes(b) else {
        return Err(Error::Corrupt(format!(
            "the producer's shared-memory section has {} bytes, not {SECTION_LEN}",
            b.len()
        )));
    };
    if wire.version.get() != VERSION {
        return Err(Error::Unsupported(format!(
            "the producer's shared-memory layout is version {}, this consumer's {VERSION}; use the same lava-flow on both sides",
            wire.version.get()
        )));
    }
    let (slot_count, pool_size, total_len) = (wire.slot_count.get(), wire.pool_size.get(), wire.total_len.get());
    let geometry = Geometry::new(slot_count, pool_size)
        .map_err(|e| Error::Corrupt(format!("the producer's shared-memory section describes no valid ring: {e}")))?;
    if geometry.pool_size != pool_size || geometry.total_len as u64 != total_len {
        return Err(Error::Corrupt("producer's geometry is inconsistent".into()));
    }
    let Some(kind) = ChannelKind::from_code(wire.kind.get()) else {
        return Err(Error::Unsupported(format!(
            "the producer created a channel of kind {}, which this consumer does not know; use the same lava-flow on \
             both sides",
            wire.kind.get()
        )));
    };
    let slot = wire.slot.get();
    if slot >= MAX_PEERS || (kind == ChannelKind::Pair && slot != 0) {
        return Err(Error::Corrupt(format!("the producer claims slot {slot} of a {kind} channel")));
    }
    Ok((geometry, Place { kind, slot }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn valid_section() -> Vec<u8> {
        let g = Geometry::new(256, 1 << 20).unwrap();
        let mut b = VERSION.to_le_bytes().to_vec();
        b.extend_from_slice(&g.slot_count.to_le_bytes());
        b.extend_from_slice(&g.pool_size.to_le_bytes());
        b.extend_from_slice(&(g.total_len as u64).to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        b
    }

    #[test]
    fn the_section_of_a_valid_ring_is_accepted() {
        let place = Place { kind: ChannelKind::FanIn, slot: 3 };
        assert_eq!(decode_section(&valid_section()).unwrap(), (Geometry::new(256, 1 << 20).unwrap(), place));
    }

    proptest! {
        #![proptest_config(crate::fuzz::config(3000))]

        /// The producer's shared-memory section: accepted only for a geometry the consumer
        /// would compute itself from the same capacity and pool size.
        #[test]
        fn fuzz_section(bytes in crate::fuzz::bytes_near(valid_section(), 40)) {
            if let Ok((g, place)) = decode_section(&bytes) {
                prop_assert!(place.slot < MAX_PEERS);
                prop_assert_eq!(Geometry::new(g.slot_count, g.pool_size).unwrap(), g);
                prop_assert!(g.slots_offset < g.pool_offset && g.pool_offset < g.total_len);
            }
        }
    }
}
