//! FIFO, exactly once, intact: a million messages of mixed sizes; loans; completion; the
//! pollable fd and async receive.

use std::time::Duration;

use lava_flow::channels::{Consumer, Producer, TransportKind, WaitStrategy};
use lava_flow::Error;

use crate::common::*;

const MILLION: u64 = 1_000_000;

#[test]
fn million_messages_mixed_sizes_fifo_exactly_once() {
    const TEST: &str = "delivery::million_messages_mixed_sizes_fifo_exactly_once";
    let wait = WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) };
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "million", &here(), &here(), &config(wait)).unwrap();
            let mut scratch = vec![0u8; 1 << 20];
            let mut last = 0;
            for seq in 0..MILLION {
                let size = size_of(seq);
                if seq % 2 == 0 {
                    message_into(&mut scratch[..size], seq);
                    last = p.send(&scratch[..size]).unwrap();
                } else {
                    let mut loan = p.loan(size, None).unwrap();
                    message_into(loan.as_mut_slice(), seq);
                    last = loan.publish().unwrap();
                }
                assert_eq!(last, seq);
            }
            p.wait_completed(last, Some(Duration::from_secs(60))).unwrap();
            assert_eq!(p.completed().unwrap(), MILLION);
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "million", &here(), &here(), &config(wait)).unwrap();
            assert_eq!(c.transport().kind, TransportKind::Shm);
            for seq in 0..MILLION {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(m.len(), size_of(seq));
                assert_eq!(m.sequence(), seq);
                check(&m, seq);
            }
            // The producer closes after its last message is released: then PeerGone, and no
            // extra message.
            match c.recv_timeout(Duration::from_secs(30)) {
                Err(Error::PeerGone(_)) => {}
                other => panic!("expected PeerGone after the last message, got {other:?}"),
            }
        }
        Some(_) => {}
        None => run_pair(TEST, "million"),
    }
}

#[test]
fn completion_follows_release_in_order() {
    const TEST: &str = "delivery::completion_follows_release_in_order";
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "completion", &here(), &here(), &config(wait)).unwrap();
            p.send(b"first message, held").unwrap();
            let mut loan = p.loan(5000, None).unwrap();
            loan.as_mut_slice().fill(7);
            assert_eq!(loan.publish().unwrap(), 1);
            // Message 0 is held by the consumer: nothing is complete even once 1 is released.
            assert!(matches!(p.wait_completed(0, Some(Duration::from_millis(200))), Err(Error::Timeout(_))));
            assert_eq!(p.completed().unwrap(), 0);
            // A loan dropped unpublished sends nothing.
            drop(p.loan(64, None).unwrap());
            p.send(b"release now").unwrap();
            p.wait_completed(1, Some(Duration::from_secs(10))).unwrap();
            assert!(p.completed().unwrap() >= 2);
            // Bad sizes.
            assert!(matches!(p.try_send(&[]), Err(Error::InvalidArgument(_))));
            let too_big = vec![0u8; p.max_message_len() + 1];
            assert!(matches!(p.try_send(&too_big), Err(Error::InvalidArgument(_))));
            p.wait_completed(2, Some(Duration::from_secs(10))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "completion", &here(), &here(), &config(wait)).unwrap();
            let first = c.recv().unwrap();
            assert_eq!(&*first, b"first message, held");
            let second = c.recv().unwrap();
            assert!(second.len() == 5000 && second.iter().all(|&b| b == 7));
            drop(second);
            let third = c.recv().unwrap();
            assert_eq!(&*third, b"release now");
            drop(first);
            drop(third);
            assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => run_pair(TEST, "completion"),
    }
}

/// The names of this process's threads that are lava-flow's.
#[cfg(feature = "async-io")]
fn lava_flow_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("lava-flow"))
        .collect();
    names.sort();
    names
}

