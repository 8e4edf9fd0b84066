//! lf-bench: OSU-style benchmarks of lava-flow channels between two processes, with the
//! machine's floors measured in the same run.
//!
//! ```text
//! lf-bench [--quick] [--json] [--sizes 8,64,4K,1M] [--iters N] [--modes busy,block,ffi]
//!          [--bw-sizes 1M,16M] [--window W] [--no-pin]
//!          [--payloads zero-copy,touch,buffer,buf-touch,copy]
//! ```
//!
//! - latency: ping-pong, half round trip (p50/p99/p99.9), per wait strategy (busy-poll,
//!   block) and payload handling: `zero-copy` (loan and publish; the receiver only takes the
//!   view), `touch` (the sender writes every byte, the receiver reads every byte), `buffer`
//!   (a buffer send: a real lava-flow buffer goes by reference, untouched), `buffer-touch`
//!   (the sender writes the buffer, sends it by reference, the receiver reads every byte) and
//!   `copy` (send of ordinary heap memory: copied into the pool, after the registry lookup
//!   that would have sent a lava-flow buffer by reference). `ffi` runs the busy zero-copy
//!   ping-pong through the C API.
//! - bandwidth: one direction, `window` messages in flight, each payload but copy.
//! - the registry lookup every copy send makes, timed in-process: with no shareable buffer,
//!   with the address outside the buffers' span, and inside it (the locked search).
//! - floors: two processes spinning on one shared cache line; an eventfd ping-pong; a
//!   single-thread memcpy. lava-flow's ratio to each is printed with its targets.
//!
//! The two processes (fork) are pinned to cores 0 and 1 unless `--no-pin`.
//!
//! `lf-bench --gpu [--quick] [--json]` measures GPU buffers through channels instead: see
//! `gpu.rs`.
//!
//! `mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [--quick] [--json] : -np 1 -x LF_HOST_ID=b
//! lf-bench --mpi [...]` measures lava-flow channels between two MPI ranks against raw MPI
//! between the same ranks (built with the cargo feature `mpi`): see `mpi.rs`.

#[cfg(feature = "vulkan")]
mod gpu;
#[cfg(feature = "mpi")]
mod mpi;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Buffer, Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;

#[derive(Clone, Debug)]
struct Options {
    quick: bool,
    json: bool,
    sizes: Vec<usize>,
    bw_sizes: Vec<usize>,
    iters: Option<usize>,
    modes: Vec<String>,
    /// Payload kinds to run (names as `Payload::name`); empty: all.
    payloads: Vec<String>,
    window: usize,
    pin: bool,
}

fn parse_size(s: &str) -> usize {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K') | Some('k') => (&s[..s.len() - 1], 1 << 10),
        Some('M') | Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().unwrap_or_else(|_| die(&format!("bad size {s:?}"))) * mult
}

fn die(msg: &str) -> ! {
    eprintln!("lf-bench: {msg}");
    std::process::exit(2)
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => format!("{s}"),
    }
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        quick: false,
        json: false,
        sizes: vec![],
        bw_sizes: vec![],
        iters: None,
        modes: vec!["busy".into(), "block".into(), "ffi".into()],
        payloads: vec![],
        window: 16,
        pin: true,
    };
    let mut i = 0;
    let value = |i: &mut usize| -> String {
        *i += 1;
        args.get(*i).cloned().unwrap_or_else(|| die("option needs a value"))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => o.quick = true,
            "--gpu" => {}
            "--json" => o.json = true,
            "--no-pin" => o.pin = false,
            "--sizes" => o.sizes = value(&mut i).split(',').map(parse_size).collect(),
            "--bw-sizes" => o.bw_sizes = value(&mut i).split(',').map(parse_size).collect(),
            "--iters" => o.iters = Some(value(&mut i).parse().unwrap_or_else(|_| die("bad --iters"))),
            "--modes" => o.modes = value(&mut i).split(',').map(str::to_owned).collect(),
            "--payloads" => o.payloads = value(&mut i).split(',').map(str::to_owned).collect(),
            "--window" => o.window = value(&mut i).parse().unwrap_or_else(|_| die("bad --window")),
            "-h" | "--help" => {
                println!("usage: lf-bench [--quick] [--json] [--sizes LIST] [--bw-sizes LIST] [--iters N] [--modes busy,block,ffi] [--payloads zero-copy,touch,buffer,buf-touch,copy] [--window W] [--no-pin]");
                println!("       lf-bench --gpu [--quick] [--json]");
                println!("       mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [--quick] [--json] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [--quick] [--json]   (see lf-bench --mpi --help)");
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other}")),
        }
        i += 1;
    }
    if o.sizes.is_empty() {
        o.sizes = if o.quick {
            vec![8, 64, 1 << 10, 64 << 10, 1 << 20, 16 << 20]
        } else {
            let mut v = vec![8, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10];
            v.extend([1 << 20, 4 << 20, 16 << 20, 64 << 20]);
            v
        };
    }
    if o.bw_sizes.is_empty() {
        o.bw_sizes = if o.quick { vec![64 << 10, 1 << 20, 16 << 20] } else { vec![4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20] };
    }
    for m in &o.modes {
        if !matches!(m.as_str(), "busy" | "block" | "ffi") {
            die(&format!("unknown mode {m}; use busy, block, ffi"));
        }
    }
    o
}

