//! Bounded capacity: would-block, send timeouts, pool exhaustion, receive timeouts.

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::Error;

use crate::common::*;

fn small_config() -> ChannelConfig {
    ChannelConfig { capacity: 4, pool_size: 64 << 10, ..config(WaitStrategy::Block) }
}

#[test]
fn full_channel_would_block_and_times_out() {
    const TEST: &str = "backpressure::full_channel_would_block_and_times_out";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "full", &here(), &here(), &small_config()).unwrap();
            for i in 0..4u8 {
                p.try_send(&[i; 16]).unwrap();
            }
            assert!(matches!(p.try_send(&[9; 16]), Err(Error::WouldBlock(_))));
            let start = Instant::now();
            assert!(matches!(p.send_timeout(&[9; 16], Duration::from_millis(100)), Err(Error::Timeout(_))));
            let waited = start.elapsed();
            assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(5), "{waited:?}");
            std::fs::write(arg("flag"), b"go").unwrap();
            // The consumer drains the ring; then the pool: message A (40 KiB) is held, so B
            // does not fit the 64 KiB pool until the consumer releases A on seeing C.
            p.wait_completed(3, Some(Duration::from_secs(10))).unwrap();
            p.send(&[0xA; 40 << 10]).unwrap();
            assert!(matches!(p.try_send(&[0xB; 40 << 10]), Err(Error::WouldBlock(_))));
            p.send(b"C").unwrap();
            p.send_timeout(&[0xB; 40 << 10], Duration::from_secs(10)).unwrap();
            p.wait_completed(6, Some(Duration::from_secs(10))).unwrap();
            // Messages never sent are refused at once, the last number a u64 holds too.
            for never in [7, u64::MAX - 1, u64::MAX] {
                let refused = p.wait_completed(never, Some(Duration::ZERO));
                assert!(matches!(refused, Err(Error::InvalidArgument(_))), "message {never}: {refused:?}");
            }
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "full", &here(), &here(), &small_config()).unwrap();
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            for i in 0..4u8 {
                assert_eq!(&*c.recv().unwrap(), &[i; 16]);
            }
            let a = c.recv().unwrap();
            assert!(a.len() == 40 << 10 && a.iter().all(|&b| b == 0xA));
            assert_eq!(&*c.recv().unwrap(), b"C");
            drop(a);
            let b = c.recv().unwrap();
            assert!(b.len() == 40 << 10 && b.iter().all(|&x| x == 0xB));
            drop(b);
            assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            let dir = test_dir("full");
            let scratch = scratch_dir();
            let flag = scratch.path().join("full.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = [("flag", flag.clone())];
            let c = spawn(TEST, "consumer", &dir, &args);
            let p = spawn(TEST, "producer", &dir, &args);
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}

#[test]
fn receive_times_out_when_nothing_arrives() {
    const TEST: &str = "backpressure::receive_times_out_when_nothing_arrives";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "quiet", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            p.send(b"late").unwrap();
            p.wait_completed(0, Some(Duration::from_secs(20))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "quiet", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))));
            for _ in 0..3 {
                let start = Instant::now();
                assert!(matches!(c.recv_timeout(Duration::from_millis(100)), Err(Error::Timeout(_))));
                let waited = start.elapsed();
                assert!(waited >= Duration::from_millis(100) && waited < Duration::from_secs(5), "{waited:?}");
            }
            std::fs::write(arg("flag"), b"go").unwrap();
            assert_eq!(&*c.recv_timeout(Duration::from_secs(20)).unwrap(), b"late");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("quiet");
            let scratch = scratch_dir();
            let flag = scratch.path().join("quiet.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = [("flag", flag.clone())];
            let c = spawn(TEST, "consumer", &dir, &args);
            let p = spawn(TEST, "producer", &dir, &args);
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}

