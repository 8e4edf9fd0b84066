//! `lf-bench --fan-out`: one producer to many consumers, each in a process of its own, through
//! lava-flow's C API (a fan-out channel, and the pair channel with one consumer as the
//! reference) beside iceoryx2 (one publisher, N subscribers on one service), all in one run and
//! with the same protocol (`scatter.rs`).
//!
//! ```text
//! lf-bench --fan-out [--quick] [--json] [--json-out FILE] [--size 1M] [--small-size 64]
//!                    [--consumers 1,2,4,8] [--warm S] [--window S] [--no-pin] [--no-peers]
//!                    [--iceoryx2-fanout PATH] [--wait busy|spin|block]
//! ```
//!
//! The main rows: `--size` bytes (1 MiB) sent by reference, one buffer rewritten in full before
//! each message and each message waited for (`lf_wait_completed`: every consumer released it)
//! before the rewrite; the producer's time in the send call and its whole cycle (send and
//! wait), per message, p50 and p99 over the timed window; every consumer reads every byte and
//! checks each message. The small rows: `--small-size` bytes (64 B) copied (`lf_send`) at
//! saturation, the producer's time per message over blocks of 64 sends. The producer is
//! pinned to core 0 and the consumers share the other cores in turn: on a 2-core machine all of
//! them run on core 1 (oversubscribed), and the report says so.
//!
//! lf-bench's main process only forks and reads results: each case's producer and consumers
//! are processes of their own, forked before any of them opens lava-flow.

#[cfg(feature = "vulkan")]
pub mod gpu;
mod lf;
mod peers;
mod report;
pub mod scatter;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};
use lava_flow_c_api::channel_config::{lf_channel_kind, lf_wait_strategy};
use lava_flow_tools::cli::{self, LIST};
use serde_json::Value;

use crate::fanin::fork_into;
use crate::machine::Machine;
use crate::spread::Wait;
use lf::Mode;
use peers::FanOutPeers;
use scatter::{consumer_core, cores_allowed, Control, MIN_SIZE};

/// The most consumers a case takes: the default `max_peers` of a fan-out.
const MAX_CONSUMERS: usize = 8;

/// lf-bench --fan-out: one producer to many consumers, each in a process of its own, through
/// the C API (a fan-out channel, the pair channel with one consumer as the reference), beside
/// iceoryx2 with N subscribers: a large message by reference, a small one copied.
///
/// `lf-bench --fan-out --gpu` fans a GPU buffer out instead (see lf-bench --fan-out --gpu --help).
#[derive(Parser, Clone, Debug)]
#[command(name = "lf-bench", override_usage = "lf-bench --fan-out [OPTIONS]")]
pub struct FanOutOptions {
    /// Measure one producer to many consumers (this benchmark)
    #[arg(long = "fan-out", required = true)]
    _fan_out: bool,
    /// A short warm-up and window (0.1 s and 0.5 s)
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON to this file (the text still goes to stdout)
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Bytes per message sent by reference (a multiple of 8, at most the default pool)
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = cli::size)]
    pub size: usize,
    /// Bytes per copied message of the small rows (0: no small rows)
    #[arg(long = "small-size", value_name = "BYTES", default_value = "64", value_parser = cli::size)]
    pub small: usize,
    /// Consumer counts, one case each, like 1,2,4,8 (1 to 8: a fan-out's default max_peers)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "1,2,4,8", value_parser = cli::count_up_to(MAX_CONSUMERS))]
    pub consumers: Vec<usize>,
    /// Seconds of warm-up before each case's timed window (0.1 with --quick)
    #[arg(long, value_name = "S", value_parser = cli::seconds, default_value = "0.3",
          default_value_if("quick", "true", Some("0.1")))]
    pub warm: Duration,
    /// Seconds of each case's timed window (0.5 with --quick)
    #[arg(long, value_name = "S", value_parser = cli::seconds, default_value = "2",
          default_value_if("quick", "true", Some("0.5")))]
    pub window: Duration,
    /// Leave the processes unpinned (default: the producer on core 0, the consumers on the others)
    #[arg(long = "no-pin", action = ArgAction::SetFalse)]
    pub pin: bool,
    /// Measure lava-flow alone: no iceoryx2 rows
    #[arg(long = "no-peers", action = ArgAction::SetFalse)]
    pub peers: bool,
    /// The iceoryx2 fan-out to run beside lava-flow (default: found beside lf-bench)
    #[arg(long = "iceoryx2-fanout", value_name = "PATH")]
    pub iceoryx2: Option<PathBuf>,
    /// The lava-flow rows' wait strategy (default: lf_channel_config_init's)
    #[arg(long, value_enum)]
    pub wait: Option<Wait>,
}

impl FanOutOptions {
    /// The lava-flow rows' wait strategy as an `lf_wait_strategy`, where not the default one.
    pub fn c_wait(&self) -> Option<u32> {
        let wait = match self.wait? {
            Wait::Busy => lf_wait_strategy::LF_WAIT_BUSY_POLL,
            Wait::Spin => lf_wait_strategy::LF_WAIT_SPIN_THEN_BLOCK,
            Wait::Block => lf_wait_strategy::LF_WAIT_BLOCK,
        };
        Some(wait as u32)
    }
}

