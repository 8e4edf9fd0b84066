//! `lf-bench --gpu`: GPU buffers through a channel between two processes on one GPU, next to
//! 64-byte messages on the same channels, measured in the same run.
//!
//! - `handoff`: a ping-pong in which each hop hands over a GPU buffer by reference (ready,
//!   its arena already imported): the half round trip, and its ratio to the same ping-pong
//!   with 64-byte messages on the same channels.
//! - `gpu-work`: the same ping-pong, but each side copies the buffer it received into a
//!   buffer of its own on the GPU (`Context::copy`, which waits for the copy on the host)
//!   and answers with that buffer: the hand-off with one GPU operation per hop, as a CUDA
//!   IPC ping-pong with one kernel per hop.
//! - `copy`: the receiver copies a received buffer into its own GPU memory (GB/s of bytes
//!   copied, 10 copies, best of 5 rounds), and the same copy between two of its own buffers
//!   in-process, the rounds alternated.
//! - `import`: the first receive of a buffer from a fresh arena (the arena is imported then),
//!   against a receive from an arena already imported, for a new pooled arena
//!   (`import-pool`, the arena's size shown) and for buffers with arenas of their own; and
//!   the arenas imported for all the messages of the run (re-imports per message: none).
//!
//! - `one-thread`: the software cost per message without a second core: both ends of one
//!   channel in the ping process, each 64 B message or hand-off sent, received and released
//!   on one thread.
//! - `cross-gpu` (hosts with two GPUs): GPU buffers to a consumer on the other GPU, staged
//!   through host memory by the channel and uploaded by the consumer, against the slower of
//!   the two halves (GPU to host, host to GPU) measured alone.
//!
//! The ping side is the parent (pinned to core 0), the pong side a forked child (core 1).

use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Buffer, Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;

fn die(msg: &str) -> ! {
    eprintln!("lf-bench --gpu: {msg}");
    std::process::exit(2)
}

struct Ends {
    tx: Producer,
    rx: Consumer,
}

