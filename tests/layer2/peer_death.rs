//! kill -9 of either end in every wait strategy: the survivor sees PeerGone promptly,
//! messages already delivered stay readable, a new producer can attach, and the survivor
//! leaves nothing behind.

use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer};
use lava_flow::Error;

use crate::common::*;

/// The bound asserted on a loaded machine; the design target is 100 ms (see lf-bench and the
/// printed figures).
const BOUND_MS: f64 = 500.0;

#[test]
fn producer_killed_consumer_sees_peer_gone() {
    const TEST: &str = "peer_death::producer_killed_consumer_sees_peer_gone";
    match child_role().as_deref() {
        Some("victim") => {
            let mut p = Producer::create(&ctx(), "victim", &here(), &here(), &config(strategy(&arg("wait")))).unwrap();
            for i in 0..10u64 {
                p.send(&i.to_le_bytes()).unwrap();
            }
            report("sent", 10);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("survivor") => {
            let mut c = Consumer::create(&ctx(), "victim", &here(), &here(), &config(strategy(&arg("wait")))).unwrap();
            // Phase 1: the producer is killed while 10 messages wait unread.
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            for i in 0..10u64 {
                assert_eq!(
                    &*c.recv_timeout(Duration::from_secs(5)).unwrap(),
                    &i.to_le_bytes(),
                    "delivered message lost"
                );
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(5)), Err(Error::PeerGone(_))));
            // Phase 2: a new producer attaches to the same name; it will be killed while the
            // consumer waits in recv.
            report("attach", 1);
            let mut got = 0u64;
            let gone_at = loop {
                match c.recv_timeout(Duration::from_secs(20)) {
                    Ok(m) => {
                        assert_eq!(&*m, &got.to_le_bytes());
                        got += 1;
                        if got == 10 {
                            report("waiting", 1);
                        }
                    }
                    Err(Error::PeerGone(_)) if got == 0 => std::thread::sleep(Duration::from_millis(2)),
                    Err(Error::PeerGone(_)) => break monotonic_ns(),
                    Err(e) => panic!("{e}"),
                }
            };
            assert_eq!(got, 10);
            report("gone_at", gone_at);
        }
        Some(_) => {}
        None => {
            for wait in STRATEGIES {
                let dir = test_dir(&format!("pkill-{wait}"));
                let scratch = scratch_dir();
                let flag = scratch.path().join(format!("pkill-{wait}.flag")).display().to_string();
                let _ = std::fs::remove_file(&flag);
                let args = [("wait", wait.to_owned()), ("flag", flag.clone())];
                let mut c = spawn(TEST, "survivor", &dir, &args);
                let mut c_out = stdout_of(&mut c);
                let mut p = spawn(TEST, "victim", &dir, &args);
                let mut p_out = stdout_of(&mut p);
                expect_line(&mut p_out, "sent");
                kill9(&mut p);
                std::fs::write(&flag, b"killed").unwrap();
                expect_line(&mut c_out, "attach");
                let mut p2 = spawn(TEST, "victim", &dir, &args);
                let mut p2_out = stdout_of(&mut p2);
                expect_line(&mut p2_out, "sent");
                expect_line(&mut c_out, "waiting");
                std::thread::sleep(Duration::from_millis(50));
                let killed_at = monotonic_ns();
                kill9(&mut p2);
                let gone_at: u64 = expect_line(&mut c_out, "gone_at").parse().unwrap();
                let ms = gone_at.saturating_sub(killed_at) as f64 / 1e6;
                println!("{wait}: consumer saw the producer's death after {ms:.1} ms");
                assert!(ms <= BOUND_MS, "{wait}: death seen after {ms:.1} ms");
                wait_ok(c, "survivor");
                let _ = std::fs::remove_file(&flag);
                assert_dir_empty(&dir);
            }
        }
    }
}

