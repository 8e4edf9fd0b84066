//! The carrier contract: what every carrier (and every route, over a carrier) promises a
//! channel's two ends, written once over the public channel API. Each case has a producer's
//! half and a consumer's half; a harness runs the two halves as its carrier needs (threads of
//! one process for loopback, two processes for shm, two MPI ranks for mpi), with the channel's
//! transports restricted to the carrier under test, and the halves meet at named points
//! ([`Sync::point`]) through files in a directory both can see.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy, AUTO_ZERO_COPY_MIN};
use lava_flow::memory::MemoryLocation;
use lava_flow::Error;

/// What differs between carriers, as far as the contract is concerned.
#[derive(Clone, Copy, Debug)]
pub struct Carrier {
    pub name: &'static str,
    /// A new producer may attach to a consumer whose producer has gone.
    pub reattach: bool,
    /// GPU buffers go by reference through a route (both ends on one host, one device).
    pub gpu_route: bool,
    /// The notification fd may wake once for a message of the carrier's own (a request for
    /// completion) with nothing to receive: MPI's, whose fd a thread sets by probing MPI's
    /// queue, which cannot tell such a message from a channel message without taking it.
    pub fd_wakes_for_control: bool,
    /// The channel is a fan-in (with one producer at a time in these cases): a producer's
    /// end is reported once, for its slot, and the consumer then waits for new producers.
    pub fan_in: bool,
    /// The channel is a fan-out (with one consumer in these cases): a consumer's end does not
    /// end the producer's sends, which go on to the consumers left (none here).
    pub fan_out: bool,
}

/// Where the two halves of a case meet, and the carrier they run on.
pub struct Sync {
    dir: PathBuf,
    case: &'static str,
    me: &'static str,
    other: &'static str,
    pub carrier: Carrier,
}

impl Sync {
    pub fn new(dir: PathBuf, case: &'static str, producer: bool, carrier: Carrier) -> Sync {
        let (me, other) = if producer { ("producer", "consumer") } else { ("consumer", "producer") };
        Sync { dir, case, me, other, carrier }
    }

    /// Waits until the other half has reached point `name` too (60 s at most).
    pub fn point(&self, name: &str) {
        std::fs::write(self.dir.join(format!("{}.{name}.{}", self.case, self.me)), b"").unwrap();
        let theirs = self.dir.join(format!("{}.{name}.{}", self.case, self.other));
        let start = Instant::now();
        while !theirs.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{}: the {} never reached {name}",
                self.case,
                self.other
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// One case: a channel config and the two halves.
pub struct Case {
    pub name: &'static str,
    pub config: fn() -> ChannelConfig,
    /// The producer's half, given its end and a way to open another producer of the channel.
    pub producer: fn(Producer, &Sync, &dyn Fn() -> Producer),
    pub consumer: fn(Consumer, &Sync),
    /// Whether the carrier can run it.
    pub runs_on: fn(&Carrier) -> bool,
}

impl Case {
    /// The case needs a Vulkan device in both processes (skipped where there is none).
    pub fn needs_gpu(&self) -> bool {
        self.name == "gpu-route"
    }
}

/// Every case of the contract.
pub fn cases() -> Vec<Case> {
    vec![
        Case { name: "order", config: base, producer: order_producer, consumer: order_consumer, runs_on: all },
        Case { name: "backpressure", config: small, producer: full_producer, consumer: full_consumer, runs_on: all },
        Case {
            name: "completion",
            config: base,
            producer: completion_producer,
            consumer: completion_consumer,
            runs_on: all,
        },
        Case { name: "empty", config: base, producer: empty_producer, consumer: empty_consumer, runs_on: all },
        Case { name: "sizes", config: small, producer: sizes_producer, consumer: sizes_consumer, runs_on: all },
        Case {
            name: "producer-close",
            config: base,
            producer: producer_close_producer,
            consumer: producer_close_consumer,
            runs_on: all,
        },
        Case {
            name: "consumer-close",
            config: base,
            producer: consumer_close_producer,
            consumer: consumer_close_consumer,
            runs_on: |c| !c.fan_out,
        },
        Case { name: "notify-fd", config: base, producer: fd_producer, consumer: fd_consumer, runs_on: all },
        Case {
            name: "new-producer",
            config: base,
            producer: reattach_producer,
            consumer: reattach_consumer,
            runs_on: |c| c.reattach,
        },
        Case {
            name: "gpu-route",
            config: base,
            producer: gpu_producer,
            consumer: gpu_consumer,
            runs_on: |c| c.gpu_route,
        },
    ]
}

fn all(_: &Carrier) -> bool {
    true
}

/// The config of most cases (the harness restricts its transports).
pub fn base() -> ChannelConfig {
    ChannelConfig {
        wait: WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) },
        capacity: 64,
        pool_size: 4 << 20,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    }
}

