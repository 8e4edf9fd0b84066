//! lf-gpu-bench: GPU memory benchmarks of lava-flow against the device's own ceiling.
//!
//! Measures, on the device `LF_VULKAN_DEVICE` selects (default: first discrete GPU):
//! - allocation latency: pooled exportable buffers vs a fresh exportable arena each time;
//! - host->device write and device->host read bandwidth (DEVICE_LOCAL staged, HOST_VISIBLE
//!   direct);
//! - device-to-device copy bandwidth, 1 MiB..1 GiB, from a lava-flow exportable buffer into an
//!   exported-and-imported buffer, against the in-process ceiling: the same vkCmdCopyBuffer
//!   between two plain (non-exported) DEVICE_LOCAL buffers, interleaved in the same run.
//!
//! Medians over repetitions; GPU copies are timed with timestamp queries where the queue has
//! them (host fence waits otherwise). `--json` prints one JSON object instead of text.
//!
//! Usage: lf-gpu-bench [--json] [--quick] [--max-size BYTES] [--reps N]

use std::time::{Duration, Instant};

use lava_flow::memory::gpu::*;
use lava_flow::Error;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

struct Options {
    json: bool,
    quick: bool,
    max_size: Option<u64>,
    reps: Option<usize>,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let (digits, scale) = if let Some(d) = t.strip_suffix("gib").or_else(|| t.strip_suffix('g')) {
        (d, 1u64 << 30)
    } else if let Some(d) = t.strip_suffix("mib").or_else(|| t.strip_suffix('m')) {
        (d, 1 << 20)
    } else if let Some(d) = t.strip_suffix("kib").or_else(|| t.strip_suffix('k')) {
        (d, 1 << 10)
    } else {
        (t.as_str(), 1)
    };
    digits.parse::<u64>().map(|n| n * scale).map_err(|e| format!("size {text:?}: {e}"))
}

