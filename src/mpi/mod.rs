//! Layer 0 runtime: joining the application's MPI, and finding every process of the job
//! through it, without a config file.
//!
//! The rules (also in docs/mpi.md):
//! - If the application has initialised MPI, lava-flow joins it: it works on a private
//!   duplicate (`MPI_Comm_dup`) of the communicator it is given (`MPI_COMM_WORLD` by default)
//!   and never finalizes MPI. If not, lava-flow calls `MPI_Init_thread` asking for
//!   `MPI_THREAD_MULTIPLE`, reports the level it got, and calls `MPI_Finalize` when its last
//!   [`MpiWorld`] is dropped.
//! - The private communicator has `MPI_ERRORS_RETURN`: MPI failures are errors, not aborts.
//! - [`MpiWorld::join`] is collective over the communicator: one `MPI_Allgather` of record
//!   lengths and one `MPI_Allgatherv` of records (name, hostname, host identity, NUMA node,
//!   GPU UUIDs), plus an `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)` to cross-check the host
//!   identities. Every process then knows every other by rank and by name.
//!
//! Built without the `mpi` feature, the types exist and [`MpiWorld::join`] returns
//! `Error::Unsupported`, saying how to build with it.

#![cfg_attr(not(feature = "mpi"), allow(dead_code))]

mod auto;
mod record;
#[cfg(feature = "mpi")]
mod runtime;

#[cfg(feature = "mpi")]
pub(crate) use auto::{here_in_world_of, join_for_context, resolve, unresolved_reason};
pub use auto::{launcher, MPI_ENV};

#[cfg(feature = "mpi")]
pub(crate) use runtime::{register_duty, Duty, DutyRegistration, PrivateComm, Request};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use std::sync::atomic::AtomicU64;
#[cfg(feature = "mpi")]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::types::{MpiAddress, ProcessLocation, ProcessName};
use record::LocationRecord;

/// Ids of the worlds joined in this process (in their peers' locations).
static NEXT_WORLD: AtomicU64 = AtomicU64::new(1);

/// The worlds joined in this process and alive (held by a world or a channel over it), for
/// channels to find the communicator of a peer's location.
static WORLDS: Mutex<Vec<WorldEntry>> = Mutex::new(Vec::new());

struct WorldEntry {
    id: u64,
    comm: Weak<PrivateComm>,
    rank: u32,
    tag_upper_bound: i32,
    thread_level: ThreadLevel,
    /// Each rank's hostname, for reports of peers met over MPI.
    hosts: Arc<[String]>,
    /// What discovery found, for another handle on the same join.
    peers: Arc<[Peer]>,
    topology_report: Arc<str>,
    initialised_by_lava_flow: bool,
    /// Joined over `MPI_COMM_WORLD`.
    over_world: bool,
    /// Joined by a context on its own (under an MPI launcher), not by the application.
    automatic: bool,
}

impl WorldEntry {
    /// Another handle on this world, while it is alive.
    #[cfg(feature = "mpi")]
    fn handle(&self) -> Option<MpiWorld> {
        Some(MpiWorld {
            rank: self.rank,
            peers: Arc::clone(&self.peers),
            thread_level: self.thread_level,
            tag_upper_bound: self.tag_upper_bound,
            initialised_by_lava_flow: self.initialised_by_lava_flow,
            topology_report: Arc::clone(&self.topology_report),
            comm: self.comm.upgrade()?,
        })
    }
}

/// A new handle on the most recently joined world still alive that `wanted` accepts.
#[cfg(feature = "mpi")]
fn live_world(wanted: impl Fn(&WorldEntry) -> bool) -> Option<MpiWorld> {
    WORLDS.lock().iter().rev().filter(|w| wanted(w)).find_map(WorldEntry::handle)
}

/// One process's way to a peer of an MPI world: the world's communicator (kept alive, and
/// MPI with it, while the endpoint lives), this process's rank, the peer's rank, and what
/// MPI allows (tags, threads).
#[cfg(feature = "mpi")]
pub(crate) struct Endpoint {
    pub(crate) comm: Arc<PrivateComm>,
    pub(crate) rank: u32,
    pub(crate) peer: u32,
    pub(crate) tag_upper_bound: i32,
    pub(crate) thread_level: ThreadLevel,
    /// Each rank's hostname.
    hosts: Arc<[String]>,
}

