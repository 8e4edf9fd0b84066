//! Allocation latency per memory strategy, beside plain malloc: median and p99 for sizes
//! 64 B to 64 KiB and 2 MiB, with the architecture's targets beside the figures.
//!
//! Usage: `lf-alloc-bench [--json] [--iterations N]`. Only the allocation is timed; the
//! buffers are freed in batches outside the timed region. Run it on a quiet machine.

use std::time::Instant;

use clap::Parser;
use lava_flow::memory::{Context, ContextConfig, HugePageSize, HugepagePolicy, MemoryLocation};
use lava_flow_tools::cli;

/// lf-alloc-bench: allocation latency per memory strategy (standard, NUMA, 2 MiB huge pages,
/// GPU-pinned) beside plain malloc, median and p99 for sizes 64 B to 64 KiB and 2 MiB, with
/// the architecture's targets beside the figures.
///
/// Only the allocation is timed; the buffers are freed in batches outside the timed region.
/// Run it on a quiet machine.
#[derive(Parser, Debug)]
#[command(name = "lf-alloc-bench")]
struct Args {
    /// Print one JSON object instead of the table
    #[arg(long)]
    json: bool,
    /// Allocations timed per row (2 MiB rows: at most 500)
    #[arg(long, value_name = "N", default_value = "5000", value_parser = cli::positive)]
    iterations: usize,
}

const SIZES: [usize; 7] = [64, 256, 1024, 4096, 16 << 10, 64 << 10, 2 << 20];

#[derive(Clone, Copy)]
enum Subject {
    Malloc,
    Lava(&'static str, MemoryLocation),
}

impl Subject {
    fn name(self) -> &'static str {
        match self {
            Subject::Malloc => "malloc",
            Subject::Lava(name, _) => name,
        }
    }

    /// The target median in microseconds, where the architecture sets one.
    fn target_us(self, size: usize) -> Option<f64> {
        match self {
            Subject::Malloc => None,
            Subject::Lava(_, MemoryLocation::CpuStandard | MemoryLocation::CpuNuma { .. }) if size <= 64 << 10 => {
                Some(1.0)
            }
            Subject::Lava(_, MemoryLocation::CpuHugepage { .. } | MemoryLocation::CpuGpuPinned) => Some(10.0),
            Subject::Lava(..) => None,
        }
    }
}

struct Row {
    subject: &'static str,
    size: usize,
    median_us: f64,
    p99_us: f64,
    target_us: Option<f64>,
    obtained: String,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn measure(context: &Context, subject: Subject, size: usize, iterations: usize) -> Result<Row, String> {
    // Keep at most 32 MiB alive per batch (huge pages and locked memory are scarce).
    let batch = (32usize << 20).div_euclid(size).clamp(1, 256);
    let mut samples = Vec::with_capacity(iterations);
    let mut obtained = String::from("heap");
    let mut warm = true;
    while samples.len() < iterations {
        match subject {
            Subject::Malloc => {
                let mut kept = Vec::with_capacity(batch);
                for _ in 0..batch {
                    let start = Instant::now();
                    // SAFETY: malloc has no preconditions; the pointer is freed below.
                    let p = unsafe { libc::malloc(size) };
                    let elapsed = start.elapsed();
                    std::hint::black_box(p);
                    kept.push(p);
                    if !warm {
                        samples.push(elapsed.as_secs_f64() * 1e6);
                    }
                }
                // SAFETY: each pointer came from malloc above and is freed once.
                kept.into_iter().for_each(|p| unsafe { libc::free(p) });
            }
            Subject::Lava(_, location) => {
                let mut kept = Vec::with_capacity(batch);
                for _ in 0..batch {
                    let start = Instant::now();
                    let buffer = context.allocate(size, location).map_err(|e| e.to_string())?;
                    let elapsed = start.elapsed();
                    obtained = format!("{} / {} KiB pages", buffer.location(), buffer.page_size() / 1024);
                    kept.push(buffer);
                    if !warm {
                        samples.push(elapsed.as_secs_f64() * 1e6);
                    }
                }
            }
        }
        warm = false;
    }
    samples.sort_by(f64::total_cmp);
    Ok(Row {
        subject: subject.name(),
        size,
        median_us: percentile(&samples, 0.5),
        p99_us: percentile(&samples, 0.99),
        target_us: subject.target_us(size),
        obtained,
    })
}

fn main() {
    let Args { json, iterations } = cli::parse::<Args>();
    let mut config = ContextConfig::default();
    // A host without reserved huge pages still gets a (labelled) hugepage row.
    config.hugepage_policy = HugepagePolicy::BestEffort;
    let context = Context::new(config).expect("memory context");
    let subjects = [
        Subject::Malloc,
        Subject::Lava("standard", MemoryLocation::CpuStandard),
        Subject::Lava("numa", MemoryLocation::CpuNuma { node: None }),
        Subject::Lava("hugepage-2M", MemoryLocation::CpuHugepage { page: HugePageSize::Size2M }),
        Subject::Lava("gpu-pinned", MemoryLocation::CpuGpuPinned),
    ];
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for subject in subjects {
        for size in SIZES {
            let count = if size >= 2 << 20 { iterations.min(500) } else { iterations };
            match measure(&context, subject, size, count) {
                Ok(row) => rows.push(row),
                Err(e) => failures.push(format!("{} {size} B: {e}", subject.name())),
            }
        }
    }
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "strategy": r.subject, "size": r.size, "median_us": r.median_us,
                    "p99_us": r.p99_us, "target_median_us": r.target_us, "obtained": r.obtained,
                })
            })
            .collect();
        let out = serde_json::json!({ "iterations": iterations, "results": rows, "failures": failures });
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return;
    }
    println!("allocation latency ({iterations} allocations per row, 500 for 2 MiB; only allocation timed)");
    println!("{:<12} {:>9} {:>11} {:>11} {:>10}  obtained", "strategy", "size", "median µs", "p99 µs", "target µs");
    for r in &rows {
        let target = r.target_us.map_or("-".into(), |t| format!("~{t}"));
        let verdict = match r.target_us {
            Some(t) if r.median_us > t => " (above target)",
            _ => "",
        };
        println!(
            "{:<12} {:>9} {:>11.3} {:>11.3} {:>10}  {}{verdict}",
            r.subject, r.size, r.median_us, r.p99_us, target, r.obtained
        );
    }
    for failure in &failures {
        println!("FAILED {failure}");
    }
}
