//! Fan-in channels whose producers are on several hosts: this test starts itself under
//! `mpirun` with four ranks, which lava-flow sees on two hosts (`LF_HOST_ID`): the consumer
//! (rank 0) and one producer (rank 1) on host a, two producers (ranks 2 and 3) on host b,
//! with Open MPI's TCP path, so that the messages of ranks 2 and 3 really cross MPI while
//! rank 1's go through shared memory. Each producer's messages arrive in its order, exactly
//! once, marked with its slot; `peers()` says each slot's route and rank; a producer over
//! MPI that closes early is reported gone after its last message while the others go on; a
//! full fan-in, a producer of another kind and a second producer of one rank are refused,
//! saying why.
#![cfg(feature = "mpi")]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer, TransportKind, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::mpi::{Communicator, MpiWorld};
use lava_flow::Error;
use mpi_sys as ffi;

/// The hosts of ranks 0 to 3, as `LF_HOST_ID` names them.
const HOSTS: [&str; 4] = ["a", "a", "b", "b"];

/// Messages of the producers that go on to the end, and of the one that closes early.
const MESSAGES: u64 = 100_000;
const EARLY: u64 = 10_000;

/// The length of message `seq`: mostly small, some over a ring slot's inline bytes, a few
/// longer than an MPI chunk (sent in pieces).
fn size_of(seq: u64) -> usize {
    match seq % 25_000 {
        24_999 => (1 << 20) + 4321,
        n if n % 100 == 99 => 20_000,
        n => 12 + (n as usize * 7) % 300,
    }
}

fn fill(buf: &mut [u8], rank: u32, seq: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&rank.to_le_bytes());
    for (i, b) in buf[12..].iter_mut().enumerate() {
        *b = (seq as usize + rank as usize + i) as u8;
    }
}

/// The sender's rank and sequence number, once the bytes are checked.
fn check(buf: &[u8]) -> (u32, u64) {
    let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let rank = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    assert_eq!(buf.len(), size_of(seq), "rank {rank}'s message {seq}: its length");
    assert!(
        buf[12..].iter().enumerate().all(|(i, &b)| b == (seq as usize + rank as usize + i) as u8),
        "rank {rank}'s message {seq}: its bytes"
    );
    (rank, seq)
}

fn config(max_peers: u32) -> ChannelConfig {
    ChannelConfig {
        kind: ChannelKind::FanIn,
        max_peers,
        wait: WaitStrategy::BusyPoll,
        capacity: 64,
        pool_size: 4 << 20,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    }
}

fn context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    Context::new(config).unwrap()
}