#[cfg(feature = "mpi")]
impl Endpoint {
    /// The way to another process of the same world.
    pub(crate) fn to(&self, peer: u32) -> Endpoint {
        Endpoint { comm: Arc::clone(&self.comm), peer, hosts: Arc::clone(&self.hosts), ..*self }
    }

    /// The peer's hostname, as discovery found it.
    pub(crate) fn peer_host(&self) -> &str {
        self.hosts.get(self.peer as usize).map_or("", String::as_str)
    }
}

/// The endpoint to the process at `address`, or why there is none.
#[cfg(feature = "mpi")]
pub(crate) fn endpoint(address: MpiAddress) -> std::result::Result<Endpoint, String> {
    let worlds = WORLDS.lock();
    let Some(entry) = worlds.iter().find(|w| w.id == address.world) else {
        return Err(format!("the peer's location names MPI world {}, which this process never joined", address.world));
    };
    let Some(comm) = entry.comm.upgrade() else {
        return Err(format!(
            "MPI world {} has been freed (lf_mpi_free): keep it while channels are created over it",
            address.world
        ));
    };
    if address.rank == entry.rank {
        return Err(format!("the peer is this process (MPI rank {})", entry.rank));
    }
    Ok(Endpoint {
        comm,
        rank: entry.rank,
        peer: address.rank,
        tag_upper_bound: entry.tag_upper_bound,
        thread_level: entry.thread_level,
        hosts: Arc::clone(&entry.hosts),
    })
}

/// This process in MPI world `world` (or, without one, in the world it joined last and still
/// holds), for an end that meets peers from any rank: an endpoint whose peer is this process
/// itself, to be turned toward each peer met ([`Endpoint::to`]). Why there is none otherwise.
#[cfg(feature = "mpi")]
pub(crate) fn here(world: Option<u64>) -> std::result::Result<Endpoint, String> {
    let worlds = WORLDS.lock();
    let alive = worlds.iter().rev().filter(|w| w.comm.strong_count() > 0);
    let entry = match world {
        Some(id) => alive.into_iter().find(|w| w.id == id),
        None => alive.into_iter().next(),
    };
    let Some(entry) = entry else {
        return Err(match world {
            Some(id) => format!("MPI world {id} is not joined in this process (or has been freed)"),
            None => "this process has not joined MPI (lf_mpi_join)".to_owned(),
        });
    };
    let comm = entry.comm.upgrade().ok_or_else(|| "the MPI world has just been freed".to_owned())?;
    Ok(Endpoint {
        comm,
        rank: entry.rank,
        peer: entry.rank,
        tag_upper_bound: entry.tag_upper_bound,
        thread_level: entry.thread_level,
        hosts: Arc::clone(&entry.hosts),
    })
}

/// The environment variable that names this process when the join does not.
pub const PROCESS_NAME_ENV: &str = crate::env::PROCESS_NAME.name;

/// Which of the application's communicators lava-flow duplicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Communicator {
    /// `MPI_COMM_WORLD`.
    #[default]
    World,
    /// A communicator as `MPI_Comm_c2f` gives it (an `MPI_Fint`), from C or Fortran.
    Fortran(i64),
}

/// The thread support MPI provides, as `MPI_Init_thread` or `MPI_Query_thread` report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadLevel {
    /// One thread only.
    Single,
    /// Only the thread that initialised MPI calls it.
    Funneled,
    /// Any thread, one at a time.
    Serialized,
    /// Any thread, at any time.
    Multiple,
}

impl fmt::Display for ThreadLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThreadLevel::Single => "MPI_THREAD_SINGLE",
            ThreadLevel::Funneled => "MPI_THREAD_FUNNELED",
            ThreadLevel::Serialized => "MPI_THREAD_SERIALIZED",
            ThreadLevel::Multiple => "MPI_THREAD_MULTIPLE",
        })
    }
}

/// One process of the world, as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    rank: u32,
    name: ProcessName,
    location: ProcessLocation,
    gpu_uuids: Vec<String>,
    shared_memory_group: u32,
}