fn iterations(o: &Options, size: usize, blocking: bool, touches: bool) -> usize {
    if let Some(n) = o.iters {
        return n;
    }
    let base = if o.quick { 5_000 } else { 50_000 };
    let base = if blocking { base / 5 } else { base };
    if !touches {
        // Nothing is moved: a 64 MiB zero-copy message costs what a 64 B one does, and gets as
        // many samples, so that the flatness comparison compares like with like.
        return base;
    }
    // Keep big messages to a bounded number of bytes moved.
    let budget = if o.quick { 256usize << 20 } else { 2usize << 30 };
    (budget / size.max(1)).clamp(10, base)
}

fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("lf-bench: could not pin to core {cpu}: {}", std::io::Error::last_os_error());
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Percentiles {
    p50: f64,
    p99: f64,
    p999: f64,
}

/// Half round trips in ns from round-trip samples.
fn percentiles(mut rtts: Vec<u64>) -> Percentiles {
    rtts.sort_unstable();
    let at = |q: f64| rtts[((rtts.len() as f64 - 1.0) * q).round() as usize] as f64 / 2.0;
    Percentiles { p50: at(0.5), p99: at(0.99), p999: at(0.999) }
}

// ----- floors ------------------------------------------------------------------------------

/// Two processes bouncing a counter on one cache line.
fn spin_floor_ping(line: &AtomicU64, iters: usize) -> Percentiles {
    let mut rtts = Vec::with_capacity(iters);
    let mut v = 0u64; // the line starts at 0; reading it could race with the peer's first store
    for _ in 0..iters + iters / 10 {
        let t = Instant::now();
        line.store(v + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != v + 2 {
            std::hint::spin_loop();
        }
        v += 2;
        rtts.push(t.elapsed().as_nanos() as u64);
    }
    percentiles(rtts.split_off(iters / 10))
}

fn spin_floor_pong(line: &AtomicU64, iters: usize) {
    let mut v = 0u64; // the line starts at 0; reading it could race with the peer's first store
    for _ in 0..iters + iters / 10 {
        while line.load(Ordering::Acquire) != v + 1 {
            std::hint::spin_loop();
        }
        line.store(v + 2, Ordering::Release);
        v += 2;
    }
}

fn efd_write(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn efd_read(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a blocking eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

fn blocking_eventfd() -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: eventfd takes integers; the result is a new fd owned here.
    unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) }
}

fn memcpy_bandwidth(size: usize, quick: bool) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src);
    let budget: usize = if quick { 1 << 30 } else { 4 << 30 };
    let reps = (budget / size).clamp(3, 10_000);
    let t = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (reps * size) as f64 / t.elapsed().as_secs_f64()
}

/// Slots of the minimal-ring floor, as many as the benchmark channels have.
const RING_SLOTS: usize = 256;
/// One slot of the minimal ring: a sequence word and a length, 128 bytes apart like the
/// shared-memory transport's slots.
#[repr(C, align(128))]
struct RingSlot {
    seq: AtomicU64,
    len: AtomicU64,
}

/// The minimal-ring floor: the same ping-pong as the channels' over two rings of
/// [`RING_SLOTS`] slots in plain shared memory, each message one slot write and one release
/// (a tail word), with no checks, pool, wake-up protocol or API. What any ring-based channel of
/// this capacity pays on this machine; lava-flow's software is the difference.
fn ring_floor(rings: *mut RingSlot, ping: bool, iters: usize) -> Option<Percentiles> {
    // SAFETY: `rings` is the shared mapping made before the fork: two rings of RING_SLOTS
    // slots, then one tail slot per ring, all used only through atomics.
    let slot = |ring: usize, i: usize| unsafe { &*rings.add(ring * RING_SLOTS + i % RING_SLOTS) };
    let tail = |ring: usize| unsafe { &(*rings.add(2 * RING_SLOTS + ring)).seq };
    let (out, inp) = if ping { (0, 1) } else { (1, 0) };
    let mut rtts = Vec::with_capacity(iters);
    let warm = iters / 10;
    for i in 0..warm + iters {
        let t = Instant::now();
        let send = |i: usize| {
            let s = slot(out, i);
            s.len.store(64, Ordering::Relaxed);
            s.seq.store(i as u64 + 1, Ordering::Release);
        };
        let recv = |i: usize| {
            let s = slot(inp, i);
            while s.seq.load(Ordering::Acquire) != i as u64 + 1 {
                std::hint::spin_loop();
            }
            std::hint::black_box(s.len.load(Ordering::Relaxed));
            tail(inp).store(i as u64 + 1, Ordering::Release);
        };
        if ping {
            send(i);
            recv(i);
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            recv(i);
            send(i);
        }
    }
    ping.then(|| percentiles(rtts))
}

/// Plain shared memory for the cross-core copy floor, mapped before the fork: two counters on
/// their own cache lines and a buffer area.
struct CopyFloorMem {
    published: &'static AtomicU64,
    acked: &'static AtomicU64,
    buf: *mut u8,
    len: usize,
}

