//! `lf-bench --mpi`'s command line, and the shape of each measurement (iterations, windows).

use crate::options::parse_size;

use super::die;

/// Default bandwidth window (messages in flight), as OSU's `osu_bw`.
pub(super) const WINDOW: usize = 64;
/// The most bytes a bandwidth window holds in flight; larger sizes get fewer messages.
pub(super) const WINDOW_BYTES: usize = 128 << 20;

#[derive(Clone, Debug)]
pub(super) struct Options {
    pub(super) quick: bool,
    pub(super) json: bool,
    pub(super) sizes: Vec<usize>,
    pub(super) window: usize,
    pub(super) rounds: usize,
    pub(super) iters: Option<usize>,
    pub(super) touch: bool,
    /// Skip the GPU row even where both ranks have a GPU.
    pub(super) no_gpu: bool,
}

pub(super) fn options() -> Options {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Options {
        quick: false,
        json: false,
        sizes: vec![],
        window: WINDOW,
        rounds: 0,
        iters: None,
        touch: true,
        no_gpu: false,
    };
    let mut i = 0;
    let value = |i: &mut usize| -> String {
        *i += 1;
        args.get(*i).cloned().unwrap_or_else(|| die("option needs a value"))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--mpi" => {}
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--untouched" => o.touch = false,
            "--no-gpu" => o.no_gpu = true,
            "--sizes" => o.sizes = value(&mut i).split(',').map(parse_size).collect(),
            "--window" => o.window = value(&mut i).parse().unwrap_or_else(|_| die("bad --window")),
            "--rounds" => o.rounds = value(&mut i).parse().unwrap_or_else(|_| die("bad --rounds")),
            "--iters" => o.iters = Some(value(&mut i).parse().unwrap_or_else(|_| die("bad --iters"))),
            "-h" | "--help" => {
                println!(
                    "usage: mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [OPTIONS] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [OPTIONS]\n\
                     options: [--quick] [--json] [--sizes LIST] [--window W] [--rounds N] [--iters N] [--untouched] [--no-gpu]"
                );
                std::process::exit(0);
            }
            other => die(&format!("unknown option {other} (with --mpi: --quick, --json, --sizes, --window, --rounds, --iters, --untouched)")),
        }
        i += 1;
    }
    if o.sizes.is_empty() {
        o.sizes = vec![8, 64, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
    }
    if let Some(&bad) = o.sizes.iter().find(|&&s| s == 0 || s > i32::MAX as usize) {
        die(&format!("size {bad} is out of range (1 byte to 2 GiB - 1)"));
    }
    if o.window == 0 {
        die("--window must be at least 1");
    }
    if o.rounds == 0 {
        o.rounds = if o.quick { 2 } else { 3 };
    }
    o
}

/// Ping-pong iterations for `size`: a fixed count for small messages, a byte budget for
/// large ones.
pub(super) fn latency_iters(o: &Options, size: usize) -> usize {
    if let Some(n) = o.iters {
        return n.max(1);
    }
    let (base, least, budget) = if o.quick { (1_000, 10, 64usize << 20) } else { (10_000, 20, 1usize << 30) };
    (budget / size).clamp(least, base)
}

/// The bandwidth window and iteration count (windows timed) for `size`.
pub(super) fn bandwidth_shape(o: &Options, size: usize) -> (usize, usize) {
    let window = o.window.min((WINDOW_BYTES / size).max(1));
    let (max, budget) = if o.quick { (200, 256usize << 20) } else { (2_000, 2usize << 30) };
    (window, (budget / (size * window)).clamp(3, max))
}
