//! The Rust API rows (secondary to the C API headline): lava-flow's own Rust API between the
//! same two processes, per wait strategy (`busy`: busy-poll, `block`) and payload handling:
//! - `zero-copy`: loan and publish; the receiver only takes the view;
//! - `touch`: loan, the sender copies the payload from a private buffer, the receiver reads
//!   every byte;
//! - `buffer`: a real lava-flow buffer goes by reference, untouched;
//! - `buf-touch`: the sender waits for the buffer's previous message to complete, copies the
//!   payload into it from a private buffer and sends it by reference; the receiver reads every
//!   byte;
//! - `copy`: send of the private (heap) buffer: copied into the pool, after the registry lookup
//!   that would have sent a lava-flow buffer by reference.
//!
//! Also: one-direction bandwidth (`window` messages in flight) per payload but copy, and the
//! registry lookup every copy send makes, timed in-process. The floors they are held against
//! (spinning, minimal ring, eventfd, memcpy, cross-core copy) are measured once, at the start
//! of this section.

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Buffer, Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;

use crate::floors::{copy_bandwidth, memcpy_bandwidth, ring_floor};
use crate::oneway::{one_way, Stream};
use crate::options::{human, Options};
use crate::pingpong::{in_turn, ping_pong, read_all, Percentiles};
use crate::table::{comment, mb_s, pingpong_bytes_per_s, ratio, us, Table};
use crate::Side;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payload {
    /// Loan and publish; nobody touches the bytes.
    ZeroCopy,
    /// Loan, the sender copies the payload from a private buffer, the receiver reads every
    /// byte.
    Touch,
    /// A lava-flow buffer sent by reference; nobody touches the bytes.
    Buffer,
    /// The sender waits for the buffer's previous message to complete, copies the payload into
    /// it from a private buffer and sends it by reference; the receiver reads every byte.
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

/// The sender's lava-flow buffers for buffer payloads (one per message in flight), each with
/// the sequence number of its message in flight.
struct Sources {
    buffers: Vec<(Buffer, Option<u64>)>,
}

impl Sources {
    fn new() -> Sources {
        Sources { buffers: Vec::new() }
    }

    /// Makes sure `count` buffers of exactly `size` bytes exist: sized to the message, as an
    /// application would, so that small messages do not each sit in an arena of its own left
    /// over from a larger size.
    fn ensure(&mut self, context: &Context, size: usize, count: usize) {
        if self.buffers.first().map_or(0, |(b, _)| b.len()) != size || self.buffers.len() < count {
            self.buffers.clear();
            for _ in 0..count {
                self.buffers.push((
                    context.allocate(size, MemoryLocation::CpuStandard).expect("allocating a benchmark buffer"),
                    None,
                ));
            }
        }
    }
}

/// Sends one message of `size` bytes; `private` is the application's own memory (at least
/// `size` bytes), `slot` picks the buffer of a buffer payload.
fn send_one(p: &mut Producer, src: &mut Sources, slot: usize, size: usize, payload: Payload, private: &[u8]) {
    match payload {
        Payload::ZeroCopy | Payload::Touch => {
            // Zero-copy: the payload is neither written nor read, so what is measured is the
            // transport alone, whatever the size.
            let mut loan = p.loan(size, None).expect("loan");
            if payload == Payload::Touch {
                loan.as_mut_slice()[..size].copy_from_slice(&private[..size]);
            }
            loan.publish().expect("publish");
        }
        Payload::Buffer | Payload::BufferTouch => {
            let count = src.buffers.len();
            let (buffer, in_flight) = &mut src.buffers[slot % count];
            if payload == Payload::BufferTouch {
                if let Some(seq) = in_flight.take() {
                    p.wait_completed(seq, None).expect("wait_completed");
                }
                // SAFETY: the buffer holds `size` bytes; its previous message is complete, and
                // nothing else writes it.
                unsafe { std::ptr::copy_nonoverlapping(private.as_ptr(), buffer.as_ptr(), size) };
            }
            *in_flight = Some(p.send_buffer(buffer, 0, size).expect("send_buffer"));
        }
        Payload::Copy => {
            p.send(&private[..size]).expect("send");
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
    ChannelConfig {
        wait,
        capacity: 256,
        pool_size: pool,
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..ChannelConfig::default()
    }
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
pub fn cpu_context() -> Context {
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

fn latency(
    pair: &mut Pair,
    ping: bool,
    size: usize,
    payload: Payload,
    iters: usize,
    private: &[u8],
) -> Option<Percentiles> {
    let touch = payload.touches();
    let Pair { tx, rx, sources } = pair;
    ping_pong(ping, iters, || {
        in_turn(ping, || send_one(tx, sources, 0, size, payload, private), || recv_one(rx, touch))
    })
}

fn bandwidth(
    pair: &mut Pair,
    ping: bool,
    size: usize,
    payload: Payload,
    window: usize,
    iters: usize,
    private: &[u8],
) -> Option<f64> {
    one_way(&mut PairStream { pair, size, payload, private }, ping, size, window, iters)
}

/// A stream of one payload kind through a pair of channels; the ack is a 1-byte loan.
struct PairStream<'a> {
    pair: &'a mut Pair,
    size: usize,
    payload: Payload,
    private: &'a [u8],
}

impl Stream for PairStream<'_> {
    fn send(&mut self, w: usize) {
        send_one(&mut self.pair.tx, &mut self.pair.sources, w, self.size, self.payload, self.private);
    }

    fn wait_ack(&mut self) {
        recv_one(&mut self.pair.rx, false);
    }

    fn recv(&mut self) {
        recv_one(&mut self.pair.rx, self.payload.touches());
    }

    fn ack(&mut self) {
        send_one(&mut self.pair.tx, &mut self.pair.sources, 0, 1, Payload::ZeroCopy, self.private);
    }
}

#[derive(Clone, Debug)]
pub struct LatencyRow {
    mode: String,
    payload: &'static str,
    size: usize,
    iters: usize,
    lat: Percentiles,
}

#[derive(Clone, Debug)]
pub struct BandwidthRow {
    payload: &'static str,
    size: usize,
    window: usize,
    bytes_per_s: f64,
}

/// The Rust API section's results (ping's side).
pub struct Results {
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

/// Round trips of the spinning and minimal-ring floors (eventfd: a tenth).
pub fn floor_iterations(o: &Options) -> usize {
    if o.quick {
        20_000
    } else {
        200_000
    }
}

/// The once-measured floors of this section: spinning, minimal ring, eventfd.
fn floors(o: &Options, side: &mut Side) -> Option<(Percentiles, Percentiles, Percentiles)> {
    let iters = floor_iterations(o);
    let spin = side.spin.probe(side.ping, iters);
    let ring = ring_floor(&side.rings, side.ping, iters);
    let eventfd = side.efd.probe(side.ping, iters / 10);
    Some((spin?, ring?, eventfd?))
}

/// Runs the Rust API modes of `o` (busy, block) in both processes; ping gets the results.
pub fn run(o: &Options, side: &mut Side, tag: &str) -> Option<Results> {
    let (ping, private) = (side.ping, std::mem::take(&mut side.private));
    let floors = floors(o, side);
    let pool = pool_for(o);
    let context = cpu_context();
    let mut latency_rows = Vec::new();
    let mut bandwidth_rows = Vec::new();
    let mut copy_floors = Vec::new();
    let wanted = |p: &Payload| o.payloads.is_empty() || o.payloads.iter().any(|n| n == p.name());
    for mode in o.modes.iter().filter(|m| *m == "busy" || *m == "block") {
        let (wait, blocking) = match mode.as_str() {
            "busy" => (WaitStrategy::BusyPoll, false),
            _ => (WaitStrategy::Block, true),
        };
        let mut pair = open_pair(&context, &format!("{tag}-{mode}"), ping, wait, pool);
        for payload in [Payload::ZeroCopy, Payload::Touch, Payload::Buffer, Payload::BufferTouch, Payload::Copy]
            .into_iter()
            .filter(wanted)
        {
            for &size in &o.sizes {
                let iters = o.iterations(size, blocking, payload.touches());
                pair.sources.ensure(&context, size, 1);
                if let Some(lat) = latency(&mut pair, ping, size, payload, iters, &private) {
                    latency_rows.push(LatencyRow { mode: mode.clone(), payload: payload.name(), size, iters, lat });
                }
            }
        }
        if mode != "busy" {
            continue;
        }
        for &size in &o.bw_sizes {
            let (window, iters) = bandwidth_shape(o, size, pool);
            if let Some(bps) = copy_bandwidth(&mut side.copy, ping, size, window, iters, &private) {
                copy_floors.push((size, bps));
            }
        }
        for payload in
            [Payload::ZeroCopy, Payload::Touch, Payload::Buffer, Payload::BufferTouch].into_iter().filter(wanted)
        {
            for &size in &o.bw_sizes {
                let (window, iters) = bandwidth_shape(o, size, pool);
                pair.sources.ensure(&context, size, window);
                if let Some(bps) = bandwidth(&mut pair, ping, size, payload, window, iters, &private) {
                    bandwidth_rows.push(BandwidthRow { payload: payload.name(), size, window, bytes_per_s: bps });
                }
            }
        }
    }
    side.private = private;
    let (spin_floor, ring_floor, eventfd_floor) = floors?;
    Some(Results {
        lookup: lookup_cost(),
        spin_floor,
        ring_floor,
        eventfd_floor,
        memcpy: o.bw_sizes.iter().map(|&s| (s, memcpy_bandwidth(s, o.quick))).collect(),
        copy_floor: copy_floors,
        latency: latency_rows,
        bandwidth: bandwidth_rows,
    })
}

/// The window and iteration count of a bandwidth row of `size` bytes.
fn bandwidth_shape(o: &Options, size: usize, pool: usize) -> (usize, usize) {
    let window = o.window.min(pool / size / 2).max(1);
    (window, (bandwidth_budget(o) / (size * window)).clamp(3, 2000))
}

/// The bytes a bandwidth row moves (3 to 2000 windows).
pub fn bandwidth_budget(o: &Options) -> usize {
    if o.quick {
        512 << 20
    } else {
        4 << 30
    }
}

/// The pool every Rust API channel gets: room for a window of the largest message.
pub fn pool_for(o: &Options) -> usize {
    let max_size = o.sizes.iter().chain(&o.bw_sizes).copied().max().unwrap_or(64);
    (max_size * 4).max(64 << 20)
}

fn find<'a>(r: &'a Results, mode: &str, payload: &str, size: usize) -> Option<&'a LatencyRow> {
    r.latency.iter().find(|l| l.mode == mode && l.payload == payload && l.size == size)
}

/// This section's own targets (set for the Rust API before the C API headline existed), as
/// (name, value, target, pass); names in parentheses are context, not targets.
fn targets(r: &Results) -> Vec<(String, f64, f64, bool)> {
    let mut t = Vec::new();
    if let Some(l) = find(r, "busy", "zero-copy", 64) {
        let ratio = l.lat.p50 / r.spin_floor.p50;
        t.push(("busy-poll 64 B p50 / spinning floor".to_owned(), ratio, 1.5, ratio <= 1.5));
        let ratio = l.lat.p50 / r.ring_floor.p50;
        t.push(("  (busy-poll 64 B p50 / minimal-ring floor)".to_owned(), ratio, 1.5, ratio <= 1.5));
    }
    for b in r.bandwidth.iter().filter(|b| b.payload == "touch" && b.size >= 1 << 20) {
        if let Some((_, m)) = r.memcpy.iter().find(|(s, _)| *s == b.size) {
            let ratio = b.bytes_per_s / m;
            t.push((format!("touch bandwidth {} / memcpy", human(b.size)), ratio, 0.9, ratio >= 0.9));
        }
        if let Some((_, f)) = r.copy_floor.iter().find(|(s, _)| *s == b.size) {
            let ratio = b.bytes_per_s / f;
            t.push((
                format!("  (touch bandwidth {} / cross-core copy floor)", human(b.size)),
                ratio,
                0.9,
                ratio >= 0.9,
            ));
        }
    }
    for payload in ["zero-copy", "buffer"] {
        let rows: Vec<&LatencyRow> =
            r.latency.iter().filter(|l| l.mode == "busy" && l.payload == payload && l.size >= 64).collect();
        if rows.len() >= 2 {
            let min = rows.iter().map(|l| l.lat.p50).fold(f64::MAX, f64::min);
            let max = rows.iter().map(|l| l.lat.p50).fold(0.0, f64::max);
            let spread = max / min - 1.0;
            t.push((
                format!(
                    "{payload} p50 spread {}..{} (max/min - 1)",
                    human(rows[0].size),
                    human(rows[rows.len() - 1].size)
                ),
                spread,
                0.10,
                spread <= 0.10,
            ));
        }
    }
    t
}

/// What each payload does, for the tables' titles.
fn describe(payload: &str) -> &'static str {
    match payload {
        "zero-copy" => "loan and publish, untouched",
        "touch" => "loan, the sender copies the payload in, the receiver reads every byte",
        "buffer" => "a lava-flow buffer sent by reference, untouched",
        "buf-touch" => {
            "completion wait, copy into a lava-flow buffer, send by reference, the receiver reads every byte"
        }
        "copy" => "send of heap memory: registry lookup, copy into the pool, the receiver reads every byte",
        _ => "",
    }
}

pub fn print_text(r: &Results) {
    comment("Rust API rows (secondary): lava-flow's Rust API between the same two processes; floors measured once, at the start of this section");
    comment("");
    comment("Floors (half round trip)");
    let mut t = Table::new(&["Floor", "p50 (us)", "p99 (us)", "p99.9 (us)"]);
    for (name, p) in [
        ("spinning on one cache line", &r.spin_floor),
        ("minimal ring (256 slots, two rings, no checks or API)", &r.ring_floor),
        ("eventfd ping-pong", &r.eventfd_floor),
    ] {
        t.row(vec![name.to_owned(), us(Some(p.p50)), us(Some(p.p99)), us(Some(p.p999))]);
    }
    t.print();
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for l in &r.latency {
        if !groups.contains(&(l.mode.as_str(), l.payload)) {
            groups.push((l.mode.as_str(), l.payload));
        }
    }
    for (mode, payload) in groups {
        let (floor_name, floor) =
            if mode == "block" { ("eventfd", r.eventfd_floor.p50) } else { ("spinning", r.spin_floor.p50) };
        comment("");
        comment(&format!(
            "Latency, {}, {payload} ({}); floor: {floor_name}; Bandwidth = size / p50",
            if mode == "block" { "blocking" } else { "busy-poll" },
            describe(payload)
        ));
        let mut t = Table::new(&[
            "Size",
            "Latency p50 (us)",
            "p99 (us)",
            "p99.9 (us)",
            "Bandwidth (MB/s)",
            "Floor p50 (us)",
            "x floor",
            "Iters",
        ]);
        for l in r.latency.iter().filter(|l| l.mode == mode && l.payload == payload) {
            t.row(vec![
                l.size.to_string(),
                us(Some(l.lat.p50)),
                us(Some(l.lat.p99)),
                us(Some(l.lat.p999)),
                mb_s(Some(pingpong_bytes_per_s(l.size, l.lat.p50))),
                us(Some(floor)),
                ratio(Some(l.lat.p50 / floor)),
                l.iters.to_string(),
            ]);
        }
        t.print();
    }
    let memcpy = |size| r.memcpy.iter().find(|(s, _)| *s == size).map(|(_, b)| *b);
    let copy_floor = |size| r.copy_floor.iter().find(|(s, _)| *s == size).map(|(_, b)| *b);
    if !r.memcpy.is_empty() {
        comment("");
        comment("Bandwidth floors: single-thread memcpy; cross-core copy (one core copies from a private buffer, the other reads every byte, no channel)");
        let mut t = Table::new(&["Size", "memcpy (MB/s)", "Cross-core copy (MB/s)"]);
        for (size, bw) in &r.memcpy {
            t.row(vec![size.to_string(), mb_s(Some(*bw)), mb_s(copy_floor(*size))]);
        }
        t.print();
    }
    let mut payloads: Vec<&str> = Vec::new();
    for b in &r.bandwidth {
        if !payloads.contains(&b.payload) {
            payloads.push(b.payload);
        }
    }
    for payload in payloads {
        comment("");
        comment(&format!(
            "Bandwidth, one direction, busy-poll, {payload} ({}){}",
            describe(payload),
            if payload == "zero-copy" || payload == "buffer" {
                ": bytes not touched, so MB/s is size x message rate"
            } else {
                ""
            }
        ));
        let mut t = Table::new(&["Size", "Bandwidth (MB/s)", "x memcpy", "x cross-core copy", "Window"]);
        for b in r.bandwidth.iter().filter(|b| b.payload == payload) {
            t.row(vec![
                b.size.to_string(),
                mb_s(Some(b.bytes_per_s)),
                ratio(memcpy(b.size).map(|m| b.bytes_per_s / m)),
                ratio(copy_floor(b.size).map(|f| b.bytes_per_s / f)),
                b.window.to_string(),
            ]);
        }
        t.print();
    }
    let (empty, outside, inside) = r.lookup;
    comment("");
    comment(&format!(
        "Registry lookup per copy send (is the memory a lava-flow buffer?): no shareable buffer {empty:.1} ns, address outside their span {outside:.1} ns, inside it {inside:.1} ns"
    ));
    comment("");
    comment("Targets of the Rust API rows (names in parentheses are context, not targets)");
    let mut t = Table::new(&["Target", "Value", "Bound", "<Verdict"]);
    for (name, value, target, pass) in targets(r) {
        t.row(vec![
            name.trim().to_owned(),
            format!("{value:.2}"),
            format!("{target:.2}"),
            if pass { "ok" } else { "MISSED" }.to_owned(),
        ]);
    }
    t.print();
}

pub fn to_json(r: &Results) -> serde_json::Value {
    use serde_json::json;
    let lat = |p: &Percentiles| json!({"p50_ns": p.p50, "p99_ns": p.p99, "p999_ns": p.p999});
    json!({
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
        "registry_lookup_ns": {"empty": r.lookup.0, "outside_span": r.lookup.1, "inside_span": r.lookup.2},
        "targets": targets(r).into_iter().map(|(n, v, t, p)| json!({"name": n, "value": v, "target": t, "pass": p})).collect::<Vec<_>>(),
    })
}