#[test]
fn consumer_killed_producer_sees_peer_gone() {
    const TEST: &str = "peer_death::consumer_killed_producer_sees_peer_gone";
    match child_role().as_deref() {
        Some("victim") => {
            let _c = Consumer::create(&ctx(), "cvictim", &here(), &here(), &config(strategy(&arg("wait")))).unwrap();
            report("ready", 1);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("survivor") => {
            let cfg = ChannelConfig { capacity: 4, ..config(strategy(&arg("wait"))) };
            let mut p = Producer::create(&ctx(), "cvictim", &here(), &here(), &cfg).unwrap();
            for _ in 0..4 {
                p.send(b"fill").unwrap();
            }
            report("blocked", 1);
            // The ring is full and never drained: send waits until it sees the death.
            let err = p.send_timeout(b"more", Duration::from_secs(20)).unwrap_err();
            let gone_at = monotonic_ns();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
            report("gone_at", gone_at);
            assert!(matches!(p.try_send(b"x"), Err(Error::PeerGone(_))));
            // Dropping the producer removes the dead consumer's socket file.
        }
        Some(_) => {}
        None => {
            for wait in STRATEGIES {
                let dir = test_dir(&format!("ckill-{wait}"));
                let args = [("wait", wait.to_owned())];
                let mut c = spawn(TEST, "victim", &dir, &args);
                let mut c_out = stdout_of(&mut c);
                let mut p = spawn(TEST, "survivor", &dir, &args);
                let mut p_out = stdout_of(&mut p);
                expect_line(&mut c_out, "ready");
                expect_line(&mut p_out, "blocked");
                std::thread::sleep(Duration::from_millis(50));
                let killed_at = monotonic_ns();
                kill9(&mut c);
                let gone_at: u64 = expect_line(&mut p_out, "gone_at").parse().unwrap();
                let ms = gone_at.saturating_sub(killed_at) as f64 / 1e6;
                println!("{wait}: producer saw the consumer's death after {ms:.1} ms");
                assert!(ms <= BOUND_MS, "{wait}: death seen after {ms:.1} ms");
                wait_ok(p, "survivor");
                assert_dir_empty(&dir);
            }
        }
    }
}

/// kill -9 of a consumer, many times over: the surviving producer removes the dead consumer's
/// socket (and lock file) every time, whether it notices the death while the consumer is
/// still dying, and whatever the consumer wrote in shared memory (a hostile one marks itself
/// closed, which once made the survivor leave the socket).
#[test]
fn a_killed_consumer_never_leaves_its_socket() {
    const TEST: &str = "peer_death::a_killed_consumer_never_leaves_its_socket";
    const ROUNDS: usize = 30;
    match child_role().as_deref() {
        Some("victim") => {
            let _c = Consumer::create(&ctx(), "stale", &here(), &here(), &config(strategy("block"))).unwrap();
            if arg("hostile") == "1" {
                let (base, _) = region_of("stale");
                // SAFETY: the consumer's own mapping of the region; offset 132 is the
                // consumer_closed word (src/channels/transports/shm/ring.rs), 4-aligned.
                unsafe {
                    (*base.add(132).cast::<std::sync::atomic::AtomicU32>())
                        .store(1, std::sync::atomic::Ordering::SeqCst)
                };
            }
            report("ready", 1);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("survivor") => {
            let cfg = ChannelConfig { capacity: 2, ..config(strategy("block")) };
            let mut p = Producer::create(&ctx(), "stale", &here(), &here(), &cfg).unwrap();
            report("connected", 1);
            // Until the consumer is gone (killed, or marked closed by a hostile one); then the
            // drop cleans up at once.
            loop {
                match p.send_timeout(b"fill", Duration::from_secs(20)) {
                    Ok(_) => {}
                    Err(Error::PeerGone(_)) => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        Some(_) => {}
        None => {
            let dir = test_dir("stale");
            for round in 0..ROUNDS {
                let hostile = if round % 2 == 1 { "1" } else { "0" };
                let args = [("hostile", hostile.to_owned())];
                let mut c = spawn(TEST, "victim", &dir, &args);
                let mut c_out = stdout_of(&mut c);
                let mut p = spawn(TEST, "survivor", &dir, &args);
                let mut p_out = stdout_of(&mut p);
                expect_line(&mut p_out, "connected");
                expect_line(&mut c_out, "ready");
                // Killed, not reaped: the survivor races the consumer's death.
                // SAFETY: kill with a pid we spawned and have not reaped yet.
                unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
                wait_ok(p, "survivor");
                drop((p_out, c_out));
                let _ = c.wait();
                let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
                assert!(left.is_empty(), "round {round} (hostile: {hostile}): left {left:?}");
            }
            assert_dir_empty(&dir);
        }
    }
}