/// A channel of 4 messages and 64 KiB.
fn small() -> ChannelConfig {
    ChannelConfig { capacity: 4, pool_size: 64 << 10, ..base() }
}

const LONG: Duration = Duration::from_secs(60);

/// Message `seq`'s bytes: its number, then bytes derived from it.
fn fill(buf: &mut [u8], seq: u64) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    for (i, b) in buf.iter_mut().enumerate().skip(8) {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
}

fn expected(seq: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    fill(&mut bytes, seq);
    bytes
}

/// The length of message `seq` of the ordered stream: inline, pool and chunked sizes.
fn len_of(seq: u64) -> usize {
    match seq % 50 {
        49 => 1 << 20,
        n if n % 7 == 3 => 5000 + seq as usize,
        n => 8 + (n as usize * 3),
    }
}

const ORDERED: u64 = 600;

/// Every message, whatever way it is sent (copy, loan, buffer send by reference), arrives
/// once, in order, intact; releases may come in any order.
fn order_producer(mut p: Producer, _: &Sync, _: &dyn Fn() -> Producer) {
    let context = p.context().clone();
    let buffer = context.allocate(1 << 20, MemoryLocation::CpuStandard).unwrap();
    for seq in 0..ORDERED {
        let len = len_of(seq);
        let sent = match seq % 3 {
            0 => p.send(&expected(seq, len)).unwrap(),
            1 => {
                let mut loan = p.loan(len, Some(LONG)).unwrap();
                fill(loan.as_mut_slice(), seq);
                loan.publish().unwrap()
            }
            _ => {
                // SAFETY: the buffer's first `len` bytes are this process's, and no message
                // points into them (the last buffer send completed below).
                fill(unsafe { std::slice::from_raw_parts_mut(buffer.as_ptr(), len) }, seq);
                let sent = p.send_buffer(&buffer, 0, len).unwrap();
                p.wait_completed(sent, Some(LONG)).unwrap();
                sent
            }
        };
        assert_eq!(sent, seq, "sequence numbers count the messages sent");
    }
    p.wait_completed(ORDERED - 1, Some(LONG)).unwrap();
    assert!(p.completed().unwrap() >= ORDERED);
}

fn order_consumer(mut c: Consumer, _: &Sync) {
    let mut held = None;
    for seq in 0..ORDERED {
        let m = c.recv_timeout(LONG).unwrap_or_else(|e| panic!("message {seq}: {e}"));
        assert_eq!(m.sequence(), seq, "in order, none lost or repeated");
        assert!(*m == expected(seq, len_of(seq))[..], "message {seq}'s bytes");
        let by_reference = seq % 3 == 2 && m.len() >= AUTO_ZERO_COPY_MIN;
        assert_eq!(m.is_zero_copy(), by_reference, "message {seq}: only buffer sends go by reference");
        // Message 3k waits for 3k + 1, which is released first.
        match seq % 3 {
            0 => held = Some(m),
            1 => {
                drop(m);
                drop(held.take());
            }
            _ => {}
        }
    }
}

/// A full channel refuses more (`WouldBlock` at once, `Timeout` after a wait), and takes
/// messages again as the consumer releases.
fn full_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    for seq in 0..4u64 {
        p.try_send(&expected(seq, 16)).unwrap();
    }
    assert!(matches!(p.try_send(&[9; 16]), Err(Error::WouldBlock(_))), "a fifth message fits 4 slots");
    assert!(matches!(p.try_loan(16), Err(Error::WouldBlock(_))));
    assert!(matches!(p.send_timeout(&[9; 16], Duration::from_millis(50)), Err(Error::Timeout(_))));
    sync.point("full");
    for seq in 4..40u64 {
        p.send_timeout(&expected(seq, 16), LONG).unwrap();
    }
    p.wait_completed(39, Some(LONG)).unwrap();
}

fn full_consumer(mut c: Consumer, sync: &Sync) {
    sync.point("full");
    for seq in 0..40u64 {
        let m = c.recv_timeout(LONG).unwrap();
        assert_eq!((m.sequence(), &*m), (seq, &expected(seq, 16)[..]));
    }
}

/// Completion counts messages released in order: a later release does not complete an earlier
/// message; sequence numbers never sent are refused, the last one a u64 holds too.
fn completion_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    for seq in 0..3u64 {
        p.send(&expected(seq, 200)).unwrap();
    }
    for never in [3, u64::MAX - 1, u64::MAX] {
        let refused = p.wait_completed(never, Some(Duration::ZERO));
        assert!(matches!(refused, Err(Error::InvalidArgument(_))), "message {never} was never sent: {refused:?}");
    }
    sync.point("sent");
    sync.point("released 2");
    assert!(
        matches!(p.wait_completed(0, Some(Duration::from_millis(50))), Err(Error::Timeout(_))),
        "message 0 is held"
    );
    sync.point("checked");
    p.wait_completed(2, Some(LONG)).unwrap();
    assert_eq!(p.completed().unwrap(), 3);
}

