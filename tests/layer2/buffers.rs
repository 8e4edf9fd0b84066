//! Buffer sends: lava-flow buffers go by reference. The consumer maps each arena once and
//! reads the producer's very pages (it sees later writes), completion says when a region may
//! be reused, `send` of bytes inside a buffer goes by reference by itself, views survive the
//! producer's kill -9, and a hostile producer's arena descriptors are `Corrupt`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy, AUTO_ZERO_COPY_MIN};
use lava_flow::memory::{Buffer, ContextConfig, MemoryLocation};
use lava_flow::Error;

use crate::common::*;

/// Region size for the many-regions stream: each buffer is cut into regions of this size.
const REGION: usize = 64 << 10;

fn arena_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.contains("lava-flow-arena")).count()
}

fn allocate(len: usize) -> Buffer {
    ctx().allocate(len, MemoryLocation::CpuStandard).unwrap()
}

/// Writes message `seq` (sequence, checksum, payload) into `len` bytes at `offset` of `buffer`.
fn write_message(buffer: &Buffer, offset: usize, len: usize, seq: u64) {
    let mut bytes = vec![0u8; len];
    message_into(&mut bytes, seq);
    buffer.write_at(offset, &bytes).unwrap();
}

#[test]
fn many_regions_of_several_arenas_arrive_by_reference() {
    const TEST: &str = "buffers::many_regions_of_several_arenas_arrive_by_reference";
    const MESSAGES: u64 = 3000;
    let wait = WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) };
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "regions", &here(), &here(), &config(wait)).unwrap();
            // Three buffers with arenas of their own (over a quarter of the 2 MiB arena size)
            // and four small ones sharing one pooled arena: four arenas in all.
            let mut buffers: Vec<Buffer> = (0..3).map(|_| allocate(1 << 20)).collect();
            buffers.extend((0..4).map(|_| allocate(REGION * 2)));
            let regions: Vec<(usize, usize)> = buffers
                .iter()
                .enumerate()
                .flat_map(|(b, buf)| (0..buf.len() / REGION).map(move |r| (b, r * REGION)))
                .collect();
            for seq in 0..MESSAGES {
                let (b, offset) = regions[seq as usize % regions.len()];
                // The region's previous message must be complete before it is rewritten.
                if let Some(previous) = seq.checked_sub(regions.len() as u64) {
                    p.wait_completed(previous, Some(Duration::from_secs(30))).unwrap();
                }
                // Ranges shorter than AUTO_ZERO_COPY_MIN are copied, not sent by reference.
                let len = AUTO_ZERO_COPY_MIN + (seq as usize * 7919) % (REGION - AUTO_ZERO_COPY_MIN - 64);
                let start = offset + if seq % 3 == 0 { 64 } else { 0 };
                write_message(&buffers[b], start, len, seq);
                assert_eq!(p.send_buffer(&buffers[b], start, len).unwrap(), seq);
            }
            p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(p.arenas_sent(), 4, "each arena's fd goes once");
            // Bad ranges and memory that cannot go by reference.
            assert!(matches!(p.send_buffer(&buffers[0], 1 << 20, 1), Err(Error::InvalidArgument(_))));
            assert!(matches!(p.send_buffer(&buffers[0], 10, usize::MAX), Err(Error::InvalidArgument(_))));
            assert!(matches!(p.send_buffer(&buffers[0], 0, 0), Err(Error::InvalidArgument(_))));
            let mut user = vec![0u8; 4096];
            // SAFETY: `user` outlives the registration (dropped at the end of this block).
            let registered = unsafe { ctx().register(user.as_mut_ptr(), user.len()) }.unwrap();
            let err = p.send_buffer(&registered, 0, 100).unwrap_err();
            assert!(matches!(err, Error::Unsupported(ref m) if m.contains("registered user memory")), "{err}");
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "regions", &here(), &here(), &config(wait)).unwrap();
            for seq in 0..MESSAGES {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert!(m.is_zero_copy());
                assert_eq!(m.sequence(), seq);
                check(&m, seq);
            }
            assert_eq!(c.arenas_received(), 4, "each arena is mapped once");
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
            drop(c);
            assert_eq!(arena_mappings(), 0, "the consumer unmapped every arena");
        }
        Some(_) => {}
        None => run_pair(TEST, "regions"),
    }
}

