//! Blocked waits sleep: a consumer blocked in recv, a producer blocked for room and one
//! blocked for a completion each sleep through a second without waking up (a handful of
//! voluntary context switches, not one every few milliseconds), and still see kill -9 of
//! their peer within milliseconds. The process's watcher, which reports a peer's end, is one
//! thread for many channels and leaves no thread or descriptor behind once they close.

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer};
use lava_flow::Error;

use crate::common::*;

/// The most voluntary context switches a wait of [`QUIET_WAIT`] may make: one to sleep, one at
/// the deadline, and a few for whatever else the machine does to the thread. A wait that
/// polled its peer every 15 ms would make about 67.
const MAX_SWITCHES: u64 = 5;
const QUIET_WAIT: Duration = Duration::from_secs(1);
/// How soon a blocked side must see its peer's death: the watcher reports it in well under a
/// millisecond; the bound leaves room for a loaded machine.
const DEATH_BOUND_MS: f64 = 100.0;

/// Keeps a peer alive until it is killed, or for a minute: a failed orchestrator leaves no
/// process behind for long.
fn linger() {
    std::thread::sleep(Duration::from_secs(60));
}

/// This thread's voluntary context switches so far.
fn voluntary_switches() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let line =
        status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).expect("voluntary_ctxt_switches in status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs `wait` (which must end with `Timeout` after [`QUIET_WAIT`]) and returns how many
/// voluntary context switches it made.
fn switches_during(what: &str, wait: impl FnOnce() -> Error) -> u64 {
    let (before, start) = (voluntary_switches(), Instant::now());
    let err = wait();
    let (switches, waited) = (voluntary_switches() - before, start.elapsed());
    assert!(matches!(err, Error::Timeout(_)), "{what}: {err}");
    assert!(waited >= QUIET_WAIT && waited < QUIET_WAIT * 5, "{what}: waited {waited:?}");
    switches
}

/// The blocked side of each case: the consumer in recv, the producer for room (a full ring),
/// the producer for a completion (a message the consumer holds). Each waits out
/// [`QUIET_WAIT`], reports its context switches, then blocks again until its peer dies.
#[test]
fn a_blocked_side_sleeps_and_still_sees_its_peer_die() {
    const TEST: &str = "blocked::a_blocked_side_sleeps_and_still_sees_its_peer_die";
    let cfg = |wait: &str| ChannelConfig { capacity: 4, ..config(strategy(wait)) };
    match child_role().as_deref() {
        Some("blocked") => {
            let case = arg("case");
            let gone = if case == "recv" {
                let mut c = Consumer::create(&ctx(), "quiet", &here(), &here(), &cfg(&arg("wait"))).unwrap();
                assert_eq!(&*c.recv().unwrap(), b"hello");
                let switches = switches_during("recv", || c.recv_timeout(QUIET_WAIT).unwrap_err());
                report("switches", switches);
                report("waiting", 1);
                c.recv_timeout(Duration::from_secs(20)).unwrap_err()
            } else {
                let mut p = Producer::create(&ctx(), "quiet", &here(), &here(), &cfg(&arg("wait"))).unwrap();
                // A full ring, which the consumer never drains; it holds message 0 (in the
                // completion case), which is never complete while the consumer lives.
                for _ in 0..4 {
                    p.send(b"fill").unwrap();
                }
                let switches = if case == "room" {
                    switches_during("send", || p.send_timeout(b"more", QUIET_WAIT).unwrap_err())
                } else {
                    switches_during("wait_completed", || p.wait_completed(0, Some(QUIET_WAIT)).unwrap_err())
                };
                report("switches", switches);
                report("waiting", 1);
                if case == "room" {
                    p.send_timeout(b"more", Duration::from_secs(20)).unwrap_err()
                } else {
                    p.wait_completed(0, Some(Duration::from_secs(20))).unwrap_err()
                }
            };
            let gone_at = monotonic_ns();
            assert!(matches!(gone, Error::PeerGone(_)), "{gone}");
            report("gone_at", gone_at);
        }
        Some("peer") => {
            if arg("case") == "recv" {
                let mut p = Producer::create(&ctx(), "quiet", &here(), &here(), &cfg(&arg("wait"))).unwrap();
                p.send(b"hello").unwrap();
                report("ready", 1);
                linger();
            }
            let mut c = Consumer::create(&ctx(), "quiet", &here(), &here(), &cfg(&arg("wait"))).unwrap();
            // Room: nothing received; completion: message 0 received and held for good.
            let _held = if arg("case") == "completion" { Some(c.recv().unwrap()) } else { None };
            report("ready", 1);
            linger();
        }
        Some(_) => {}
        None => {
            for case in ["recv", "room", "completion"] {
                for wait in ["block", "spin"] {
                    let dir = test_dir(&format!("quiet-{case}-{wait}"));
                    let args = [("case", case.to_owned()), ("wait", wait.to_owned())];
                    let (blocked, mut blocked_out) = spawn_reporting(TEST, "blocked", &dir, &args);
                    let (mut peer, mut peer_out) = spawn_reporting(TEST, "peer", &dir, &args);
                    expect_line(&mut peer_out, "ready");
                    let switches: u64 = expect_line(&mut blocked_out, "switches").parse().unwrap();
                    println!("{case} ({wait}): {switches} voluntary context switches in a {QUIET_WAIT:?} wait");
                    assert!(
                        switches < MAX_SWITCHES,
                        "{case} ({wait}): a blocked wait of {QUIET_WAIT:?} made {switches} voluntary context switches"
                    );
                    expect_line(&mut blocked_out, "waiting");
                    let ms = ms_until_death_seen(&mut peer, &mut blocked_out);
                    println!("{case} ({wait}): the peer's death seen after {ms:.2} ms");
                    assert!(ms <= DEATH_BOUND_MS, "{case} ({wait}): the peer's death seen after {ms:.1} ms");
                    wait_ok(blocked, "blocked side");
                    assert_dir_empty(&dir);
                }
            }
        }
    }
}

/// This process's threads named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

const CHANNELS: usize = 64;

/// Many channels share one watcher thread; once they have all closed, the thread and every
/// descriptor are gone. Then, with many channels open, kill -9 of the process at their other
/// end is reported on every one of them.
#[test]
fn one_watcher_for_many_channels_and_nothing_left_after_them() {
    const TEST: &str = "blocked::one_watcher_for_many_channels_and_nothing_left_after_them";
    let names = |round: &str| (0..CHANNELS).map(|i| format!("many-{round}-{i}")).collect::<Vec<_>>();
    match child_role().as_deref() {
        Some("consumers") => {
            // What the memory context opens is not the channels'.
            let _ = ctx();
            let (fds, threads) = (open_fds(), std::fs::read_dir("/proc/self/task").unwrap().count());
            assert_eq!(threads_named("lava-flow-watch"), 0);
            let mut consumers: Vec<Consumer> = names("a")
                .iter()
                .map(|n| Consumer::create(&ctx(), n, &here(), &here(), &config(strategy("block"))).unwrap())
                .collect();
            for c in &mut consumers {
                assert_eq!(&*c.recv().unwrap(), b"hi");
            }
            assert_eq!(threads_named("lava-flow-watch"), 1, "one watcher thread for {CHANNELS} channels");
            for c in &mut consumers {
                assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
            }
            drop(consumers);
            assert_eq!(threads_named("lava-flow-watch"), 0, "the watcher thread outlived every channel");
            assert_eq!(std::fs::read_dir("/proc/self/task").unwrap().count(), threads, "threads left behind");
            assert_eq!(open_fds(), fds, "descriptors left behind");
            report("clean", 1);
            // Round two: the producers' process is killed while these wait.
            let mut consumers: Vec<Consumer> = names("b")
                .iter()
                .map(|n| Consumer::create(&ctx(), n, &here(), &here(), &config(strategy("block"))).unwrap())
                .collect();
            report("waiting", 1);
            let start = Instant::now();
            for c in &mut consumers {
                assert!(matches!(c.recv_timeout(Duration::from_secs(20)), Err(Error::PeerGone(_))));
            }
            report("gone_at", monotonic_ns());
            assert!(start.elapsed() < Duration::from_secs(20));
            drop(consumers);
            assert_eq!(threads_named("lava-flow-watch"), 0);
            assert_eq!(open_fds(), fds, "descriptors left behind");
        }
        Some("producers") => {
            let round = arg("round");
            let mut producers: Vec<Producer> = names(&round)
                .iter()
                .map(|n| Producer::create(&ctx(), n, &here(), &here(), &config(strategy("block"))).unwrap())
                .collect();
            if round == "a" {
                for p in &mut producers {
                    p.send(b"hi").unwrap();
                }
                return;
            }
            report("ready", 1);
            linger();
        }
        Some(_) => {}
        None => {
            let dir = test_dir("many");
            let (consumers, mut consumers_out) = spawn_reporting(TEST, "consumers", &dir, &[]);
            let first = spawn(TEST, "producers", &dir, &[("round", "a".to_owned())]);
            wait_ok(first, "the first producers");
            expect_line(&mut consumers_out, "clean");
            let (mut second, mut second_out) = spawn_reporting(TEST, "producers", &dir, &[("round", "b".to_owned())]);
            expect_line(&mut second_out, "ready");
            expect_line(&mut consumers_out, "waiting");
            let ms = ms_until_death_seen(&mut second, &mut consumers_out);
            println!("{CHANNELS} consumers saw their producers' death after {ms:.2} ms");
            assert!(ms <= 500.0, "{CHANNELS} consumers saw their producers' death after {ms:.1} ms");
            wait_ok(consumers, "consumers");
            assert_dir_empty(&dir);
        }
    }
}