fn completion_consumer(mut c: Consumer, sync: &Sync) {
    sync.point("sent");
    let m: Vec<_> = (0..3).map(|_| c.recv_timeout(LONG).unwrap()).collect();
    let [m0, m1, m2] = <[_; 3]>::try_from(m).ok().unwrap();
    drop(m2);
    sync.point("released 2");
    sync.point("checked");
    drop(m1);
    drop(m0);
}

/// An empty channel: `WouldBlock` at once, `Timeout` after the wait.
fn empty_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    sync.point("looked");
    p.send(b"after").unwrap();
    p.wait_completed(0, Some(LONG)).unwrap();
}

fn empty_consumer(mut c: Consumer, sync: &Sync) {
    assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))));
    let start = Instant::now();
    assert!(matches!(c.recv_timeout(Duration::from_millis(50)), Err(Error::Timeout(_))));
    assert!(start.elapsed() >= Duration::from_millis(50), "the wait lasts its timeout");
    sync.point("looked");
    assert_eq!(&*c.recv_timeout(LONG).unwrap(), b"after");
}

/// The largest message is the pool size; one byte more is refused at once, saying why; an
/// empty message too.
fn sizes_producer(mut p: Producer, _: &Sync, _: &dyn Fn() -> Producer) {
    let max = p.max_message_len();
    assert!(max >= 64 << 10, "the channel takes messages of its pool size ({max} bytes)");
    for too_long in [p.send(&vec![0; max + 1]).map(drop), p.loan(max + 1, None).map(drop)] {
        assert!(matches!(too_long, Err(Error::InvalidArgument(_))), "{too_long:?}");
    }
    assert!(matches!(p.send(&[]), Err(Error::InvalidArgument(_))), "a message has a byte at least");
    p.send(&expected(0, 64 << 10)).unwrap();
    p.wait_completed(0, Some(LONG)).unwrap();
}

fn sizes_consumer(mut c: Consumer, _: &Sync) {
    assert!(*c.recv_timeout(LONG).unwrap() == expected(0, 64 << 10)[..]);
}

/// A producer's close reaches the consumer after its last message: every message, then
/// `PeerGone`, never a hang.
fn producer_close_producer(mut p: Producer, _: &Sync, _: &dyn Fn() -> Producer) {
    for seq in 0..5u64 {
        p.send(&expected(seq, 64)).unwrap();
    }
}

fn producer_close_consumer(mut c: Consumer, _: &Sync) {
    for seq in 0..5u64 {
        assert_eq!(c.recv_timeout(LONG).unwrap().sequence(), seq);
    }
    match c.recv_timeout(LONG) {
        Err(Error::PeerGone(_)) => {}
        other => panic!("after the producer's close: {other:?}"),
    }
    if c.peers().len() > 1 {
        // A fan-in reports each producer's end once; with none left, it waits for new ones.
        assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))), "a fan-in's end is said once");
        assert_eq!(c.producers(), 0);
    } else {
        assert!(matches!(c.try_recv(), Err(Error::PeerGone(_))), "the end is said again");
    }
}

/// A consumer's close reaches the producer: by its next wait, or within its next 32 sends.
fn consumer_close_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    p.send(b"one").unwrap();
    sync.point("closed");
    let mut sent = 0;
    let gone = loop {
        match p.send_timeout(b"more", LONG) {
            Ok(_) if sent < 32 => sent += 1,
            Ok(_) => panic!("33 sends after the consumer closed went through"),
            Err(e) => break e,
        }
    };
    assert!(matches!(gone, Error::PeerGone(_)), "{gone:?}");
    assert!(matches!(p.wait_completed(0, Some(LONG)), Ok(()) | Err(Error::PeerGone(_))));
}

fn consumer_close_consumer(mut c: Consumer, sync: &Sync) {
    assert_eq!(&*c.recv_timeout(LONG).unwrap(), b"one");
    drop(c);
    sync.point("closed");
}

/// The notification fd polls readable while a message waits or the producer has gone, and a
/// readable fd means the next `try_recv` has something to say (never `WouldBlock`).
fn fd_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    sync.point("fd ready");
    for seq in 0..20u64 {
        p.send(&expected(seq, 100)).unwrap();
    }
    p.wait_completed(19, Some(LONG)).unwrap();
    sync.point("drained");
}

