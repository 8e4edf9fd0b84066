//! A peer scribbling on the shared control region gets `Corrupt`, never an out-of-bounds
//! access.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use lava_flow::channels::{Consumer, Producer, WaitStrategy};
use lava_flow::Error;

use crate::common::*;

// The layout from src/channels/transports/shm/ring.rs, as a hostile peer would learn it.
const SLOTS: usize = 4096;
const SLOT: usize = 128;
const TAIL: usize = 256;

/// What the hostile producer writes into the slot of message 3.
const VARIANTS: [&str; 5] = ["seq", "inline-len", "pool-range", "kind", "zero-len"];

unsafe fn u64_at(base: *mut u8, off: usize) -> &'static AtomicU64 {
    &*(base.add(off) as *const AtomicU64)
}
unsafe fn u32_at(base: *mut u8, off: usize) -> &'static AtomicU32 {
    &*(base.add(off) as *const AtomicU32)
}

#[test]
fn garbage_in_the_control_region_is_corrupt() {
    const TEST: &str = "hostile::garbage_in_the_control_region_is_corrupt";
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            for variant in VARIANTS {
                let mut p = Producer::create(&ctx(), &format!("hostile-{variant}"), &here(), &here(), &config(wait)).unwrap();
                for i in 0..3u64 {
                    p.send(&i.to_le_bytes()).unwrap();
                }
                let (base, _) = p.raw_region_for_tests().unwrap();
                let slot = SLOTS + 3 * SLOT;
                // SAFETY: the test owns the mapping and writes inside slot 3.
                unsafe {
                    match variant {
                        "seq" => u64_at(base, slot).store(0xdead_beef, Ordering::SeqCst),
                        "inline-len" => {
                            u32_at(base, slot + 8).store(100_000, Ordering::Relaxed);
                            u32_at(base, slot + 12).store(1, Ordering::Relaxed);
                            u64_at(base, slot).store(4, Ordering::SeqCst);
                        }
                        "pool-range" => {
                            u32_at(base, slot + 8).store(4096, Ordering::Relaxed);
                            u32_at(base, slot + 12).store(2, Ordering::Relaxed);
                            u64_at(base, slot + 16).store(u64::MAX - 100, Ordering::Relaxed);
                            u64_at(base, slot).store(4, Ordering::SeqCst);
                        }
                        "kind" => {
                            u32_at(base, slot + 8).store(8, Ordering::Relaxed);
                            u32_at(base, slot + 12).store(77, Ordering::Relaxed);
                            u64_at(base, slot).store(4, Ordering::SeqCst);
                        }
                        _ => {
                            u32_at(base, slot + 8).store(0, Ordering::Relaxed);
                            u32_at(base, slot + 12).store(1, Ordering::Relaxed);
                            u64_at(base, slot).store(4, Ordering::SeqCst);
                        }
                    }
                }
                p.wait_completed(2, Some(Duration::from_secs(10))).unwrap();
                // Keep the producer alive until the consumer has looked.
                let _ = p.wait_completed(3, Some(Duration::from_millis(300)));
            }
            // A hostile consumer: its tail jumps ahead of anything sent.
            let mut p = Producer::create(&ctx(), "hostile-tail", &here(), &here(), &config(wait)).unwrap();
            p.send(b"one").unwrap();
            let err = loop {
                match p.completed() {
                    Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => break e,
                }
            };
            assert!(matches!(err, Error::Corrupt(ref m) if m.contains("tail")), "{err}");
        }
        Some("consumer") => {
            for variant in VARIANTS {
                let mut c = Consumer::create(&ctx(), &format!("hostile-{variant}"), &here(), &here(), &config(wait)).unwrap();
                for i in 0..3u64 {
                    assert_eq!(&*c.recv().unwrap(), &i.to_le_bytes());
                }
                let err = c.recv_timeout(Duration::from_secs(10)).unwrap_err();
                assert!(matches!(err, Error::Corrupt(_)), "{variant}: {err}");
                println!("{variant}: {err}");
            }
            let mut c = Consumer::create(&ctx(), "hostile-tail", &here(), &here(), &config(wait)).unwrap();
            drop(c.recv().unwrap());
            let (base, _) = c.raw_region_for_tests().unwrap();
            // SAFETY: the test owns the mapping; the tail word lies in the header page.
            unsafe { u64_at(base, TAIL).store(1 << 40, Ordering::SeqCst) };
            let _ = c.recv_timeout(Duration::from_secs(10));
        }
        Some(_) => {}
        None => run_pair(TEST, "hostile"),
    }
}
