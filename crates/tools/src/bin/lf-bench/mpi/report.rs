//! The report: a row per size with its targets, and the text table and JSON document rank 0
//! prints.

use std::time::Duration;

use lava_flow::mpi::MpiWorld;

use super::options::{Options, WINDOW_BYTES};
use crate::options::human;
use crate::pingpong::Percentiles;
use crate::table::{comment, mb_s, us};

/// The latency target for small messages: lava-flow's p50 at most this much above raw MPI's.
const SMALL_DIFF_TARGET_NS: f64 = 500.0;
/// Sizes up to this have the latency target.
const SMALL_MAX: usize = 1 << 10;
/// Sizes from this have the bandwidth target.
const LARGE_MIN: usize = 64 << 10;
/// The bandwidth target: lava-flow at least this fraction of raw MPI.
const BW_RATIO_TARGET: f64 = 0.95;

#[derive(Clone, Debug, Default)]
pub(super) struct Row {
    pub(super) size: usize,
    pub(super) lat_iters: usize,
    pub(super) raw_lat: Vec<Percentiles>,
    pub(super) lf_lat: Vec<Percentiles>,
    pub(super) window: usize,
    pub(super) bw_iters: usize,
    pub(super) raw_bw: Vec<f64>,
    pub(super) lf_bw: Vec<f64>,
    /// Why lava-flow has no figures for this size, if it has none.
    pub(super) lf_skipped: Option<String>,
}

/// The round with the lowest p50.
fn best_latency(rounds: &[Percentiles]) -> Option<Percentiles> {
    rounds.iter().copied().min_by(|a, b| a.p50.total_cmp(&b.p50))
}

fn best_bandwidth(rounds: &[f64]) -> Option<f64> {
    rounds.iter().copied().max_by(f64::total_cmp)
}

impl Row {
    /// lava-flow's p50 minus raw MPI's, in ns.
    fn diff_ns(&self) -> Option<f64> {
        Some(best_latency(&self.lf_lat)?.p50 - best_latency(&self.raw_lat)?.p50)
    }

    fn bw_ratio(&self) -> Option<f64> {
        Some(best_bandwidth(&self.lf_bw)? / best_bandwidth(&self.raw_bw)?)
    }

    /// (latency target met, bandwidth target met), each `None` where this size has no target
    /// or lava-flow no figure.
    fn verdicts(&self) -> (Option<bool>, Option<bool>) {
        let lat = (self.size <= SMALL_MAX).then(|| self.diff_ns().map(|d| d <= SMALL_DIFF_TARGET_NS)).flatten();
        let bw = (self.size >= LARGE_MIN).then(|| self.bw_ratio().map(|r| r >= BW_RATIO_TARGET)).flatten();
        (lat, bw)
    }
}

/// What the report says about the lava-flow half.
pub(super) struct LavaFlowStatus {
    /// The transport's names and reason, when the channels opened.
    pub(super) transport: Option<(String, String)>,
    /// Why the channels did not open.
    pub(super) error: Option<String>,
}

impl LavaFlowStatus {
    fn is_mpi(&self) -> bool {
        self.transport.as_ref().is_some_and(|(names, _)| names.split('+').any(|n| n == "mpi"))
    }
}

pub(super) struct Report {
    pub(super) machine: crate::machine::Machine,
    pub(super) library: String,
    pub(super) thread_level: String,
    pub(super) locations: Vec<String>,
    pub(super) lava_flow: LavaFlowStatus,
    pub(super) rows: Vec<Row>,
}

fn what_is_measured(o: &Options) -> &'static str {
    if o.touch {
        "the sender writes every byte of each message, the receiver reads every byte"
    } else {
        "payloads untouched (plain OSU pattern)"
    }
}

fn not_mpi_warning(names: &str) -> String {
    format!(
        "WARNING: the lava-flow channels use {names}, not mpi: the lava-flow rows do not measure lava-flow over MPI. \
         Make the ranks different hosts as lava-flow sees them: mpirun -np 1 -x LF_HOST_ID=a lf-bench --mpi : -np 1 -x LF_HOST_ID=b lf-bench --mpi"
    )
}

