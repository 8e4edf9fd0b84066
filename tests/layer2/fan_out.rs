//! Fan-out channels between real processes: one producer, several consumers; every message to
//! every consumer attached when it was sent, a buffer by reference shared and complete after
//! the last release, late joiners, a consumer's death or slowness never stopping the producer,
//! a full fan-out refused, and nothing left behind.

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer};
use lava_flow::memory::MemoryLocation;
use lava_flow::Error;

use crate::common::*;

/// The bound asserted on a loaded machine; the design target is 100 ms.
const BOUND_MS: f64 = 500.0;

fn fan_out(wait: &str, max_peers: u32) -> ChannelConfig {
    ChannelConfig { kind: ChannelKind::FanOut, max_peers, ..config(strategy(wait)) }
}

fn flag_set(name: &str) -> bool {
    std::path::Path::new(&arg(name)).exists()
}

fn wait_flag(name: &str) {
    while !flag_set(name) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Four consumers each receive every message, in order: copies of several sizes and a 1 MiB
/// buffer sent by reference, which is one memory for all four and complete only after the
/// fourth release.
#[test]
fn four_consumers_each_get_every_message() {
    const TEST: &str = "fan_out::four_consumers_each_get_every_message";
    const COUNT: u64 = 20_000;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "fanout4", &here(), &here(), &fan_out("spin", 4)).unwrap();
            // The first consumer came with create; the others attach while we wait for them.
            let start = Instant::now();
            while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < 4 {
                assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
                p.try_send(b"hello").unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            p.send(b"start").unwrap();
            for seq in 0..COUNT {
                let mut m = vec![0u8; size_of(seq)];
                message_into(&mut m, seq);
                p.send(&m).unwrap();
            }
            let buffer = ctx().allocate(1 << 20, MemoryLocation::CpuStandard).unwrap();
            buffer.write_at(0, &[7u8; 1 << 20]).unwrap();
            let seq = p.send_buffer(&buffer, 0, 1 << 20).unwrap();
            report("buffer", seq);
            // Not complete while any consumer holds it.
            std::thread::sleep(Duration::from_millis(100));
            assert!(p.completed().unwrap() <= seq, "complete before the consumers released it");
            std::fs::write(arg("release"), b"go").unwrap();
            p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(p.arenas_sent(), 4, "one arena passed to each consumer");
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanout4", &here(), &here(), &fan_out("spin", 4)).unwrap();
            report("attached", 1);
            // Greetings until the start.
            while &*c.recv_timeout(Duration::from_secs(30)).unwrap() != b"start" {}
            for seq in 0..COUNT {
                check(&c.recv_timeout(Duration::from_secs(30)).unwrap(), seq);
            }
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(m.is_zero_copy() && m.len() == 1 << 20 && m.iter().all(|b| *b == 7));
            wait_flag("release");
            drop(m);
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanout4");
            let scratch = scratch_dir();
            let release = scratch.path().join("release").display().to_string();
            let args = [("release", release)];
            let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &args);
            let consumers: Vec<_> = (0..4).map(|_| spawn_reporting(TEST, "consumer", &dir, &args)).collect();
            expect_line(&mut p_out, "buffer");
            wait_ok(p, "producer");
            for (c, _) in consumers {
                wait_ok(c, "consumer");
            }
            assert_dir_empty(&dir);
        }
    }
}