impl CopyFloorMem {
    fn map(len: usize) -> CopyFloorMem {
        let total = len + 4096;
        // SAFETY: a fresh shared anonymous mapping, populated now so that page faults are not
        // timed; checked.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), total, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED, "mapping the copy floor's memory");
        let p = p.cast::<u8>();
        // SAFETY: the mapping lives until the process exits; both words are 8-aligned, on
        // lines of their own, and used only through atomics.
        unsafe {
            CopyFloorMem {
                published: &*(p.add(128) as *const AtomicU64),
                acked: &*(p.add(256) as *const AtomicU64),
                buf: p.add(4096),
                len,
            }
        }
    }
}

/// The cross-core copy floor for touch bandwidth: exactly the `bandwidth` pipeline in touch
/// mode (the sender writes `window` buffers of `size` bytes, publishing each; the receiver
/// reads every byte of each; then acknowledges the window), over plain shared memory with two
/// counters and no channel. What the machine allows one core to hand another.
fn copy_floor(mem: &CopyFloorMem, ping: bool, size: usize, window: usize, iters: usize) -> Option<f64> {
    // Like a channel's pool (the area is as large), the buffers move on through the whole area:
    // reusing the same few would make every write wait for the reader's copies to be
    // invalidated.
    let count = (mem.len / size).max(1);
    assert!(count >= window && size <= mem.len);
    let mut next = 0usize;
    // SAFETY: `size` bytes at a multiple of `size` inside the shared buffer; the counters order
    // the writes and reads, and a buffer is rewritten only after the window holding it is
    // acknowledged.
    let mut next_buffer = || {
        let at = next % count * size;
        next += 1;
        unsafe { std::slice::from_raw_parts_mut(mem.buf.add(at), size) }
    };
    let (mut published, mut acked) = (mem.published.load(Ordering::Acquire), mem.acked.load(Ordering::Acquire));
    let mut start = Instant::now();
    for it in 0..iters + 1 {
        if it == 1 {
            start = Instant::now();
        }
        if ping {
            for w in 0..window {
                fill(next_buffer(), w as u8);
                published += 1;
                mem.published.store(published, Ordering::Release);
            }
            acked += 1;
            while mem.acked.load(Ordering::Acquire) < acked {
                std::hint::spin_loop();
            }
        } else {
            for _ in 0..window {
                published += 1;
                while mem.published.load(Ordering::Acquire) < published {
                    std::hint::spin_loop();
                }
                read_all(next_buffer());
            }
            acked += 1;
            mem.acked.store(acked, Ordering::Release);
        }
    }
    ping.then(|| (iters * window * size) as f64 / start.elapsed().as_secs_f64())
}

// ----- lava-flow ---------------------------------------------------------------------------

fn fill(buf: &mut [u8], v: u8) {
    buf.fill(v);
}

/// Reads every byte (summing words), so that touch mode really moves the data.
fn read_all(buf: &[u8]) -> u64 {
    // SAFETY: u64 has no invalid bit patterns; align_to splits at aligned boundaries.
    let (head, words, tail) = unsafe { buf.align_to::<u64>() };
    let mut sum = 0u64;
    for w in words {
        sum = sum.wrapping_add(*w);
    }
    for b in head.iter().chain(tail) {
        sum = sum.wrapping_add(*b as u64);
    }
    std::hint::black_box(sum)
}

/// How a benchmark message's payload is produced and consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    /// Loan and publish; nobody touches the bytes.
    ZeroCopy,
    /// Loan, the sender writes every byte, the receiver reads every byte.
    Touch,
    /// A lava-flow buffer sent by reference; nobody touches the bytes.
    Buffer,
    /// The sender writes the buffer, sends it by reference; the receiver reads every byte.
    BufferTouch,
    /// `send` of ordinary heap memory: the registry lookup, then a copy into the pool.
    Copy,
}

impl Payload {
    fn name(self) -> &'static str {
        match self {
            Payload::ZeroCopy => "zero-copy",
            Payload::Touch => "touch",
            Payload::Buffer => "buffer",
            Payload::BufferTouch => "buf-touch",
            Payload::Copy => "copy",
        }
    }

    fn touches(self) -> bool {
        matches!(self, Payload::Touch | Payload::BufferTouch | Payload::Copy)
    }
}

/// The sender's memory for buffer and copy payloads: lava-flow buffers (one per message in
/// flight) and a heap buffer.
struct Sources {
    buffers: Vec<Buffer>,
    heap: Vec<u8>,
}

impl Sources {
    fn new() -> Sources {
        Sources { buffers: Vec::new(), heap: Vec::new() }
    }

    /// Makes sure `count` buffers of exactly `size` bytes (and a heap buffer) exist: sized to
    /// the message, as an application would, so that small messages do not each sit in an
    /// arena of its own left over from a larger size.
    fn ensure(&mut self, context: &Context, size: usize, count: usize) {
        if self.buffers.first().map_or(0, Buffer::len) != size || self.buffers.len() < count {
            self.buffers.clear();
            for _ in 0..count {
                self.buffers.push(context.allocate(size, MemoryLocation::CpuStandard).expect("allocating a benchmark buffer"));
            }
        }
        if self.heap.len() < size {
            self.heap = vec![1u8; size];
        }
    }
}