impl Peer {
    /// Its rank in the communicator lava-flow joined.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn name(&self) -> &ProcessName {
        &self.name
    }

    /// Its hostname, host identity and NUMA node (`device_id` is unset: which GPU a process
    /// uses is its own choice).
    pub fn location(&self) -> &ProcessLocation {
        &self.location
    }

    /// The UUIDs of the GPUs of its host, as the driver names them, where that is cheap to
    /// know (NVIDIA's `/proc/driver/nvidia/gpus`); empty otherwise.
    pub fn gpu_uuids(&self) -> &[String] {
        &self.gpu_uuids
    }

    /// The lowest rank that MPI's shared-memory split (`MPI_COMM_TYPE_SHARED`) puts with
    /// this process: equal for processes that MPI says can share memory.
    pub fn shared_memory_group(&self) -> u32 {
        self.shared_memory_group
    }
}

/// Without MPI no world can exist.
#[cfg(not(feature = "mpi"))]
enum PrivateComm {}

/// lava-flow's membership in the application's MPI job: its private communicator and every
/// process's name and location.
///
/// Dropping the last world finalizes MPI if, and only if, lava-flow initialised it. Drop it
/// from a thread that may call MPI at the world's [`thread_level`](Self::thread_level).
/// The accessors only read what discovery found, so they may be called from any thread.
pub struct MpiWorld {
    rank: u32,
    peers: Arc<[Peer]>,
    thread_level: ThreadLevel,
    tag_upper_bound: i32,
    initialised_by_lava_flow: bool,
    topology_report: Arc<str>,
    /// Freed when the world and the channels over it are gone (and MPI finalized with the
    /// last one, where lava-flow initialised it); the MPI transport sends through it.
    #[allow(dead_code)]
    comm: Arc<PrivateComm>,
}

impl fmt::Debug for MpiWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiWorld")
            .field("rank", &self.rank)
            .field("size", &self.peers.len())
            .field("thread_level", &self.thread_level)
            .finish_non_exhaustive()
    }
}

impl MpiWorld {
    /// Joins the application's MPI (initialising it if the application has not) and finds
    /// every process of `communicator`. Collective: every process of the communicator must
    /// call it. `process_name` names this process; without one, `LF_PROCESS_NAME` does, and
    /// without that the name is `rank<N>`. Names must be unique in the world.
    ///
    /// Failures that depend on one process's input (a bad name, a name used twice, a record
    /// that fails validation) make every process's join fail, so none is left waiting in a
    /// collective.
    ///
    /// Where a context of this process has joined `MPI_COMM_WORLD` by itself (under an MPI
    /// launcher, see [`launcher`]), a join of [`Communicator::World`] is that join again, with
    /// no collective: the same ranks and names. It must then name this process as that join
    /// did (or name none), else `InvalidState`. So is a join of the Fortran handle of
    /// `MPI_COMM_WORLD`.
    #[cfg(feature = "mpi")]
    pub fn join(communicator: Communicator, process_name: Option<&str>) -> Result<MpiWorld> {
        if let Some(world) = live_world(|w| w.automatic) {
            // MPI is initialised while the world lives: a Fortran handle can be compared.
            let world_comm = match communicator {
                Communicator::World => true,
                Communicator::Fortran(handle) => runtime::names_comm_world(handle),
            };
            if world_comm {
                return auto::same_join(world, process_name);
            }
        }
        Self::join_new(communicator, process_name, false)
    }

