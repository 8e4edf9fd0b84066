//! A peer scribbling on the shared control region gets `Corrupt`, never an out-of-bounds
//! access.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::MemoryLocation;
use lava_flow::Error;

use crate::common::*;

// The layout from src/channels/transports/shm/ring.rs, as a hostile peer would learn it.
const SLOTS: usize = 4096;
const SLOT: usize = 128;
const TAIL: usize = 256;
const PRODUCER_CLOSED: usize = 128;

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
                let mut p =
                    Producer::create(&ctx(), &format!("hostile-{variant}"), &here(), &here(), &config(wait)).unwrap();
                for i in 0..3u64 {
                    p.send(&i.to_le_bytes()).unwrap();
                }
                let (base, _) = region_of(&format!("hostile-{variant}"));
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
                let mut c =
                    Consumer::create(&ctx(), &format!("hostile-{variant}"), &here(), &here(), &config(wait)).unwrap();
                for i in 0..3u64 {
                    assert_eq!(&*c.recv().unwrap(), &i.to_le_bytes());
                }
                let err = c.recv_timeout(Duration::from_secs(10)).unwrap_err();
                assert!(matches!(err, Error::Corrupt(_)), "{variant}: {err}");
                println!("{variant}: {err}");
            }
            let mut c = Consumer::create(&ctx(), "hostile-tail", &here(), &here(), &config(wait)).unwrap();
            drop(c.recv().unwrap());
            let (base, _) = region_of("hostile-tail");
            // SAFETY: the test owns the mapping; the tail word lies in the header page.
            unsafe { u64_at(base, TAIL).store(1 << 40, Ordering::SeqCst) };
            let _ = c.recv_timeout(Duration::from_secs(10));
        }
        Some(_) => {}
        None => run_pair(TEST, "hostile"),
    }
}

/// Whether this kernel offers `F_SEAL_FUTURE_WRITE` (Linux 5.1), probed on a memfd of our own.
fn kernel_seals_future_writes() -> bool {
    // SAFETY: memfd_create with a static name; the fd is closed below.
    let fd = unsafe { libc::memfd_create(c"lf-probe".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fcntl and close on the descriptor just made.
    unsafe {
        let ok = libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE) == 0;
        libc::close(fd);
        ok
    }
}

/// A hostile consumer cannot make its read-only view of the producer's ring (slots and pool)
/// writable: the kernel refuses `mprotect`, where it offers the seal; the messages arrive intact.
#[test]
fn the_consumer_cannot_make_the_ring_writable() {
    const TEST: &str = "hostile::the_consumer_cannot_make_the_ring_writable";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p =
                Producer::create(&ctx(), "sealed-ring", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            for i in 0..4u64 {
                p.send(&[i as u8; 300]).unwrap();
            }
            p.wait_completed(3, Some(Duration::from_secs(20))).unwrap();
        }
        Some("consumer") => {
            let mut c =
                Consumer::create(&ctx(), "sealed-ring", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let m = c.recv_timeout(Duration::from_secs(20)).unwrap();
            let (base, len) = region_of("sealed-ring");
            // SAFETY: mprotect of the consumer's own mapping of the data part (from the slots
            // on); refused, it leaves the mapping as it was.
            let rc = unsafe { libc::mprotect(base.add(SLOTS).cast(), len - SLOTS, libc::PROT_READ | libc::PROT_WRITE) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            if kernel_seals_future_writes() {
                assert_eq!((rc, errno), (-1, Some(libc::EACCES)), "the ring's data part could be made writable");
            } else {
                println!("this kernel has no F_SEAL_FUTURE_WRITE (Linux 5.1): the ring's data part is not sealed");
            }
            assert_eq!(&*m, &[0u8; 300]);
            drop(m);
            for i in 1..4u8 {
                assert_eq!(&*c.recv_timeout(Duration::from_secs(20)).unwrap(), &[i; 300]);
            }
        }
        Some(_) => {}
        None => run_pair_with(TEST, "sealed-ring", &[]),
    }
}

/// The eventfds, pipes and sockets among the targets of the consumer's notification set (its
/// epoll fd): what the channel waits on for the producer. A peer that holds a descriptor of
/// one of them shares its open file description: it can clear `O_NONBLOCK` on it, fill an
/// eventfd's counter, or read it empty.
fn notification_fds(epoll: RawFd) -> Vec<(RawFd, bool)> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{epoll}")).unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("tfd:")?.split_whitespace().next()?.parse::<RawFd>().ok())
        .filter_map(|fd| {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
            let link = link.to_string_lossy();
            let eventfd = link == "anon_inode:[eventfd]";
            (eventfd || link.starts_with("pipe:") || link.starts_with("socket:")).then_some((fd, eventfd))
        })
        .collect()
}

/// Does to `fd` what a hostile peer holding the same open file description can: makes it
/// blocking, and where it is an eventfd, fills its counter, so that the next write of a signal
/// would block.
fn make_blocking_and_full(fd: RawFd, eventfd: bool) {
    // SAFETY: fcntl and write on a descriptor this process holds; failures are harmless here.
    unsafe {
        libc::fcntl(fd, libc::F_SETFL, 0);
        if eventfd {
            let max = 0xffff_ffff_ffff_fffeu64;
            libc::write(fd, (&max as *const u64).cast(), 8);
        }
    }
}

/// Runs `work` on a thread and panics with `what` if it has not returned within `limit`.
fn within<T: Send + 'static>(limit: Duration, what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(work()));
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} blocked for {limit:?}"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} failed (see its panic above)"),
    }
}

