//! The consumer's end of an MPI channel (`MpiConsumer`): a pair's, which met its one
//! producer, or a fan-in's, whose acceptor meets producers as they come.
//!
//! A fan-in consumer's acceptor meets producers of any rank as they say hello,
//! on the channel's hello tag (`Tags::hellos`), which it probes with `MPI_ANY_SOURCE`: the
//! messages of the producers already attached stay on the messages tag, where each session
//! receives from its own rank alone.
//!
//! Each producer gets a slot of the fan-in, taken through `ClaimSlot` (the lock a same-host
//! producer of that slot would hold, so that slots are one space whatever the carrier), and
//! its rank: one producer per rank, since a rank's producers would share its tags (a process
//! refuses a second one itself). A hello from a rank whose last producer closed, but whose
//! close the consumer has not read yet, is answered once it has (refused after `PARK_WAIT`);
//! a full fan-in and a producer of another kind are refused, saying why, in the words of the
//! shared-memory carrier's refusals. With a notification fd, a thread probes for hellos every millisecond
//! and makes the fd readable while one waits.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::consumer::{refuse, MpiSession, Seat};
use super::watch::Prober;
use super::{full_refusal, shape_refusal, tags_for, ClaimSlot, Hello, TagProbe, Tags};
use crate::channels::transport::{ConsumerTransport, TransportInfo};
use crate::channels::ChannelConfig;
use crate::error::Result;
use crate::mpi::{Endpoint, ThreadLevel};
use crate::os::event;

/// The consuming end of an MPI channel: a pair's one producer's session, or a fan-in's
/// acceptor, which meets producers from any rank.
pub(crate) struct MpiConsumer {
    info: TransportInfo,
    /// The notification fd once asked for, which the sessions' probing threads (and a
    /// fan-in's acceptor's) signal.
    notify: Option<Arc<OwnedFd>>,
    acceptor: Option<Acceptor>,
    /// A fan-in's: the thread that probes its sleeping sessions for the fd (started with it).
    prober: Option<Prober>,
}

impl MpiConsumer {
    /// Waits for the producer of `name` at `ep` (its hello), up to the config's rendezvous
    /// timeout, and answers it: the consumer, and its producer's session.
    pub(crate) fn listen(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        ep: Endpoint,
    ) -> Result<(MpiConsumer, MpiSession)> {
        let session = MpiSession::listen(name, config, ep)?;
        Ok((MpiConsumer { info, notify: None, acceptor: None, prober: None }, session))
    }

    /// A consumer of fan-out channel `name` whose producer is at `ep`'s peer (on another
    /// host): joins it (`joins`), and returns with its session.
    pub(crate) fn join(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        ep: Endpoint,
    ) -> Result<(MpiConsumer, MpiSession)> {
        let session = super::joins::join(name, config, ep)?;
        Ok((MpiConsumer { info, notify: None, acceptor: None, prober: None }, session))
    }

    /// The consumer of fan-in channel `name` over MPI, in the world of `here` (this process):
    /// it meets producers of any rank as they say hello ([`try_accept`]), each in a slot that
    /// `claim` takes for it. Returns at once.
    ///
    /// [`try_accept`]: ConsumerTransport::try_accept
    pub(crate) fn fan_in(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        here: Endpoint,
        claim: ClaimSlot,
    ) -> Result<MpiConsumer> {
        let acceptor = Acceptor::new(name, config, here, claim)?;
        Ok(MpiConsumer { info, notify: None, acceptor: Some(acceptor), prober: None })
    }
}

impl ConsumerTransport for MpiConsumer {
    type Session = MpiSession;

    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn try_accept(&mut self) -> Result<Option<MpiSession>> {
        match &mut self.acceptor {
            Some(acceptor) => acceptor.try_accept(),
            None => Ok(None),
        }
    }

    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.notify.is_none() {
            let fd = Arc::new(event::new()?);
            if let Some(acceptor) = &mut self.acceptor {
                acceptor.start_probe(Arc::clone(&fd))?;
            }
            self.notify = Some(fd);
        }
        Ok(self.notify.as_ref().expect("set up above").as_fd())
    }

    fn watch(&mut self, session: &mut MpiSession) -> Result<()> {
        let Some(fd) = &self.notify else { return Ok(()) };
        let Some(acceptor) = &self.acceptor else { return session.start_notifier(Arc::clone(fd)) };
        // A fan-in's sessions keep receiving ahead, and are probed by the carrier's one
        // thread only while the consumer sleeps (`watch`).
        if self.prober.is_none() {
            acceptor.check_thread_level()?;
            self.prober = Some(Prober::start(Arc::clone(&acceptor.here.comm), Arc::clone(fd))?);
        }
        session.watch_lazily(self.prober.as_ref().expect("started above"));
        Ok(())
    }

    fn unwatch(&mut self, session: &mut MpiSession) {
        session.stop_notifier();
        session.unwatch_lazily();
    }
}