/// kill -9 of one consumer among four, in every wait strategy, while the producer waits for
/// its room: the producer goes on within the bound, and the others get every message.
#[test]
fn one_consumer_killed_among_four() {
    const TEST: &str = "fan_out::one_consumer_killed_among_four";
    match child_role().as_deref() {
        Some("producer") => {
            let cfg = ChannelConfig { capacity: 8, ..fan_out(&arg("wait"), 4) };
            let mut p = Producer::create(&ctx(), "fanout-kill", &here(), &here(), &cfg).unwrap();
            wait_flag("all");
            // A consumer's create returns as it answers; the producer has it a moment later.
            let start = Instant::now();
            while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < 4 {
                assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
                std::thread::sleep(Duration::from_millis(1));
            }
            // The victim never reads: the ninth message waits for its room.
            for seq in 0..8u64 {
                p.send(&seq.to_le_bytes()).unwrap();
            }
            report("blocked", 1);
            p.send_timeout(&8u64.to_le_bytes(), Duration::from_secs(20)).unwrap();
            report("gone_at", monotonic_ns());
            for seq in 9..100u64 {
                p.send(&seq.to_le_bytes()).unwrap();
            }
            p.wait_completed(99, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(p.peers().iter().filter(|c| c.state == PeerState::Alive).count(), 3);
        }
        Some("victim") => {
            let _c = Consumer::create(&ctx(), "fanout-kill", &here(), &here(), &fan_out(&arg("wait"), 4)).unwrap();
            report("attached", 1);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanout-kill", &here(), &here(), &fan_out(&arg("wait"), 4)).unwrap();
            report("attached", 1);
            for seq in 0..100u64 {
                assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), &seq.to_le_bytes());
            }
        }
        Some(_) => {}
        None => {
            for wait in STRATEGIES {
                let dir = test_dir(&format!("fanout-kill-{wait}"));
                let scratch = scratch_dir();
                let all = scratch.path().join("all").display().to_string();
                let args = [("wait", wait.to_owned()), ("all", all.clone())];
                let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &args);
                let (mut victim, mut v_out) = spawn_reporting(TEST, "victim", &dir, &args);
                expect_line(&mut v_out, "attached");
                let mut others: Vec<_> = (0..3).map(|_| spawn_reporting(TEST, "consumer", &dir, &args)).collect();
                for (_, out) in others.iter_mut() {
                    expect_line(out, "attached");
                }
                std::fs::write(&all, b"go").unwrap();
                expect_line(&mut p_out, "blocked");
                let ms = ms_until_death_seen(&mut victim, &mut p_out);
                println!("{wait}: the fan-out producer went on {ms:.1} ms after a consumer's death");
                assert!(ms <= BOUND_MS, "{wait}: the producer went on after {ms:.1} ms");
                wait_ok(p, "producer");
                for (c, _) in others {
                    wait_ok(c, "consumer");
                }
                assert_dir_empty(&dir);
            }
        }
    }
}

