//! lf-bench's command line (clap, with the value syntax of `lava_flow_tools::cli`), the size
//! lists and how many round trips each case gets.

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use lava_flow_tools::cli::{self, LIST};

/// lf-bench: lava-flow's channels between two processes, beside the machine's floors and the
/// peers a user would compare them with (iceoryx2, Open MPI), all measured in one run.
///
/// `lf-bench --plot DIR --from-json FILE` charts a saved `--json` / `--json-out` result and
/// measures nothing. The other benchmarks (`--gpu`, `--fan-in`, `--fan-out`, `--fan-out
/// --gpu`, `--mpi`) take options of their own: see `lf-bench --fan-in --help` and so on.
#[derive(Parser, Clone, Debug)]
#[command(name = "lf-bench")]
pub struct Options {
    /// Fewer sizes and round trips: seconds, not minutes
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON to this file (the text still goes to stdout)
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Write the charts (latency and bandwidth against size, SVG and PNG) into this directory
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Chart this saved JSON result instead of measuring (with --plot DIR)
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<PathBuf>,
    /// Latency sizes, like 8,64,1K,64M (default 8 B to 64 MiB, fewer with --quick); the
    /// headline's untouched rows take those up to 64 B, its touched rows those from 64 B
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set, value_parser = cli::nonzero_size)]
    pub sizes: Vec<usize>,
    /// Bandwidth sizes of the Rust API rows, like 1M,16M (default 4K to 64M; 64K,1M,16M with --quick)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set, value_parser = cli::nonzero_size)]
    pub bw_sizes: Vec<usize>,
    /// Timed round trips per latency case (default: by size, a byte budget for large ones)
    #[arg(long, value_name = "N")]
    pub iters: Option<usize>,
    /// What to measure: capi (the headline: the C API, its floors and the peers), busy, block
    /// (the Rust API rows)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "capi,busy,block", value_parser = ["capi", "busy", "block"])]
    pub modes: Vec<String>,
    /// Payload kinds of the Rust API rows (default: all)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          value_parser = ["zero-copy", "touch", "buffer", "buf-touch", "copy"])]
    pub payloads: Vec<String>,
    /// Messages in flight in a bandwidth window of the Rust API rows
    #[arg(long, value_name = "W", default_value_t = 16)]
    pub window: usize,
    /// Leave the two processes unpinned (default: cores 0 and 1)
    #[arg(long = "no-pin", action = ArgAction::SetFalse)]
    pub pin: bool,
    /// Measure lava-flow alone: no iceoryx2 or Open MPI beside the headline rows
    #[arg(long = "no-peers", action = ArgAction::SetFalse)]
    pub peers: bool,
    /// The iceoryx2 ping-pong to run beside the headline (default: found beside lf-bench)
    #[arg(long, value_name = "PATH")]
    pub iceoryx2: Option<PathBuf>,
    /// The Open MPI ping-pong to run beside the headline (default: found beside lf-bench)
    #[arg(long, value_name = "PATH")]
    pub mpi_pingpong: Option<PathBuf>,
    /// The other benchmarks, listed here for --help; main() picks one before this parse.
    #[command(flatten)]
    _benchmarks: Benchmarks,
}

/// lf-bench's other benchmarks: each parses a command line of its own, so which one runs is
/// decided by these flags alone, before any other option is read.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Benchmarks {
    /// GPU buffers through channels between two processes instead (see lf-bench --gpu --help)
    #[arg(long)]
    pub gpu: bool,
    /// Many producers to one consumer instead (see lf-bench --fan-in --help)
    #[arg(long = "fan-in")]
    pub fan_in: bool,
    /// One producer to many consumers instead; with --gpu, a GPU buffer fanned out (see
    /// lf-bench --fan-out --help)
    #[arg(long = "fan-out")]
    pub fan_out: bool,
    /// Channels between two MPI ranks against raw MPI, under mpirun (see lf-bench --mpi --help)
    #[arg(long)]
    pub mpi: bool,
}

impl Benchmarks {
    /// The benchmark flags on this process's command line, wherever they stand.
    pub fn chosen() -> Benchmarks {
        let given = |flag: &str| std::env::args().skip(1).any(|a| a == flag);
        Benchmarks { gpu: given("--gpu"), fan_in: given("--fan-in"), fan_out: given("--fan-out"), mpi: given("--mpi") }
    }
}