/// The first id of a fan-in's MPI sessions: far above the ids that other carriers' sessions
/// count up from 1, so that a view's session names one session of the fan-in.
const FAN_IN_SESSIONS: u64 = 1 << 62;

/// How long a hello from a rank waits for its last producer's close to be read before it is
/// refused. (A process has one producer of a channel at a time, so the close is on its way.)
const PARK_WAIT: Duration = Duration::from_secs(5);

/// A fan-in consumer's acceptor over MPI.
pub(super) struct Acceptor {
    name: String,
    config: ChannelConfig,
    /// This process in the world the producers come from.
    here: Endpoint,
    tags: Tags,
    claim: ClaimSlot,
    /// The ranks with a producer attached whose close is not read yet.
    ranks: Arc<Mutex<BTreeSet<u32>>>,
    /// Hellos from such ranks, with when they arrived, oldest first.
    parked: Vec<(Instant, u32, Hello)>,
    sessions: u64,
    probe: Option<TagProbe>,
}

/// A rank's claim: one producer at a time from it.
struct RankClaim {
    ranks: Arc<Mutex<BTreeSet<u32>>>,
    rank: u32,
}

impl Drop for RankClaim {
    fn drop(&mut self) {
        self.ranks.lock().remove(&self.rank);
    }
}

impl Acceptor {
    pub(super) fn new(name: &str, config: &ChannelConfig, here: Endpoint, claim: ClaimSlot) -> Result<Acceptor> {
        let tags = tags_for(name, here.tag_upper_bound)?;
        Ok(Acceptor {
            name: name.to_owned(),
            config: config.clone(),
            here,
            tags,
            claim,
            ranks: Arc::default(),
            parked: Vec::new(),
            sessions: 0,
            probe: None,
        })
    }

    /// Whether MPI's thread level lets a thread probe for the sessions, or why not.
    fn check_thread_level(&self) -> Result<()> {
        if self.here.thread_level < ThreadLevel::Serialized {
            return Err(crate::error::Error::Unsupported(format!(
                "a descriptor for fan-in channel {:?} needs a thread that probes MPI, and MPI runs at thread level {} \
                 here; initialise MPI with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (lava-flow asks for MULTIPLE \
                 when it initialises MPI itself), or poll with try_recv",
                self.name, self.here.thread_level
            )));
        }
        Ok(())
    }

    /// Starts the thread that signals `fd` while a hello waits; without one (MPI's thread
    /// level allows none), each `try_accept` probes.
    pub(super) fn start_probe(&mut self, fd: Arc<OwnedFd>) -> Result<()> {
        if self.probe.is_none() && self.here.thread_level >= ThreadLevel::Serialized {
            self.probe = Some(TagProbe::start(&self.here, self.tags.hellos, fd, "hellos")?);
        }
        Ok(())
    }

    /// A producer that said hello, answered and attached in its slot; `None` when none waits
    /// (those refused were told why).
    pub(super) fn try_accept(&mut self) -> Result<Option<MpiSession>> {
        if !self.parked.is_empty() {
            if let Some(session) = self.unpark()? {
                return Ok(Some(session));
            }
        }
        // One atomic load while no producer comes.
        if self.probe.as_ref().is_some_and(|p| !p.seen()) {
            return Ok(None);
        }
        loop {
            let Some((rank, len)) = self.here.comm.iprobe_any(self.tags.hellos)? else {
                if let Some(probe) = &self.probe {
                    probe.looked();
                }
                return Ok(None);
            };
            // Received whole whatever it holds: one left in MPI would be probed for ever.
            let mut bytes = vec![0u8; len];
            // SAFETY: `bytes` has the `len` bytes the probe reported.
            unsafe { self.here.comm.recv_probed(bytes.as_mut_ptr(), len, rank, self.tags.hellos)? };
            match Hello::decode(&bytes, rank) {
                Ok(hello) => {
                    if let Some(session) = self.admit(rank, hello)? {
                        return Ok(Some(session));
                    }
                }
                Err(e) => log::warn!("fan-in channel {:?} (consumer): dropped a hello over MPI: {e}", self.name),
            }
        }
    }

