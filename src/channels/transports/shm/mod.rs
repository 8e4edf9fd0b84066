//! The same-host shared-memory transport: the carrier of every channel between two processes
//! of one host.
//!
//! Two memfds hold a ring of message slots and a payload pool, the part only the producer
//! writes sealed against the consumer (`ring` has the layout).
//! Sending a message writes its slot (and, for a large one, its pool bytes) and then the
//! slot's `seq` word; that store is the only synchronisation on the fast path. Afterwards the
//! producer reads the consumer's "sleeping" flags, a cache line the consumer writes only when
//! it goes to sleep, and makes a syscall (futex wake, notification send) only if one is set: the
//! channel's wait protocol (`channels::wait`).
//!
//! What a slot carries:
//! - bytes inline (up to 112) or in the pool: copies and loans;
//! - (arena, offset, len) of a lava-flow CPU buffer: buffer sends by reference (`arenas`
//!   has the protocol: each arena's fd goes once per channel over the rendezvous socket);
//! - another route's descriptor, inline and unread (a GPU buffer's, say), with the route's
//!   records passed over the socket before it: so every message of a channel, whatever route
//!   carries its payload, takes one place in one order.
//!
//! The files: `rendezvous` (meeting the peer by name: the runtime dir, the ends' lock files,
//! the socket, the hello and its answer, the peer watch), `handshake` (the rendezvous section
//! this transport offers and the consumer's checks), `producer`, `session` (what the views of
//! one producer's messages share, and how releases become the tail the producer reads),
//! `consumer` (the socket producers attach to, and the notification set), `consumer_session`
//! (one producer's session at the consumer: the reading of its ring), `arenas`, `fan_out` (a
//! fan-out producer's socket, which consumers connect to, and the thread that meets each one
//! and hands its ring to the fan-out in the channel core).
//!
//! Peer death: each side keeps the rendezvous socket and a pidfd of the peer, and has the
//! process's watcher (`os::watcher`) watch them: when the peer's process exits or its socket
//! hangs up, the watcher's thread marks the side's `PeerWatch` and wakes the futex that side
//! sleeps on, through a mapping of the control part of its own (`ring::WaitWords`), so a
//! blocked wait sleeps until a message, its deadline or the peer's end, and never wakes
//! periodically. Where the peer's end cannot be reported so (no pidfd of the peer: another
//! PID namespace, a kernel before 5.3), waits poll the socket and process every
//! `LIVENESS_PERIOD` and blocked waits sleep at most `SLEEP_SLICE` at a time; the channel's
//! transport report says so. A closing peer also sets its `closed` word and wakes the other
//! side, which is seen at once. A consumer that ends without its `closed` word died: the
//! producer lets go of what the other routes hold for it (`PeerHolds`: the GPU arenas of its
//! unreleased messages) as the watcher reports it, or else at the producer's next look. The
//! consumer's notification fd (an epoll set over the producer's end of the notification pair,
//! its socket and its pidfd) polls readable the moment the kernel knows of the producer's
//! death, possibly before the watcher has reported it: there `try_recv` looks for itself (the
//! pair's hang-up, a poll of the pidfd and socket), so that a readable fd never gets
//! `WouldBlock` for an answer.

mod acceptor;
mod arenas;
mod consumer;
mod consumer_session;
mod fan_out;
mod handshake;
mod producer;
pub(crate) mod rendezvous;
pub(crate) mod ring;
mod session;

use crate::channels::transport::{Route, TransportId, TransportInfo};
use crate::channels::wait::{PeerEnd, SLEEP_SLICE};
use rendezvous::PeerWatch;

pub(crate) use consumer::ShmConsumer;
pub(crate) use consumer_session::ShmSession;
pub(crate) use fan_out::{FanOutAcceptor, Meeting};
pub(crate) use producer::ShmProducer;

pub(crate) const ID: TransportId = TransportId::new("shm");

/// What to tell a user whose rendezvous timed out waiting for the `peer` end.
pub(crate) fn rendezvous_hint(peer: &str) -> String {
    let dir = rendezvous::runtime_dir().map_or_else(|e| format!("unusable: {e}"), |d| d.display().to_string());
    format!(
        ". Start the {peer} with the same channel name, as the same user and with the same runtime dir ({dir}; {} \
         sets it), or raise rendezvous_timeout",
        rendezvous::RUNTIME_DIR_ENV
    )
}
pub(crate) use session::{release_message, Session};

/// The largest payload carried inside its ring slot; longer ones go through the pool.
pub(crate) use ring::INLINE_MAX as SHM_INLINE_MAX;
/// The id of this transport's section in the rendezvous.
pub(crate) const ROUTE_ID: u32 = 1;

/// How a side's blocked waits learn of the end of the peer that `watch` watches.
fn peer_end(watch: &PeerWatch) -> PeerEnd {
    if watch.prompt() {
        PeerEnd::Reported
    } else {
        PeerEnd::Polled
    }
}

/// Sets the carrier's reason in `info` to `base` with, where the peer's end is polled, a note
/// that says so and why.
fn note_peer_watch(info: &mut TransportInfo, base: &str, watch: &PeerWatch) {
    let Some(carrier) = info.routes.first().cloned() else { return };
    let reason = match watch.polled_because() {
        None => base.to_owned(),
        Some(why) => format!(
            "{base}; blocked waits wake every {} ms to check that the peer lives, since {why}",
            SLEEP_SLICE.as_millis()
        ),
    };
    info.set_route(Route { reason, ..carrier });
}

// Unix sockets and descriptors throughout.
#[cfg(all(unix, test))]
mod tests {
    use super::*;
    use crate::channels::transport::PayloadClass;
    use std::os::unix::net::UnixStream;

    /// The carrier's reason says when the peer's end is polled, and why; the note goes again
    /// with a producer whose end is reported. The other routes keep their place.
    #[test]
    fn the_report_notes_a_polled_peer() {
        let route = |class, reason: &str| Route { class, kind: ID, reason: reason.to_owned() };
        let mut info =
            TransportInfo::new(vec![route(PayloadClass::Host, "same host"), route(PayloadClass::Gpu, "staged")]);
        let (_a, b) = UnixStream::pair().unwrap();
        let mut blind = PeerWatch::new(b, 0);
        blind.arm(|| {});
        note_peer_watch(&mut info, "same host", &blind);
        assert!(info.routes[0].reason.starts_with("same host; blocked waits wake every 15 ms"), "{}", info.reason);
        assert!(info.reason.contains("PID namespace") && info.routes[1].class == PayloadClass::Gpu);
        let (_c, d) = UnixStream::pair().unwrap();
        let mut seen = PeerWatch::new(d, std::process::id() as i32);
        seen.arm(|| {});
        note_peer_watch(&mut info, "same host", &seen);
        assert_eq!(info.routes[0].reason, "same host");
        assert_eq!(info.kind, ID);
    }
}