fn open(context: &Context, tag: &str, ping: bool) -> Ends {
    let here = ProcessLocation::from_hostname().expect("hostname");
    let cfg = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    };
    let (out, back) = (format!("{tag}-a2b"), format!("{tag}-b2a"));
    if ping {
        let tx = Producer::create(context, &out, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
        let rx = Consumer::create(context, &back, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
        Ends { tx, rx }
    } else {
        let rx = Consumer::create(context, &out, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
        let tx = Producer::create(context, &back, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
        Ends { tx, rx }
    }
}

/// p50, p99 and p99.9 of the samples (nearest rank).
fn percentiles(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99), at(0.999))
}

/// What one hop of a ping-pong carries.
#[derive(Clone, Copy, PartialEq)]
enum Hop {
    Bytes64,
    Handoff,
    GpuWork,
}

/// One ping-pong row: half round trips in ns on the ping side.
fn pingpong(
    context: &Context,
    ends: &mut Ends,
    ping: bool,
    hop: Hop,
    size: usize,
    iters: usize,
    keep: &mut Vec<Buffer>,
) -> Option<(f64, f64, f64)> {
    let mine = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    let warm = iters / 10 + 10;
    let mut samples = Vec::with_capacity(iters);
    let small = [7u8; 64];
    let send = |ends: &mut Ends| -> u64 {
        match hop {
            Hop::Bytes64 => ends.tx.send(&small).expect("send"),
            _ => ends.tx.send_buffer(&mine, 0, size).expect("send_buffer"),
        }
    };
    let receive = |ends: &mut Ends| {
        let m = ends.rx.recv().expect("recv");
        if hop == Hop::GpuWork {
            let received = m.buffer().expect("a GPU buffer");
            context.copy(&mine, 0, received, 0, size).expect("GPU copy");
        }
    };
    let mut last = None;
    for i in 0..warm + iters {
        let t0 = Instant::now();
        if ping {
            // The previous hand-off of `mine` must be complete before it goes again.
            if let Some(seq) = last {
                ends.tx.wait_completed(seq, None).expect("completion");
            }
            last = Some(send(ends));
            receive(ends);
            if i >= warm {
                samples.push(t0.elapsed().as_nanos() as f64 / 2.0);
            }
        } else {
            receive(ends);
            if let Some(seq) = last {
                ends.tx.wait_completed(seq, None).expect("completion");
            }
            last = Some(send(ends));
        }
    }
    if let Some(seq) = last {
        ends.tx.wait_completed(seq, None).expect("completion");
    }
    keep.push(mine);
    ping.then(|| percentiles(samples))
}

/// GB/s of bytes copied: the pong side copies a received buffer, then its own.
fn copy_rate(
    context: &Context,
    ends: &mut Ends,
    ping: bool,
    size: usize,
    keep: &mut Vec<Buffer>,
) -> Option<(f64, f64)> {
    const REPS: usize = 10;
    if ping {
        let mine = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
        let seq = ends.tx.send_buffer(&mine, 0, size).expect("send_buffer");
        let m = ends.rx.recv().expect("the pong side's rates");
        ends.tx.wait_completed(seq, None).expect("completion");
        keep.push(mine);
        let rates: Vec<f64> = m.chunks(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        return Some((rates[0], rates[1]));
    }
    let m = ends.rx.recv().expect("recv");
    let received = m.buffer().expect("a GPU buffer");
    let own = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    let other = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    let rate = |src: &Buffer| {
        let t0 = Instant::now();
        for _ in 0..REPS {
            context.copy(&own, 0, src, 0, size).expect("copy");
        }
        (size * REPS) as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    // Alternated, best of five rounds each: clocks and caches treat both alike.
    context.copy(&own, 0, received, 0, size).expect("warm-up copy");
    let (mut imported, mut local) = (0f64, 0f64);
    for _ in 0..5 {
        imported = imported.max(rate(received));
        local = local.max(rate(&other));
    }
    drop(m);
    let mut bytes = imported.to_le_bytes().to_vec();
    bytes.extend_from_slice(&local.to_le_bytes());
    ends.tx.send(&bytes).expect("send rates");
    None
}

/// The software cost of one message, without a second core: a producer and a consumer of one
/// channel in this process, each message sent, received and released on this thread, for 64 B
/// messages and for hand-offs of a GPU buffer (best of three rounds, ns per message).
fn one_thread_cost(context: &Context, tag: &str, iters: usize) -> (f64, f64) {
    let here = ProcessLocation::from_hostname().expect("hostname");
    let cfg = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    };
    let name = format!("{tag}-one");
    let (c2, n2, h2, cfg2) = (context.clone(), name.clone(), here.clone(), cfg.clone());
    let consumer = std::thread::spawn(move || Consumer::create(&c2, &n2, &h2, &h2, &cfg2));
    let mut tx = Producer::create(context, &name, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
    let mut rx = consumer.join().expect("consumer thread").unwrap_or_else(|e| die(&e.to_string()));
    let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    let small = [7u8; 64];
    let mut best = [f64::MAX; 2];
    for _ in 0..3 {
        for (i, gpu) in [false, true].into_iter().enumerate() {
            let t0 = Instant::now();
            for _ in 0..iters {
                let seq = if gpu { tx.send_buffer(&buffer, 0, 4096) } else { tx.send(&small) }.expect("send");
                let m = rx.recv().expect("recv");
                std::hint::black_box(m.len());
                drop(m);
                tx.wait_completed(seq, None).expect("completion");
            }
            best[i] = best[i].min(t0.elapsed().as_nanos() as f64 / iters as f64);
        }
    }
    (best[0], best[1])
}

/// A buffer of `size` bytes in an arena never sent before: its own arena (over a quarter of
/// the pooled arena size), or, for `pooled`, the first buffer of a new pooled arena.
fn fresh_buffer(context: &Context, size: usize, pooled: bool, keep: &mut Vec<Buffer>) -> Buffer {
    let allocate = |len| context.allocate(len, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    if !pooled {
        return allocate(size);
    }
    let arena_of = |b: &Buffer| b.gpu_buffer().expect("GPU memory").arena_id();
    let first = allocate(size);
    let old = arena_of(&first);
    keep.push(first);
    loop {
        let next = allocate(size);
        if arena_of(&next) != old {
            return next;
        }
        keep.push(next);
    }
}

/// The first receive from a fresh arena against a receive from it once imported, in µs, as
/// the pong side times its successful `try_recv`.
fn first_import(
    context: &Context,
    ends: &mut Ends,
    ping: bool,
    size: usize,
    pooled: bool,
    keep: &mut Vec<Buffer>,
) -> Option<(f64, f64)> {
    if ping {
        let fresh = fresh_buffer(context, size, pooled, keep);
        for _ in 0..2 {
            let seq = ends.tx.send_buffer(&fresh, 0, 64).expect("send_buffer");
            ends.tx.wait_completed(seq, None).expect("completion");
        }
        let m = ends.rx.recv().expect("the pong side's times");
        let t: Vec<f64> = m.chunks(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        keep.push(fresh);
        return Some((t[0], t[1]));
    }
    let mut times = Vec::new();
    for _ in 0..2 {
        let (m, took) = loop {
            let t0 = Instant::now();
            match ends.rx.try_recv() {
                Ok(m) => break (m, t0.elapsed()),
                Err(lava_flow::Error::WouldBlock(_)) => std::hint::spin_loop(),
                Err(e) => die(&e.to_string()),
            }
        };
        assert!(m.buffer().is_some());
        times.push(took.as_secs_f64() * 1e6);
    }
    let bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    ends.tx.send(&bytes).expect("send times");
    None
}

/// GPU buffers to a consumer on another GPU (staged through host memory by the channel): GB/s
/// from the consumer's first receive to its last, each message uploaded into the consumer's
/// own GPU memory; beside it, in the same run, the producer's own read of the buffer to the
/// host and the consumer's own upload, the two halves of any staged path (GB/s: staged,
/// GPU-to-host, host-to-GPU). `None` on the consumer's side.
fn cross_gpu(tag: &str, ping: bool, size: usize) -> Option<(f64, f64, f64)> {
    const MESSAGES: usize = 16;
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    config.gpu_device = Some(lava_flow::memory::DeviceSelector::Index(if ping { 0 } else { 1 }));
    let context = Context::new(config).unwrap_or_else(|e| die(&format!("second GPU: {e}")));
    let here = ProcessLocation::from_hostname().expect("hostname");
    // Room for two staged messages in flight.
    let cfg = ChannelConfig {
        wait: WaitStrategy::BusyPoll,
        pool_size: 2 * size,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    };
    let name = format!("{tag}-xgpu");
    let buffer = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    let mut host = vec![0u8; size];
    // Best of three.
    let rate = |f: &mut dyn FnMut()| {
        (0..3)
            .map(|_| {
                let t0 = Instant::now();
                f();
                size as f64 / t0.elapsed().as_secs_f64() / 1e9
            })
            .fold(0f64, f64::max)
    };
    if ping {
        let d2h = rate(&mut || buffer.read_at(0, &mut host).expect("read"));
        let mut p = Producer::create(&context, &name, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
        assert!(p.transport().reason.contains("staged"), "{}", p.transport().reason);
        for _ in 0..MESSAGES {
            p.send_buffer(&buffer, 0, size).expect("staged send");
        }
        let mut c = Consumer::create(&context, &format!("{name}-back"), &here, &here, &cfg)
            .unwrap_or_else(|e| die(&e.to_string()));
        let m = c.recv().expect("the consumer's figures");
        let t: Vec<f64> = m.chunks(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        return Some((t[0], d2h, t[1]));
    }
    let h2d = rate(&mut || buffer.write_at(0, &host).expect("write"));
    let mut c = Consumer::create(&context, &name, &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
    let mut started = None;
    for _ in 0..MESSAGES {
        let m = c.recv().expect("staged message");
        started.get_or_insert_with(Instant::now);
        buffer.write_at(0, &m).expect("upload");
    }
    let staged = (size * (MESSAGES - 1)) as f64 / started.expect("received").elapsed().as_secs_f64() / 1e9;
    let mut p =
        Producer::create(&context, &format!("{name}-back"), &here, &here, &cfg).unwrap_or_else(|e| die(&e.to_string()));
    let mut bytes = staged.to_le_bytes().to_vec();
    bytes.extend_from_slice(&h2d.to_le_bytes());
    p.send(&bytes).expect("send figures");
    p.wait_completed(0, Some(Duration::from_secs(30))).expect("figures read");
    None
}

/// One row of the report: `a` and `b` in `unit` (ping-pong rows: p50 and p99, with `p999`).
struct GpuRow {
    name: &'static str,
    size: usize,
    a: f64,
    b: f64,
    p999: Option<f64>,
    unit: &'static str,
}

/// lf-bench --gpu: GPU buffers through a channel between two processes on one GPU, next to
/// 64-byte messages on the same channels, measured in the same run.
#[derive(clap::Parser, Debug)]
#[command(name = "lf-bench", override_usage = "lf-bench --gpu [OPTIONS]")]
struct GpuArgs {
    /// Measure GPU buffers through channels (this benchmark)
    #[arg(long = "gpu", required = true)]
    _gpu: bool,
    /// 2,000 round trips per case instead of 20,000
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
}

pub(crate) fn main() {
    let GpuArgs { quick, json, .. } = lava_flow_tools::cli::parse();
    let machine = crate::machine::Machine::probe();
    let tag = format!("lfg{}", std::process::id());
    if std::env::var_os("LF_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("{tag}-rt"));
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("runtime dir");
        std::env::set_var("LF_RUNTIME_DIR", &dir);
    }
    // SAFETY: no threads exist yet; the child runs only this function's code.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die("fork failed");
    }
    let ping = child > 0;
    crate::pingpong::pin_to(if ping { 0 } else { 1 });
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    let context = Context::new(config).unwrap_or_else(|e| die(&format!("no GPU: {e}")));
    let mut ends = open(&context, &tag, ping);
    let iters = if quick { 2_000 } else { 20_000 };
    let sizes = [4usize << 10, 1 << 20, 64 << 20];
    let mut rows: Vec<GpuRow> = Vec::new();
    let mut row = |name: &'static str, size: usize, values: Option<(f64, f64)>, unit: &'static str| {
        if let Some((a, b)) = values {
            rows.push(GpuRow { name, size, a, b, p999: None, unit });
        }
    };
    let mut tails = Vec::new();
    let mut pingpong_row = |name: &'static str, size: usize, r: Option<(f64, f64, f64)>| {
        if let Some((p50, p99, p999)) = r {
            tails.push(GpuRow { name, size, a: p50, b: p99, p999: Some(p999), unit: "ns p50/p99" });
        }
    };
    // Every buffer sent stays alive to the end: an arena that dies is dropped by the consumer
    // at the next new arena, and that free would be timed with the next import.
    let mut keep = Vec::new();
    let base = pingpong(&context, &mut ends, ping, Hop::Bytes64, 64, iters, &mut keep);
    pingpong_row("bytes-64", 64, base);
    for &size in &sizes {
        let r = pingpong(&context, &mut ends, ping, Hop::Handoff, size, iters, &mut keep);
        pingpong_row("handoff", size, r);
    }
    for &size in &sizes[..2] {
        let r = pingpong(&context, &mut ends, ping, Hop::GpuWork, size, iters / 10, &mut keep);
        pingpong_row("gpu-work", size, r);
    }
    // Arenas of their own, then a new pooled arena (64 MiB, the default) of 1 MiB buffers.
    let import_sizes: &[usize] = if quick { &[20 << 20, 64 << 20] } else { &[20 << 20, 64 << 20, 256 << 20, 1 << 30] };
    for &size in import_sizes {
        let r = first_import(&context, &mut ends, ping, size, false, &mut keep);
        row("import", size, r, "us first/imported");
    }
    let r = first_import(&context, &mut ends, ping, 1 << 20, true, &mut keep);
    row("import-pool", 64 << 20, r, "us first/imported");
    for size in [1usize << 20, 16 << 20, 64 << 20, 256 << 20] {
        let r = copy_rate(&context, &mut ends, ping, size, &mut keep);
        row("copy", size, r, "GB/s imported/in-process");
    }
    let devices = context.device_info().map_or(0, |d| d.all_devices.len());
    let mut halves = None;
    if devices >= 2 {
        let r = cross_gpu(&tag, ping, 64 << 20);
        halves = r.map(|(_, d2h, h2d)| (d2h, h2d));
        row("cross-gpu", 64 << 20, r.map(|(staged, d2h, h2d)| (staged, d2h.min(h2d))), "GB/s staged/slower half");
    }
    let imports = context.imported_arenas();
    let reason = ends.tx.transport().reason.clone();
    if !ping {
        drop(ends);
        std::process::exit(0);
    }
    drop(ends);
    let (cost_64, cost_handoff) = one_thread_cost(&context, &tag, if quick { 200_000 } else { 1_000_000 });
    row("one-thread", 64, Some((cost_64, cost_handoff)), "ns/message 64 B / hand-off");
    let mut status = 0;
    // SAFETY: waiting for the child we forked.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if let Ok(dir) = std::env::var("LF_RUNTIME_DIR") {
        if dir.contains(&tag) {
            let _ = std::fs::remove_dir(&dir);
        }
    }
    tails.append(&mut rows);
    let rows = tails;
    let device = context.device_info().map(|d| d.name.clone()).unwrap_or_default();
    let setup = GpuSetup { machine, device, devices, reason, quick, iters, imports, halves };
    if json {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"case": r.name, "size": r.size, "a": r.a, "b": r.b, "p999": r.p999, "unit": r.unit}))
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "config": {"machine": setup.machine.to_json(), "text": setup.lines(), "quick": quick, "iters": iters},
                "device": setup.device, "route": setup.reason, "rows": out, "arenas_imported": imports,
                "child_status": status,
            })
        );
    } else {
        print_text(&setup, &rows);
    }
    if status != 0 {
        die("the pong side failed");
    }
}

