//! Fan-in channels whose producers are on several hosts: this test starts itself under
//! `mpirun` with four ranks, which lava-flow sees on two hosts (`LF_HOST_ID`): the consumer
//! (rank 0) and one producer (rank 1) on host a, two producers (ranks 2 and 3) on host b,
//! with Open MPI's TCP path, so that the messages of ranks 2 and 3 really cross MPI while
//! rank 1's go through shared memory. Each producer's messages arrive in its order, exactly
//! once, marked with its slot; `peers()` says each slot's route and rank; a producer over
//! MPI that closes early is reported gone after its last message while the others go on; a
//! full fan-in, a producer of another kind and a second producer of one rank are refused,
//! saying why.
//!
//! Fan-outs the other way round: the producer (rank 0) sends every message to a consumer on
//! its host over shared memory (rank 1) and to two on host b over MPI (ranks 2 and 3), copies,
//! loans, buffers by reference and GPU buffers (staged), each consumer in order; a remote
//! consumer that closes early is dropped while the others go on, and comes back as a late
//! consumer that starts at the producer's next message; a full fan-out refuses a consumer over
//! MPI, naming `max_peers`; a slow consumer over MPI is detached and says so.
#![cfg(feature = "mpi")]

#[path = "common/mpirun.rs"]
mod mpirun;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer, TransportKind, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::mpi::{Communicator, MpiWorld};
use lava_flow::Error;
use mpi_sys as ffi;

/// The hosts of ranks 0 to 3, as `LF_HOST_ID` names them.
const HOSTS: [&str; 4] = ["a", "a", "b", "b"];

/// Messages of the producers that go on to the end, and of the one that closes early.
const MESSAGES: u64 = 100_000;
const EARLY: u64 = 10_000;