fn send_one(p: &mut Producer, src: &Sources, slot: usize, size: usize, payload: Payload, v: u8) {
    match payload {
        Payload::ZeroCopy | Payload::Touch => {
            // Zero-copy: the payload is neither written nor read, so what is measured is the
            // transport alone, whatever the size.
            let mut loan = p.loan(size, None).expect("loan");
            if payload == Payload::Touch {
                fill(loan.as_mut_slice(), v);
            }
            loan.publish().expect("publish");
        }
        Payload::Buffer | Payload::BufferTouch => {
            let buffer = &src.buffers[slot % src.buffers.len()];
            if payload == Payload::BufferTouch {
                // SAFETY: the buffer's previous message was released (ping-pong) or the
                // benchmark accepts rewriting bytes in flight (bandwidth); nothing else
                // writes it.
                unsafe { std::ptr::write_bytes(buffer.as_ptr(), v, size) };
            }
            p.send_buffer(buffer, 0, size).expect("send_buffer");
        }
        Payload::Copy => {
            p.send(&src.heap[..size]).expect("send");
        }
    }
}

fn recv_one(c: &mut Consumer, touch: bool) {
    let m = c.recv().expect("recv");
    if touch {
        read_all(&m);
    } else {
        std::hint::black_box(m.len());
    }
}

struct Pair {
    tx: Producer,
    rx: Consumer,
    sources: Sources,
}

fn config(wait: WaitStrategy, pool: usize) -> ChannelConfig {
    ChannelConfig { wait, capacity: 256, pool_size: pool, rendezvous_timeout: Some(Duration::from_secs(30)), ..ChannelConfig::default() }
}

/// The ping side produces on `<tag>-a2b` and consumes `<tag>-b2a`; pong the reverse. The
/// producer is created first on both sides, then the consumer: ping's producer meets pong's
/// consumer first.
fn open_pair(context: &Context, tag: &str, ping: bool, wait: WaitStrategy, pool: usize) -> Pair {
    let here = ProcessLocation::from_hostname().expect("hostname");
    let cfg = config(wait, pool);
    let sources = Sources::new();
    if ping {
        let tx = Producer::create(context, &format!("{tag}-a2b"), &here, &here, &cfg).expect("producer a2b");
        let rx = Consumer::create(context, &format!("{tag}-b2a"), &here, &here, &cfg).expect("consumer b2a");
        Pair { tx, rx, sources }
    } else {
        let rx = Consumer::create(context, &format!("{tag}-a2b"), &here, &here, &cfg).expect("consumer a2b");
        let tx = Producer::create(context, &format!("{tag}-b2a"), &here, &here, &cfg).expect("producer b2a");
        Pair { tx, rx, sources }
    }
}

/// A CPU-only context: the benchmark is about channels, not the GPU.
fn cpu_context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    Context::new(config).expect("memory context")
}

/// ns per `find_shareable` call for a heap address: (no shareable buffer, outside the
/// buffers' span, inside the span but in no buffer).
fn lookup_cost() -> (f64, f64, f64) {
    let context = cpu_context();
    let heap = vec![0u8; 4096];
    let time = |ptr: *const u8| {
        let calls = 2_000_000;
        let t = Instant::now();
        for _ in 0..calls {
            std::hint::black_box(context.find_shareable(std::hint::black_box(ptr), 1024));
        }
        t.elapsed().as_nanos() as f64 / calls as f64
    };
    let empty = time(heap.as_ptr());
    // Two dedicated arenas far apart: a gap between them lies inside the span.
    let a = context.allocate(8 << 20, MemoryLocation::CpuStandard).expect("buffer");
    let _spacer = context.allocate(8 << 20, MemoryLocation::CpuStandard).expect("buffer");
    let b = context.allocate(8 << 20, MemoryLocation::CpuStandard).expect("buffer");
    drop(_spacer);
    let outside = time(heap.as_ptr());
    let (lo, hi) = (a.as_ptr().min(b.as_ptr()) as usize, a.as_ptr().max(b.as_ptr()) as usize);
    let gap = if hi - lo > (8 << 20) { (lo + (8 << 20) + 4096) as *const u8 } else { heap.as_ptr() };
    let inside = time(gap);
    (empty, outside, inside)
}

#[derive(Clone, Debug)]
struct LatencyRow {
    mode: String,
    payload: &'static str,
    size: usize,
    iters: usize,
    lat: Percentiles,
}

#[derive(Clone, Debug)]
struct BandwidthRow {
    payload: &'static str,
    size: usize,
    window: usize,
    bytes_per_s: f64,
}