fn check_size(size: usize, what: &str) {
    if size < MIN_SIZE || size % 8 != 0 || size > crate::capi::default_pool() {
        cli::refuse::<FanOutOptions>(format!(
            "{what} {size} is out of range: a fan-out message carries its counter at both ends (at least {MIN_SIZE} bytes, a multiple of 8) and fits the default pool"
        ));
    }
}

fn options() -> FanOutOptions {
    let o = cli::parse::<FanOutOptions>();
    check_size(o.size, "--size");
    if o.small != 0 {
        check_size(o.small, "--small-size");
    }
    o
}

/// One row: who, how many consumers, how the producer sent, and the producer's line with the
/// consumers' lines under `consumer_results` (or why there is none).
pub struct Row {
    pub who: String,
    pub consumers: usize,
    pub mode: &'static str,
    pub result: Result<Value, String>,
}

/// The producer's line (it has `who`) and the consumers' (`consumer`) from `text`, joined:
/// the consumers' under `consumer_results`, and `all_received`: every consumer got every
/// message the producer sent, each checked (in order, whole, once).
pub fn gather_lines(text: &str, consumers: usize) -> Result<Value, String> {
    let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let mut producer =
        lines.iter().find(|v| v["who"].is_string()).cloned().ok_or_else(|| "no line from the producer".to_owned())?;
    let mut got: Vec<Value> = lines.into_iter().filter(|v| v["consumer"].is_u64()).collect();
    got.sort_by_key(|v| v["consumer"].as_u64());
    let sent = producer["sent"].as_u64();
    let all =
        got.len() == consumers && got.iter().all(|c| c["received"].as_u64() == sent && c["errors"].as_u64() == Some(0));
    producer["all_received"] = Value::Bool(all);
    producer["consumer_results"] = Value::Array(got);
    Ok(producer)
}

/// A lava-flow case: a producer sending `mode` and `consumers` consumers on channel `name`.
fn run_lf(
    o: &FanOutOptions,
    control: &Control,
    name: &str,
    kind: lf_channel_kind,
    consumers: usize,
    mode: Mode,
) -> Row {
    control.reset();
    let cores = cores_allowed();
    let size = if mode == Mode::Copy { o.small } else { o.size };
    let cfg = lf::config(kind, o.c_wait());
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
    let (warm, window) = (o.warm, o.window);
    let mut pids = vec![fork_into(o.pin.then_some(0), || {
        send_line(lf::producer(control, name, &cfg, consumers, size, mode, warm, window))
    })];
    for i in 0..consumers {
        let core = o.pin.then(|| consumer_core(i, cores));
        pids.push(fork_into(core, || send_line(lf::consumer(control, name, &cfg, i, size))));
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
    let who = if kind == lf_channel_kind::LF_CHANNEL_PAIR { "lava-flow pair" } else { "lava-flow fan-out" };
    let result = match gather_lines(&text, consumers) {
        Ok(v) if failed.is_empty() => Ok(v),
        Ok(_) => Err(failed.join("; ")),
        Err(e) => Err(format!("{e} ({}); see stderr", failed.join("; "))),
    };
    Row { who: who.to_owned(), consumers, mode: mode.name(), result }
}

/// The whole run: lava-flow's rows by reference, then iceoryx2's, then the small copies.
pub fn main() {
    let o = options();
    let machine = Machine::probe();
    let peers = FanOutPeers::find(&o);
    let tag = format!("lfb{}", std::process::id());
    let made_dir = crate::runtime_dir(&tag);
    let control = Control::map();
    let mut rows = Vec::new();
    let pair = lf_channel_kind::LF_CHANNEL_PAIR;
    let fan_out = lf_channel_kind::LF_CHANNEL_FAN_OUT;
    rows.push(run_lf(&o, &control, &format!("{tag}-pair-ref"), pair, 1, Mode::Reference));
    for &n in &o.consumers {
        rows.push(run_lf(&o, &control, &format!("{tag}-fanout{n}-ref"), fan_out, n, Mode::Reference));
    }
    if peers.iceoryx2.is_ok() {
        for &n in &o.consumers {
            rows.push(Row { who: "iceoryx2".to_owned(), consumers: n, mode: "ref", result: peers.run(n, &o) });
        }
    }
    if o.small != 0 {
        rows.push(run_lf(&o, &control, &format!("{tag}-pair-copy"), pair, 1, Mode::Copy));
        for &n in &o.consumers {
            rows.push(run_lf(&o, &control, &format!("{tag}-fanout{n}-copy"), fan_out, n, Mode::Copy));
        }
    }
    if let Some(dir) = made_dir {
        let _ = std::fs::remove_dir(&dir);
    }
    report::print(&o, &machine, &peers, &rows);
}