/// A hostile consumer makes the notification descriptors it shares with the producer blocking
/// and full, then asks for a signal: the producer's send (and close) still return at once.
#[test]
fn a_hostile_consumer_cannot_block_the_producer_on_a_signal() {
    const TEST: &str = "hostile::a_hostile_consumer_cannot_block_the_producer_on_a_signal";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p =
                Producer::create(&ctx(), "blocked-signal", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            p.send(b"zero").unwrap();
            // Released once the consumer has tampered with its descriptors and asked for a signal.
            p.wait_completed(0, Some(Duration::from_secs(20))).unwrap();
            let p = within(Duration::from_secs(10), "a send that signals the consumer", move || {
                p.send(b"one").unwrap();
                p
            });
            within(Duration::from_secs(10), "the producer's close", move || {
                let mut p = p;
                let _ = p.wait_completed(1, Some(Duration::from_secs(5)));
                drop(p);
            });
        }
        Some("consumer") => {
            let mut c =
                Consumer::create(&ctx(), "blocked-signal", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let zero = c.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(&*zero, b"zero");
            // Arming the notification set asks the producer to signal the next message.
            let epoll = c.notify_fd().unwrap().as_raw_fd();
            let fds = notification_fds(epoll);
            assert!(!fds.is_empty(), "no eventfd, pipe or socket in the notification set");
            for (fd, eventfd) in fds {
                make_blocking_and_full(fd, eventfd);
            }
            drop(zero);
            assert_eq!(&*c.recv_timeout(Duration::from_secs(20)).unwrap(), b"one");
        }
        Some(_) => {}
        None => run_pair(TEST, "blocked-signal"),
    }
}

/// The descriptions a hostile producer shares with the consumer made blocking (as a producer
/// that kept a copy of them can): the consumer's non-blocking receive and its reset of the
/// notification still return at once.
#[test]
fn a_hostile_producer_cannot_block_the_consumers_try_recv() {
    const TEST: &str = "hostile::a_hostile_producer_cannot_block_the_consumers_try_recv";
    match child_role().as_deref() {
        Some("producer") => {
            let mut p =
                Producer::create(&ctx(), "blocked-drain", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            p.send(b"zero").unwrap();
            p.wait_completed(0, Some(Duration::from_secs(20))).unwrap();
            p.send(b"one").unwrap();
            p.wait_completed(1, Some(Duration::from_secs(20))).unwrap();
        }
        Some("consumer") => {
            let mut c =
                Consumer::create(&ctx(), "blocked-drain", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            // Held, so that the producer sends nothing more until the receives below are done.
            let zero = c.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(&*zero, b"zero");
            let epoll = c.notify_fd().unwrap().as_raw_fd();
            // Only made blocking: an empty descriptor that blocks is what would hang a reset.
            for (fd, _) in notification_fds(epoll) {
                // SAFETY: fcntl on a descriptor this process holds.
                unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
            }
            let mut c = within(Duration::from_secs(10), "try_recv on an empty channel", move || {
                for _ in 0..3 {
                    assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))));
                }
                c
            });
            drop(zero);
            assert_eq!(&*c.recv_timeout(Duration::from_secs(20)).unwrap(), b"one");
        }
        Some(_) => {}
        None => run_pair(TEST, "blocked-drain"),
    }
}

