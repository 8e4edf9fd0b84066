//! Joining MPI without being asked: under an MPI launcher, a context joins the job's
//! `MPI_COMM_WORLD` when it is created (`LF_MPI=auto`, the default), so that a program that
//! never calls MPI reaches its peers on other hosts with locations from a config file: a
//! location that names a process is found through discovery by that name.

#[cfg(feature = "mpi")]
use super::{live_world, Communicator, MpiWorld, WORLDS};
#[cfg(feature = "mpi")]
use crate::error::{Error, Result};
#[cfg(feature = "mpi")]
use crate::types::ProcessLocation;

/// The environment variable that turns the join at context creation off (`LF_MPI=off`).
pub const MPI_ENV: &str = crate::env::MPI.name;

/// The variables MPI launchers set in every process they start, and who sets them. Any one
/// of them means "started by an MPI launcher"; none is set by MPI itself, so a program that
/// initialised MPI as a singleton (no launcher) is not taken for one.
const LAUNCHER_VARS: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMIX_RANK", "a PMIx launcher (Open MPI 5's mpirun, srun --mpi=pmix)"),
    ("PMI_RANK", "a PMI launcher (MPICH's and Intel MPI's mpiexec, srun --mpi=pmi2)"),
    ("PMI_SIZE", "a PMI launcher (MPICH's and Intel MPI's mpiexec, srun --mpi=pmi2)"),
    ("MPI_LOCALNRANKS", "MPICH's mpiexec"),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's mpirun_rsh"),
];

/// Whether this process was started by an MPI launcher: the variable that says so and who
/// sets it (`OMPI_COMM_WORLD_SIZE`, `PMIX_RANK`, `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALNRANKS` or
/// `MV2_COMM_WORLD_SIZE`, set and not empty), or `None`.
pub fn launcher() -> Option<(&'static str, &'static str)> {
    LAUNCHER_VARS.iter().copied().find(|(var, _)| std::env::var_os(var).is_some_and(|v| !v.is_empty()))
}

/// Whether `LF_MPI` lets a context join by itself: `Ok(true)` for `auto` (or unset, or
/// empty), `Ok(false)` for `off`.
#[cfg(feature = "mpi")]
fn auto_join_allowed() -> Result<bool> {
    match std::env::var(MPI_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(true),
        Ok(value) => match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(true),
            "off" => Ok(false),
            _ => Err(Error::invalid(format!(
                "{MPI_ENV}={value:?} is neither auto nor off; set {MPI_ENV}=auto (join MPI at context creation \
                 under an MPI launcher) or {MPI_ENV}=off (only lf_mpi_join joins), or unset it"
            ))),
        },
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::invalid(format!("{MPI_ENV} is not valid UTF-8; set it to auto or off, or unset it")))
        }
    }
}

/// Only one context joins at a time: two at once would make two collectives.
#[cfg(feature = "mpi")]
static JOINING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// The join a context makes when it is created: none outside an MPI launcher or with
/// `LF_MPI=off`; the world over `MPI_COMM_WORLD` already joined in this process if one is
/// alive (no collective); none once MPI has been finalized; else a new join of
/// `MPI_COMM_WORLD` (a collective: every rank must create a context), naming this process
/// by `LF_PROCESS_NAME` or `rank<N>`. The context holds the world for its life.
#[cfg(feature = "mpi")]
pub(crate) fn join_for_context() -> Result<Option<MpiWorld>> {
    let Some((var, who)) = launcher() else {
        return Ok(None);
    };
    if !auto_join_allowed()? {
        log::debug!("{MPI_ENV}=off: this context does not join MPI ({var} says {who} started this process)");
        return Ok(None);
    }
    let _one_at_a_time = JOINING.lock();
    if let Some(world) = live_world(|w| w.over_world) {
        return Ok(Some(world));
    }
    if super::runtime::finalized()? {
        log::info!(
            "MPI has been finalized in this process, so this context does not join it: channels of this context \
             reach other hosts only through locations of a world joined before"
        );
        return Ok(None);
    }
    let world = MpiWorld::join_new(Communicator::World, None, true).map_err(|e| {
        let why = format!(
            "joining MPI at context creation ({who} started this process: {var} is set; every rank must create a \
             context, or set {MPI_ENV}=off and join with lf_mpi_join where wanted)"
        );
        match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{why}: {m}")),
            Error::InvalidState(m) => Error::InvalidState(format!("{why}: {m}")),
            Error::NotFound(m) => Error::NotFound(format!("{why}: {m}")),
            Error::Unsupported(m) => Error::Unsupported(format!("{why}: {m}")),
            Error::Corrupt(m) => Error::Corrupt(format!("{why}: {m}")),
            other => other,
        }
    })?;
    log::info!(
        "this context joined MPI by itself as rank {} of {} ({}), because {who} started this process ({var} is set; \
         {MPI_ENV}=off turns this off)",
        world.rank(),
        world.size(),
        world.me().name()
    );
    Ok(Some(world))
}