    /// A join of its own (a collective), by the application or (`automatic`) by a context.
    #[cfg(feature = "mpi")]
    fn join_new(communicator: Communicator, process_name: Option<&str>, automatic: bool) -> Result<MpiWorld> {
        crate::logging::init();
        let fortran = match communicator {
            Communicator::World => None,
            Communicator::Fortran(handle) => Some(handle),
        };
        let joined = runtime::join(fortran)?;
        let shared_memory_group = joined.comm.shared_memory_group(joined.rank)?;
        let mine = describe_self(process_name, joined.rank, shared_memory_group).and_then(|r| r.encode());
        let gathered = joined.comm.all_gather(mine.as_deref().ok(), joined.size, record::MAX_RECORD_LEN);
        // This process's own error first: it says what is wrong here, not just that a rank failed.
        mine?;
        let records = gathered?
            .iter()
            .enumerate()
            .map(|(rank, bytes)| LocationRecord::decode(bytes, rank, joined.size as usize))
            .collect::<Result<Vec<_>>>()?;
        let id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        let peers = peers_from(records, id)?;
        let topology_report = topology_report(&peers);
        if joined.rank == 0 && !topology_report.is_empty() {
            // Said once per job, by rank 0; every process can read it with `topology_report`.
            for note in topology_report.lines() {
                log::warn!("{note}");
            }
        }
        log::info!(
            "joined MPI as rank {} of {} ({}), thread level {}; MPI was initialised by {}",
            joined.rank,
            joined.size,
            peers.get(joined.rank as usize).map_or_else(|| "?".to_owned(), |p| p.name.to_string()),
            joined.thread_level,
            if joined.initialised_by_lava_flow {
                "lava-flow, and is finalized when its last handle is freed"
            } else {
                "the application"
            }
        );
        if joined.thread_level < ThreadLevel::Serialized {
            log::info!(
                "MPI runs at thread level {} here: lava-flow starts no progress thread and MPI channels have no \
                 descriptor (lf_channel_fd), so large transfers move only while this process calls lava-flow; \
                 initialise MPI with MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE to lift this",
                joined.thread_level
            );
        }
        let world = MpiWorld {
            rank: joined.rank,
            peers: peers.into(),
            thread_level: joined.thread_level,
            tag_upper_bound: joined.tag_upper_bound,
            initialised_by_lava_flow: joined.initialised_by_lava_flow,
            topology_report: topology_report.into(),
            comm: Arc::new(joined.comm),
        };
        let mut worlds = WORLDS.lock();
        worlds.retain(|w| w.comm.strong_count() > 0);
        worlds.push(WorldEntry {
            id,
            comm: Arc::downgrade(&world.comm),
            rank: world.rank,
            tag_upper_bound: world.tag_upper_bound,
            thread_level: world.thread_level,
            hosts: world.peers.iter().map(|p| p.location.hostname.clone()).collect(),
            peers: Arc::clone(&world.peers),
            topology_report: Arc::clone(&world.topology_report),
            initialised_by_lava_flow: world.initialised_by_lava_flow,
            over_world: joined.over_world,
            automatic,
        });
        drop(worlds);
        Ok(world)
    }

    /// Always `Error::Unsupported`: this build has no MPI.
    #[cfg(not(feature = "mpi"))]
    pub fn join(_communicator: Communicator, _process_name: Option<&str>) -> Result<MpiWorld> {
        Err(Error::Unsupported(
            "lava-flow was built without MPI support: rebuild it with the `mpi` feature \
             (cargo build --features mpi, or cmake -DLAVA_FLOW_MPI=ON)"
                .into(),
        ))
    }

    /// The number of processes in the world.
    pub fn size(&self) -> u32 {
        self.peers.len() as u32
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// What MPI provides: `Multiple` when lava-flow initialised MPI (where the MPI library
    /// supports it); whatever the application asked for otherwise.
    pub fn thread_level(&self) -> ThreadLevel {
        self.thread_level
    }

    /// The largest tag MPI accepts on the world's communicator (`MPI_TAG_UB`, at least 32767).
    pub fn tag_upper_bound(&self) -> i32 {
        self.tag_upper_bound
    }

    /// Whether lava-flow called `MPI_Init_thread` (and so will call `MPI_Finalize`).
    pub fn initialised_mpi(&self) -> bool {
        self.initialised_by_lava_flow
    }

    /// Where MPI's shared-memory split disagrees with the host identities, what lava-flow
    /// concluded and how to fix it; empty when they agree. The same on every process.
    pub fn topology_report(&self) -> &str {
        &self.topology_report
    }

    /// Every process, in rank order.
    pub fn peers(&self) -> &[Peer] {
        &self.peers
    }

    /// This process.
    pub fn me(&self) -> &Peer {
        &self.peers[self.rank as usize]
    }

    /// The process of rank `rank`.
    pub fn peer(&self, rank: u32) -> Result<&Peer> {
        self.peers.get(rank as usize).ok_or_else(|| {
            Error::invalid(format!(
                "rank {rank} is out of range: the MPI world has {} processes (ranks 0 to {})",
                self.peers.len(),
                self.peers.len() - 1
            ))
        })
    }

    /// The rank of the process called `name`.
    pub fn rank_of(&self, name: &str) -> Result<u32> {
        let name = ProcessName::new(name)?;
        if let Some(peer) = self.peers.iter().find(|p| p.name == name) {
            return Ok(peer.rank);
        }
        let mut known: Vec<&str> = self.peers.iter().take(16).map(|p| p.name.as_str()).collect();
        if self.peers.len() > 16 {
            known.push("...");
        }
        Err(Error::NotFound(format!(
            "no process named {:?} in the MPI world of {} processes (they are: {}); name processes with the \
             process_name argument of the join or with {PROCESS_NAME_ENV}",
            name.as_str(),
            self.peers.len(),
            known.join(", ")
        )))
    }
}

/// This process's record: its name (argument, `LF_PROCESS_NAME`, or `rank<N>`), location
/// and GPUs.
fn describe_self(process_name: Option<&str>, rank: u32, shared_memory_group: u32) -> Result<LocationRecord> {
    let name = match process_name {
        Some(name) => ProcessName::new(name)?,
        None => match std::env::var(PROCESS_NAME_ENV) {
            Ok(name) if !name.is_empty() => ProcessName::new(&name).map_err(|e| {
                Error::invalid(format!("{PROCESS_NAME_ENV}: {e}; fix it or unset it (the name is then rank{rank})"))
            })?,
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(Error::invalid(format!("{PROCESS_NAME_ENV} is not valid UTF-8; fix it or unset it")))
            }
            _ => ProcessName::new(&format!("rank{rank}"))?,
        },
    };
    Ok(LocationRecord {
        name,
        location: ProcessLocation::from_hostname()?,
        gpu_uuids: host_gpu_uuids(),
        shared_memory_group,
    })
}