/// Small messages: the headline's untouched rows go up to this size.
pub const SMALL_MAX: usize = 64;
/// Touched rows start at this size.
pub const TOUCH_MIN: usize = 64;

pub fn die(msg: &str) -> ! {
    eprintln!("lf-bench: {msg}");
    std::process::exit(2)
}

pub fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 30 && s % (1 << 30) == 0 => format!("{}G", s >> 30),
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{}K", s >> 10),
        s => format!("{s}"),
    }
}

/// `64 B`, `1 KiB`, `64 MiB`.
pub fn bytes(size: usize) -> String {
    let h = human(size);
    match h.strip_suffix('K').or_else(|| h.strip_suffix('M')).or_else(|| h.strip_suffix('G')) {
        Some(n) => format!("{n} {}iB", &h[h.len() - 1..]),
        None => format!("{h} B"),
    }
}

fn default_sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![8, 64, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    } else {
        let mut v = vec![8, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10];
        v.extend([1 << 20, 4 << 20, 16 << 20, 64 << 20]);
        v
    }
}

fn default_bw_sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![64 << 10, 1 << 20, 16 << 20]
    } else {
        vec![4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    }
}

pub fn options() -> Options {
    let mut o = cli::parse::<Options>();
    if o.from_json.is_some() && o.plot.is_none() {
        cli::refuse::<Options>("--from-json FILE charts a saved result: give --plot DIR too");
    }
    if o.sizes.is_empty() {
        o.sizes = default_sizes(o.quick);
    }
    if o.bw_sizes.is_empty() {
        o.bw_sizes = default_bw_sizes(o.quick);
    }
    o
}

impl Options {
    pub fn has_mode(&self, mode: &str) -> bool {
        self.modes.iter().any(|m| m == mode)
    }

    /// The headline's untouched sizes.
    pub fn small_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.sizes.iter().copied().filter(|&s| s <= SMALL_MAX)
    }

    /// The headline's touched sizes.
    pub fn touch_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.sizes.iter().copied().filter(|&s| s >= TOUCH_MIN)
    }

    /// The largest latency size.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(64)
    }

    /// Timed round trips of a latency case (a tenth more are run first, untimed).
    pub fn iterations(&self, size: usize, blocking: bool, touches: bool) -> usize {
        if let Some(n) = self.iters {
            return n;
        }
        let base = if self.quick { 5_000 } else { 50_000 };
        let base = if blocking { base / 5 } else { base };
        if !touches {
            // Nothing is moved: a 64 MiB zero-copy message costs what a 64 B one does, and gets
            // as many samples, so that the flatness comparison compares like with like.
            return base;
        }
        // Keep big messages to a bounded number of bytes moved.
        let budget = if self.quick { 256usize << 20 } else { 2usize << 30 };
        (budget / size.max(1)).clamp(10, base)
    }

    /// Round trips of a floor probe taken right before or after a case: a few thousand, so
    /// that its p99.9 means something, and no more than the case itself gets.
    pub fn probe_iterations(&self, case_iters: usize) -> usize {
        let n = if self.quick { 5_000 } else { 10_000 };
        n.min(case_iters.max(10))
    }

    /// How many round trips each kind of case gets, for the report's configuration (read from
    /// the functions that decide it).
    pub fn iterations_text(&self) -> Vec<String> {
        let warm = "plus a tenth as many untimed first (at least 5)";
        let mut lines = Vec::new();
        match self.iters {
            Some(n) => lines.push(format!("Iterations: {n} timed round trips per latency case (--iters), {warm}")),
            None => lines.push(format!(
                "Iterations: {} timed round trips per latency case ({} blocking), touched sizes at most {} moved per case (at least 10); {warm}",
                self.iterations(8, false, false),
                self.iterations(8, true, false),
                bytes(self.iterations(1 << 20, false, true) << 20),
            )),
        }
        if self.has_mode("capi") {
            lines.push(format!(
                "Floor probes (C API headline): {} round trips, no more than the case has, before and after every case",
                self.probe_iterations(usize::MAX)
            ));
        }
        if self.has_mode("busy") || self.has_mode("block") {
            let floors = crate::rustapi::floor_iterations(self);
            lines.push(format!(
                "Rust API: floors {floors} round trips (eventfd {}), once; bandwidth windows of {} messages (fewer where the pool holds fewer), {} per row (3 to 2000 windows)",
                floors / 10,
                self.window,
                bytes(crate::rustapi::bandwidth_budget(self)),
            ));
        }
        lines
    }
}