/// A hostile consumer that releases messages (it writes the released count itself) but never
/// reads its socket, over which the producer passes each new arena of a buffer send: once the
/// socket is full, the producer's buffer sends fail with `WouldBlock` and never block.
#[test]
fn a_consumer_that_never_reads_its_socket_cannot_block_buffer_sends() {
    const TEST: &str = "hostile::a_consumer_that_never_reads_its_socket_cannot_block_buffer_sends";
    const CAPACITY: u64 = 64;
    // The producer spins for room: the hostile consumer releases without waking it.
    let config = |wait| ChannelConfig { capacity: CAPACITY as u32, ..config(wait) };
    match child_role().as_deref() {
        Some("producer") => {
            let p =
                Producer::create(&ctx(), "unread-socket", &here(), &here(), &config(WaitStrategy::BusyPoll)).unwrap();
            let (sent, err) = within(Duration::from_secs(60), "the buffer sends", move || {
                let mut p = p;
                for sent in 0..100_000u64 {
                    // Over a quarter of the arena size: each buffer is an arena of its own, and
                    // the one before dies once released, so every send passes two records.
                    let buffer = ctx().allocate(1 << 20, MemoryLocation::CpuStandard).unwrap();
                    if let Err(e) = p.send_buffer_timeout(&buffer, 0, 4096, Duration::from_secs(10)) {
                        return (sent, e);
                    }
                }
                panic!("100000 buffer sends went through a socket nobody reads");
            });
            assert!(matches!(err, Error::WouldBlock(ref m) if m.contains("socket")), "after {sent} sends: {err}");
            eprintln!("WouldBlock after {sent} buffer sends: {err}");
        }
        Some("consumer") => {
            let _c = Consumer::create(&ctx(), "unread-socket", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let (base, _) = region_of("unread-socket");
            // SAFETY: the test owns the mapping; the slots, the tail and the producer's closed
            // word lie inside it.
            let (tail, producer_closed) = unsafe { (u64_at(base, TAIL), u32_at(base, PRODUCER_CLOSED)) };
            // SAFETY: as above, slot n % CAPACITY.
            let published =
                |n: u64| unsafe { u64_at(base, SLOTS + (n % CAPACITY) as usize * SLOT) }.load(Ordering::Acquire);
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            let mut n = 0;
            while producer_closed.load(Ordering::Acquire) == 0 && std::time::Instant::now() < deadline {
                if published(n) == n + 1 {
                    n += 1;
                    tail.store(n, Ordering::Release);
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
        Some(_) => {}
        None => run_pair(TEST, "unread-socket"),
    }
}

/// A producer with `SIGPIPE`'s default action (as a C program has it) whose consumer armed its
/// notification and then closed: the producer's send and close, which notify the consumer's
/// end, get no signal and the process lives.
#[test]
fn a_gone_consumer_raises_no_sigpipe_in_the_producer() {
    const TEST: &str = "hostile::a_gone_consumer_raises_no_sigpipe_in_the_producer";
    match child_role().as_deref() {
        Some("producer") => {
            // SAFETY: sets this child process's SIGPIPE action to the default, which kills it.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            let mut p = Producer::create(&ctx(), "no-sigpipe", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            p.send(b"zero").unwrap();
            // Complete once the consumer has armed its notification and received it.
            p.wait_completed(0, Some(Duration::from_secs(20))).unwrap();
            // The consumer closes after the release: wait for its end.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while p.send(b"more").is_ok() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            // The consumer's process exits after its close: then its end is closed too.
            std::thread::sleep(Duration::from_millis(300));
            drop(p);
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "no-sigpipe", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let zero = c.recv_timeout(Duration::from_secs(20)).unwrap();
            // Armed with the ring empty after this message: the next send notifies.
            c.notify_fd().unwrap();
            drop(zero);
        }
        Some(_) => {}
        None => run_pair(TEST, "no-sigpipe"),
    }
}
