//! A fan-out's producer over MPI keeps only its meeting of consumers on other hosts here: a
//! thread that runs the producer's [`MpiJoins`] (a joiner's answer can take seconds, which no
//! send of the producer's may wait for), each consumer met in a slot of the fan-out's slot
//! table, which every carrier's acceptor takes slots from. Each consumer's end (an
//! [`MpiProducer`]) goes to the fan-out in the channel core, which takes it up at its next send
//! and publishes to it as to any consumer's end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::joins::{Joined, MpiJoins};
use super::producer::MpiProducer;
use crate::channels::peers::Arrivals;
use crate::channels::transport::TransportInfo;
use crate::channels::ChannelConfig;
use crate::error::{Error, Result};
use crate::mpi::{Endpoint, ThreadLevel};

/// How often the thread looks for joins: a consumer that attaches is rare, and waits for its
/// answer anyway.
const LOOK_EVERY: Duration = Duration::from_millis(1);

/// A slot of the fan-out's table taken for a joiner; freed again when dropped before the
/// joiner was handed over (it did not answer, or the producer closed meanwhile).
struct SlotClaim<T: Send + 'static> {
    arrivals: Arc<Arrivals<T>>,
    slot: usize,
    armed: bool,
}

impl<T: Send + 'static> Drop for SlotClaim<T> {
    fn drop(&mut self) {
        if self.armed {
            self.arrivals.free(self.slot);
        }
    }
}

/// A fan-out producer's acceptor over MPI; dropping it stops the thread (refusing the joins it
/// had parked).
pub(crate) struct MpiFanOutAcceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MpiFanOutAcceptor {
    /// Meets the consumers of fan-out `name` that join from any rank of `here`'s world: each
    /// takes the lowest free slot of `arrivals` (one past `max_peers` is refused, saying so),
    /// its end reports `info`, is made into what the fan-out takes up by `meet`, and is handed
    /// over in its slot. Returns at once.
    pub(crate) fn start<T: Send + 'static>(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        here: Endpoint,
        arrivals: Arc<Arrivals<T>>,
        meet: impl FnMut(MpiProducer) -> Result<T> + Send + 'static,
    ) -> Result<MpiFanOutAcceptor> {
        if here.thread_level < ThreadLevel::Serialized {
            return Err(Error::Unsupported(format!(
                "the producer of fan-out channel {name:?} meets consumers on other hosts on a thread of its own, and \
                 MPI runs at thread level {} here; initialise MPI with MPI_THREAD_SERIALIZED or \
                 MPI_THREAD_MULTIPLE (lava-flow asks for MULTIPLE when it initialises MPI itself), or keep the \
                 fan-out's consumers on this host",
                here.thread_level
            )));
        }
        let table = Arc::clone(&arrivals);
        let claim: super::ClaimSlot = Box::new(move |slot| {
            let slot = slot as usize;
            Ok(table.claim(|free| free == slot).map(|slot| {
                Box::new(SlotClaim { arrivals: Arc::clone(&table), slot, armed: true })
                    as Box<dyn std::any::Any + Send + Sync>
            }))
        });
        let joins = MpiJoins::new(name, info, config, here, claim)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (name, stop) = (name.to_owned(), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("lava-flow-mpi-fan-out".into())
                .spawn(move || meet_consumers(joins, &name, &arrivals, meet, &stop))
                .map_err(|e| Error::os("starting the fan-out's MPI acceptor thread", e))?
        };
        Ok(MpiFanOutAcceptor { stop, thread: Some(thread) })
    }
}

impl Drop for MpiFanOutAcceptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The acceptor thread: meets each consumer that joins until `stop` is set.
fn meet_consumers<T: Send + 'static>(
    mut joins: MpiJoins,
    name: &str,
    arrivals: &Arrivals<T>,
    mut meet: impl FnMut(MpiProducer) -> Result<T>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        match joins.try_join() {
            Ok(Some(Joined { slot, producer, claim })) => {
                // The slot is the consumer's now: the fan-out frees it when it drops the end.
                if let Ok(mut claim) = claim.downcast::<SlotClaim<T>>() {
                    claim.armed = false;
                }
                let rank = producer.peer_rank();
                match meet(producer) {
                    Ok(peer) => arrivals.arrive(slot as usize, peer),
                    Err(e) => {
                        arrivals.free(slot as usize);
                        log::warn!(
                            "channel {name:?} (fan-out producer): a consumer (MPI rank {rank}) failed to attach: {e}"
                        );
                    }
                }
            }
            Ok(None) => std::thread::sleep(LOOK_EVERY),
            Err(e) => {
                log::warn!("channel {name:?} (fan-out producer): looking for consumers over MPI failed: {e}");
                std::thread::sleep(LOOK_EVERY * 100);
            }
        }
    }
}