/// Three producers on two hosts, each in order and exactly once; the one on host b that
/// closes early (rank 3) is reported gone, naming its slot, after its last message, and the
/// other two (which wait for that report halfway) go on to their end.
#[test]
fn a_fan_in_takes_producers_over_shm_and_mpi() {
    under_mpirun("a_fan_in_takes_producers_over_shm_and_mpi", |world| {
        let context = context();
        let name = "fan-in-hosts";
        let mine = world.me().location().clone();
        let early_gone = signal_dir().join("early-gone");
        if world.rank() == 0 {
            // The first producer is expected on this host; the others come over either carrier.
            let peer = world.peer(1).unwrap().location().clone();
            let mut c = Consumer::create(&context, name, &mine, &peer, &config(4)).unwrap();
            let reason = &c.transport().reason;
            assert!(reason.contains("takes producers over shm and mpi"), "{reason}");
            // Each slot's producer (rank) and its next sequence number.
            let mut slots: HashMap<u32, (u32, u64)> = HashMap::new();
            let mut received_after_early_gone = 0u64;
            let mut ended = Vec::new();
            let started = Instant::now();
            while ended.len() < 3 {
                match c.recv_timeout(Duration::from_secs(60)) {
                    Ok(m) => {
                        let (rank, seq) = check(&m);
                        let slot = m.producer();
                        let entry = slots.entry(slot).or_insert_with(|| {
                            let peer = c.peers().into_iter().find(|p| p.slot == slot).unwrap();
                            assert_ne!(peer.state, PeerState::Free, "slot {slot} serves rank {rank}: {peer:?}");
                            if rank == 1 {
                                assert_eq!((peer.route, peer.rank), (Some("shm"), None), "{peer:?}");
                                assert!(peer.pid != 0 && peer.host == mine.hostname, "{peer:?}");
                            } else {
                                assert_eq!((peer.route, peer.rank), (Some("mpi"), Some(rank as i32)), "{peer:?}");
                                assert_eq!(peer.host, world.peer(rank).unwrap().location().hostname, "{peer:?}");
                            }
                            (rank, 0)
                        });
                        assert_eq!(entry.0, rank, "slot {slot} carries one producer's messages");
                        assert_eq!((seq, m.sequence()), (entry.1, entry.1), "rank {rank}'s messages in order");
                        entry.1 += 1;
                        if early_gone.exists() {
                            received_after_early_gone += 1;
                        }
                    }
                    Err(Error::PeerGone(why)) => {
                        let slot = c.last_gone().expect("a fan-in names the slot that ended");
                        assert!(why.contains(&format!("slot {slot}")), "{why}");
                        let (rank, count) = slots.remove(&slot).expect("a slot that sent messages");
                        let expected = if rank == 3 { EARLY } else { MESSAGES };
                        assert_eq!(count, expected, "rank {rank}'s end comes after its last message");
                        if rank == 3 {
                            assert!(ended.is_empty(), "rank 3 closes first");
                            std::fs::write(&early_gone, b"gone").unwrap();
                        }
                        ended.push(rank);
                        println!("rank {rank} (slot {slot}) ended after {count} messages, {:?}", started.elapsed());
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(
                received_after_early_gone >= MESSAGES,
                "the other producers go on after one ended ({received_after_early_gone} messages after)"
            );
            assert_eq!(c.producers(), 0);
            assert!(c.peers().iter().all(|p| p.state == PeerState::Free), "{:?}", c.peers());
        } else {
            let peer = world.peer(0).unwrap().location().clone();
            let mut p = Producer::create(&context, name, &mine, &peer, &config(4)).unwrap();
            let expected = if world.rank() == 1 { TransportKind::Shm } else { TransportKind::Mpi };
            assert_eq!(p.transport().kind, expected, "{}", p.transport().reason);
            let count = if world.rank() == 3 { EARLY } else { MESSAGES };
            let rank = world.rank();
            let mut bytes = vec![0u8; 2 << 20];
            for seq in 0..count {
                if seq == MESSAGES / 2 {
                    // Halfway: the early one's end is reported first.
                    await_file(&early_gone);
                }
                let len = size_of(seq);
                let sent = if seq % 3 == 1 {
                    let mut loan = p.loan(len, None).unwrap();
                    fill(loan.as_mut_slice(), rank, seq);
                    loan.publish().unwrap()
                } else {
                    fill(&mut bytes[..len], rank, seq);
                    p.send(&bytes[..len]).unwrap()
                };
                assert_eq!(sent, seq);
            }
        }
    });
}

/// A fan-in of two (rank 1 over shared memory, rank 2 over MPI) refuses a third producer
/// over MPI, naming `max_peers`; a pair's producer of its name, saying that it is a fan-in;
/// a second producer of rank 2, saying one per rank. The two attached go on.
#[test]
fn a_full_fan_in_refuses_over_mpi() {
    under_mpirun("a_full_fan_in_refuses_over_mpi", |world| {
        let context = context();
        let name = "fan-in-full";
        let mine = world.me().location().clone();
        let dir = signal_dir();
        let (attached, finish) = (dir.join("attached"), dir.join("finish"));
        let refused = |rank: u32| dir.join(format!("refused-{rank}"));
        let to_consumer = || world.peer(0).unwrap().location().clone();
        match world.rank() {
            0 => {
                // The first producer is expected on the other host (the plan's carrier is mpi);
                // the consumer listens on shared memory all the same.
                let peer = world.peer(2).unwrap().location().clone();
                let mut c = Consumer::create(&context, name, &mine, &peer, &config(2)).unwrap();
                assert_eq!(c.transport().kind, TransportKind::Mpi);
                let reason = &c.transport().reason;
                assert!(reason.contains("takes producers over mpi and shm"), "{reason}");
                let mut received = Vec::new();
                // The producers' hellos are answered while the consumer receives.
                while received.len() < 2 || !refused(2).exists() || !refused(3).exists() {
                    match c.recv_timeout(Duration::from_millis(10)) {
                        Ok(m) => {
                            received.push((m.producer(), m.to_vec()));
                            if received.len() == 2 {
                                assert_eq!(c.producers(), 2);
                                std::fs::write(&attached, b"").unwrap();
                            }
                        }
                        Err(Error::Timeout(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                let peers = c.peers();
                assert_eq!(peers.len(), 2);
                assert!(peers.iter().all(|p| p.state == PeerState::Alive), "{peers:?}");
                let routes: Vec<_> = peers.iter().map(|p| (p.route, p.rank)).collect();
                assert!(routes.contains(&(Some("shm"), None)) && routes.contains(&(Some("mpi"), Some(2))), "{peers:?}");
                std::fs::write(&finish, b"").unwrap();
                let mut last = Vec::new();
                let mut gone = 0;
                while gone < 2 {
                    match c.recv_timeout(Duration::from_secs(60)) {
                        Ok(m) => last.push(m.to_vec()),
                        Err(Error::PeerGone(_)) => gone += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                last.sort();
                assert_eq!(last, [b"rank 1 goes on".to_vec(), b"rank 2 goes on".to_vec()]);
            }
            1 | 2 => {
                let mut p = Producer::create(&context, name, &mine, &to_consumer(), &config(2)).unwrap();
                p.send(format!("rank {} attached", world.rank()).as_bytes()).unwrap();
                if world.rank() == 2 {
                    await_file(&attached);
                    match Producer::create(&context, name, &mine, &to_consumer(), &config(2)) {
                        Err(Error::InvalidState(m)) => assert!(m.contains("one producer per MPI rank"), "{m}"),
                        other => panic!("a second producer of rank 2: {other:?}"),
                    }
                    std::fs::write(refused(2), b"").unwrap();
                }
                await_file(&finish);
                p.send(format!("rank {} goes on", world.rank()).as_bytes()).unwrap();
            }
            _ => {
                await_file(&attached);
                match Producer::create(&context, name, &mine, &to_consumer(), &config(2)) {
                    Err(Error::InvalidState(m)) => {
                        assert!(m.contains("is full: it takes max_peers = 2 producers"), "{m}")
                    }
                    other => panic!("a third producer of a fan-in of two: {other:?}"),
                }
                let pair = ChannelConfig { kind: ChannelKind::Pair, ..config(2) };
                match Producer::create(&context, name, &mine, &to_consumer(), &pair) {
                    Err(Error::InvalidState(m)) => {
                        assert!(m.contains("is a fan-in channel and this producer created a pair one"), "{m}")
                    }
                    other => panic!("a pair's producer on a fan-in: {other:?}"),
                }
                std::fs::write(refused(3), b"").unwrap();
            }
        }
    });
}

/// A folder every rank sees, for signals that must not go through MPI.
fn signal_dir() -> PathBuf {
    std::env::var_os("LF_TEST_SIGNALS").expect("under_mpirun sets LF_TEST_SIGNALS").into()
}

/// Waits for another rank to make `path` (two minutes at most: a rank that failed ends the
/// job).
fn await_file(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} never came", path.display());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `test` as the test named `name` on four ranks under mpirun, on the hosts of `HOSTS`
/// (this process starts mpirun, which starts the test again in each rank).
fn under_mpirun(name: &str, test: impl FnOnce(&MpiWorld)) {
    if std::env::var_os("OMPI_COMM_WORLD_RANK").is_some() {
        let world = MpiWorld::join(Communicator::World, None).unwrap();
        assert_eq!(world.size(), HOSTS.len() as u32);
        // A rank that fails ends the job: the others may wait for it (in MPI_Finalize when the
        // world goes) and would never return.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&world))).is_err() {
            // SAFETY: MPI is initialised; aborting the job is what a failed rank wants.
            unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
        }
        return;
    }
    let Ok(exe) = std::env::current_exe() else { panic!("no test executable") };
    let signals = std::env::temp_dir().join(format!("lf-mpi-fan-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&signals);
    std::fs::create_dir_all(&signals).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]);
    for (rank, host) in HOSTS.iter().enumerate() {
        if rank > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1", "-x", &format!("LF_HOST_ID={host}"), "-x"]);
        cmd.arg(format!("LF_TEST_SIGNALS={}", signals.display()));
        cmd.arg(&exe).args(["--exact", name, "--nocapture"]);
    }
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            assert!(std::env::var_os("LF_REQUIRE_MPI").is_none(), "LF_REQUIRE_MPI is set but mpirun cannot start: {e}");
            eprintln!("skipped: mpirun cannot start ({e})");
            return;
        }
    };
    let _ = std::fs::remove_dir_all(&signals);
    assert!(status.success(), "the four ranks of {name} under mpirun: {status}");
}