/// Payload space is reused while it is still in cache: with the default 16 MiB pool, 64 KiB
/// messages each sent after the last one was released (as the producer learns from an answer,
/// not from a completion wait) stay within the pool's first 2 MiB and one message, and so
/// does a steady stream of small pool messages.
#[test]
fn pool_payloads_reuse_recent_space() {
    const TEST: &str = "backpressure::pool_payloads_reuse_recent_space";
    const LARGE: u64 = 200;
    const SMALL: u64 = 20_000;
    let answered = |seq: u64| seq < LARGE || seq % 16 == 15;
    match child_role().as_deref() {
        Some("producer") => {
            let config = config(WaitStrategy::BusyPoll);
            let mut p = Producer::create(&ctx(), "hot", &here(), &here(), &config).unwrap();
            let mut answers = Consumer::create(&ctx(), "hot-answers", &here(), &here(), &config).unwrap();
            // (low, high) of the large messages, then of the small ones.
            let mut spans = [(usize::MAX, 0); 2];
            for i in 0..LARGE + SMALL {
                let len = if i < LARGE { 64 << 10 } else { 1 << 10 };
                let mut loan = p.loan(len, None).unwrap();
                let at = loan.as_mut_slice().as_mut_ptr() as usize;
                let (low, high) = &mut spans[usize::from(i >= LARGE)];
                (*low, *high) = ((*low).min(at), (*high).max(at + len));
                loan.as_mut_slice().fill(i as u8);
                loan.publish().unwrap();
                if answered(i) {
                    answers.recv_timeout(Duration::from_secs(10)).unwrap();
                }
            }
            let [large, small] = spans.map(|(low, high)| (high - low) >> 10);
            assert!(large <= 2048 + 64, "64 KiB messages spread over {large} KiB of the pool");
            assert!(small <= 2048 + 1, "a stream of 1 KiB messages spread over {small} KiB of the pool");
        }
        Some("consumer") => {
            let config = config(WaitStrategy::BusyPoll);
            let mut c = Consumer::create(&ctx(), "hot", &here(), &here(), &config).unwrap();
            let mut answers = Producer::create(&ctx(), "hot-answers", &here(), &here(), &config).unwrap();
            for i in 0..LARGE + SMALL {
                let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
                assert!(m.iter().all(|&b| b == i as u8), "message {i}'s bytes");
                drop(m);
                if answered(i) {
                    answers.send(b"released").unwrap();
                }
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            let dir = test_dir("hot");
            let c = spawn(TEST, "consumer", &dir, &[]);
            let p = spawn(TEST, "producer", &dir, &[]);
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// KiB of the mapping that holds `addr` that are mapped into this process (its `Rss` in
/// /proc/self/smaps).
fn rss_kib_of_mapping_at(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((start, end)) = range.split_once('-') {
                if let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) {
                    inside = (start..end).contains(&addr);
                    continue;
                }
            }
        }
        if inside {
            if let Some(kib) = line.strip_prefix("Rss:") {
                return kib.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("no mapping holds {addr:#x}")
}

#[test]
fn the_pool_is_faulted_in_at_creation_unless_turned_off() {
    const TEST: &str = "backpressure::the_pool_is_faulted_in_at_creation_unless_turned_off";
    const POOL: usize = 8 << 20;
    // The data part (slots and pool) follows the region's first page; how much of it this
    // process has mapped in, in KiB, right after the channel is made.
    let mapped = |name: &str| {
        let (ptr, len) = region_of(name);
        (rss_kib_of_mapping_at(ptr as usize + 4096), (len as u64 - 4096) / 1024)
    };
    for (name, prefault) in [("warm", true), ("cold", false)] {
        let config = ChannelConfig { prefault, pool_size: POOL, ..config(WaitStrategy::BusyPoll) };
        let (rss, data) = match child_role().as_deref() {
            Some("producer") => {
                let _p = Producer::create(&ctx(), name, &here(), &here(), &config).unwrap();
                mapped(name)
            }
            Some("consumer") => {
                let _c = Consumer::create(&ctx(), name, &here(), &here(), &config).unwrap();
                mapped(name)
            }
            Some(_) => return,
            None => return run_pair(TEST, "prefault"),
        };
        if prefault {
            assert!(rss * 10 >= data * 9, "{name}: {rss} of {data} KiB mapped in");
        } else {
            assert!(rss * 10 <= data, "{name}: {rss} of {data} KiB mapped in without prefault");
        }
    }
}