fn latency(pair: &mut Pair, ping: bool, size: usize, payload: Payload, iters: usize) -> Option<Percentiles> {
    let warm = (iters / 10).max(5);
    let mut rtts = Vec::with_capacity(iters);
    let touch = payload.touches();
    for i in 0..warm + iters {
        let v = i as u8;
        if ping {
            let t = Instant::now();
            send_one(&mut pair.tx, &pair.sources, 0, size, payload, v);
            recv_one(&mut pair.rx, touch);
            if i >= warm {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            recv_one(&mut pair.rx, touch);
            send_one(&mut pair.tx, &pair.sources, 0, size, payload, v);
        }
    }
    ping.then(|| percentiles(rtts))
}

fn bandwidth(pair: &mut Pair, ping: bool, size: usize, payload: Payload, window: usize, iters: usize) -> Option<f64> {
    let touch = payload.touches();
    let mut start = Instant::now();
    for it in 0..iters + 1 {
        if it == 1 {
            start = Instant::now();
        }
        if ping {
            for w in 0..window {
                send_one(&mut pair.tx, &pair.sources, w, size, payload, w as u8);
            }
            recv_one(&mut pair.rx, false);
        } else {
            for _ in 0..window {
                recv_one(&mut pair.rx, touch);
            }
            send_one(&mut pair.tx, &pair.sources, 0, 1, Payload::ZeroCopy, 0);
        }
    }
    ping.then(|| (iters * window * size) as f64 / start.elapsed().as_secs_f64())
}

/// Ping-pong through the C API (busy-poll, zero-copy): the cost of the handle registry and
/// the panic boundary on the hot path.
fn ffi_latency(tag: &str, ping: bool, size: usize, iters: usize) -> Option<Percentiles> {
    use lava_flow::ffi::channel::*;
    use lava_flow::ffi::context::{lf_context_config, lf_context_create, lf_context_free};
    use lava_flow::ffi::device::LF_GPU_DISABLED;
    use lava_flow::ffi::location::{lf_location_detect, lf_location_free};
    use lava_flow::ffi::status::lf_status;
    use std::ffi::CString;
    // SAFETY: C API calls with valid pointers; every status is checked.
    unsafe {
        let mut here = std::ptr::null_mut();
        assert_eq!(lf_location_detect(&mut here), lf_status::LF_OK);
        let mut ctx_config: lf_context_config = std::mem::zeroed();
        ctx_config.gpu_policy = LF_GPU_DISABLED;
        let mut ctx = std::ptr::null_mut();
        assert_eq!(lf_context_create(&ctx_config, &mut ctx), lf_status::LF_OK);
        let mut cfg: lf_channel_config = std::mem::zeroed();
        lf_channel_config_default(&mut cfg);
        cfg.wait_strategy = LF_WAIT_BUSY_POLL;
        let a2b = CString::new(format!("{tag}-a2b")).unwrap();
        let b2a = CString::new(format!("{tag}-b2a")).unwrap();
        let (mut tx, mut rx) = (std::ptr::null_mut(), std::ptr::null_mut());
        if ping {
            assert_eq!(lf_channel_create(ctx, a2b.as_ptr(), LF_ROLE_PRODUCER, here, here, &cfg, &mut tx), lf_status::LF_OK);
            assert_eq!(lf_channel_create(ctx, b2a.as_ptr(), LF_ROLE_CONSUMER, here, here, &cfg, &mut rx), lf_status::LF_OK);
        } else {
            assert_eq!(lf_channel_create(ctx, a2b.as_ptr(), LF_ROLE_CONSUMER, here, here, &cfg, &mut rx), lf_status::LF_OK);
            assert_eq!(lf_channel_create(ctx, b2a.as_ptr(), LF_ROLE_PRODUCER, here, here, &cfg, &mut tx), lf_status::LF_OK);
        }
        lf_location_free(here);
        lf_context_free(ctx);
        let warm = (iters / 10).max(5);
        let mut rtts = Vec::with_capacity(iters);
        let mut loan: lf_loan_region = std::mem::zeroed();
        let mut msg: lf_message = std::mem::zeroed();
        let send = |loan: &mut lf_loan_region| {
            assert_eq!(lf_loan(tx, size, -1, loan), lf_status::LF_OK);
            assert_eq!(lf_publish(tx, loan, size, std::ptr::null_mut()), lf_status::LF_OK);
        };
        let recv = |msg: &mut lf_message| {
            assert_eq!(lf_recv(rx, -1, msg), lf_status::LF_OK);
            std::hint::black_box(msg.len);
            assert_eq!(lf_release(rx, msg), lf_status::LF_OK);
        };
        for i in 0..warm + iters {
            if ping {
                let t = Instant::now();
                send(&mut loan);
                recv(&mut msg);
                if i >= warm {
                    rtts.push(t.elapsed().as_nanos() as u64);
                }
            } else {
                recv(&mut msg);
                send(&mut loan);
            }
        }
        // The cost of one handle check + boundary, in-process: the cheapest call there is.
        let calls = 1_000_000;
        let mut location = std::ptr::null_mut();
        assert_eq!(lava_flow::ffi::location::lf_location_detect(&mut location), lf_status::LF_OK);
        let mut node = 0i64;
        let t = Instant::now();
        for _ in 0..calls {
            lava_flow::ffi::location::lf_location_node_id(std::hint::black_box(location), &mut node);
        }
        let per_call = t.elapsed().as_nanos() as f64 / calls as f64;
        lava_flow::ffi::location::lf_location_free(location);
        if ping {
            eprintln!("ffi: handle check + boundary (lf_location_node_id) {per_call:.1} ns/call");
            FFI_CALL_NS.store(per_call.to_bits(), Ordering::Relaxed);
        }
        lf_channel_free(tx);
        lf_channel_free(rx);
        ping.then(|| percentiles(rtts))
    }
}

static FFI_CALL_NS: AtomicU64 = AtomicU64::new(0);

// ----- driver ------------------------------------------------------------------------------

struct Results {
    /// ns per registry lookup: no shareable buffer, outside their span, inside it.
    lookup: (f64, f64, f64),
    spin_floor: Percentiles,
    ring_floor: Percentiles,
    eventfd_floor: Percentiles,
    memcpy: Vec<(usize, f64)>,
    /// (size, bytes/s) of the cross-core copy floor.
    copy_floor: Vec<(usize, f64)>,
    latency: Vec<LatencyRow>,
    bandwidth: Vec<BandwidthRow>,
}

fn run(o: &Options, ping: bool, line: &AtomicU64, rings: *mut RingSlot, floor_mem: &CopyFloorMem, efd: (&OwnedFd, &OwnedFd), tag: &str) -> Option<Results> {
    let floor_iters = if o.quick { 20_000 } else { 200_000 };
    let spin_floor = if ping { Some(spin_floor_ping(line, floor_iters)) } else {
        spin_floor_pong(line, floor_iters);
        None
    };
    let ring = ring_floor(rings, ping, floor_iters);
    let efd_iters = floor_iters / 10;
    let mut rtts = Vec::new();
    for i in 0..efd_iters + efd_iters / 10 {
        if ping {
            let t = Instant::now();
            efd_write(efd.0);
            efd_read(efd.1);
            if i >= efd_iters / 10 {
                rtts.push(t.elapsed().as_nanos() as u64);
            }
        } else {
            efd_read(efd.0);
            efd_write(efd.1);
        }
    }
    let eventfd_floor = ping.then(|| percentiles(rtts));

    let pool = pool_for(o);
    let context = cpu_context();
    let mut latency_rows = Vec::new();
    let mut bandwidth_rows = Vec::new();
    let mut copy_floors = Vec::new();
    for mode in &o.modes {
        if mode == "ffi" {
            for &size in o.sizes.iter().filter(|&&s| s <= 64) {
                let iters = iterations(o, size, false, false);
                if let Some(lat) = ffi_latency(&format!("{tag}-ffi{size}"), ping, size, iters) {
                    latency_rows.push(LatencyRow { mode: "busy-ffi".into(), payload: "zero-copy", size, iters, lat });
                }
            }
            continue;
        }
        let (wait, blocking) = match mode.as_str() {
            "busy" => (WaitStrategy::BusyPoll, false),
            _ => (WaitStrategy::Block, true),
        };
        let mut pair = open_pair(&context, &format!("{tag}-{mode}"), ping, wait, pool);
        let wanted = |p: &Payload| o.payloads.is_empty() || o.payloads.iter().any(|n| n == p.name());
        for payload in [Payload::ZeroCopy, Payload::Touch, Payload::Buffer, Payload::BufferTouch, Payload::Copy].iter().filter(|p| wanted(p)).copied() {
            for &size in &o.sizes {
                let iters = iterations(o, size, blocking, payload.touches());
                pair.sources.ensure(&context, size, 1);
                if let Some(lat) = latency(&mut pair, ping, size, payload, iters) {
                    latency_rows.push(LatencyRow { mode: mode.clone(), payload: payload.name(), size, iters, lat });
                }
            }
        }
        if mode == "busy" {
            for &size in &o.bw_sizes {
                let (window, iters) = bandwidth_shape(o, size, pool);
                if let Some(bps) = copy_floor(floor_mem, ping, size, window, iters) {
                    copy_floors.push((size, bps));
                }
            }
            for payload in [Payload::ZeroCopy, Payload::Touch, Payload::Buffer, Payload::BufferTouch].iter().filter(|p| wanted(p)).copied() {
                for &size in &o.bw_sizes {
                    let (window, iters) = bandwidth_shape(o, size, pool);
                    pair.sources.ensure(&context, size, window);
                    if let Some(bps) = bandwidth(&mut pair, ping, size, payload, window, iters) {
                        bandwidth_rows.push(BandwidthRow { payload: payload.name(), size, window, bytes_per_s: bps });
                    }
                }
            }
        }
    }
    if !ping {
        return None;
    }
    let memcpy = o.bw_sizes.iter().map(|&s| (s, memcpy_bandwidth(s, o.quick))).collect();
    Some(Results {
        lookup: lookup_cost(),
        spin_floor: spin_floor.unwrap(),
        ring_floor: ring.unwrap(),
        eventfd_floor: eventfd_floor.unwrap(),
        memcpy,
        copy_floor: copy_floors,
        latency: latency_rows,
        bandwidth: bandwidth_rows,
    })
}

/// The window and iteration count of a bandwidth row of `size` bytes.
fn bandwidth_shape(o: &Options, size: usize, pool: usize) -> (usize, usize) {
    let window = o.window.min(pool / size / 2).max(1);
    let budget: usize = if o.quick { 512 << 20 } else { 4 << 30 };
    (window, (budget / (size * window)).clamp(3, 2000))
}

/// The pool every benchmark channel gets: room for a window of the largest message.
fn pool_for(o: &Options) -> usize {
    let max_size = o.sizes.iter().chain(&o.bw_sizes).copied().max().unwrap_or(64);
    (max_size * 4).max(64 << 20)
}

fn find<'a>(r: &'a Results, mode: &str, payload: &str, size: usize) -> Option<&'a LatencyRow> {
    r.latency.iter().find(|l| l.mode == mode && l.payload == payload && l.size == size)
}