/// The records, validated as a whole: names are unique.
fn peers_from(records: Vec<LocationRecord>, world: u64) -> Result<Vec<Peer>> {
    let mut first_rank: HashMap<&ProcessName, usize> = HashMap::new();
    for (rank, record) in records.iter().enumerate() {
        if let Some(other) = first_rank.insert(&record.name, rank) {
            return Err(Error::invalid(format!(
                "process name {:?} is used by MPI ranks {other} and {rank}; give every process its own name \
                 (the process_name argument of the join, or {PROCESS_NAME_ENV}), or name none (then each is rank<N>)",
                record.name.as_str()
            )));
        }
    }
    Ok(records
        .into_iter()
        .enumerate()
        .map(|(rank, r)| Peer {
            rank: rank as u32,
            name: r.name,
            location: ProcessLocation { mpi: Some(MpiAddress { world, rank: rank as u32 }), ..r.location },
            gpu_uuids: r.gpu_uuids,
            shared_memory_group: r.shared_memory_group,
        })
        .collect())
}

/// What lava-flow uses to tell hosts apart: the host identity, or the hostname without one.
fn host_key(location: &ProcessLocation) -> String {
    match &location.host_id {
        Some(id) => id.clone(),
        None => format!("hostname {}", location.hostname.to_ascii_lowercase()),
    }
}

/// Compares MPI's shared-memory groups with the host identities. Disagreement is reported,
/// never an error: the identities decide the scope (they are what `LF_HOST_ID` sets, and MPI's
/// split may be coarser or finer than what lava-flow's shared memory can reach), and an MPI
/// transport works between any two processes anyway.
fn topology_report(peers: &[Peer]) -> String {
    let mut hosts_of_group: BTreeMap<u32, BTreeMap<String, Vec<usize>>> = BTreeMap::new();
    let mut groups_of_host: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for peer in peers {
        let key = host_key(&peer.location);
        hosts_of_group
            .entry(peer.shared_memory_group)
            .or_default()
            .entry(key.clone())
            .or_default()
            .push(peer.rank as usize);
        groups_of_host.entry(key).or_default().insert(peer.shared_memory_group);
    }
    let mut notes = Vec::new();
    for hosts in hosts_of_group.values().filter(|hosts| hosts.len() > 1) {
        let all: Vec<usize> = hosts.values().flatten().copied().collect::<BTreeSet<_>>().into_iter().collect();
        let each: Vec<String> =
            hosts.iter().map(|(key, ranks)| format!("{key:?}: ranks {}", rank_list(ranks))).collect();
        notes.push(format!(
            "MPI says ranks {} can share memory (one MPI_COMM_TYPE_SHARED group), but they report {} host identities \
             ({}); lava-flow follows the host identities and treats processes with different ones as remote. If they \
             are on one host and should share memory, give them the same LF_HOST_ID.",
            rank_list(&all),
            hosts.len(),
            each.join("; ")
        ));
    }
    for (key, groups) in groups_of_host.iter().filter(|(_, groups)| groups.len() > 1) {
        let ranks: Vec<usize> =
            peers.iter().filter(|p| host_key(&p.location) == *key).map(|p| p.rank as usize).collect();
        notes.push(format!(
            "ranks {} report the same host identity {key:?}, but MPI puts them in {} shared-memory groups; lava-flow \
             treats them as local (shared memory). If they run on different machines, set LF_HOST_ID to a different \
             value on each.",
            rank_list(&ranks),
            groups.len()
        ));
    }
    notes.join("\n")
}

