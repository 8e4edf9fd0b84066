//! A program that never joins MPI itself, started by `mpirun` with both locations from a
//! config file: its context joins MPI by itself when it is created, and its channel finds the
//! peer named in the config through discovery. On two host identities (`LF_HOST_ID=a` and
//! `b`) the messages cross MPI (Open MPI's TCP path); on one they go over shared memory; the
//! program is the same. `LF_MPI=off` turns the join off and brings back the refusal, naming
//! `LF_MPI`. An explicit join after the automatic one is that join again: no collective.
#![cfg(feature = "mpi")]

#[path = "common/mpirun.rs"]
mod mpirun;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, TransportKind};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::mpi::{Communicator, MpiWorld};
use lava_flow::{Error, ProcessLocation, ProcessName};
use mpi_sys as ffi;

const MESSAGES: u64 = 300;

/// Message `seq`: small ones, and every hundredth over a mebibyte (sent in chunks).
fn message(seq: u64) -> Vec<u8> {
    let len = if seq % 100 == 99 { (1 << 20) + 3 } else { 8 + (seq as usize * 13) % 500 };
    (0..len).map(|i| (seq as usize * 31 + i) as u8).collect()
}

/// The rank mpirun gave this process; `None` outside mpirun.
fn rank() -> Option<u32> {
    std::env::var("OMPI_COMM_WORLD_RANK").ok().map(|r| r.parse().expect("a rank"))
}

fn location(config: &Path, name: &str) -> ProcessLocation {
    ProcessLocation::from_config(config, &ProcessName::new(name).unwrap()).unwrap()
}

fn context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    Context::new(config).unwrap()
}

fn channel_config() -> ChannelConfig {
    ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(60)), ..ChannelConfig::default() }
}

/// The rank's half: what the program of a new user does, with no MPI call of its own. Rank 0
/// produces; `names` are the config's process names of ranks 0 and 1.
fn exchange(names: [&str; 2], expected: TransportKind) {
    let rank = rank().unwrap() as usize;
    let config = PathBuf::from(std::env::var("LF_TEST_CONFIG").unwrap());
    let context = context();
    let (mine, peer) = (location(&config, names[rank]), location(&config, names[1 - rank]));
    if rank == 0 {
        let mut p = Producer::create(&context, "from-config", &mine, &peer, &channel_config()).unwrap();
        assert_eq!(p.transport().kind, expected, "{}", p.transport().reason);
        for seq in 0..MESSAGES {
            assert_eq!(p.send(&message(seq)).unwrap(), seq);
        }
        p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(60))).unwrap();
    } else {
        let mut c = Consumer::create(&context, "from-config", &mine, &peer, &channel_config()).unwrap();
        assert_eq!(c.transport().kind, expected, "{}", c.transport().reason);
        for seq in 0..MESSAGES {
            let m = c.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|e| panic!("message {seq}: {e}"));
            assert_eq!(m.sequence(), seq);
            assert!(*m == message(seq)[..], "message {seq}'s bytes");
        }
    }
    explicit_join_is_the_same(rank as u32, names);
}