/// The targets, as (name, value, target, pass).
fn targets(r: &Results) -> Vec<(String, f64, f64, bool)> {
    let mut t = Vec::new();
    if let Some(l) = find(r, "busy", "zero-copy", 64) {
        let ratio = l.lat.p50 / r.spin_floor.p50;
        t.push(("busy-poll 64 B p50 / spinning floor".to_owned(), ratio, 1.5, ratio <= 1.5));
        // Context, not a target: against the least a ring channel pays here.
        let ratio = l.lat.p50 / r.ring_floor.p50;
        t.push(("  (busy-poll 64 B p50 / minimal-ring floor)".to_owned(), ratio, 1.5, ratio <= 1.5));
    }
    if let Some(l) = find(r, "block", "zero-copy", 8) {
        let ratio = l.lat.p50 / r.eventfd_floor.p50;
        t.push(("blocking 8 B p50 / eventfd floor".to_owned(), ratio, 1.3, ratio <= 1.3));
    }
    for b in r.bandwidth.iter().filter(|b| b.payload == "touch" && b.size >= 1 << 20) {
        if let Some((_, m)) = r.memcpy.iter().find(|(s, _)| *s == b.size) {
            let ratio = b.bytes_per_s / m;
            t.push((format!("touch bandwidth {} / memcpy", human(b.size)), ratio, 0.9, ratio >= 0.9));
        }
        if let Some((_, f)) = r.copy_floor.iter().find(|(s, _)| *s == b.size) {
            // Context, not a target: how close to what the machine allows.
            let ratio = b.bytes_per_s / f;
            t.push((format!("  (touch bandwidth {} / cross-core copy floor)", human(b.size)), ratio, 0.9, ratio >= 0.9));
        }
    }
    for payload in ["zero-copy", "buffer"] {
        let zc: Vec<&LatencyRow> = r.latency.iter().filter(|l| l.mode == "busy" && l.payload == payload && l.size >= 64).collect();
        if zc.len() >= 2 {
            let min = zc.iter().map(|l| l.lat.p50).fold(f64::MAX, f64::min);
            let max = zc.iter().map(|l| l.lat.p50).fold(0.0, f64::max);
            let spread = max / min - 1.0;
            t.push((
                format!("{payload} p50 spread {}..{} (max/min - 1)", human(zc[0].size), human(zc[zc.len() - 1].size)),
                spread,
                0.10,
                spread <= 0.10,
            ));
        }
    }
    t
}

