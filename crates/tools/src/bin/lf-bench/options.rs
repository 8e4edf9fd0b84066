//! lf-bench's command line, the size lists and how many round trips each case gets.

use std::path::PathBuf;

pub const USAGE: &str = "usage: lf-bench [--quick] [--json] [--json-out FILE] [--plot DIR] [--sizes LIST] [--bw-sizes LIST]
                [--iters N] [--modes capi,busy,block] [--payloads zero-copy,touch,buffer,buf-touch,copy]
                [--window W] [--no-pin] [--no-peers] [--iceoryx2 PATH] [--mpi-pingpong PATH]
       lf-bench --plot DIR --from-json FILE   (charts of a saved --json / --json-out result; measures nothing)
       lf-bench --gpu [--quick] [--json]
       lf-bench --fan-in [--quick] [--json] [--json-out FILE] [--size 64] [--producers 1,2,4,8] [--warm S] [--window S]
                [--no-pin] [--no-peers] [--iceoryx2-fanin PATH] [--mpi-fanin PATH]
       lf-bench --fan-out [--quick] [--json] [--json-out FILE] [--size 1M] [--small-size 64] [--consumers 1,2,4,8]
                [--warm S] [--window S] [--no-pin] [--no-peers] [--iceoryx2-fanout PATH]
       mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [...] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [...]   (see lf-bench --mpi --help)";

#[derive(Clone, Debug)]
pub struct Options {
    pub quick: bool,
    /// Print JSON instead of text.
    pub json: bool,
    /// Also write the JSON to this file (the text still goes to stdout).
    pub json_out: Option<PathBuf>,
    /// Write the charts (SVG and PNG) into this directory.
    pub plot: Option<PathBuf>,
    /// Chart this saved JSON result instead of measuring.
    pub from_json: Option<PathBuf>,
    /// Latency sizes: the headline's untouched rows take those up to [`SMALL_MAX`], its touched
    /// rows those from [`TOUCH_MIN`]; the Rust API rows take them all.
    pub sizes: Vec<usize>,
    pub bw_sizes: Vec<usize>,
    pub iters: Option<usize>,
    /// `capi` (the headline: the C API, its floors and the peers), `busy`, `block` (the
    /// Rust API rows).
    pub modes: Vec<String>,
    /// Payload kinds of the Rust API rows (names as `Payload::name`); empty: all.
    pub payloads: Vec<String>,
    pub window: usize,
    pub pin: bool,
    /// Run iceoryx2 and Open MPI beside the headline rows.
    pub peers: bool,
    pub iceoryx2: Option<PathBuf>,
    pub mpi_pingpong: Option<PathBuf>,
}

/// Small messages: the headline's untouched rows go up to this size.
pub const SMALL_MAX: usize = 64;
/// Touched rows start at this size.
pub const TOUCH_MIN: usize = 64;

pub fn die(msg: &str) -> ! {
    eprintln!("lf-bench: {msg}");
    std::process::exit(2)
}

/// A size as `8`, `64K`, `1M`; exits on a malformed one.
pub fn parse_size(s: &str) -> usize {
    crate::pingpong::parse_size(s).unwrap_or_else(|e| die(&e))
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        quick: false,
        json: false,
        json_out: None,
        plot: None,
        from_json: None,
        sizes: vec![],
        bw_sizes: vec![],
        iters: None,
        modes: vec!["capi".into(), "busy".into(), "block".into()],
        payloads: vec![],
        window: 16,
        pin: true,
        peers: true,
        iceoryx2: None,
        mpi_pingpong: None,
    };
    let mut i = 0;
    let value = |i: &mut usize| -> String {
        *i += 1;
        args.get(*i).cloned().unwrap_or_else(|| die("option needs a value"))
    };
    let list = |v: String| -> Vec<usize> { v.split(',').map(parse_size).collect() };
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--json-out" => o.json_out = Some(value(&mut i).into()),
            "--plot" => o.plot = Some(value(&mut i).into()),
            "--from-json" => o.from_json = Some(value(&mut i).into()),
            "--no-pin" => o.pin = false,
            "--no-peers" => o.peers = false,
            "--iceoryx2" => o.iceoryx2 = Some(value(&mut i).into()),
            "--mpi-pingpong" => o.mpi_pingpong = Some(value(&mut i).into()),
            "--sizes" => o.sizes = list(value(&mut i)),
            "--bw-sizes" => o.bw_sizes = list(value(&mut i)),
            "--iters" => o.iters = Some(value(&mut i).parse().unwrap_or_else(|_| die("bad --iters"))),
            "--modes" => o.modes = value(&mut i).split(',').map(str::to_owned).collect(),
            "--payloads" => o.payloads = value(&mut i).split(',').map(str::to_owned).collect(),
            "--window" => o.window = value(&mut i).parse().unwrap_or_else(|_| die("bad --window")),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other}")),
        }
        i += 1;
    }
    if o.from_json.is_some() && o.plot.is_none() {
        die("--from-json FILE charts a saved result: give --plot DIR too");
    }
    if o.sizes.is_empty() {
        o.sizes = default_sizes(o.quick);
    }
    if o.bw_sizes.is_empty() {
        o.bw_sizes = default_bw_sizes(o.quick);
    }
    if let Some(bad) = o.sizes.iter().chain(&o.bw_sizes).find(|&&s| s == 0) {
        die(&format!("size {bad} is out of range (at least 1 byte)"));
    }
    for m in &o.modes {
        if !matches!(m.as_str(), "capi" | "busy" | "block") {
            die(&format!("unknown mode {m}; use capi (the C API headline), busy, block (the Rust API rows)"));
        }
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
