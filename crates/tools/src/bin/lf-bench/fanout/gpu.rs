//! `lf-bench --fan-out --gpu`: a GPU buffer fanned out by reference to N consumers (N = 4 by
//! default), against the pair channel's GPU hand-off, in one run.
//!
//! ```text
//! lf-bench --fan-out --gpu [--quick] [--json] [--json-out FILE] [--sizes 4K,1M] [--consumers 4]
//!                          [--iters N] [--wait busy|spin|block] [--no-pin]
//! ```
//!
//! The producer (a process of its own, pinned to core 0) allocates one DEVICE_LOCAL buffer and,
//! per message, sends it by reference (`send_buffer`: the Vulkan IPC route, its arena imported
//! once by each consumer) and waits until every consumer released it (`wait_completed`): the
//! hand-off, timed per message, with the send call alone beside it. The consumers (a process
//! each, on the other cores in turn) receive and release each message, touching nothing, as
//! `lf-bench --gpu`'s hand-off does. The pair channel (one consumer) runs the same protocol in
//! the same run, size by size; the target is a fan-out hand-off at most 1.5x the pair's (p50).
//! Both use `ChannelConfig::default()` with busy-poll (as `lf-bench --gpu`) unless `--wait`
//! says otherwise, and a 60 s rendezvous timeout.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ArgAction;
use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;
use lava_flow_tools::cli::{self, LIST};
use serde_json::{json, Value};

use super::scatter::{consumer_core, cores_allowed};
use crate::fanin::fork_into;
use crate::machine::Machine;
use crate::options::die;
use crate::spread::Wait;

/// The target: a fan-out's hand-off at most this many times the pair's.
const TARGET: f64 = 1.5;

/// lf-bench --fan-out --gpu: a GPU buffer fanned out by reference to N consumer processes,
/// against the pair channel's GPU hand-off, in one run.
#[derive(clap::Parser, Debug)]
#[command(name = "lf-bench", override_usage = "lf-bench --fan-out --gpu [OPTIONS]")]
struct Options {
    /// Measure one producer to many consumers (with --gpu: of a GPU buffer)
    #[arg(long = "fan-out", required = true)]
    _fan_out: bool,
    /// Fan a GPU buffer out (this benchmark)
    #[arg(long = "gpu", required = true)]
    _gpu: bool,
    /// 200 messages per case instead of 5,000
    #[arg(long)]
    quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    json: bool,
    /// Also write the JSON to this file (the text still goes to stdout)
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Buffer sizes, one case each, like 4K,1M
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "4K,1M", value_parser = cli::nonzero_size)]
    sizes: Vec<usize>,
    /// Consumer counts, one case each, like 1,4 (1 to 8: a fan-out's default max_peers)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "4", value_parser = cli::count_up_to(8))]
    consumers: Vec<usize>,
    /// Timed messages per case (200 with --quick)
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value = "5000",
          default_value_if("quick", "true", Some("200")))]
    iters: usize,
    /// The channels' wait strategy
    #[arg(long, value_enum, default_value = "busy")]
    wait: Wait,
    /// Leave the processes unpinned (default: the producer on core 0, the consumers on the others)
    #[arg(long = "no-pin", action = ArgAction::SetFalse)]
    pin: bool,
}

/// The channels' wait strategy for `--wait`, and its name in the report.
fn strategy(wait: Wait) -> (WaitStrategy, &'static str) {
    match wait {
        Wait::Busy => (WaitStrategy::BusyPoll, "busy-poll"),
        Wait::Spin => (WaitStrategy::SpinThenBlock { spin: Duration::from_micros(50) }, "spin-then-block"),
        Wait::Block => (WaitStrategy::Block, "block"),
    }
}

fn options() -> Options {
    cli::parse()
}

fn gpu_context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    Context::new(config).unwrap_or_else(|e| die(&format!("no GPU: {e}")))
}

fn channel_config(o: &Options, kind: ChannelKind) -> ChannelConfig {
    ChannelConfig {
        kind,
        wait: strategy(o.wait).0,
        rendezvous_timeout: Some(Duration::from_secs(60)),
        ..ChannelConfig::default()
    }
}

/// p50 and p99 of `samples` (nearest rank), in ns.
fn percentiles(mut samples: Vec<u64>) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize] as f64;
    (at(0.5), at(0.99))
}