#[test]
fn the_consumer_reads_the_producers_pages_and_completion_says_when_to_reuse() {
    const TEST: &str = "buffers::the_consumer_reads_the_producers_pages_and_completion_says_when_to_reuse";
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "pages", &here(), &here(), &config(wait)).unwrap();
            let buffer = allocate(1 << 16);
            buffer.write_at(4096, &[0xaa; 1000]).unwrap();
            assert_eq!(p.send_buffer(&buffer, 4096, 1000).unwrap(), 0);
            // The consumer holds the view: the region is not free for reuse yet.
            assert!(matches!(p.wait_completed(0, Some(Duration::from_millis(300))), Err(Error::Timeout(_))));
            assert_eq!(p.completed().unwrap(), 0);
            // Writing it anyway shows the consumer reads these very pages.
            buffer.write_at(4096, &[0xbb; 1000]).unwrap();
            p.send(b"rewritten").unwrap();
            p.wait_completed(1, Some(Duration::from_secs(10))).unwrap();
            assert_eq!(p.completed().unwrap(), 2);
            // send() of bytes inside a buffer goes by reference by itself; ordinary memory,
            // registered memory and short sends are copied.
            // SAFETY: the buffer is live and holds 64 KiB.
            let inside = unsafe { std::slice::from_raw_parts(buffer.as_ptr().add(100), 5000) };
            assert_eq!(p.send(inside).unwrap(), 2);
            let heap = vec![0xccu8; 5000];
            p.send(&heap).unwrap();
            let short = unsafe { std::slice::from_raw_parts(buffer.as_ptr(), AUTO_ZERO_COPY_MIN - 1) };
            p.send(short).unwrap();
            let mut user = vec![0xddu8; 8192];
            // SAFETY: `user` outlives the registration.
            let registered = unsafe { ctx().register(user.as_mut_ptr(), user.len()) }.unwrap();
            // SAFETY: the registered range is live.
            p.send(unsafe { std::slice::from_raw_parts(registered.as_ptr(), 8192) }).unwrap();
            p.wait_completed(5, Some(Duration::from_secs(10))).unwrap();
            // A short buffer send is copied into the message: complete at once, before the
            // consumer has even looked, and the buffer is free to rewrite.
            buffer.write_at(0, &[0xee; 8]).unwrap();
            assert_eq!(p.send_buffer(&buffer, 0, 8).unwrap(), 6);
            p.wait_completed(6, Some(Duration::ZERO)).unwrap();
            buffer.write_at(0, &[0x11; 8]).unwrap();
            assert_eq!(p.arenas_sent(), 1);
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "pages", &here(), &here(), &config(wait)).unwrap();
            let held = c.recv().unwrap();
            assert!(held.is_zero_copy());
            assert!(held.iter().all(|&b| b == 0xaa));
            let note = c.recv().unwrap();
            assert_eq!(&*note, b"rewritten");
            assert!(!note.is_zero_copy());
            assert!(held.iter().all(|&b| b == 0xbb), "the view shows the producer's later write: same pages");
            drop(note);
            drop(held);
            let expect = [(5000, true), (5000, false), (AUTO_ZERO_COPY_MIN - 1, false), (8192, false), (8, false)];
            for (i, (len, zero_copy)) in expect.into_iter().enumerate() {
                let m = c.recv().unwrap();
                assert_eq!((m.len(), m.is_zero_copy()), (len, zero_copy), "message {}", i + 2);
            }
            assert_eq!(c.arenas_received(), 1);
            assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => run_pair(TEST, "pages"),
    }
}

#[test]
fn views_of_arena_memory_survive_the_producers_kill_9() {
    const TEST: &str = "buffers::views_of_arena_memory_survive_the_producers_kill_9";
    let wait = WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) };
    match child_role().as_deref() {
        Some("victim") => {
            let mut p = Producer::create(&ctx(), "arena-victim", &here(), &here(), &config(wait)).unwrap();
            let buffers = [allocate(1 << 20), allocate(4096)];
            for seq in 0..4u64 {
                let buffer = &buffers[seq as usize % 2];
                let offset = (seq as usize / 2) * 2048;
                write_message(buffer, offset, 2000, seq);
                p.send_buffer(buffer, offset, 2000).unwrap();
            }
            report("sent", 4);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some("survivor") => {
            let mut c = Consumer::create(&ctx(), "arena-victim", &here(), &here(), &config(wait)).unwrap();
            let views: Vec<_> = (0..4).map(|_| c.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
            report("holding", views.len());
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(5)), Err(Error::PeerGone(_))));
            for (seq, view) in views.iter().enumerate() {
                assert!(view.is_zero_copy());
                check(view, seq as u64);
            }
            drop(views);
            drop(c);
            assert_eq!(arena_mappings(), 0, "the dead producer's arenas were unmapped");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("arena-kill");
            let scratch = scratch_dir();
            let flag = scratch.path().join("arena-kill.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = [("flag", flag.clone())];
            let mut c = spawn(TEST, "survivor", &dir, &args);
            let mut c_out = stdout_of(&mut c);
            let mut p = spawn(TEST, "victim", &dir, &args);
            let mut p_out = stdout_of(&mut p);
            expect_line(&mut p_out, "sent");
            expect_line(&mut c_out, "holding");
            kill9(&mut p);
            std::fs::write(&flag, b"killed").unwrap();
            wait_ok(c, "survivor");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}

#[test]
fn arenas_that_die_at_the_producer_are_unmapped_at_the_consumer() {
    const TEST: &str = "buffers::arenas_that_die_at_the_producer_are_unmapped_at_the_consumer";
    const ROUNDS: u64 = 20;
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "forget", &here(), &here(), &config(wait)).unwrap();
            for round in 0..ROUNDS {
                // A buffer with an arena of its own, freed once its message is complete: the
                // next announcement tells the consumer to forget it.
                let buffer = allocate(1 << 20);
                write_message(&buffer, 4096, 4096, round);
                p.send_buffer(&buffer, 4096, 4096).unwrap();
                p.wait_completed(round, Some(Duration::from_secs(10))).unwrap();
            }
            assert_eq!(p.arenas_sent(), ROUNDS);
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "forget", &here(), &here(), &config(wait)).unwrap();
            for round in 0..ROUNDS {
                let m = c.recv().unwrap();
                assert!(m.is_zero_copy());
                check(&m, round);
                assert_eq!(arena_mappings(), 1, "round {round}: the arenas that died are unmapped");
            }
            assert_eq!(c.arenas_received(), ROUNDS);
        }
        Some(_) => {}
        None => run_pair(TEST, "forget"),
    }
}