fn print_text(r: &Results, o: &Options) {
    println!("lf-bench: lava-flow channels, shm transport{}", if o.pin { ", pinned to cores 0 and 1" } else { "" });
    println!();
    println!("floors (half round trip, same run)");
    println!("  spinning on one cache line   p50 {:8.0} ns  p99 {:8.0} ns", r.spin_floor.p50, r.spin_floor.p99);
    println!("  minimal ring ({RING_SLOTS} slots)     p50 {:8.0} ns  p99 {:8.0} ns  (two rings, no checks or API)", r.ring_floor.p50, r.ring_floor.p99);
    println!("  eventfd ping-pong            p50 {:8.0} ns  p99 {:8.0} ns", r.eventfd_floor.p50, r.eventfd_floor.p99);
    for (s, bw) in &r.memcpy {
        println!("  memcpy {:>6}                {:8.2} GB/s", human(*s), bw / 1e9);
    }
    for (s, bw) in &r.copy_floor {
        println!("  cross-core copy {:>6}       {:8.2} GB/s  (one core writes, the other reads, no channel)", human(*s), bw / 1e9);
    }
    println!();
    println!("latency (half round trip, ns)");
    println!("  {:<9} {:<9} {:>6} {:>9} {:>9} {:>9} {:>8} {:>8}", "mode", "payload", "size", "p50", "p99", "p99.9", "iters", "x floor");
    for l in &r.latency {
        let floor = if l.mode == "block" { r.eventfd_floor.p50 } else { r.spin_floor.p50 };
        println!(
            "  {:<9} {:<9} {:>6} {:>9.0} {:>9.0} {:>9.0} {:>8} {:>8.2}",
            l.mode, l.payload, human(l.size), l.lat.p50, l.lat.p99, l.lat.p999, l.iters, l.lat.p50 / floor
        );
    }
    if !r.bandwidth.is_empty() {
        println!();
        println!("bandwidth (one direction, busy-poll)");
        println!("  {:<9} {:>6} {:>7} {:>10} {:>10}   (zero-copy: bytes not touched, so GB/s is size x message rate)", "payload", "size", "window", "GB/s", "x memcpy");
        for b in &r.bandwidth {
            let m = r.memcpy.iter().find(|(s, _)| *s == b.size).map_or(f64::NAN, |(_, m)| b.bytes_per_s / m);
            println!("  {:<9} {:>6} {:>7} {:>10.2} {:>10.2}", b.payload, human(b.size), b.window, b.bytes_per_s / 1e9, m);
        }
    }
    let (empty, outside, inside) = r.lookup;
    println!();
    println!("registry lookup per copy send (is the memory a lava-flow buffer?)");
    println!("  no shareable buffer {empty:.1} ns, address outside their span {outside:.1} ns, inside it {inside:.1} ns");
    let ffi = f64::from_bits(FFI_CALL_NS.load(Ordering::Relaxed));
    if ffi > 0.0 {
        println!();
        println!("C API: handle check + panic boundary {ffi:.1} ns per call");
    }
    println!();
    println!("targets");
    for (name, value, target, pass) in targets(r) {
        println!("  {:<48} {:>7.2}  target {:>5.2}  {}", name, value, target, if pass { "ok" } else { "MISSED" });
    }
}