/// The length of message `seq`: mostly small, some over a ring slot's inline bytes (those a
/// fan-out sends from buffers among them: smaller ones are copied), a few longer than an MPI
/// chunk (sent in pieces).
fn size_of(seq: u64) -> usize {
    match seq % 25_000 {
        24_999 => (1 << 20) + 4321,
        n if n % 100 == 99 || n % 1000 == 500 || n % 1000 == 700 => 20_000,
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

fn fan_out_config(max_peers: u32) -> ChannelConfig {
    ChannelConfig { kind: ChannelKind::FanOut, wait: WaitStrategy::default(), ..config(max_peers) }
}

/// Messages of the fan-out, and where its early consumer closes.
const FAN_MESSAGES: u64 = 30_000;
const FAN_EARLY: u64 = 5_000;

/// How the fan-out's producer sends message `seq`: a copy, a loan, a buffer by reference, or
/// a GPU buffer (staged to every consumer, none of which imports GPU memory).
#[derive(Clone, Copy, Debug, PartialEq)]
enum How {
    Copy,
    Loan,
    Buffer,
    Gpu,
}

fn how(seq: u64) -> How {
    match seq % 1000 {
        500 => How::Buffer,
        700 => How::Gpu,
        n if n % 3 == 1 => How::Loan,
        _ => How::Copy,
    }
}

/// Every consumer the producer has (met ones included: its next send takes them up), once
/// there are `count`.
fn wait_consumers(p: &Producer, count: usize) -> Vec<lava_flow::channels::Peer> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let peers = p.peers();
        if peers.iter().filter(|c| c.state == PeerState::Alive).count() == count {
            return peers.into_iter().filter(|c| c.state == PeerState::Alive).collect();
        }
        assert!(Instant::now() < deadline, "{peers:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Receives the fan-out's messages from `first` on (the sender's numbering) in order, each
/// numbered from 0 at this consumer, up to the producer's close.
fn receive_fan_out(c: &mut Consumer, first: Option<u64>, until: u64) -> u64 {
    let mut expected = first;
    let mut count = 0;
    loop {
        let m = match c.recv_timeout(Duration::from_secs(60)) {
            Ok(m) => m,
            Err(Error::PeerGone(_)) => return count,
            Err(e) => panic!("{e}"),
        };
        let (rank, seq) = check(&m);
        assert_eq!(rank, 0);
        assert_eq!(seq, *expected.get_or_insert(seq), "message {count} at this consumer");
        assert_eq!(m.sequence(), count, "a consumer numbers its messages from 0");
        if how(seq) == How::Buffer {
            assert!(m.is_zero_copy(), "message {seq} was sent by reference");
        }
        expected = Some(seq + 1);
        count += 1;
        if seq + 1 == until {
            return count;
        }
    }
}

/// A fan-out to three consumers: rank 1 on the producer's host over shared memory, ranks 2
/// and 3 on host b over MPI. Each gets every message in order, whatever its kind and size;
/// rank 3 closes early, is dropped while the others go on, and joins again: a late consumer
/// that starts at the producer's next message. The last message completes once every
/// consumer released it.
#[test]
fn a_fan_out_sends_to_consumers_over_shm_and_mpi() {
    under_mpirun("a_fan_out_sends_to_consumers_over_shm_and_mpi", |world| {
        let name = "fan-out-hosts";
        let mine = world.me().location().clone();
        let dir = signal_dir();
        let (early_gone, rejoin, rejoined) = (dir.join("early-gone"), dir.join("rejoin"), dir.join("rejoined"));
        let to_producer = || world.peer(0).unwrap().location().clone();
        if world.rank() == 0 {
            // A GPU buffer needs a device; where there is none, those messages go as copies.
            let context = Context::new(ContextConfig::default()).unwrap();
            let gpu = context.gpu_unavailable_reason().is_none();
            let peer = world.peer(1).unwrap().location().clone();
            let mut p = Producer::create(&context, name, &mine, &peer, &fan_out_config(3)).unwrap();
            let reason = &p.transport().reason;
            assert!(reason.contains("takes consumers over shm and mpi"), "{reason}");
            for peer in wait_consumers(&p, 3) {
                if peer.route == Some("shm") {
                    assert!(peer.pid != 0 && peer.host == mine.hostname && peer.rank.is_none(), "{peer:?}");
                } else {
                    assert_eq!(peer.route, Some("mpi"), "{peer:?}");
                    let rank = peer.rank.expect("an MPI consumer's rank") as u32;
                    assert!(rank == 2 || rank == 3, "{peer:?}");
                    assert_eq!(peer.host, world.peer(rank).unwrap().location().hostname, "{peer:?}");
                }
            }
            let mut bytes = vec![0u8; 2 << 20];
            // Buffers sent by reference stay untouched until the end.
            let mut kept = Vec::new();
            let mut last = 0;
            for seq in 0..FAN_MESSAGES {
                if seq == FAN_MESSAGES / 2 {
                    await_file(&early_gone);
                }
                if seq == 3 * FAN_MESSAGES / 4 {
                    // Rank 3's first end was dropped meanwhile (what it sent there after rank 3
                    // closed lies unread in MPI); its second is taken up now.
                    assert_eq!(wait_consumers(&p, 2).len(), 2);
                    std::fs::write(&rejoin, b"").unwrap();
                    await_file(&rejoined);
                    wait_consumers(&p, 3);
                }
                let len = size_of(seq);
                let sent = match how(seq) {
                    How::Loan => {
                        let mut loan = p.loan(len, None).unwrap();
                        fill(loan.as_mut_slice(), 0, seq);
                        loan.publish().unwrap()
                    }
                    How::Buffer | How::Gpu => {
                        let location = if how(seq) == How::Gpu && gpu {
                            MemoryLocation::GpuDeviceLocal
                        } else {
                            MemoryLocation::CpuStandard
                        };
                        let buffer = context.allocate(len, location).unwrap();
                        fill(&mut bytes[..len], 0, seq);
                        buffer.write_at(0, &bytes[..len]).unwrap();
                        let sent = p.send_buffer(&buffer, 0, len).unwrap();
                        kept.push(buffer);
                        sent
                    }
                    How::Copy => {
                        fill(&mut bytes[..len], 0, seq);
                        p.send(&bytes[..len]).unwrap()
                    }
                };
                assert_eq!(sent, seq);
                last = sent;
            }
            p.wait_completed(last, Some(Duration::from_secs(60))).unwrap();
            assert_eq!(p.completed().unwrap(), FAN_MESSAGES);
            let alive = p.peers().iter().filter(|c| c.state == PeerState::Alive).count();
            assert_eq!(alive, 3, "{:?}", p.peers());
        } else {
            let context = context();
            let mut c = Consumer::create(&context, name, &mine, &to_producer(), &fan_out_config(3)).unwrap();
            let expected = if world.rank() == 1 { TransportKind::Shm } else { TransportKind::Mpi };
            assert_eq!(c.transport().kind, expected, "{}", c.transport().reason);
            if world.rank() == 3 {
                assert_eq!(receive_fan_out(&mut c, Some(0), FAN_EARLY), FAN_EARLY);
                drop(c);
                std::fs::write(&early_gone, b"").unwrap();
                // A late consumer of the same rank: from the producer's next message on.
                await_file(&rejoin);
                let mut c = Consumer::create(&context, name, &mine, &to_producer(), &fan_out_config(3)).unwrap();
                std::fs::write(&rejoined, b"").unwrap();
                let first = 3 * FAN_MESSAGES / 4;
                assert_eq!(receive_fan_out(&mut c, Some(first), u64::MAX), FAN_MESSAGES - first);
            } else {
                assert_eq!(receive_fan_out(&mut c, Some(0), u64::MAX), FAN_MESSAGES);
            }
        }
    });
}

/// A fan-out of two (rank 1 over shared memory, rank 2 over MPI) refuses a third consumer
/// over MPI, naming `max_peers`. Rank 2 then stops reading: the producer detaches it after
/// its `slow_consumer_timeout` and goes on with rank 1; rank 2 reads what it had, then learns
/// that it was detached; rank 3 takes the slot it left and starts at the next message.
#[test]
fn a_full_fan_out_refuses_and_a_slow_consumer_is_detached_over_mpi() {
    under_mpirun("a_full_fan_out_refuses_and_a_slow_consumer_is_detached_over_mpi", |world| {
        let context = context();
        let name = "fan-out-full";
        let mine = world.me().location().clone();
        let dir = signal_dir();
        let signal = |what: &str| dir.join(what);
        let bounded =
            || ChannelConfig { capacity: 4, slow_consumer_timeout: Some(Duration::from_secs(2)), ..fan_out_config(2) };
        let to_producer = || world.peer(0).unwrap().location().clone();
        match world.rank() {
            0 => {
                let peer = world.peer(2).unwrap().location().clone();
                // The report names the carrier of the consumer met first: rank 1 over shm and rank
                // 2 over MPI race to attach, so only the routes of both, once attached, are known.
                let mut p = Producer::create(&context, name, &mine, &peer, &bounded()).unwrap();
                let routes: Vec<_> = wait_consumers(&p, 2).into_iter().map(|c| c.route).collect();
                assert!(routes.contains(&Some("shm")) && routes.contains(&Some("mpi")), "{routes:?}");
                std::fs::write(signal("attached"), b"").unwrap();
                await_file(&signal("refused"));
                for seq in 0..50u64 {
                    p.send_timeout(&seq.to_le_bytes(), Duration::from_secs(30)).unwrap();
                }
                let alive: Vec<_> = p.peers().into_iter().filter(|c| c.state == PeerState::Alive).collect();
                assert_eq!(alive.len(), 1, "the slow consumer was detached: {alive:?}");
                assert_eq!(alive[0].route, Some("shm"), "{alive:?}");
                std::fs::write(signal("detached"), b"").unwrap();
                // Rank 3 takes the slot left, and starts at the next message.
                wait_consumers(&p, 2);
                let last = p.send(&1000u64.to_le_bytes()).unwrap();
                p.wait_completed(last, Some(Duration::from_secs(30))).unwrap();
                await_file(&signal("done"));
            }
            1 => {
                let mut c = Consumer::create(&context, name, &mine, &to_producer(), &bounded()).unwrap();
                for seq in 0..50u64 {
                    assert_eq!(&*c.recv_timeout(Duration::from_secs(60)).unwrap(), &seq.to_le_bytes());
                }
                assert_eq!(&*c.recv_timeout(Duration::from_secs(60)).unwrap(), &1000u64.to_le_bytes());
                assert!(matches!(c.recv_timeout(Duration::from_secs(60)), Err(Error::PeerGone(_))));
            }
            2 => {
                let mut c = Consumer::create(&context, name, &mine, &to_producer(), &bounded()).unwrap();
                await_file(&signal("detached"));
                let mut got = 0u64;
                let err = loop {
                    match c.recv_timeout(Duration::from_secs(60)) {
                        Ok(m) => {
                            assert_eq!(&*m, &got.to_le_bytes());
                            got += 1;
                        }
                        Err(e) => break e,
                    }
                };
                assert!(got <= 4, "{got} messages: more than the capacity");
                assert!(matches!(&err, Error::PeerGone(why) if why.contains("detached")), "{err}");
            }
            _ => {
                await_file(&signal("attached"));
                match Consumer::create(&context, name, &mine, &to_producer(), &bounded()) {
                    Err(Error::InvalidState(m)) => {
                        assert!(m.contains("fan-out channel \"fan-out-full\" is full: it takes max_peers = 2"), "{m}")
                    }
                    other => panic!("a third consumer of a fan-out of two: {:?}", other.map(|_| ())),
                }
                std::fs::write(signal("refused"), b"").unwrap();
                await_file(&signal("detached"));
                let mut c = Consumer::create(&context, name, &mine, &to_producer(), &bounded()).unwrap();
                let m = c.recv_timeout(Duration::from_secs(60)).unwrap();
                assert_eq!((&*m, m.sequence()), (&1000u64.to_le_bytes()[..], 0), "a late consumer counts from 0");
                drop(m);
                std::fs::write(signal("done"), b"").unwrap();
                assert!(matches!(c.recv_timeout(Duration::from_secs(60)), Err(Error::PeerGone(_))));
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
    mpirun::run_ranks(cmd, name, "four", &signals);
}