// The layout from src/channels/transports/shm/ring.rs, as a hostile peer would learn it.
const SLOTS: usize = 4096;
const SLOT: usize = 128;
const KIND_ARENA: u32 = 3;

/// What the hostile producer writes into the arena descriptor of message 3.
const VARIANTS: [&str; 4] = ["unknown-id", "offset-beyond", "len-overflow", "zero-len"];

#[test]
fn hostile_arena_descriptors_are_corrupt() {
    const TEST: &str = "buffers::hostile_arena_descriptors_are_corrupt";
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            let buffer = allocate(1 << 16);
            for variant in VARIANTS {
                let mut p =
                    Producer::create(&ctx(), &format!("hostile-arena-{variant}"), &here(), &here(), &config(wait))
                        .unwrap();
                for i in 0..3u64 {
                    buffer.write_at(i as usize * 8, &i.to_le_bytes()).unwrap();
                    p.send_buffer(&buffer, i as usize * 8, 8).unwrap();
                }
                let (base, _) = region_of(&format!("hostile-arena-{variant}"));
                let slot = SLOTS + 3 * SLOT;
                let (id, offset, len) = match variant {
                    "unknown-id" => (0xdead_beef, 0, 8),
                    // The buffer's pooled arena has the default size: 4 bytes past its end.
                    "offset-beyond" => (1, ContextConfig::DEFAULT_ARENA_SIZE as u64 - 4, 8),
                    "len-overflow" => (1, 64, u64::MAX - 10),
                    _ => (1, 0, 0),
                };
                // SAFETY: the test owns the mapping and writes inside slot 3.
                unsafe {
                    let u64_at = |off: usize| &*(base.add(off) as *const AtomicU64);
                    (*(base.add(slot + 12) as *const AtomicU32)).store(KIND_ARENA, Ordering::Relaxed);
                    u64_at(slot + 16).store(id, Ordering::Relaxed);
                    u64_at(slot + 24).store(offset, Ordering::Relaxed);
                    u64_at(slot + 32).store(len, Ordering::Relaxed);
                    u64_at(slot).store(4, Ordering::SeqCst);
                }
                p.wait_completed(2, Some(Duration::from_secs(10))).unwrap();
                // Keep the producer alive until the consumer has looked.
                let _ = p.wait_completed(3, Some(Duration::from_millis(300)));
            }
        }
        Some("consumer") => {
            for variant in VARIANTS {
                let mut c =
                    Consumer::create(&ctx(), &format!("hostile-arena-{variant}"), &here(), &here(), &config(wait))
                        .unwrap();
                for i in 0..3u64 {
                    let m = c.recv().unwrap();
                    assert_eq!(&*m, &i.to_le_bytes());
                }
                let err = c.recv_timeout(Duration::from_secs(10)).unwrap_err();
                assert!(matches!(err, Error::Corrupt(_)), "{variant}: {err}");
                println!("{variant}: {err}");
            }
        }
        Some(_) => {}
        None => run_pair(TEST, "hostile-arena"),
    }
}

#[test]
fn with_auto_zero_copy_off_send_copies_and_the_bytes_are_free_at_once() {
    const TEST: &str = "buffers::with_auto_zero_copy_off_send_copies_and_the_bytes_are_free_at_once";
    let config = ChannelConfig { auto_zero_copy: false, ..config(WaitStrategy::Block) };
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "copy-only", &here(), &here(), &config).unwrap();
            let buffer = allocate(1 << 16);
            buffer.write_at(0, &[0x11; 4000]).unwrap();
            // SAFETY: the buffer is live and holds 64 KiB.
            let inside = unsafe { std::slice::from_raw_parts(buffer.as_ptr(), 4000) };
            p.send(inside).unwrap();
            // Copy semantics: rewriting at once cannot change the message in flight.
            buffer.write_at(0, &[0x22; 4000]).unwrap();
            p.send(b"rewritten").unwrap();
            p.wait_completed(1, Some(Duration::from_secs(10))).unwrap();
            assert_eq!(p.arenas_sent(), 0, "nothing went by reference");
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "copy-only", &here(), &here(), &config).unwrap();
            let first = c.recv().unwrap();
            let second = c.recv().unwrap();
            assert_eq!(&*second, b"rewritten");
            assert!(!first.is_zero_copy());
            assert!(first.iter().all(|&b| b == 0x11), "the copy kept the bytes as they were sent");
        }
        Some(_) => {}
        None => run_pair(TEST, "copy-only"),
    }
}