/// What the report's configuration says.
struct GpuSetup {
    machine: crate::machine::Machine,
    device: String,
    devices: usize,
    reason: String,
    quick: bool,
    iters: usize,
    imports: usize,
    /// GPU-to-host and host-to-GPU GB/s, each alone, of the cross-GPU row.
    halves: Option<(f64, f64)>,
}

impl GpuSetup {
    fn lines(&self) -> Vec<String> {
        let mut l =
            vec!["lf-bench --gpu: GPU buffers through lava-flow channels between two processes on one GPU".to_owned()];
        l.extend(self.machine.lines());
        l.push(format!(
            "GPU: {} ({} device{} seen)",
            self.device,
            self.devices,
            if self.devices == 1 { "" } else { "s" }
        ));
        l.push(format!("Route: {}", self.reason));
        l.push("Pinning: ping on core 0, pong on core 1".to_owned());
        l.push("Channels: ChannelConfig::default() with busy-poll and a 60 s rendezvous timeout".to_owned());
        l.push(format!(
            "Iterations: {} timed round trips per ping-pong row ({} with GPU work), a tenth more untimed first; copies 10 per round, best of 5 rounds{}",
            self.iters,
            self.iters / 10,
            if self.quick { " (--quick)" } else { "" }
        ));
        l.push("Latency: half round trips, percentiles by nearest rank; MB/s = 10^6 bytes per second".to_owned());
        l
    }
}