    /// Answers `hello` from `rank`: the producer's session, or `None` where it was refused or
    /// waits for its rank's last producer.
    fn admit(&mut self, rank: u32, hello: Hello) -> Result<Option<MpiSession>> {
        let name = &self.name;
        let why = if hello.name != *name {
            Some(format!(
                "channels {:?} and {name:?} share MPI tag {} at MPI rank {}; rename one",
                hello.name, self.tags.hellos, self.here.rank
            ))
        } else {
            shape_refusal(name, self.config.kind, hello.kind)
        };
        if let Some(why) = why {
            self.refuse(rank, &hello, &why)?;
            return Ok(None);
        }
        if self.ranks.lock().contains(&rank) {
            self.parked.push((Instant::now(), rank, hello));
            return Ok(None);
        }
        self.seat(rank, hello)
    }

    /// The parked hello whose rank is free now, seated; those that waited too long refused.
    fn unpark(&mut self) -> Result<Option<MpiSession>> {
        let mut at = 0;
        while at < self.parked.len() {
            let (since, rank, _) = self.parked[at];
            if !self.ranks.lock().contains(&rank) {
                let (_, rank, hello) = self.parked.remove(at);
                match self.seat(rank, hello)? {
                    Some(session) => return Ok(Some(session)),
                    None => continue,
                }
            }
            if since.elapsed() >= PARK_WAIT {
                let (_, rank, hello) = self.parked.remove(at);
                let why = format!(
                    "one producer per MPI rank on a fan-in: the last producer of MPI rank {rank} on fan-in channel \
                     {:?} is still attached (the consumer has not read its messages to its close within {} s, and a \
                     rank's producers share its MPI tags); try again once the consumer has read them",
                    self.name,
                    PARK_WAIT.as_secs()
                );
                self.refuse(rank, &hello, &why)?;
                continue;
            }
            at += 1;
        }
        Ok(None)
    }

    /// Gives `hello`'s producer the lowest free slot and starts its session; a full fan-in
    /// refuses it.
    fn seat(&mut self, rank: u32, hello: Hello) -> Result<Option<MpiSession>> {
        let mut claimed = None;
        for slot in 0..self.config.max_peers {
            if let Some(lock) = (self.claim)(slot)? {
                claimed = Some((slot, lock));
                break;
            }
        }
        let Some((slot, lock)) = claimed else {
            let why = full_refusal(&self.name, self.config.max_peers);
            self.refuse(rank, &hello, &why)?;
            return Ok(None);
        };
        self.ranks.lock().insert(rank);
        let rank_claim = RankClaim { ranks: Arc::clone(&self.ranks), rank };
        self.sessions += 1;
        let claims = Some(Box::new((lock, rank_claim)) as Box<dyn std::any::Any + Send + Sync>);
        let seat = Seat { id: FAN_IN_SESSIONS + self.sessions, slot, claims, stream: None };
        log::info!(
            "fan-in channel {:?} (consumer): a producer at MPI rank {rank} ({}) attached in slot {slot}",
            self.name,
            self.here.to(rank).peer_host()
        );
        MpiSession::start(&self.name, &self.config, self.here.to(rank), self.tags, &hello, seat).map(Some)
    }

    fn refuse(&self, rank: u32, hello: &Hello, why: &str) -> Result<()> {
        log::info!("fan-in channel {:?} (consumer): refused a producer at MPI rank {rank}: {why}", self.name);
        refuse(&self.here.to(rank), self.tags, hello.nonce, why)
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        drop(self.probe.take());
        // Parked producers would otherwise wait for their rendezvous timeout.
        for (_, rank, hello) in std::mem::take(&mut self.parked) {
            let why = format!("the consumer of fan-in channel {:?} closed", self.name);
            let _ = self.refuse(rank, &hello, &why);
        }
    }
}
