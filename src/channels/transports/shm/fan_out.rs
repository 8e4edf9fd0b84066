//! A fan-out's producer over shared memory keeps only its meeting of consumers here: the socket
//! consumers connect to (the producer listens in a fan-out), and a thread that meets each one
//! as a pair's producer meets its consumer, over that connection, in a slot of the fan-out's
//! slot table, so that consumers attach while the producer is busy elsewhere. Each consumer's
//! ring (a [`ShmProducer`]) goes to the fan-out in the channel core, which takes it up at its
//! next send and publishes to it as to any consumer's end.

use crate::os::OwnedHandle;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::handshake::Place;
use super::producer::ShmProducer;
use super::rendezvous::{self, End, EndLock, Listener};
use super::ring::Geometry;
use crate::channels::peers::{Arrivals, ChannelKind};
use crate::channels::transport::{Attachment, TransportInfo};
use crate::channels::ChannelConfig;
use crate::error::{Error, Result};
use crate::os::event;
use crate::os::stream::{PeerIdentity, Stream};

/// One consumer that connected, in the slot it was given: the handshake still to run.
pub(crate) struct Meeting<'a> {
    sock: Stream,
    peer: PeerIdentity,
    name: &'a str,
    info: &'a TransportInfo,
    config: &'a ChannelConfig,
    slot: usize,
}

impl Meeting<'_> {
    /// Offers the consumer its ring, with the other routes' sections that `offers` makes,
    /// and reads its answer (its own sections for those routes stay with the ring:
    /// `peer_sections`).
    pub(crate) fn handshake(self, offers: &mut dyn FnMut() -> Result<Vec<Attachment>>) -> Result<ShmProducer> {
        let place = Place { kind: ChannelKind::FanOut, slot: self.slot as u32 };
        ShmProducer::accepted(self.name, self.sock, self.peer, self.info.clone(), self.config, place, offers)
    }
}

/// A fan-out producer's acceptor; dropping it stops the thread, which closes the socket, and
/// gives up the channel's producer end.
pub(crate) struct FanOutAcceptor {
    stop: OwnedHandle,
    thread: Option<JoinHandle<()>>,
    max_len: usize,
    _lock: EndLock,
}

impl FanOutAcceptor {
    /// Claims the producer's end of `name` and listens there: each consumer that connects
    /// takes the lowest free slot of `arrivals` (one past `max_peers` is refused, saying so),
    /// is met by `meet`, and is handed over in its slot.
    pub(crate) fn start<T: Send + 'static>(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        arrivals: Arc<Arrivals<T>>,
        meet: impl FnMut(Meeting<'_>) -> Result<T> + Send + 'static,
    ) -> Result<FanOutAcceptor> {
        // Every ring's shape, checked before anyone is met.
        let geometry = Geometry::new(config.capacity, config.pool_size as u64)?;
        let lock = match EndLock::take(name, End::Producer)? {
            Ok(lock) => lock,
            Err(pid) => {
                return Err(Error::InvalidState(format!(
                    "channel {name:?} already has a live producer{}; a fan-out has one producer: close that one \
                     first, or use another channel name",
                    rendezvous::holder(pid)
                )))
            }
        };
        let listener = Listener::bind(name)?;
        let stop = event::new()?;
        let thread = {
            let (name, config) = (name.to_owned(), config.clone());
            let stop = stop.try_clone().map_err(|e| Error::os("duplicating the acceptor's stop eventfd", e))?;
            std::thread::Builder::new()
                .name("lava-flow-fan-out".into())
                .spawn(move || accept_consumers(listener, &name, &info, &config, &arrivals, meet, &stop))
                .map_err(|e| Error::os("starting the fan-out's acceptor thread", e))?
        };
        Ok(FanOutAcceptor { stop, thread: Some(thread), max_len: geometry.pool_size as usize, _lock: lock })
    }

    /// The largest message each consumer's ring carries (its pool).
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }
}

impl Drop for FanOutAcceptor {
    fn drop(&mut self) {
        event::signal(crate::os::borrow(&self.stop));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The acceptor thread: meets each consumer that connects until `stop` is signalled; then
/// closes the socket.
fn accept_consumers<T>(
    mut listener: Listener,
    name: &str,
    info: &TransportInfo,
    config: &ChannelConfig,
    arrivals: &Arrivals<T>,
    mut meet: impl FnMut(Meeting<'_>) -> Result<T>,
    stop: &OwnedHandle,
) {
    loop {
        if !crate::os::ready::wait_listener(listener.inner(), crate::os::borrow(stop)).unwrap_or(false) {
            break;
        }
        let mut refused = Vec::new();
        let Ok(Some((sock, peer))) = listener.accept(Some(Instant::now()), &mut refused, name) else { continue };
        // A slot whose consumer was detached for slowness is free at the fan-out, but taken
        // until that consumer lets go of it.
        let held = |slot: usize| {
            matches!(
                rendezvous::end_state(name, End::FanOutConsumer(slot as u32)),
                Ok(rendezvous::EndState::Live { .. })
            )
        };
        let Some(slot) = arrivals.claim(|slot| !held(slot)) else {
            let why = format!(
                "fan-out channel {name:?} is full: it takes max_peers = {} consumers and all of them are attached; \
                 wait for one to close, or create the producer with a larger max_peers",
                arrivals.max_peers()
            );
            let _ = rendezvous::send_ack(&sock, rendezvous::ACK_REFUSED, &why, &[]);
            continue;
        };
        let pid = peer.pid;
        match meet(Meeting { sock, peer, name, info, config, slot }) {
            Ok(peer) => arrivals.arrive(slot, peer),
            Err(e) => {
                arrivals.free(slot);
                log::warn!("channel {name:?} (fan-out producer): a consumer (pid {pid}) failed to attach: {e}");
            }
        }
    }
    listener.close();
}
