//! Fan-in channels between real processes: several producers, one consumer; order and
//! exactly-once per producer, a producer's end reported for its slot alone, a full fan-in
//! refused, late joiners, and nothing left behind.

use std::collections::HashMap;
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer};
use lava_flow::Error;

use crate::common::*;

/// The bound asserted on a loaded machine; the design target is 100 ms.
const BOUND_MS: f64 = 500.0;

fn fan_in(wait: &str, max_peers: u32) -> ChannelConfig {
    ChannelConfig { kind: ChannelKind::FanIn, max_peers, ..config(strategy(wait)) }
}

/// A producer's message: its id and its sequence number.
fn message(id: u64, seq: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&id.to_le_bytes());
    m[8..].copy_from_slice(&seq.to_le_bytes());
    m
}

fn parse(m: &[u8]) -> (u64, u64) {
    (u64::from_le_bytes(m[..8].try_into().unwrap()), u64::from_le_bytes(m[8..16].try_into().unwrap()))
}

/// Four producers send their messages at once; the consumer gets each producer's in its order,
/// every one once, each under the slot `peers` names for that producer, and each producer's
/// end after its last message.
#[test]
fn four_producers_each_in_order() {
    const TEST: &str = "fan_in::four_producers_each_in_order";
    const PRODUCERS: u64 = 4;
    let count: u64 = std::env::var("LF_TEST_FAN_IN_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    match child_role().as_deref() {
        Some("producer") => {
            let id: u64 = arg("id").parse().unwrap();
            let n: u64 = arg("count").parse().unwrap();
            let mut p = Producer::create(&ctx(), "fanin4", &here(), &here(), &fan_in("spin", 4)).unwrap();
            for seq in 0..n {
                p.send(&message(id, seq)).unwrap();
            }
            p.wait_completed(n - 1, Some(Duration::from_secs(60))).unwrap();
        }
        Some("consumer") => {
            let n: u64 = arg("count").parse().unwrap();
            let mut c = Consumer::create(&ctx(), "fanin4", &here(), &here(), &fan_in("spin", 4)).unwrap();
            let mut next: HashMap<u64, u64> = HashMap::new();
            let mut slot_of: HashMap<u64, u32> = HashMap::new();
            let mut ended = 0;
            while ended < PRODUCERS {
                match c.recv_timeout(Duration::from_secs(60)) {
                    Ok(m) => {
                        let (id, seq) = parse(&m);
                        let expected = next.entry(id).or_insert(0);
                        assert_eq!(seq, *expected, "producer {id}: message {seq} out of order");
                        *expected += 1;
                        let slot = *slot_of.entry(id).or_insert(m.producer());
                        assert_eq!(m.producer(), slot, "producer {id}'s messages came under two slots");
                        assert!(c.peers()[slot as usize].state != PeerState::Free);
                    }
                    Err(Error::PeerGone(_)) => {
                        let slot = c.last_gone().expect("a fan-in names the slot that ended");
                        let id = slot_of.iter().find(|(_, s)| **s == slot).map(|(id, _)| *id).expect("a slot seen");
                        assert_eq!(next[&id], n, "producer {id}'s end came before its last message");
                        ended += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(next.len() as u64, PRODUCERS);
            let mut slots: Vec<u32> = slot_of.values().copied().collect();
            slots.sort_unstable();
            assert_eq!(slots, vec![0, 1, 2, 3], "each producer had a slot of its own");
            assert!(c.peers().iter().all(|p| p.state == PeerState::Free), "{:?}", c.peers());
            report("received", n * PRODUCERS);
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanin4");
            let args = |id: u64| [("id", id.to_string()), ("count", count.to_string())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args(0));
            let producers: Vec<_> = (0..PRODUCERS).map(|id| spawn(TEST, "producer", &dir, &args(id))).collect();
            assert_eq!(expect_line(&mut c_out, "received"), (count * PRODUCERS).to_string());
            for p in producers {
                wait_ok(p, "producer");
            }
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// kill -9 of one producer among four, in every wait strategy: the consumer reports that
/// producer's slot gone within the bound, and the other three go on to their last message.
#[test]
fn one_producer_killed_among_four() {
    const TEST: &str = "fan_in::one_producer_killed_among_four";
    match child_role().as_deref() {
        Some("producer") => {
            let id: u64 = arg("id").parse().unwrap();
            let mut p = Producer::create(&ctx(), "fanin-kill", &here(), &here(), &fan_in(&arg("wait"), 4)).unwrap();
            for seq in 0..100 {
                p.send(&message(id, seq)).unwrap();
            }
            report("sent", id);
            if id == 0 {
                // The victim: killed while it lives.
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            // The others send 100 more once the victim is dead.
            while !std::path::Path::new(&arg("flag")).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            for seq in 100..200 {
                p.send(&message(id, seq)).unwrap();
            }
            p.wait_completed(199, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanin-kill", &here(), &here(), &fan_in(&arg("wait"), 4)).unwrap();
            let mut next: HashMap<u64, u64> = HashMap::new();
            let mut slot_of: HashMap<u32, u64> = HashMap::new();
            let mut ended = 0;
            while ended < 4 {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Ok(m) => {
                        let (id, seq) = parse(&m);
                        assert_eq!(seq, next.get(&id).copied().unwrap_or(0));
                        next.insert(id, seq + 1);
                        slot_of.insert(m.producer(), id);
                        if next.values().sum::<u64>() == 400 {
                            report("waiting", 1);
                        }
                    }
                    Err(Error::PeerGone(why)) => {
                        let id = slot_of[&c.last_gone().unwrap()];
                        if id == 0 {
                            assert_eq!(next[&0], 100, "the victim's messages were all delivered first");
                            assert!(why.contains("slot"), "{why}");
                            report("gone_at", monotonic_ns());
                        } else {
                            assert_eq!(next[&id], 200);
                        }
                        ended += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        Some(_) => {}
        None => {
            for wait in STRATEGIES {
                let dir = test_dir(&format!("fanin-kill-{wait}"));
                let scratch = scratch_dir();
                let flag = scratch.path().join("go").display().to_string();
                let args = |id: u64| [("id", id.to_string()), ("wait", wait.to_owned()), ("flag", flag.clone())];
                let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args(9));
                let mut producers: Vec<_> =
                    (0..4).map(|id| spawn_reporting(TEST, "producer", &dir, &args(id))).collect();
                for (_, out) in producers.iter_mut() {
                    expect_line(out, "sent");
                }
                expect_line(&mut c_out, "waiting");
                let ms = ms_until_death_seen(&mut producers[0].0, &mut c_out);
                println!("{wait}: the fan-in consumer saw one producer's death after {ms:.1} ms");
                assert!(ms <= BOUND_MS, "{wait}: death seen after {ms:.1} ms");
                std::fs::write(&flag, b"go").unwrap();
                for (p, _) in producers.drain(1..) {
                    wait_ok(p, "producer");
                }
                wait_ok(c, "consumer");
                assert_dir_empty(&dir);
            }
        }
    }
}

/// A fan-in of two takes two producers; a third is refused at once, saying the channel is full
/// and naming max_peers; once one closes, a late producer takes its slot. A pair producer is
/// refused, naming both kinds.
#[test]
fn a_full_fan_in_refuses_and_a_late_producer_takes_a_freed_slot() {
    const TEST: &str = "fan_in::a_full_fan_in_refuses_and_a_late_producer_takes_a_freed_slot";
    match child_role().as_deref() {
        Some("producer") => {
            let id: u64 = arg("id").parse().unwrap();
            let mut p = Producer::create(&ctx(), "fanin-full", &here(), &here(), &fan_in("spin", 2)).unwrap();
            p.send(&message(id, 0)).unwrap();
            report("sent", id);
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
            // Holds its slot until told to go.
            while !std::path::Path::new(&arg("flag")).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Some("refused") => {
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(10)), ..fan_in("spin", 2) };
            let err = Producer::create(&ctx(), "fanin-full", &here(), &here(), &cfg).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::InvalidState(_)), "{text}");
            assert!(text.contains("full") && text.contains("max_peers = 2"), "{text}");
            let pair = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(10)), ..config(strategy("spin")) };
            let err = Producer::create(&ctx(), "fanin-full", &here(), &here(), &pair).unwrap_err().to_string();
            assert!(err.contains("fan-in") && err.contains("pair"), "{err}");
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanin-full", &here(), &here(), &fan_in("spin", 2)).unwrap();
            let mut seen = Vec::new();
            // Two first messages, then the late producer's, with one end reported between.
            let mut gone = 0;
            while seen.len() < 3 {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Ok(m) => {
                        seen.push(parse(&m).0);
                        report("got", parse(&m).0);
                    }
                    Err(Error::PeerGone(_)) => gone += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(gone >= 1, "the late producer came after an end");
            assert_eq!(seen[2], 2, "{seen:?}");
            assert_eq!(c.producers(), 2);
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanin-full");
            let scratch = scratch_dir();
            let flag = |id: u64| scratch.path().join(format!("go-{id}")).display().to_string();
            let args = |id: u64| [("id", id.to_string()), ("flag", flag(id))];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args(9));
            let (p0, mut p0_out) = spawn_reporting(TEST, "producer", &dir, &args(0));
            let (p1, mut p1_out) = spawn_reporting(TEST, "producer", &dir, &args(1));
            expect_line(&mut p0_out, "sent");
            expect_line(&mut p1_out, "sent");
            expect_line(&mut c_out, "got");
            expect_line(&mut c_out, "got");
            wait_ok(spawn(TEST, "refused", &dir, &args(5)), "the third producer");
            // Producer 0 closes; a late one attaches in its slot.
            std::fs::write(flag(0), b"go").unwrap();
            wait_ok(p0, "producer 0");
            let (p2, _p2_out) = spawn_reporting(TEST, "producer", &dir, &args(2));
            assert_eq!(expect_line(&mut c_out, "got"), "2");
            std::fs::write(flag(1), b"go").unwrap();
            std::fs::write(flag(2), b"go").unwrap();
            wait_ok(p1, "producer 1");
            wait_ok(p2, "producer 2");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// A producer that writes garbage into its own ring gets itself detached: the consumer reports
/// `Corrupt` for that slot once, and the honest producer's messages all arrive, in order.
#[test]
fn a_hostile_producer_is_detached_and_the_others_go_on() {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    const TEST: &str = "fan_in::a_hostile_producer_is_detached_and_the_others_go_on";
    // The ring's layout (src/channels/transports/shm/ring.rs), as a hostile peer would learn it.
    const SLOTS: usize = 4096;
    const SLOT: usize = 128;
    match child_role().as_deref() {
        Some("hostile") => {
            let mut p = Producer::create(&ctx(), "fanin-hostile", &here(), &here(), &fan_in("block", 4)).unwrap();
            for seq in 0..3 {
                p.send(&message(0, seq)).unwrap();
            }
            let (base, _) = region_of("fanin-hostile");
            let slot = SLOTS + 3 * SLOT;
            // SAFETY: this process owns the mapping and writes inside slot 3: a kind no message
            // has, then the sequence word that publishes it.
            unsafe {
                (*(base.add(slot + 8) as *const AtomicU32)).store(8, Ordering::Relaxed);
                (*(base.add(slot + 12) as *const AtomicU32)).store(77, Ordering::Relaxed);
                (*(base.add(slot) as *const AtomicU64)).store(4, Ordering::SeqCst);
            }
            report("scribbled", 1);
            // Detached: its channel ends (a send now would overwrite the scribble).
            let start = std::time::Instant::now();
            let err = loop {
                // A loan, cancelled when dropped, finds the channel's end without sending.
                match p.try_loan(8) {
                    Ok(_) if start.elapsed() < Duration::from_secs(30) => std::thread::sleep(Duration::from_millis(1)),
                    Ok(_) => panic!("still attached after 30 s"),
                    Err(e) => break e,
                }
            };
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
            assert!(matches!(p.send(&message(0, 4)), Err(Error::PeerGone(_))));
        }
        Some("honest") => {
            let mut p = Producer::create(&ctx(), "fanin-hostile", &here(), &here(), &fan_in("block", 4)).unwrap();
            for seq in 0..1000 {
                p.send(&message(1, seq)).unwrap();
            }
            p.wait_completed(999, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanin-hostile", &here(), &here(), &fan_in("block", 4)).unwrap();
            let (mut honest, mut hostile, mut corrupt) = (0u64, 0u64, 0);
            while honest < 1000 {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Ok(m) => match parse(&m) {
                        (1, seq) => {
                            assert_eq!(seq, honest);
                            honest += 1;
                        }
                        (0, seq) => {
                            assert_eq!(seq, hostile);
                            hostile += 1;
                        }
                        other => panic!("{other:?}"),
                    },
                    Err(Error::Corrupt(why)) => {
                        assert!(why.contains("slot") && why.contains("detached"), "{why}");
                        corrupt += 1;
                    }
                    Err(Error::PeerGone(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert!(hostile <= 3 && corrupt <= 1, "hostile {hostile}, corrupt {corrupt}");
            // The scribble is reported by the time the honest producer is done.
            while corrupt == 0 {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Err(Error::Corrupt(_)) => corrupt += 1,
                    Ok(m) => assert_eq!(parse(&m).0, 0),
                    Err(Error::PeerGone(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            report("done", honest);
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanin-hostile");
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &[]);
            let (bad, mut bad_out) = spawn_reporting(TEST, "hostile", &dir, &[]);
            expect_line(&mut bad_out, "scribbled");
            let good = spawn(TEST, "honest", &dir, &[]);
            assert_eq!(expect_line(&mut c_out, "done"), "1000");
            wait_ok(good, "honest producer");
            wait_ok(bad, "hostile producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// Producers are met while the consumer is busy elsewhere: one attaches, and one past
/// `max_peers` is refused at once, though the consumer never receives meanwhile.
#[test]
fn producers_are_met_while_the_consumer_is_busy() {
    const TEST: &str = "fan_in::producers_are_met_while_the_consumer_is_busy";
    match child_role().as_deref() {
        Some("producer") => {
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(20)), ..fan_in("spin", 2) };
            let mut p = Producer::create(&ctx(), "fanin-busy", &here(), &here(), &cfg).unwrap();
            p.send(b"hello").unwrap();
            report("attached", 1);
            wait_for_file(&arg("flag"));
        }
        Some("refused") => {
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(20)), ..fan_in("spin", 2) };
            let start = std::time::Instant::now();
            let text = Producer::create(&ctx(), "fanin-busy", &here(), &here(), &cfg).unwrap_err().to_string();
            assert!(text.contains("max_peers = 2"), "{text}");
            assert!(start.elapsed() < Duration::from_secs(10), "refused only after {:?}", start.elapsed());
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanin-busy", &here(), &here(), &fan_in("spin", 2)).unwrap();
            report("created", 1);
            // Busy: no receive until told.
            wait_for_file(&arg("flag"));
            let mut got = 0;
            while got < 2 {
                match c.recv_timeout(Duration::from_secs(20)) {
                    Ok(m) => {
                        assert_eq!(&*m, b"hello");
                        got += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanin-busy");
            let scratch = scratch_dir();
            let args = [("flag", scratch.path().join("go").display().to_string())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args);
            let (p0, mut p0_out) = spawn_reporting(TEST, "producer", &dir, &args);
            expect_line(&mut c_out, "created");
            expect_line(&mut p0_out, "attached");
            let (p1, mut p1_out) = spawn_reporting(TEST, "producer", &dir, &args);
            expect_line(&mut p1_out, "attached");
            wait_ok(spawn(TEST, "refused", &dir, &args), "the refused producer");
            std::fs::write(&args[0].1, b"").unwrap();
            wait_ok(c, "consumer");
            wait_ok(p0, "producer 0");
            wait_ok(p1, "producer 1");
            assert_dir_empty(&dir);
        }
    }
}

fn wait_for_file(path: &str) {
    while !std::path::Path::new(path).exists() {
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A busy producer does not starve the others: with one producer flooding its ring and another
/// with 100 messages waiting, the consumer takes the second's messages in turns, at most 32 of
/// the busy one's between them.
#[test]
fn a_busy_producer_does_not_starve_another() {
    const TEST: &str = "fan_in::a_busy_producer_does_not_starve_another";
    match child_role().as_deref() {
        Some("flood") => {
            let mut p = Producer::create(&ctx(), "fanin-fair", &here(), &here(), &fan_in("spin", 2)).unwrap();
            let mut seq = 0u64;
            // Its ring full before the other sends; then as fast as the consumer takes them.
            while p.try_send(&message(0, seq)).is_ok() {
                seq += 1;
            }
            report("full", seq);
            while p.send_timeout(&message(0, seq), Duration::from_secs(30)).is_ok() {
                seq += 1;
            }
        }
        Some("few") => {
            let mut p = Producer::create(&ctx(), "fanin-fair", &here(), &here(), &fan_in("spin", 2)).unwrap();
            for seq in 0..100 {
                p.send(&message(1, seq)).unwrap();
            }
            report("sent", 100);
            p.wait_completed(99, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "fanin-fair", &here(), &here(), &fan_in("spin", 2)).unwrap();
            report("created", 1);
            wait_for_file(&arg("flag"));
            let (mut few, mut run, mut longest) = (0u64, 0u32, 0u32);
            // Counted from when the consumer has taken the second producer up: its acceptor
            // thread meets it, and on a loaded machine that thread may wait for a core while
            // the consumer serves the one producer it has.
            let mut both = false;
            while few < 100 {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                both = both || c.peers().iter().filter(|p| p.state == PeerState::Alive).count() == 2;
                match parse(&m) {
                    (1, seq) => {
                        assert_eq!(seq, few);
                        few += 1;
                        run = 0;
                    }
                    _ if both => {
                        run += 1;
                        longest = longest.max(run);
                    }
                    _ => {}
                }
            }
            assert!(longest <= 32, "{longest} of the busy producer's messages in a row while the other's waited");
            report("longest", longest);
        }
        Some(_) => {}
        None => {
            let dir = test_dir("fanin-fair");
            let scratch = scratch_dir();
            let args = [("flag", scratch.path().join("go").display().to_string())];
            let (c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args);
            let (flood, mut flood_out) = spawn_reporting(TEST, "flood", &dir, &args);
            expect_line(&mut flood_out, "full");
            let (few, mut few_out) = spawn_reporting(TEST, "few", &dir, &args);
            expect_line(&mut few_out, "sent");
            expect_line(&mut c_out, "created");
            std::fs::write(&args[0].1, b"").unwrap();
            let longest = expect_line(&mut c_out, "longest");
            println!("at most {longest} of the busy producer's messages in a row");
            wait_ok(few, "the producer with few messages");
            wait_ok(c, "consumer");
            // The flood ends with the consumer's close.
            wait_ok(flood, "the busy producer");
            assert_dir_empty(&dir);
        }
    }
}
