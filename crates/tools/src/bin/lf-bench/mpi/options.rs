//! `lf-bench --mpi`'s command line, and the shape of each measurement (iterations, windows).

use clap::{ArgAction, Parser};
use lava_flow_tools::cli::{self, LIST};

/// Default bandwidth window (messages in flight), as OSU's `osu_bw`.
pub(super) const WINDOW: usize = 64;
/// The most bytes a bandwidth window holds in flight; larger sizes get fewer messages.
pub(super) const WINDOW_BYTES: usize = 128 << 20;

/// lf-bench --mpi: lava-flow channels between two MPI ranks, next to raw MPI between the same
/// ranks, run under mpirun with two ranks of different host identities (built with the cargo
/// feature `mpi`).
#[derive(Parser, Clone, Debug)]
#[command(
    name = "lf-bench",
    override_usage = "mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi [OPTIONS] : -np 1 -x LF_HOST_ID=b lf-bench --mpi [OPTIONS]"
)]
pub(super) struct Options {
    /// Measure channels between two MPI ranks (this benchmark)
    #[arg(long = "mpi", required = true)]
    _mpi: bool,
    /// Fewer iterations and 2 rounds
    #[arg(long)]
    pub(super) quick: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub(super) json: bool,
    /// Message sizes, like 8,64,1K (1 byte to 2 GiB - 1)
    #[arg(long, value_name = "LIST", value_delimiter = LIST, action = ArgAction::Set,
          default_value = "8,64,1K,64K,1M,16M,64M", value_parser = cli::nonzero_size)]
    pub(super) sizes: Vec<usize>,
    /// Messages in flight in a bandwidth window (at most 128 MiB of them)
    #[arg(long, value_name = "W", default_value_t = WINDOW, value_parser = cli::positive)]
    pub(super) window: usize,
    /// Rounds of each measurement, lava-flow and raw MPI alternated (2 with --quick)
    #[arg(long, value_name = "N", value_parser = cli::positive, default_value = "3",
          default_value_if("quick", "true", Some("2")))]
    pub(super) rounds: usize,
    /// Round trips per latency case (default: by size, a byte budget for large ones)
    #[arg(long, value_name = "N")]
    pub(super) iters: Option<usize>,
    /// Send and receive without writing or reading the payload
    #[arg(long = "untouched", action = ArgAction::SetFalse)]
    pub(super) touch: bool,
    /// Skip the GPU row even where both ranks have a GPU
    #[arg(long)]
    pub(super) no_gpu: bool,
}

pub(super) fn options() -> Options {
    let o = cli::parse::<Options>();
    if let Some(&bad) = o.sizes.iter().find(|&&s| s > i32::MAX as usize) {
        cli::refuse::<Options>(format!("size {bad} is out of range (1 byte to 2 GiB - 1)"));
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
