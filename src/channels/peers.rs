//! How many processes share a channel ([`ChannelKind`]), and what one end knows of the
//! processes at its other end, slot by slot ([`Peer`]), and a fan-out's table of those slots
//! (`Arrivals`).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// The most producers a fan-in takes, or consumers a fan-out (`ChannelConfig::max_peers`).
pub const MAX_PEERS: u32 = 64;

/// How many processes share a channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChannelKind {
    /// One producer, one consumer.
    #[default]
    Pair,
    /// Up to `max_peers` producers, one consumer: order and exactly-once hold per producer,
    /// and the consumer serves the producers in turn.
    FanIn,
    /// One producer, up to `max_peers` consumers: each message goes to every consumer.
    FanOut,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Pair => "pair",
            ChannelKind::FanIn => "fan-in",
            ChannelKind::FanOut => "fan-out",
        }
    }

    /// The number the shared-memory handshake and the C API give the kind.
    pub fn code(self) -> u32 {
        match self {
            ChannelKind::Pair => 0,
            ChannelKind::FanIn => 1,
            ChannelKind::FanOut => 2,
        }
    }

    pub fn from_code(code: u32) -> Option<ChannelKind> {
        [ChannelKind::Pair, ChannelKind::FanIn, ChannelKind::FanOut].into_iter().find(|k| k.code() == code)
    }
}

impl std::fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a slot has a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Nobody holds the slot: a new peer may take it.
    Free,
    /// The peer is attached.
    Alive,
    /// The peer closed its end or died; what it sent is still being received (the slot is
    /// free once its end has been reported).
    Gone,
}

impl PeerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Free => "free",
            PeerState::Alive => "alive",
            PeerState::Gone => "gone",
        }
    }
}

/// One slot at the other end of a channel: for a consumer, a producer's; for a producer, its
/// consumer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The slot: 0 for a pair channel; from 0 to `max_peers - 1` for a fan-in's producers.
    pub slot: u32,
    pub state: PeerState,
    /// The peer's process id on its host, 0 if unknown (a free slot, or a peer on another
    /// host).
    pub pid: u32,
    /// The peer's MPI rank where it is reached through MPI.
    pub rank: Option<i32>,
    /// The peer's host, as the carrier knows it (empty for a free slot).
    pub host: String,
    /// The name of the carrier this peer's messages take (`"shm"`, `"mpi"`; `None` for a free
    /// slot).
    pub route: Option<&'static str>,
}

impl Peer {
    /// An empty slot.
    pub fn free(slot: u32) -> Peer {
        Peer { slot, state: PeerState::Free, pid: 0, rank: None, host: String::new(), route: None }
    }
}

/// Refuses a producer that created a `theirs` channel, in `slot`, at a consumer of kind `ours`
/// that takes `max_peers` producers, saying why: every carrier refuses in these words.
pub(crate) fn check_producer_place(
    name: &str,
    ours: ChannelKind,
    max_peers: u32,
    theirs: ChannelKind,
    slot: u32,
) -> crate::error::Result<()> {
    use crate::error::Error;
    if theirs != ours {
        return Err(Error::InvalidState(kind_mismatch(name, ours, theirs)));
    }
    if theirs == ChannelKind::FanIn && slot >= max_peers {
        return Err(Error::InvalidState(fan_in_full(name, max_peers)));
    }
    Ok(())
}

/// Why a producer that created a `theirs` channel is refused by a consumer of kind `ours`.
pub(crate) fn kind_mismatch(name: &str, ours: ChannelKind, theirs: ChannelKind) -> String {
    format!(
        "channel {name:?} is a {ours} channel and this producer created a {theirs} one; every end of a channel names \
         the same kind"
    )
}

/// Why a producer of a full fan-in that takes `max_peers` producers is refused.
pub(crate) fn fan_in_full(name: &str, max_peers: u32) -> String {
    format!(
        "fan-in channel {name:?} is full: it takes max_peers = {max_peers} producers and all of them are attached; \
         wait for one to close, or create the consumer with a larger max_peers"
    )
}

/// A fan-out's slot table, and the consumers its carriers met that the producer has not taken
/// up yet. Each carrier's acceptor claims a slot here (one space per channel, whatever carrier
/// meets the consumer), meets the consumer on a thread of its own, and hands it over in its
/// slot; the producer takes them up at its next send (one relaxed load when none waits).
pub(crate) struct Arrivals<T> {
    /// Whether each slot is taken (by a consumer taken up, or one met).
    taken: Mutex<Vec<bool>>,
    /// Consumers met, by slot, not taken up yet.
    met: Mutex<Vec<(usize, T)>>,
    /// Something waits in `met`.
    waiting: AtomicBool,
}

impl<T> Arrivals<T> {
    pub(crate) fn new(max_peers: u32) -> Arrivals<T> {
        Arrivals {
            taken: Mutex::new(vec![false; max_peers as usize]),
            met: Mutex::new(Vec::new()),
            waiting: AtomicBool::new(false),
        }
    }

    /// How many slots the table has.
    pub(crate) fn max_peers(&self) -> usize {
        self.taken.lock().len()
    }

    /// The lowest free slot that `usable` accepts, taken now; `None` when there is none.
    pub(crate) fn claim(&self, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let mut taken = self.taken.lock();
        let slot = (0..taken.len()).find(|&slot| !taken[slot] && usable(slot))?;
        taken[slot] = true;
        Some(slot)
    }

    /// Frees `slot`: its consumer left, or could not be met.
    pub(crate) fn free(&self, slot: usize) {
        if let Some(taken) = self.taken.lock().get_mut(slot) {
            *taken = false;
        }
    }

    /// Hands over the consumer met in `slot` (claimed by [`claim`](Self::claim)).
    pub(crate) fn arrive(&self, slot: usize, peer: T) {
        self.met.lock().push((slot, peer));
        self.waiting.store(true, Ordering::Release);
    }

    /// The consumers met since the last call, if any.
    #[inline]
    pub(crate) fn take(&self) -> Option<Vec<(usize, T)>> {
        if !self.waiting.load(Ordering::Relaxed) {
            return None;
        }
        self.take_slow()
    }

    #[inline(never)]
    fn take_slow(&self) -> Option<Vec<(usize, T)>> {
        let mut met = self.met.lock();
        // Under the lock, so that a consumer handed over after this take raises it again.
        self.waiting.store(false, Ordering::Relaxed);
        Some(std::mem::take(&mut *met))
    }

    /// Calls `f` with each consumer met and not taken up yet, and its slot.
    pub(crate) fn each_met(&self, mut f: impl FnMut(usize, &T)) {
        for (slot, peer) in self.met.lock().iter() {
            f(*slot, peer);
        }
    }
}