/// The configuration lines (without `# `).
pub(super) fn head_lines(r: &Report, o: &Options, world: &MpiWorld) -> Vec<String> {
    let mut l = vec!["lf-bench --mpi: lava-flow channels against raw MPI between two ranks".to_owned()];
    l.extend(r.machine.lines());
    l.push(format!("MPI: {} ({})", r.library, r.thread_level));
    l.extend(r.locations.iter().cloned());
    if !world.topology_report().is_empty() {
        l.extend(world.topology_report().lines().map(|d| format!("discovery: {d}")));
    }
    match (&r.lava_flow.transport, &r.lava_flow.error) {
        (Some((names, reason)), _) => {
            l.push(format!("lava-flow transport: {names} ({reason})"));
            if !r.lava_flow.is_mpi() {
                l.push(not_mpi_warning(names));
            }
        }
        (None, Some(error)) => {
            l.push("lava-flow channels: NOT CREATED:".to_owned());
            l.extend(error.lines().map(|e| format!("  {e}")));
            l.push("(only the raw MPI rows are measured)".to_owned());
        }
        (None, None) => {}
    }
    l.push("lava-flow channels: ChannelConfig::default() with busy-poll, a 30 s rendezvous timeout and a pool for the largest window".to_owned());
    l.push(format!(
        "Sizes: {}; {}; best of {} rounds, raw and lava-flow alternated",
        o.sizes.iter().map(|&s| human(s)).collect::<Vec<_>>().join(","),
        what_is_measured(o),
        o.rounds
    ));
    l.push(format!(
        "Bandwidth: windows of {} messages (at most {} in flight), then a 4-byte ack; MB/s = 10^6 bytes per second",
        o.window,
        human(WINDOW_BYTES)
    ));
    l.push(format!(
        "Targets: sizes <= {} lava-flow p50 <= raw p50 + {:.1} us; sizes >= {} lava-flow bandwidth >= {:.2}x raw",
        human(SMALL_MAX),
        SMALL_DIFF_TARGET_NS / 1e3,
        human(LARGE_MIN),
        BW_RATIO_TARGET
    ));
    l
}

/// The table's columns: (name, width); every row is printed with the same widths as it is
/// measured.
const COLUMNS: [(&str, usize); 15] = [
    ("Size", 10),
    ("Iters", 6),
    ("Raw p50 (us)", 12),
    ("Raw p99 (us)", 12),
    ("Raw p99.9 (us)", 14),
    ("lava-flow p50 (us)", 18),
    ("lava-flow p99 (us)", 18),
    ("lava-flow p99.9 (us)", 20),
    ("Diff p50 (us)", 13),
    ("Target", 6),
    ("Window", 6),
    ("BW iters", 8),
    ("Raw (MB/s)", 12),
    ("lava-flow (MB/s)", 16),
    ("Ratio", 6),
];
/// The last column, after [`COLUMNS`]: the bandwidth target's verdict.
const LAST: &str = "Target";

fn line(cells: &[String]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS.iter()).enumerate() {
        if i == 0 {
            out.push_str(&format!("{cell:<width$}"));
        } else if i == 9 {
            out.push_str(&format!("  {cell:<width$}"));
        } else {
            out.push_str(&format!("  {cell:>width$}"));
        }
    }
    if let Some(last) = cells.get(COLUMNS.len()) {
        out.push_str(&format!("  {last}"));
    }
    out.trim_end().to_owned()
}

pub(super) fn print_head(r: &Report, o: &Options, world: &MpiWorld) {
    for l in head_lines(r, o, world) {
        comment(&l);
    }
    comment("");
    comment("Latency: half round trips, best round's percentiles; Diff = lava-flow p50 - raw p50. Bandwidth: best round; Ratio = lava-flow / raw");
    let mut names: Vec<String> = COLUMNS.iter().map(|(n, _)| (*n).to_owned()).collect();
    names[0] = "# Size".to_owned();
    names.push(LAST.to_owned());
    println!("{}", line(&names));
}

fn verdict(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "ok",
        Some(false) => "MISSED",
        None => "",
    }
}

pub(super) fn print_row(row: &Row) {
    let raw = best_latency(&row.raw_lat);
    let lfl = best_latency(&row.lf_lat);
    let (lat_ok, bw_ok) = row.verdicts();
    println!(
        "{}",
        line(&[
            row.size.to_string(),
            row.lat_iters.to_string(),
            us(raw.map(|p| p.p50)),
            us(raw.map(|p| p.p99)),
            us(raw.map(|p| p.p999)),
            us(lfl.map(|p| p.p50)),
            us(lfl.map(|p| p.p99)),
            us(lfl.map(|p| p.p999)),
            row.diff_ns().map_or("-".to_owned(), |d| format!("{:+.3}", d / 1e3)),
            verdict(lat_ok).to_owned(),
            row.window.to_string(),
            row.bw_iters.to_string(),
            mb_s(best_bandwidth(&row.raw_bw)),
            mb_s(best_bandwidth(&row.lf_bw)),
            row.bw_ratio().map_or("-".to_owned(), |r| format!("{r:.3}")),
            verdict(bw_ok).to_owned(),
        ])
    );
    if let Some(why) = &row.lf_skipped {
        comment(&format!("{}: lava-flow skipped: {why}", human(row.size)));
    }
}