/// With a slow-consumer bound, a consumer that stops reading is detached once the producer has
/// waited that long for it; it reads what it had, then learns it was detached. A late consumer
/// takes the freed slot and starts with the next message.
#[test]
fn a_slow_consumer_is_detached_and_a_late_one_takes_its_slot() {
    const TEST: &str = "fan_out::a_slow_consumer_is_detached_and_a_late_one_takes_its_slot";
    // A bound a busy 2-core machine does not reach for a consumer that keeps reading.
    let bounded =
        || ChannelConfig { capacity: 4, slow_consumer_timeout: Some(Duration::from_secs(2)), ..fan_out("block", 2) };
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "fanout-slow", &here(), &here(), &bounded()).unwrap();
            wait_flag("both");
            // A consumer's create returns once its handshake is answered; the producer's acceptor
            // thread hands it over just after (on a loaded machine, some time after): both are
            // the producer's before the stream starts.
            let start = Instant::now();
            while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < 2 {
                assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
                std::thread::sleep(Duration::from_millis(2));
            }
            for seq in 0..50u64 {
                p.send_timeout(&seq.to_le_bytes(), Duration::from_secs(20)).unwrap();
            }
            report("sent", 50);
            assert_eq!(p.peers().iter().filter(|c| c.state == PeerState::Alive).count(), 1, "the slow one went");
            // A late consumer takes the freed slot and starts with the next message.
            wait_flag("late");
            let start = Instant::now();
            while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < 2 {
                assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
                p.send(&u64::MAX.to_le_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            let last = p.send(&1000u64.to_le_bytes()).unwrap();
            p.wait_completed(last, Some(Duration::from_secs(30))).unwrap();
            wait_flag("done");
        }
        Some("slow") => {
            let mut c = Consumer::create(&ctx(), "fanout-slow", &here(), &here(), &bounded()).unwrap();
            report("attached", 1);
            wait_flag("detached");
            let mut got = 0;
            let err = loop {
                match c.recv_timeout(Duration::from_secs(20)) {
                    Ok(_) => got += 1,
                    Err(e) => break e,
                }
            };
            assert!(got <= 4, "{got}");
            assert!(matches!(&err, Error::PeerGone(why) if why.contains("detached")), "{err}");
        }
        Some("fast") => {
            let mut c = Consumer::create(&ctx(), "fanout-slow", &here(), &here(), &bounded()).unwrap();
            report("attached", 1);
            for seq in 0..50u64 {
                assert_eq!(&*c.recv_timeout(Duration::from_secs(20)).unwrap(), &seq.to_le_bytes());
            }
            // Keeps up with what follows.
            while !flag_set("done") {
                let _ = c.recv_timeout(Duration::from_millis(10));
            }
        }
        Some("late") => {
            let mut c = Consumer::create(&ctx(), "fanout-slow", &here(), &here(), &bounded()).unwrap();
            let mut expected = 0;
            loop {
                let m = c.recv_timeout(Duration::from_secs(20)).unwrap();
                assert_eq!(m.sequence(), expected, "a late consumer counts from 0");
                expected += 1;
                if *m == 1000u64.to_le_bytes() {
                    break;
                }
            }
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanout-slow");
            let scratch = scratch_dir();
            let flag = |name: &str| scratch.path().join(name).display().to_string();
            let args: Vec<(&str, String)> =
                ["both", "detached", "late", "done"].iter().map(|n| (*n, flag(n))).collect();
            let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &args);
            let (slow, mut s_out) = spawn_reporting(TEST, "slow", &dir, &args);
            expect_line(&mut s_out, "attached");
            let (fast, mut f_out) = spawn_reporting(TEST, "fast", &dir, &args);
            expect_line(&mut f_out, "attached");
            std::fs::write(flag("both"), b"").unwrap();
            expect_line(&mut p_out, "sent");
            std::fs::write(flag("detached"), b"").unwrap();
            wait_ok(slow, "slow consumer");
            std::fs::write(flag("late"), b"").unwrap();
            let (late, _late_out) = spawn_reporting(TEST, "late", &dir, &args);
            wait_ok(late, "late consumer");
            std::fs::write(flag("done"), b"").unwrap();
            wait_ok(p, "producer");
            wait_ok(fast, "fast consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// A fan-out of one refuses a second consumer at once, naming max_peers; a pair consumer of a
/// fan-out's name is refused too.
#[test]
fn a_full_fan_out_refuses_a_consumer() {
    const TEST: &str = "fan_out::a_full_fan_out_refuses_a_consumer";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "fanout-full", &here(), &here(), &fan_out("spin", 1)).unwrap();
            // Sends keep it looking for consumers.
            while !flag_set("done") {
                p.try_send(b"tick").ok();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanout-full", &here(), &here(), &fan_out("spin", 1)).unwrap();
            report("attached", 1);
            while !flag_set("done") {
                let _ = c.try_recv();
            }
        }
        Some("refused") => {
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(10)), ..fan_out("spin", 1) };
            let text = Consumer::create(&ctx(), "fanout-full", &here(), &here(), &cfg).unwrap_err().to_string();
            assert!(text.contains("full") && text.contains("max_peers = 1"), "{text}");
            let pair = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(2)), ..config(strategy("spin")) };
            let text = Consumer::create(&ctx(), "fanout-full", &here(), &here(), &pair).unwrap_err().to_string();
            assert!(text.contains("live consumer"), "{text}");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanout-full");
            let scratch = scratch_dir();
            let args = [("done", scratch.path().join("done").display().to_string())];
            let p = spawn(TEST, "producer", &dir, &args);
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args);
            expect_line(&mut c_out, "attached");
            wait_ok(spawn(TEST, "refused", &dir, &args), "the refused consumer");
            std::fs::write(&args[0].1, b"").unwrap();
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// kill -9 of a fan-out's producer: every consumer reads what it had, then learns of the end,
/// and the consumers leave nothing behind (the producer's socket and locks included).
#[test]
fn the_producer_killed_ends_every_consumer_and_leaves_nothing() {
    const TEST: &str = "fan_out::the_producer_killed_ends_every_consumer_and_leaves_nothing";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "fanout-pkill", &here(), &here(), &fan_out("block", 4)).unwrap();
            let start = Instant::now();
            while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < 3 {
                assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
                std::thread::sleep(Duration::from_millis(1));
            }
            for seq in 0..10u64 {
                p.send(&seq.to_le_bytes()).unwrap();
            }
            report("sent", 10);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanout-pkill", &here(), &here(), &fan_out("block", 4)).unwrap();
            report("attached", 1);
            for seq in 0..10u64 {
                assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), &seq.to_le_bytes());
            }
            let err = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanout-pkill");
            let (mut p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &[]);
            let mut consumers: Vec<_> = (0..3).map(|_| spawn_reporting(TEST, "consumer", &dir, &[])).collect();
            for (_, out) in consumers.iter_mut() {
                expect_line(out, "attached");
            }
            expect_line(&mut p_out, "sent");
            kill9(&mut p);
            for (c, _) in consumers {
                wait_ok(c, "consumer");
            }
            assert_dir_empty(&dir);
        }
    }
}