/// The producer's process: waits for `consumers` consumers, then hands the buffer off
/// `iters` times after a tenth as many untimed; returns its JSON line.
fn producer(o: &Options, name: &str, kind: ChannelKind, consumers: usize, size: usize) -> String {
    let context = gpu_context();
    let here = ProcessLocation::from_hostname().expect("hostname");
    let mut p = Producer::create(&context, name, &here, &here, &channel_config(o, kind))
        .unwrap_or_else(|e| die(&format!("{name}: {e}")));
    let deadline = Instant::now() + Duration::from_secs(60);
    // A consumer met is taken up at the next send: greetings (CPU bytes) until all are there.
    while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < consumers {
        assert!(Instant::now() < deadline, "{name}: fewer than {consumers} consumers attached within 60 s");
        let _ = p.try_send(b"greeting");
        std::thread::sleep(Duration::from_millis(1));
    }
    let buffer = context.allocate(size, MemoryLocation::GpuDeviceLocal).expect("GPU buffer");
    buffer.write_at(0, &vec![7u8; size]).expect("filling the buffer");
    let warm = o.iters / 10 + 10;
    let (mut send, mut handoff) = (Vec::with_capacity(o.iters), Vec::with_capacity(o.iters));
    for i in 0..warm + o.iters {
        let t0 = Instant::now();
        let seq = p.send_buffer(&buffer, 0, size).expect("send_buffer");
        let t1 = Instant::now();
        p.wait_completed(seq, Some(Duration::from_secs(60))).expect("every consumer's release");
        let t2 = Instant::now();
        if i >= warm {
            send.push((t1 - t0).as_nanos() as u64);
            handoff.push((t2 - t0).as_nanos() as u64);
        }
    }
    let alive = p.peers().iter().filter(|c| c.state == PeerState::Alive).count();
    let (send_p50, send_p99) = percentiles(send);
    let (p50, p99) = percentiles(handoff);
    json!({
        "who": if kind == ChannelKind::Pair { "pair" } else { "fan-out" },
        "consumers": consumers, "size": size, "sent": (warm + o.iters) as u64, "timed": o.iters,
        "send_p50_ns": send_p50, "send_p99_ns": send_p99, "handoff_p50_ns": p50, "handoff_p99_ns": p99,
        "alive_at_end": alive, "route": p.transport().reason.clone(), "names": p.transport().names(),
    })
    .to_string()
}

/// A consumer's process: receives and releases every message until the producer's end, and
/// returns how many GPU messages (by reference) it got.
fn consumer(o: &Options, name: &str, kind: ChannelKind, index: usize, size: usize) -> String {
    let context = gpu_context();
    let here = ProcessLocation::from_hostname().expect("hostname");
    let mut c = Consumer::create(&context, name, &here, &here, &channel_config(o, kind))
        .unwrap_or_else(|e| die(&format!("{name}: {e}")));
    let mut gpu = 0u64;
    let mut other = 0u64;
    loop {
        match c.recv() {
            Ok(m) if m.len() == size && m.is_zero_copy() => gpu += 1,
            Ok(_) => other += 1,
            Err(lava_flow::Error::PeerGone(_)) => break,
            Err(e) => die(&format!("{name}: consumer {index}: {e}")),
        }
    }
    json!({"consumer": index, "gpu_received": gpu, "other": other, "names": c.transport().names()}).to_string()
}

/// One case: the producer and `consumers` consumers of channel `name`, each forked.
fn run(o: &Options, name: &str, kind: ChannelKind, consumers: usize, size: usize) -> Result<Value, String> {
    let cores = cores_allowed();
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors; checked.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe");
    // SAFETY: two new descriptors that nothing else owns.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Each line in one write, shorter than PIPE_BUF: lines from several processes never mix.
    let send_line = |line: String| {
        let mut out = std::fs::File::from(write_end.try_clone().expect("dup"));
        std::io::Write::write_all(&mut out, format!("{line}\n").as_bytes()).expect("writing the result");
    };
    let mut pids = vec![fork_into(o.pin.then_some(0), || send_line(producer(o, name, kind, consumers, size)))];
    for i in 0..consumers {
        let core = o.pin.then(|| consumer_core(i, cores));
        pids.push(fork_into(core, || send_line(consumer(o, name, kind, i, size))));
    }
    drop(write_end);
    let mut text = String::new();
    let _ = std::fs::File::from(read_end).read_to_string(&mut text);
    let mut failed = Vec::new();
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for a child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            failed.push(format!("process {pid} ended with status {status:#x}"));
        }
    }
    if !failed.is_empty() {
        return Err(format!("{} (see stderr)", failed.join("; ")));
    }
    let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let mut row = lines.iter().find(|v| v["who"].is_string()).cloned().ok_or("no line from the producer")?;
    let got: Vec<Value> = lines.into_iter().filter(|v| v["consumer"].is_u64()).collect();
    let timed = row["sent"].as_u64();
    row["all_received"] =
        Value::Bool(got.len() == consumers && got.iter().all(|c| c["gpu_received"].as_u64() == timed));
    row["by_reference"] = Value::Bool(row["route"].as_str().is_some_and(|r| r.contains("vulkan_ipc, by reference")));
    row["consumer_results"] = Value::Array(got);
    Ok(row)
}