fn options() -> Result<Options, String> {
    let mut o = Options { json: false, quick: false, max_size: None, reps: None };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => o.json = true,
            "--quick" => o.quick = true,
            "--max-size" => o.max_size = Some(parse_size(&args.next().ok_or("--max-size needs a value")?)?),
            "--reps" => {
                o.reps = Some(args.next().ok_or("--reps needs a value")?.parse().map_err(|e| format!("--reps: {e}"))?)
            }
            "-h" | "--help" => {
                println!("usage: lf-gpu-bench [--json] [--quick] [--max-size BYTES (e.g. 256M)] [--reps N]");
                println!("device: LF_VULKAN_DEVICE=<index|deviceUUID> (default: first discrete GPU, else first device)");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(o)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

fn size_name(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes % (1 << 30) == 0 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Latency samples (µs) of `alloc`, dropping each buffer outside the timed part.
fn allocation_latency(n: usize, mut alloc: impl FnMut() -> Result<GpuBuffer, Error>) -> Result<Vec<f64>, Error> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let buffer = alloc()?;
        samples.push(start.elapsed().as_secs_f64() * 1e6);
        drop(buffer);
    }
    Ok(samples)
}

fn copy_seconds(timing: CopyTiming) -> (f64, bool) {
    match timing.gpu {
        Some(gpu) if gpu > Duration::ZERO => (gpu.as_secs_f64(), true),
        _ => (timing.wall.as_secs_f64(), false),
    }
}

fn run(o: &Options) -> Result<Value, Error> {
    let device = VulkanDevice::open(&GpuConfig::default())?;
    let info = device.info().clone();
    let say = |text: String| {
        if !o.json {
            println!("{text}");
        }
    };
    say(format!("{info}\n"));
    let cpu_device = info.device_type == DeviceType::Cpu;
    let max_size = o.max_size.unwrap_or(if cpu_device || o.quick { 64 * MIB } else { 1 << 30 });
    let exportable = GpuAllocator::new(&device, GpuAllocatorConfig::default())?;
    let plain = GpuAllocator::new(&device, GpuAllocatorConfig { exportable: false, ..GpuAllocatorConfig::default() })?;
    let importer = GpuImporter::new(&device);

    // ---- Allocation latency
    let n_pooled = if o.quick { 200 } else { 2000 };
    let n_fresh = if o.quick { 50 } else { 300 };
    let alloc_size = 64 << 10;
    drop(exportable.allocate(alloc_size, GpuMemoryKind::DeviceLocal)?); // creates the first arena
    drop(exportable.allocate(alloc_size, GpuMemoryKind::HostVisible)?);
    let mut pooled = allocation_latency(n_pooled, || exportable.allocate(alloc_size, GpuMemoryKind::DeviceLocal))?;
    let mut pooled_host = allocation_latency(n_pooled, || exportable.allocate(alloc_size, GpuMemoryKind::HostVisible))?;
    let mut fresh = allocation_latency(n_fresh, || exportable.allocate_unpooled(alloc_size, GpuMemoryKind::DeviceLocal))?;
    let mut fresh_export = Vec::with_capacity(n_fresh);
    for _ in 0..n_fresh {
        let start = Instant::now();
        let buffer = exportable.allocate_unpooled(alloc_size, GpuMemoryKind::DeviceLocal)?;
        let export = buffer.export()?;
        fresh_export.push(start.elapsed().as_secs_f64() * 1e6);
        drop((export, buffer));
    }
    let allocation = json!({
        "size": alloc_size,
        "pooled_device_local_us": { "median": median(&mut pooled), "p99": percentile(&mut pooled, 0.99), "n": n_pooled },
        "pooled_host_visible_us": { "median": median(&mut pooled_host), "p99": percentile(&mut pooled_host, 0.99), "n": n_pooled },
        "fresh_exportable_arena_us": { "median": median(&mut fresh), "p99": percentile(&mut fresh, 0.99), "n": n_fresh },
        "fresh_exportable_arena_plus_export_us": { "median": median(&mut fresh_export), "n": n_fresh },
    });
    say(format!("Allocation latency ({} buffers, median / p99):", size_name(alloc_size)));
    say(format!("  pooled DEVICE_LOCAL        {:8.2} / {:8.2} µs", median(&mut pooled), percentile(&mut pooled, 0.99)));
    say(format!("  pooled HOST_VISIBLE        {:8.2} / {:8.2} µs", median(&mut pooled_host), percentile(&mut pooled_host, 0.99)));
    say(format!("  fresh exportable arena     {:8.2} / {:8.2} µs", median(&mut fresh), percentile(&mut fresh, 0.99)));
    say(format!("  fresh arena + export fd    {:8.2} µs", median(&mut fresh_export)));

    // ---- Host <-> device bandwidth
    let host_reps = o.reps.unwrap_or(if o.quick { 3 } else { 7 });
    let mut host_rows = Vec::new();
    say("\nHost transfers (median GB/s; DEVICE_LOCAL staged unless the memory is mappable):".into());
    let mut size = MIB;
    while size <= max_size.min(1 << 30) {
        let data = vec![0x5au8; size as usize];
        let mut out = vec![0u8; size as usize];
        for kind in GpuMemoryKind::ALL {
            let buffer = exportable.allocate(size, kind)?;
            let (mut w, mut r) = (Vec::new(), Vec::new());
            for _ in 0..host_reps {
                let t = Instant::now();
                buffer.write(0, &data)?;
                w.push(gbps(size, t.elapsed().as_secs_f64()));
                let t = Instant::now();
                buffer.read(0, &mut out)?;
                r.push(gbps(size, t.elapsed().as_secs_f64()));
            }
            let (w, r) = (median(&mut w), median(&mut r));
            say(format!(
                "  {:>8} {:<13} write {w:8.2}  read {r:8.2}{}",
                size_name(size),
                kind.as_str(),
                if buffer.is_host_mappable() { "  (direct)" } else { "  (staged)" }
            ));
            host_rows.push(json!({ "size": size, "kind": kind.as_str(), "write_gbps": w, "read_gbps": r,
                                   "direct": buffer.is_host_mappable() }));
        }
        size *= 16;
    }

    // ---- Device-to-device copies
    say("\nDevice-to-device copy (median; GB/s = bytes copied / s; read+write traffic is twice that):".into());
    let mut d2d_rows = Vec::new();
    let mut worst_large_ratio: Option<f64> = None;
    let mut timer = "gpu timestamps";
    let mut size = MIB;
    while size <= max_size {
        let reps = o.reps.unwrap_or(match (o.quick, size >= 256 * MIB) {
            (true, _) => 5,
            (false, true) => 15,
            (false, false) => 30,
        });
        let base_src = plain.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?;
        let base_dst = plain.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?;
        let lf_src = exportable.allocate(size, GpuMemoryKind::DeviceLocal)?;
        let exported_dst = exportable.allocate(size, GpuMemoryKind::DeviceLocal)?;
        // The destination as another process sees it: exported, then imported (here, into the
        // same device; a different process imports into its own device the same way).
        let (lf_dst, dst_path) = match importer.import(exported_dst.export()?) {
            Ok(imported) => (imported, "exported->imported"),
            Err(e) => {
                say(format!("  (self-import refused: {e}; copying into the exported buffer itself)"));
                (exportable.allocate(size, GpuMemoryKind::DeviceLocal)?, "exported->exported")
            }
        };
        // Warm up both paths, then interleave so clocks and caches treat them alike.
        copy_buffer(&base_src, 0, &base_dst, 0, size)?;
        copy_buffer(&lf_src, 0, &lf_dst, 0, size)?;
        let (mut base, mut lf) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let (s, gpu) = copy_seconds(copy_buffer_timed(&base_src, 0, &base_dst, 0, size)?);
            base.push(gbps(size, s));
            let (s2, gpu2) = copy_seconds(copy_buffer_timed(&lf_src, 0, &lf_dst, 0, size)?);
            lf.push(gbps(size, s2));
            if !(gpu && gpu2) {
                timer = "host fence waits";
            }
        }
        let (base, lf) = (median(&mut base), median(&mut lf));
        let ratio = lf / base;
        if size >= 256 * MIB {
            worst_large_ratio = Some(worst_large_ratio.map_or(ratio, |w: f64| w.min(ratio)));
        }
        say(format!(
            "  {:>8}  ceiling {base:9.2}  lava-flow {lf:9.2} GB/s  ({:5.1}% of ceiling, {dst_path})",
            size_name(size),
            ratio * 100.0
        ));
        d2d_rows.push(json!({ "size": size, "ceiling_gbps": base, "lava_flow_gbps": lf, "ratio": ratio,
                              "path": dst_path, "reps": reps }));
        drop((lf_dst, exported_dst, lf_src, base_src, base_dst));
        exportable.trim();
        size *= 4;
    }
    say(format!("  (timed with {timer})"));

    // ---- Targets
    let pooled_median = median(&mut pooled);
    let fresh_median = median(&mut fresh);
    let d2d_pass = worst_large_ratio.map(|r| r >= 0.90);
    let alloc_pass = pooled_median <= 10.0;
    say("\nTargets:".into());
    say(format!(
        "  D2D copy >= 256 MiB at >= 90% of the in-process ceiling: {}",
        match (d2d_pass, worst_large_ratio) {
            (Some(p), Some(r)) => format!("{} (worst {:.1}%)", if p { "PASS" } else { "FAIL" }, r * 100.0),
            _ => format!("not measured (max size {}; pass --max-size 1G)", size_name(max_size)),
        }
    ));
    say(format!(
        "  pooled allocation <= 10 µs median: {} ({pooled_median:.2} µs)",
        if alloc_pass { "PASS" } else { "FAIL" }
    ));
    say(format!("  fresh exportable allocation ~100 µs: {fresh_median:.2} µs (informational)"));
    if cpu_device {
        say("  note: this is a CPU Vulkan driver (lavapipe): numbers show code paths, not GPU performance".into());
    }

    Ok(json!({
        "device": info.to_json(),
        "allocation": allocation,
        "host_transfers": host_rows,
        "d2d": d2d_rows,
        "d2d_timer": timer,
        "targets": {
            "d2d_large_ratio_min": worst_large_ratio,
            "d2d_pass": d2d_pass,
            "pooled_alloc_median_us": pooled_median,
            "pooled_alloc_pass": alloc_pass,
            "fresh_exportable_median_us": fresh_median,
        }
    }))
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lf-gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    match run(&o) {
        Ok(report) => {
            if o.json {
                println!("{}", serde_json::to_string_pretty(&report).expect("JSON values serialise"));
            }
        }
        Err(e) => {
            eprintln!("lf-gpu-bench: {e}");
            std::process::exit(1);
        }
    }
}