fn verdict(pass: bool) -> String {
    if pass { "ok" } else { "MISSED" }.to_owned()
}

fn print_text(setup: &GpuSetup, rows: &[GpuRow]) {
    use crate::table::{comment, ratio, us, Table};
    for line in setup.lines() {
        comment(&line);
    }
    let of = |name: &'static str| rows.iter().filter(move |r| r.name == name);
    let bytes64 = of("bytes-64").next().map_or(f64::NAN, |r| r.a);
    comment("");
    comment("Ping-pong: bytes-64 a 64 B message; handoff a ready GPU buffer by reference; gpu-work the same, each side copying the received buffer on the GPU");
    comment("x 64 B = p50 / the 64 B message's p50 on the same channels; target: a hand-off <= 1.2x");
    let mut t = Table::new(&["Size", "<Case", "Latency p50 (us)", "p99 (us)", "p99.9 (us)", "x 64 B", "<Target"]);
    for r in ["bytes-64", "handoff", "gpu-work"].into_iter().flat_map(of) {
        let x = r.a / bytes64;
        let target = if r.name == "handoff" { verdict(x <= 1.2) } else { String::new() };
        t.row(vec![
            r.size.to_string(),
            r.name.to_owned(),
            us(Some(r.a)),
            us(Some(r.b)),
            us(r.p999),
            ratio(Some(x)),
            target,
        ]);
    }
    t.print();
    comment("");
    comment("Copy of a received buffer into the receiver's own GPU memory, against the same copy between two of its own buffers; target >= 0.95x");
    let mut t = Table::new(&["Size", "Imported (MB/s)", "In-process (MB/s)", "Ratio", "<Target"]);
    for r in of("copy") {
        let x = r.a / r.b;
        t.row(vec![
            r.size.to_string(),
            format!("{:.2}", r.a * 1e3),
            format!("{:.2}", r.b * 1e3),
            format!("{x:.3}"),
            verdict(x >= 0.95),
        ]);
    }
    t.print();
    comment("");
    comment("First receive from a fresh arena (imported then), against a receive once it is imported; import: a buffer with an arena of its own; import-pool: the first buffer of a new pooled arena (its size shown); target <= 1 ms up to 64 MiB");
    let mut t = Table::new(&["Size", "<Case", "First (us)", "Imported (us)", "<Target"]);
    for r in ["import", "import-pool"].into_iter().flat_map(of) {
        let target = if r.size <= 64 << 20 { verdict(r.a <= 1000.0) } else { String::new() };
        t.row(vec![r.size.to_string(), r.name.to_owned(), format!("{:.1}", r.a), format!("{:.1}", r.b), target]);
    }
    t.print();
    comment(&format!(
        "Arenas imported by the ping side for all its messages: {} (each arena once per channel)",
        setup.imports
    ));
    for r in of("cross-gpu") {
        comment("");
        comment("Another GPU: 16 GPU buffers staged through host memory to a consumer on the second GPU, each uploaded there, against the slower of the two halves measured alone");
        let mut t = Table::new(&["Size", "Staged (MB/s)", "GPU-to-host (MB/s)", "Host-to-GPU (MB/s)", "x slower half"]);
        let (d2h, h2d) = setup.halves.unwrap_or((f64::NAN, f64::NAN));
        t.row(vec![
            r.size.to_string(),
            format!("{:.2}", r.a * 1e3),
            format!("{:.2}", d2h * 1e3),
            format!("{:.2}", h2d * 1e3),
            ratio(Some(r.a / r.b)),
        ]);
        t.print();
    }
    for r in of("one-thread") {
        comment("");
        comment("One thread: both ends of one channel in one process, each message sent, received and released there (best of 3 rounds)");
        let mut t = Table::new(&["Size", "64 B message (ns)", "Hand-off (ns)", "Hand-off extra (ns)"]);
        t.row(vec![r.size.to_string(), format!("{:.1}", r.a), format!("{:.1}", r.b), format!("{:.1}", r.b - r.a)]);
        t.print();
    }
}