fn print_json(r: &Results, o: &Options) {
    use serde_json::json;
    let lat = |p: &Percentiles| json!({"p50_ns": p.p50, "p99_ns": p.p99, "p999_ns": p.p999});
    let doc = json!({
        "pinned": o.pin,
        "floors": {
            "spin_cache_line": lat(&r.spin_floor),
            "minimal_ring": lat(&r.ring_floor),
            "eventfd": lat(&r.eventfd_floor),
            "memcpy": r.memcpy.iter().map(|(s, b)| json!({"size": s, "bytes_per_s": b})).collect::<Vec<_>>(),
            "cross_core_copy": r.copy_floor.iter().map(|(s, b)| json!({"size": s, "bytes_per_s": b})).collect::<Vec<_>>(),
        },
        "latency": r.latency.iter().map(|l| json!({
            "mode": l.mode, "payload": l.payload, "size": l.size, "iters": l.iters,
            "p50_ns": l.lat.p50, "p99_ns": l.lat.p99, "p999_ns": l.lat.p999,
        })).collect::<Vec<_>>(),
        "bandwidth": r.bandwidth.iter().map(|b| json!({
            "payload": b.payload, "size": b.size, "window": b.window, "bytes_per_s": b.bytes_per_s,
        })).collect::<Vec<_>>(),
        "ffi_call_ns": f64::from_bits(FFI_CALL_NS.load(Ordering::Relaxed)),
        "registry_lookup_ns": {"empty": r.lookup.0, "outside_span": r.lookup.1, "inside_span": r.lookup.2},
        "targets": targets(r).into_iter().map(|(n, v, t, p)| json!({"name": n, "value": v, "target": t, "pass": p})).collect::<Vec<_>>(),
    });
    println!("{}", serde_json::to_string_pretty(&doc).unwrap());
}

fn main() {
    if std::env::args().any(|a| a == "--gpu") {
        #[cfg(feature = "vulkan")]
        {
            gpu::main(std::env::args().any(|a| a == "--quick"), std::env::args().any(|a| a == "--json"));
            return;
        }
        #[cfg(not(feature = "vulkan"))]
        die("this lf-bench was built without the cargo feature `vulkan`");
    }
    if std::env::args().any(|a| a == "--mpi") {
        #[cfg(feature = "mpi")]
        {
            mpi::main();
            return;
        }
        #[cfg(not(feature = "mpi"))]
        die("this lf-bench was built without MPI support: build it with `cargo build --release --features mpi --bin lf-bench` (needs the MPI headers and libclang)");
    }
    let o = options();
    // A private runtime dir unless the caller chose one.
    let tag = format!("lfb{}", std::process::id());
    if std::env::var_os("LF_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("{tag}-rt"));
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("runtime dir");
        std::env::set_var("LF_RUNTIME_DIR", &dir);
    }
    // The floor's cache line must stay shared after fork: MAP_SHARED anonymous.
    // SAFETY: a fresh shared anonymous page; the result is checked.
    let line_ptr = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        p
    };
    // SAFETY: the page is live for the whole run, 8-aligned, and used only through atomics.
    let line = unsafe { &*(line_ptr as *const AtomicU64) };
    let floor_mem = CopyFloorMem::map(pool_for(&o));
    let ring_len = (2 * RING_SLOTS + 2) * std::mem::size_of::<RingSlot>();
    // SAFETY: a fresh shared anonymous mapping (zeroed: every sequence word starts at 0); checked.
    let rings = unsafe {
        libc::mmap(std::ptr::null_mut(), ring_len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(rings, libc::MAP_FAILED, "mapping the ring floor");
    let (efd_a, efd_b) = (blocking_eventfd(), blocking_eventfd());
    // SAFETY: no other threads exist yet; the child only runs this function's code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    let ping = child > 0;
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    if o.pin && online >= 2 {
        pin_to(if ping { 0 } else { 1 });
    }
    let results = run(&o, ping, line, rings.cast(), &floor_mem, (&efd_a, &efd_b), &tag);
    if !ping {
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: waiting for the child we forked.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if let Ok(dir) = std::env::var("LF_RUNTIME_DIR") {
        if dir.contains(&tag) {
            let _ = std::fs::remove_dir(&dir);
        }
    }
    let r = results.expect("ping side has results");
    if o.json {
        print_json(&r, &o);
    } else {
        print_text(&r, &o);
    }
}