/// "0, 1, 2", with at most eight ranks named.
fn rank_list(ranks: &[usize]) -> String {
    let mut s: Vec<String> = ranks.iter().take(8).map(|r| r.to_string()).collect();
    if ranks.len() > 8 {
        s.push(format!("and {} more", ranks.len() - 8));
    }
    s.join(", ")
}

/// The host's NVIDIA GPU UUIDs from the driver's proc files (no driver library is loaded),
/// in bus order; empty without that driver. Other GPUs are not listed: knowing them would
/// mean opening a device.
fn host_gpu_uuids() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/driver/nvidia/gpus") else {
        return Vec::new();
    };
    let mut buses: Vec<_> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    buses.sort();
    buses
        .iter()
        .filter_map(|bus| std::fs::read_to_string(bus.join("information")).ok())
        .filter_map(|info| {
            info.lines().find_map(|line| line.strip_prefix("GPU UUID:")).map(|uuid| uuid.trim().to_owned())
        })
        .filter(|uuid| record::gpu_uuid_problem(uuid).is_none())
        .take(record::MAX_GPUS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32, host: &str, group: u32) -> Peer {
        Peer {
            rank,
            name: ProcessName::new(&format!("p{rank}")).unwrap(),
            location: ProcessLocation::new("node", None, None).unwrap().with_host_id(host).unwrap(),
            gpu_uuids: vec![],
            shared_memory_group: group,
        }
    }

    #[test]
    fn agreeing_topologies_give_an_empty_report() {
        let peers = [peer(0, "a", 0), peer(1, "a", 0), peer(2, "b", 2), peer(3, "b", 2)];
        assert_eq!(topology_report(&peers), "");
    }

    #[test]
    fn disagreements_are_reported_both_ways() {
        // LF_HOST_ID splits one machine in two.
        let split = [peer(0, "a", 0), peer(1, "a", 0), peer(2, "b", 0), peer(3, "b", 0)];
        let report = topology_report(&split);
        assert!(report.contains("ranks 0, 1, 2, 3 can share memory"), "{report}");
        assert!(report.contains("\"a\": ranks 0, 1; \"b\": ranks 2, 3"), "{report}");
        assert!(report.contains("LF_HOST_ID"), "{report}");
        // One identity across two shared-memory groups.
        let merged = [peer(0, "a", 0), peer(1, "a", 1)];
        let report = topology_report(&merged);
        assert!(report.contains("ranks 0, 1 report the same host identity \"a\""), "{report}");
        assert!(report.contains("different value on each"), "{report}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let record = |name: &str| LocationRecord {
            name: ProcessName::new(name).unwrap(),
            location: ProcessLocation::new("h", None, None).unwrap(),
            gpu_uuids: vec![],
            shared_memory_group: 0,
        };
        let err = peers_from(vec![record("x"), record("y"), record("x")], 1).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert!(err.to_string().contains("\"x\" is used by MPI ranks 0 and 2"), "{err}");
        assert_eq!(peers_from(vec![record("x"), record("y")], 1).unwrap()[1].rank(), 1);
    }

    #[test]
    fn own_name_comes_from_the_argument_or_the_rank() {
        // LF_PROCESS_NAME is not touched here (tests share the environment); the C tests
        // launch processes with it.
        if std::env::var_os(PROCESS_NAME_ENV).is_none() {
            assert_eq!(describe_self(None, 7, 0).unwrap().name.as_str(), "rank7");
        }
        assert_eq!(describe_self(Some("loader"), 7, 0).unwrap().name.as_str(), "loader");
        assert!(matches!(describe_self(Some("a b"), 0, 0), Err(Error::InvalidArgument(_))));
    }

    #[cfg(not(feature = "mpi"))]
    #[test]
    fn without_the_feature_join_says_how_to_get_it() {
        let err = MpiWorld::join(Communicator::World, None).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)));
        assert!(err.to_string().contains("`mpi` feature"), "{err}");
    }
}
