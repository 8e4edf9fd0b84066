//! 1,000 create/destroy cycles, each with a copy send and a buffer send (the arena's fd
//! travels and is mapped anew per channel), leave no fd, mapping, /dev/shm entry or socket
//! file behind.

use std::time::Duration;

use lava_flow::channels::{Consumer, Producer, WaitStrategy, AUTO_ZERO_COPY_MIN};
use lava_flow::memory::MemoryLocation;

use crate::common::*;

const CYCLES: u32 = 1000;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Channels mapped here: each maps its control part and its data part (`lava-flow:NAME` and
/// `lava-flow:NAME:data`) together, and unmaps them together; the two counts must agree.
fn channel_mappings() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let parts: Vec<&str> = maps.lines().filter(|l| l.contains("lava-flow:")).collect();
    let data = parts.iter().filter(|l| l.contains(":data")).count();
    assert_eq!(data * 2, parts.len(), "control and data parts mapped together: {parts:?}");
    data
}

fn arena_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("lava-flow-arena")).count()
}

fn dev_shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn thousand_cycles_leave_nothing() {
    const TEST: &str = "leaks::thousand_cycles_leave_nothing";
    let wait = WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) };
    match child_role().as_deref() {
        Some("producer") => {
            let buffer = ctx().allocate(1 << 20, MemoryLocation::CpuStandard).unwrap();
            let (fds, arenas) = (open_fds(), arena_mappings());
            for i in 0..CYCLES {
                let mut p = Producer::create(&ctx(), "cycle", &here(), &here(), &config(wait)).unwrap();
                p.send(&i.to_le_bytes()).unwrap();
                // Long enough to go by reference (shorter ranges are copied).
                let offset = i as usize * AUTO_ZERO_COPY_MIN;
                buffer.write_at(offset, &u64::from(i).to_le_bytes()).unwrap();
                p.send_buffer(&buffer, offset, AUTO_ZERO_COPY_MIN).unwrap();
                p.wait_completed(1, Some(Duration::from_secs(10))).unwrap();
                assert_eq!(p.arenas_sent(), 1);
            }
            assert_eq!(open_fds(), fds, "fds leaked");
            assert_eq!(channel_mappings(), 0, "mappings leaked");
            assert_eq!(arena_mappings(), arenas, "arena mappings leaked");
        }
        Some("consumer") => {
            let fds = open_fds();
            for i in 0..CYCLES {
                let mut c = Consumer::create(&ctx(), "cycle", &here(), &here(), &config(wait)).unwrap();
                assert_eq!(&*c.recv().unwrap(), &i.to_le_bytes());
                let m = c.recv().unwrap();
                assert!(m.is_zero_copy());
                assert_eq!(&m[..8], &u64::from(i).to_le_bytes());
            }
            assert_eq!(open_fds(), fds, "fds leaked");
            assert_eq!(channel_mappings(), 0, "mappings leaked");
            assert_eq!(arena_mappings(), 0, "arena mappings leaked");
        }
        Some(_) => {}
        None => {
            let shm_before = dev_shm_entries();
            let dir = test_dir("cycles");
            let c = spawn(TEST, "consumer", &dir, &[]);
            let p = spawn(TEST, "producer", &dir, &[]);
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
            let new: Vec<_> =
                dev_shm_entries().into_iter().filter(|e| !shm_before.contains(e) && e.contains("lava")).collect();
            assert!(new.is_empty(), "left in /dev/shm: {new:?}");
        }
    }
}

/// Messages may outlive their consumer: they stay readable, in any thread, and the last one
/// released unmaps the channel (a message points at its session without a reference count,
/// so this is what checks that the session is neither freed early nor leaked).
#[test]
fn messages_outlive_their_consumer() {
    const TEST: &str = "leaks::messages_outlive_their_consumer";
    let wait = WaitStrategy::BusyPoll;
    match child_role().as_deref() {
        Some("producer") => {
            let buffer = ctx().allocate(4096, MemoryLocation::CpuStandard).unwrap();
            buffer.write_at(0, b"by reference").unwrap();
            let mut p = Producer::create(&ctx(), "outlive", &here(), &here(), &config(wait)).unwrap();
            p.send(b"first").unwrap();
            p.send(&[7u8; 5000]).unwrap();
            p.send_buffer(&buffer, 0, 12).unwrap();
            // The consumer closes before it releases: the producer sees either the close or
            // the releases that follow it (the shared tail still moves), whichever it looks
            // at first.
            match p.wait_completed(2, Some(Duration::from_secs(20))) {
                Ok(()) | Err(lava_flow::Error::PeerGone(_)) => {}
                Err(e) => panic!("waiting for the consumer: {e}"),
            }
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "outlive", &here(), &here(), &config(wait)).unwrap();
            let first = c.recv().unwrap();
            let pooled = c.recv().unwrap();
            let by_ref = c.recv().unwrap();
            drop(c);
            assert_eq!(channel_mappings(), 1, "the held messages keep the channel mapped");
            assert_eq!(&*first, b"first");
            let elsewhere = std::thread::spawn(move || {
                assert!(pooled.iter().all(|&b| b == 7) && pooled.len() == 5000);
                drop(pooled);
            });
            elsewhere.join().unwrap();
            assert_eq!(&*by_ref, b"by reference");
            drop(first);
            assert_eq!(channel_mappings(), 1, "one message is still held");
            drop(by_ref);
            assert_eq!(channel_mappings(), 0, "the last release unmaps the channel");
            assert_eq!(arena_mappings(), 0, "and the producer's arena");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("outlive");
            let c = spawn(TEST, "consumer", &dir, &[]);
            let p = spawn(TEST, "producer", &dir, &[]);
            wait_ok(c, "consumer");
            wait_ok(p, "producer");
            assert_dir_empty(&dir);
        }
    }
}