#[test]
#[cfg(feature = "async-io")]
fn pollable_fd_and_async_receive() {
    const TEST: &str = "delivery::pollable_fd_and_async_receive";
    const N: u64 = 2000;
    let wait = WaitStrategy::Block;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "pollable", &here(), &here(), &config(wait)).unwrap();
            let mut buf = vec![0u8; 4096];
            for seq in 0..2 * N {
                let size = size_of(seq).min(4096);
                message_into(&mut buf[..size], seq);
                p.send(&buf[..size]).unwrap();
                if seq % 97 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
            p.wait_completed(2 * N - 1, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            use std::os::fd::AsRawFd;
            let mut c = Consumer::create(&ctx(), "pollable", &here(), &here(), &config(wait)).unwrap();
            let fd = c.notify_fd().unwrap().as_raw_fd();
            let mut seq = 0;
            while seq < N {
                let mut p = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                // SAFETY: p is a live pollfd array.
                let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 10_000) };
                assert_eq!(n, 1, "the fd did not become readable with messages waiting");
                loop {
                    match c.try_recv() {
                        Ok(m) => {
                            check(&m, seq);
                            seq += 1;
                        }
                        Err(Error::WouldBlock(_)) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            // The wait is async-io's reactor's (driven by its block_on on this thread): lava-flow
            // starts no thread of its own to receive asynchronously.
            let threads = lava_flow_threads();
            while seq < 2 * N {
                let m = async_io::block_on(c.recv_async()).unwrap();
                check(&m, seq);
                seq += 1;
                assert_eq!(lava_flow_threads(), threads, "lava-flow started a thread to receive asynchronously");
            }
            assert!(matches!(async_io::block_on(c.recv_async()), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => run_pair(TEST, "pollable"),
    }
}

#[test]
fn views_released_from_many_threads_in_any_order() {
    const TEST: &str = "delivery::views_released_from_many_threads_in_any_order";
    const N: u64 = 200_000;
    let cfg = lava_flow::channels::ChannelConfig {
        capacity: 64,
        ..config(WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) })
    };
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "threads", &here(), &here(), &cfg).unwrap();
            for seq in 0..N {
                let size = 16 + (seq as usize * 37) % 300;
                let mut loan = p.loan(size, Some(Duration::from_secs(30))).unwrap();
                message_into(loan.as_mut_slice(), seq);
                loan.publish().unwrap();
            }
            p.wait_completed(N - 1, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "threads", &here(), &here(), &cfg).unwrap();
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    let (tx, rx) = std::sync::mpsc::channel::<lava_flow::channels::Message>();
                    let t = std::thread::spawn(move || {
                        let mut held = Vec::new();
                        for m in rx {
                            check(&m, m.sequence());
                            held.push(m);
                            // Release in a scrambled order once a few are held (space is
                            // reclaimed in order, so none may be held for long).
                            if held.len() > 2 + w {
                                while !held.is_empty() {
                                    let i = (held[0].sequence() as usize * 7) % held.len();
                                    drop(held.swap_remove(i));
                                }
                            }
                        }
                    });
                    (tx, t)
                })
                .collect();
            for seq in 0..N {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(m.sequence(), seq);
                workers[(seq % 4) as usize].0.send(m).unwrap();
            }
            for (tx, t) in workers {
                drop(tx);
                t.join().unwrap();
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => run_pair(TEST, "threads"),
    }
}

/// Copied messages of 512 KiB and more go into the pool through the copy crew (forced here by
/// `LF_COPY_THREADS`, whatever the machine's cores): every byte arrives, in order, at sizes
/// that do not divide into the crew's chunks, between small messages.
#[test]
fn large_copied_messages_arrive_whole() {
    const TEST: &str = "delivery::large_copied_messages_arrive_whole";
    const SIZES: [usize; 7] = [2 << 20, (2 << 20) + 17, (5 << 20) + 4093, 64, (12 << 20) - 1, (512 << 10) + 3, 3 << 20];
    const COUNT: u64 = 30;
    let wait = WaitStrategy::BusyPoll;
    let size = |seq: u64| SIZES[seq as usize % SIZES.len()];
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "large", &here(), &here(), &config(wait)).unwrap();
            let mut scratch = vec![0u8; 12 << 20];
            for seq in 0..COUNT {
                message_into(&mut scratch[..size(seq)], seq);
                assert_eq!(p.send(&scratch[..size(seq)]).unwrap(), seq);
            }
            p.wait_completed(COUNT - 1, Some(Duration::from_secs(60))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "large", &here(), &here(), &config(wait)).unwrap();
            for seq in 0..COUNT {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(m.len(), size(seq));
                check(&m, seq);
            }
        }
        Some(_) => {}
        None => run_pair_producer_env(TEST, "large", &[], &[("LF_COPY_THREADS", "3")]),
    }
}