pub(super) fn print_tail(r: &Report, o: &Options, complete: bool, elapsed: Duration) {
    comment("");
    let verdicts: Vec<bool> = r
        .rows
        .iter()
        .flat_map(|row| {
            let (a, b) = row.verdicts();
            [a, b].into_iter().flatten()
        })
        .collect();
    if !verdicts.is_empty() {
        comment(&format!("Targets: {} of {} met", verdicts.iter().filter(|v| **v).count(), verdicts.len()));
    }
    if let Some((names, _)) = &r.lava_flow.transport {
        if !r.lava_flow.is_mpi() {
            comment(&not_mpi_warning(names));
        }
    }
    if r.lava_flow.error.is_some() {
        comment("lava-flow half not run: the channels were not created (see above)");
    }
    comment(&format!(
        "{} in {:.1} s{}",
        if complete { "complete" } else { "INCOMPLETE" },
        elapsed.as_secs_f64(),
        if o.quick { " (--quick)" } else { "" }
    ));
}

pub(super) fn print_json(r: &Report, o: &Options, complete: bool, elapsed: Duration, head: Vec<String>) {
    use serde_json::json;
    let lat = |rounds: &[Percentiles]| match best_latency(rounds) {
        Some(best) => json!({
            "p50_ns": best.p50, "p99_ns": best.p99, "p999_ns": best.p999,
            "rounds": rounds.iter().map(|p| json!({"p50_ns": p.p50, "p99_ns": p.p99})).collect::<Vec<_>>(),
        }),
        None => serde_json::Value::Null,
    };
    let bw = |rounds: &[f64]| match best_bandwidth(rounds) {
        Some(best) => json!({"bytes_per_s": best, "mb_per_s": best / 1e6, "rounds_bytes_per_s": rounds}),
        None => serde_json::Value::Null,
    };
    let doc = json!({
        "config": {"machine": r.machine.to_json(), "text": head},
        "mode": "mpi",
        "mpi_library": r.library,
        "thread_level": r.thread_level,
        "locations": r.locations,
        "touch": o.touch,
        "quick": o.quick,
        "rounds": o.rounds,
        "lava_flow": {
            "transport": r.lava_flow.transport.as_ref().map(|(n, _)| n.clone()),
            "reason": r.lava_flow.transport.as_ref().map(|(_, why)| why.clone()),
            "is_mpi": r.lava_flow.is_mpi(),
            "warning": r.lava_flow.transport.as_ref().filter(|_| !r.lava_flow.is_mpi()).map(|(n, _)| not_mpi_warning(n)),
            "error": r.lava_flow.error,
        },
        "targets": {
            "small_max_size": SMALL_MAX, "small_p50_diff_max_ns": SMALL_DIFF_TARGET_NS,
            "large_min_size": LARGE_MIN, "large_bandwidth_ratio_min": BW_RATIO_TARGET,
        },
        "rows": r.rows.iter().map(|row| {
            let (lat_ok, bw_ok) = row.verdicts();
            json!({
                "size": row.size,
                "latency": {
                    "iters": row.lat_iters,
                    "raw": lat(&row.raw_lat),
                    "lava_flow": lat(&row.lf_lat),
                    "diff_p50_ns": row.diff_ns(),
                    "target_met": lat_ok,
                },
                "bandwidth": {
                    "window": row.window,
                    "iters": row.bw_iters,
                    "raw": bw(&row.raw_bw),
                    "lava_flow": bw(&row.lf_bw),
                    "ratio": row.bw_ratio(),
                    "target_met": bw_ok,
                },
                "lava_flow_skipped": row.lf_skipped,
            })
        }).collect::<Vec<_>>(),
        "complete": complete,
        "elapsed_s": elapsed.as_secs_f64(),
    });
    println!("{}", serde_json::to_string_pretty(&doc).expect("JSON"));
}

/// The GPU row (`gpu_row`'s rates in B/s: through the channel, the GPU-to-host copy alone,
/// raw MPI alone) as a table of its own.
pub(super) fn print_gpu_row(rate: f64, d2h: f64, raw: f64) {
    let slower = d2h.min(raw);
    comment("");
    comment("GPU buffers, 64 MiB, staged through host memory, against the slower of its halves measured alone; target >= 0.9x");
    let mut t = crate::table::Table::new(&[
        "Size",
        "Staged (MB/s)",
        "GPU-to-host (MB/s)",
        "Raw MPI (MB/s)",
        "x slower",
        "<Target",
    ]);
    t.row(vec![
        (64usize << 20).to_string(), // gpu_row's size
        mb_s(Some(rate)),
        mb_s(Some(d2h)),
        mb_s(Some(raw)),
        format!("{:.2}", rate / slower),
        verdict(Some(rate / slower >= 0.9)).to_owned(),
    ]);
    t.print();
}