fn fd_consumer(mut c: Consumer, sync: &Sync) {
    use std::os::fd::AsRawFd;
    let fd = c.notify_fd().unwrap().as_raw_fd();
    let readable = |timeout_ms: i32| {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) == 1 }
    };
    assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))));
    assert!(!readable(0), "the fd of an empty channel is not readable once try_recv said so");
    sync.point("fd ready");
    let mut next = 0;
    let mut woken_for_nothing = 0;
    while next < 20 {
        assert!(readable(60_000), "no wake-up for message {next}");
        let mut got_one = false;
        loop {
            match c.try_recv() {
                Ok(m) => {
                    assert_eq!(m.sequence(), next);
                    next += 1;
                    got_one = true;
                }
                Err(Error::WouldBlock(_)) => break,
                Err(e) => panic!("message {next}: {e}"),
            }
        }
        woken_for_nothing += usize::from(!got_one);
    }
    assert!(woken_for_nothing <= 1, "the fd woke {woken_for_nothing} times with nothing to receive");
    sync.point("drained");
    // The producer's end: readable, and try_recv says so (after one wake-up for the producer's
    // request for completion, where the carrier's fd cannot tell it from a message).
    let mut control = usize::from(sync.carrier.fd_wakes_for_control);
    loop {
        assert!(readable(60_000), "no wake-up for the producer's end");
        match c.try_recv() {
            Err(Error::PeerGone(_)) => break,
            Err(Error::WouldBlock(_)) if control > 0 => control -= 1,
            other => panic!("a readable fd after the producer's end: {other:?}"),
        }
    }
}

/// A consumer outlives its producer: a new producer of the channel attaches once the old one's
/// end was reported, and its messages start again at 0.
fn reattach_producer(mut p: Producer, sync: &Sync, open: &dyn Fn() -> Producer) {
    p.send(b"first").unwrap();
    p.wait_completed(0, Some(LONG)).unwrap();
    drop(p);
    sync.point("first gone");
    let mut second = open();
    assert_eq!(second.send(b"second").unwrap(), 0);
    second.wait_completed(0, Some(LONG)).unwrap();
}

fn reattach_consumer(mut c: Consumer, sync: &Sync) {
    assert_eq!(&*c.recv_timeout(LONG).unwrap(), b"first");
    assert!(matches!(c.recv_timeout(LONG), Err(Error::PeerGone(_))));
    sync.point("first gone");
    let start = Instant::now();
    let m = loop {
        match c.recv_timeout(LONG) {
            Ok(m) => break m,
            Err(Error::PeerGone(_)) if start.elapsed() < LONG => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("the second producer's message: {e}"),
        }
    };
    assert_eq!((m.sequence(), &*m), (0, &b"second"[..]));
}

const GPU_MESSAGES: u64 = 12;

/// GPU buffers go by reference through the channel's route, in the one order of all its
/// messages; the consumer reads them where they lie, and its release completes them.
fn gpu_producer(mut p: Producer, sync: &Sync, _: &dyn Fn() -> Producer) {
    let context = p.context().clone();
    sync.point("start");
    for seq in 0..GPU_MESSAGES {
        let location = if seq % 2 == 0 { MemoryLocation::GpuDeviceLocal } else { MemoryLocation::GpuHostVisible };
        let len = 4096 + seq as usize * 1000;
        let buffer = context.allocate(len, location).unwrap();
        buffer.write_at(0, &expected(seq, len)).unwrap();
        let sent = p.send_buffer(&buffer, 0, len).unwrap();
        assert_eq!(sent, 2 * seq);
        p.send(&expected(seq, 24)).unwrap();
        p.wait_completed(sent, Some(LONG)).unwrap();
    }
    p.wait_completed(2 * GPU_MESSAGES - 1, Some(LONG)).unwrap();
}

fn gpu_consumer(mut c: Consumer, sync: &Sync) {
    sync.point("start");
    let by_reference = c.transport().routes.iter().any(|r| r.kind.name() == "vulkan_ipc");
    assert!(by_reference, "GPU buffers go by reference here: {}", c.transport().reason);
    for seq in 0..GPU_MESSAGES {
        let m = c.recv_timeout(LONG).unwrap();
        assert_eq!(m.sequence(), 2 * seq);
        let buffer = m.buffer().expect("a GPU message carries its buffer");
        let mut bytes = vec![0u8; m.len()];
        buffer.read_at(0, &mut bytes).unwrap();
        assert!(bytes == expected(seq, 4096 + seq as usize * 1000), "GPU message {seq}'s bytes");
        assert!(m.is_zero_copy());
        drop(m);
        let cpu = c.recv_timeout(LONG).unwrap();
        assert_eq!((cpu.sequence(), &*cpu), (2 * seq + 1, &expected(seq, 24)[..]));
    }
}