/// The whole run: for each size, the pair, then the fan-out to each number of consumers.
pub fn main() {
    let o = options();
    let machine = Machine::probe();
    let tag = format!("lfgf{}", std::process::id());
    let made_dir = crate::runtime_dir(&tag);
    let mut rows = Vec::new();
    for &size in &o.sizes {
        let pair = run(&o, &format!("{tag}-pair-{size}"), ChannelKind::Pair, 1, size);
        let pair_p50 = pair.as_ref().ok().and_then(|r| r["handoff_p50_ns"].as_f64());
        rows.push(("pair".to_owned(), 1, size, pair, None));
        for &n in &o.consumers {
            let mut r = run(&o, &format!("{tag}-fanout{n}-{size}"), ChannelKind::FanOut, n, size);
            let x = r.as_ref().ok().and_then(|r| r["handoff_p50_ns"].as_f64()).zip(pair_p50).map(|(f, p)| f / p);
            if let (Ok(row), Some(x)) = (r.as_mut(), x) {
                row["x_pair"] = json!(x);
            }
            rows.push((format!("fan-out to {n}"), n, size, r, x));
        }
    }
    if let Some(dir) = made_dir {
        let _ = std::fs::remove_dir(&dir);
    }
    let config = vec![
        "lf-bench --fan-out --gpu: a GPU buffer by reference to N consumer processes, against the pair channel, in one run"
            .to_owned(),
        format!(
            "Channels: ChannelConfig::default() with {} and a 60 s rendezvous timeout; one DEVICE_LOCAL buffer, send_buffer + wait_completed per message",
            strategy(o.wait).1
        ),
        format!(
            "Iterations: {} timed hand-offs per row, a tenth more untimed first{}; percentiles by nearest rank",
            o.iters,
            if o.quick { " (--quick)" } else { "" }
        ),
        format!(
            "Pinning: {}",
            if o.pin { "the producer on core 0, the consumers on the other cores in turn" } else { "none (--no-pin)" }
        ),
    ];
    let config: Vec<String> = config.into_iter().chain(machine.lines()).collect();
    let out = json!({
        "config": {"text": config, "machine": machine.to_json(), "iters": o.iters, "quick": o.quick},
        "target": TARGET,
        "rows": rows.iter().map(|(case, n, size, r, _)| match r {
            Ok(v) => json!({"case": case, "consumers": n, "size": size, "result": v}),
            Err(e) => json!({"case": case, "consumers": n, "size": size, "error": e}),
        }).collect::<Vec<_>>(),
    });
    if let Some(file) = &o.json_out {
        std::fs::write(file, format!("{out}\n"))
            .unwrap_or_else(|e| die(&format!("--json-out {}: {e}", file.display())));
    }
    if o.json {
        println!("{out}");
        return;
    }
    use crate::table::{comment, ratio, us, Table};
    for line in &config {
        comment(line);
    }
    comment("");
    comment(&format!(
        "Hand-off: send_buffer of a GPU buffer by reference + wait_completed (every consumer released it); x pair = p50 / the pair's p50 at that size; target <= {TARGET}x"
    ));
    let mut t = Table::new(&[
        "Size",
        "<Case",
        "Send p50 (us)",
        "Hand-off p50 (us)",
        "p99 (us)",
        "x pair",
        "<Target",
        "<By reference, all received",
    ]);
    for (case, _, size, r, x) in &rows {
        let cells = match r {
            Ok(v) => vec![
                size.to_string(),
                case.clone(),
                us(v["send_p50_ns"].as_f64()),
                us(v["handoff_p50_ns"].as_f64()),
                us(v["handoff_p99_ns"].as_f64()),
                x.map_or(String::new(), |x| ratio(Some(x))),
                x.map_or(String::new(), |x| if x <= TARGET { "ok" } else { "MISSED" }.to_owned()),
                format!("{} / {}", v["by_reference"], v["all_received"]),
            ],
            Err(e) => {
                let mut cells = vec![size.to_string(), case.clone()];
                cells.extend(["-"; 5].map(str::to_owned));
                cells.push(format!("failed: {e}"));
                cells
            }
        };
        t.row(cells);
    }
    t.print();
    if let Some(route) = rows.iter().find_map(|(_, n, _, r, _)| r.as_ref().ok().filter(|_| *n > 1)) {
        comment(&format!("Route (fan-out): {}", route["route"].as_str().unwrap_or_default()));
    }
}