/// An explicit join of `MPI_COMM_WORLD` after the context's: the same world, made without a
/// collective (rank 0 alone joins again, while rank 1 waits for it in no MPI call), with the
/// names the context's join found; a join that renames the process is refused.
fn explicit_join_is_the_same(rank: u32, names: [&str; 2]) {
    let signal = PathBuf::from(std::env::var("LF_TEST_SIGNALS").unwrap()).join("joined-again");
    if rank == 0 {
        let world = MpiWorld::join(Communicator::World, None).unwrap();
        assert_eq!((world.rank(), world.size()), (0, 2));
        assert!(world.initialised_mpi(), "the context initialised MPI: the application did not");
        assert_eq!(world.rank_of(names[1]).unwrap(), 1);
        assert_eq!(world.me().name().as_str(), names[0]);
        let again = MpiWorld::join(Communicator::World, Some(names[0])).unwrap();
        assert_eq!(again.peers(), world.peers());
        let err = MpiWorld::join(Communicator::World, Some("renamed")).unwrap_err();
        assert!(matches!(err, Error::InvalidState(ref m) if m.contains("LF_PROCESS_NAME")), "{err}");
        std::fs::write(&signal, b"").unwrap();
    } else {
        let start = Instant::now();
        while !signal.exists() {
            assert!(start.elapsed() < Duration::from_secs(60), "rank 0's explicit join did not return");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs `child` in each of two ranks under mpirun (this process starts mpirun, which starts
/// the test `name` again in each rank), rank `i` with the environment `envs[i]`, both with
/// the config file `config`.
fn under_mpirun(name: &str, config: &str, envs: [&[(&str, &str)]; 2], child: impl FnOnce()) {
    if rank().is_some() {
        // A rank that fails ends the job: its peer may wait for it in MPI and never return.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).is_err() {
            let mut initialised = 0;
            // SAFETY: MPI_Initialized may be called at any time; the out-pointer is valid.
            unsafe { ffi::MPI_Initialized(&mut initialised) };
            if initialised != 0 {
                // SAFETY: MPI is initialised; aborting the job is what a failed rank wants.
                unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
            }
            std::process::exit(1);
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("lf-mpi-auto-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config_path = dir.join("processes.json");
    std::fs::write(&config_path, config).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]);
    for (i, env) in envs.iter().enumerate() {
        if i == 1 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1"]);
        let common =
            [("LF_TEST_CONFIG", config_path.display().to_string()), ("LF_TEST_SIGNALS", dir.display().to_string())];
        for (key, value) in env.iter().map(|(k, v)| (*k, v.to_string())).chain(common) {
            cmd.args(["-x", &format!("{key}={value}")]);
        }
        cmd.arg(&exe).args(["--exact", name, "--nocapture"]);
    }
    mpirun::run_ranks(cmd, name, "two", &dir);
}

/// A config a user would write: the processes by name, on the hosts they were meant for.
const BY_NAME: &str = r#"{"processes": [
    {"name": "producer", "hostname": "node-a"},
    {"name": "consumer", "hostname": "node-b"}
]}"#;

/// The same config naming the processes as discovery does without LF_PROCESS_NAME.
const BY_RANK: &str = r#"{"processes": [
    {"name": "rank0", "hostname": "node-a"},
    {"name": "rank1", "hostname": "node-b"}
]}"#;

#[test]
fn config_locations_reach_another_host_over_mpi_without_a_join() {
    under_mpirun(
        "config_locations_reach_another_host_over_mpi_without_a_join",
        BY_NAME,
        [
            &[("LF_HOST_ID", "a"), ("LF_PROCESS_NAME", "producer")],
            &[("LF_HOST_ID", "b"), ("LF_PROCESS_NAME", "consumer")],
        ],
        || exchange(["producer", "consumer"], TransportKind::Mpi),
    );
}

#[test]
fn the_same_program_on_one_host_goes_over_shared_memory() {
    // The config's hostnames differ, but discovery finds both processes on host "a".
    under_mpirun(
        "the_same_program_on_one_host_goes_over_shared_memory",
        BY_RANK,
        [&[("LF_HOST_ID", "a")], &[("LF_HOST_ID", "a")]],
        || exchange(["rank0", "rank1"], TransportKind::Shm),
    );
}

#[test]
fn lf_mpi_off_keeps_the_refusal_and_names_it() {
    under_mpirun(
        "lf_mpi_off_keeps_the_refusal_and_names_it",
        BY_RANK,
        [&[("LF_HOST_ID", "a"), ("LF_MPI", "off")], &[("LF_HOST_ID", "b"), ("LF_MPI", "off")]],
        || {
            let rank = rank().unwrap() as usize;
            let config = PathBuf::from(std::env::var("LF_TEST_CONFIG").unwrap());
            let context = context();
            let names = ["rank0", "rank1"];
            let (mine, peer) = (location(&config, names[rank]), location(&config, names[1 - rank]));
            let err = Producer::create(&context, "refused", &mine, &peer, &channel_config()).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported(ref m) if m.contains("LF_MPI=off") && m.contains("MPI discovery")),
                "{err}"
            );
            let mut initialised = 0;
            // SAFETY: MPI_Initialized may be called at any time; the out-pointer is valid.
            unsafe { ffi::MPI_Initialized(&mut initialised) };
            assert_eq!(initialised, 0, "LF_MPI=off: the context left MPI alone");
        },
    );
}