/// An explicit join of `MPI_COMM_WORLD` after a context joined it by itself: the same join,
/// if it names this process as that one did (or names none).
#[cfg(feature = "mpi")]
pub(super) fn same_join(world: MpiWorld, process_name: Option<&str>) -> Result<MpiWorld> {
    match process_name {
        Some(name) if name != world.me().name().as_str() => Err(Error::InvalidState(format!(
            "this process joined MPI when its context was created (under an MPI launcher), as {:?}; a join cannot \
             rename it {name:?} without a second collective. Name it with {} before creating the context, pass \
             NULL (None) as the name, or set {MPI_ENV}=off to join only here",
            world.me().name().as_str(),
            super::PROCESS_NAME_ENV
        ))),
        _ => Ok(world),
    }
}

/// The location a channel uses for `location`, where it is one read from a config file (a
/// name, no MPI address) and this process joined an MPI world that has a process of that
/// name: where discovery found that process (hostname, host identity, MPI rank), with the
/// config's NUMA node and device. `None` where that does not apply.
#[cfg(feature = "mpi")]
pub(crate) fn resolve(location: &ProcessLocation) -> Option<ProcessLocation> {
    let name = location.name.as_ref().filter(|_| location.mpi.is_none())?;
    let worlds = WORLDS.lock();
    let found = worlds
        .iter()
        .rev()
        .filter(|w| w.comm.strong_count() > 0)
        .find_map(|w| w.peers.iter().find(|p| p.name() == name))?;
    let mut resolved = found.location().clone();
    resolved.node_id = location.node_id.or(resolved.node_id);
    resolved.device_id = location.device_id.or(resolved.device_id);
    resolved.name = Some(name.clone());
    Some(resolved)
}

/// This process as discovery found it in the world of `peer` (a location that `resolve`
/// gave), for a location of its own that does not say which host it is on.
#[cfg(feature = "mpi")]
pub(crate) fn here_in_world_of(peer: &ProcessLocation) -> Option<ProcessLocation> {
    let address = peer.mpi?;
    let worlds = WORLDS.lock();
    let world = worlds.iter().find(|w| w.id == address.world && w.comm.strong_count() > 0)?;
    world.peers.get(world.rank as usize).map(|me| me.location().clone())
}

/// Why a location without an MPI address cannot be reached over MPI, for the channel's
/// refusal: what this process joined, and what to change.
#[cfg(feature = "mpi")]
pub(crate) fn unresolved_reason(location: &ProcessLocation) -> String {
    let worlds = WORLDS.lock();
    let live: Vec<_> = worlds.iter().rev().filter(|w| w.comm.strong_count() > 0).collect();
    let Some(world) = live.first() else {
        let (why, fix) = match (launcher(), auto_join_allowed()) {
            (Some(_), Ok(false)) => (
                format!("{MPI_ENV}=off is set, so contexts do not join MPI by themselves"),
                format!("unset {MPI_ENV} (or set it to auto)"),
            ),
            (Some(_), _) => (
                "this process has not joined MPI (MPI had been finalized when its context was created)".to_owned(),
                "create the context before MPI is finalized".to_owned(),
            ),
            (None, _) => (
                "this process was not started by an MPI launcher, so its contexts do not join MPI by themselves"
                    .to_owned(),
                "launch every process with mpirun, mpiexec or srun".to_owned(),
            ),
        };
        return format!(
            "mpi needs the peer's location from MPI discovery, which carries its rank, and {why}: {fix}, and take \
             the peer's location from a config file that names it"
        );
    };
    match &location.name {
        Some(name) => {
            let mut known: Vec<&str> = world.peers.iter().take(16).map(|p| p.name().as_str()).collect();
            if world.peers.len() > 16 {
                known.push("...");
            }
            format!(
                "mpi: no process of the MPI world joined here is named {:?} (they are: {}); name each process as the \
                 config file does ({} before the context is created), or name the config's processes as MPI \
                 discovery does (rank<N>)",
                name.as_str(),
                known.join(", "),
                super::PROCESS_NAME_ENV
            )
        }
        None => "mpi needs the peer's location from MPI discovery (lf_mpi_location), which carries its rank, or one \
                 from a config file, which names the process"
            .to_owned(),
    }
}
