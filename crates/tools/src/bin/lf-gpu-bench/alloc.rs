//! Allocation: latency of pooled buffers and of fresh exportable arenas (64 KiB), the first
//! allocation of each memory kind in a fresh process (a child: `--child first-alloc`), and
//! the memory given back after buffers are freed and the allocator is trimmed (with CUDA, as
//! the driver's free memory shows it).

use std::time::Instant;

use lava_flow::memory::gpu::{
    DeviceSelector, GpuAllocator, GpuAllocatorConfig, GpuBuffer, GpuConfig, GpuMemoryKind, VulkanDevice,
};
use lava_flow::Error;
use serde_json::{json, Value};

use crate::util::{brief, child_reply, from_hex, median, num, percentile, run_child, size_name, to_hex, us, KIB, MIB};
use crate::{Bench, ChildArgs};

const ALLOC_SIZE: u64 = 64 * KIB;

pub struct AllocSummary {
    pub pooled_p50_us: Vec<(GpuMemoryKind, f64)>,
    pub fresh_p50_us: f64,
    /// The median over fresh processes of the first HOST_VISIBLE allocation (µs).
    pub first_host_visible_us: Result<f64, String>,
}

/// Latency samples (µs) of `alloc`, dropping each buffer outside the timed part.
fn latency(n: usize, mut alloc: impl FnMut() -> Result<GpuBuffer, Error>) -> Result<Vec<f64>, Error> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let buffer = alloc()?;
        samples.push(us(start.elapsed()));
        drop(buffer);
    }
    Ok(samples)
}

fn stats(samples: &[f64], n: usize) -> Value {
    json!({ "p50": num(median(samples)), "p99": num(percentile(samples, 0.99)), "n": n })
}

pub fn run(b: &Bench) -> Result<(Value, AllocSummary), Error> {
    let n_pooled = if b.o.quick { 200 } else { 2000 };
    let n_fresh = if b.o.quick { 50 } else { 300 };
    let exportable = &b.exportable;
    drop(exportable.allocate(ALLOC_SIZE, GpuMemoryKind::DeviceLocal)?); // the first arenas
    drop(exportable.allocate(ALLOC_SIZE, GpuMemoryKind::HostVisible)?);
    let pooled = latency(n_pooled, || exportable.allocate(ALLOC_SIZE, GpuMemoryKind::DeviceLocal))?;
    let pooled_host = latency(n_pooled, || exportable.allocate(ALLOC_SIZE, GpuMemoryKind::HostVisible))?;
    let fresh = latency(n_fresh, || exportable.allocate_unpooled(ALLOC_SIZE, GpuMemoryKind::DeviceLocal))?;
    let mut fresh_export = Vec::with_capacity(n_fresh);
    for _ in 0..n_fresh {
        let start = Instant::now();
        let buffer = exportable.allocate_unpooled(ALLOC_SIZE, GpuMemoryKind::DeviceLocal)?;
        let export = buffer.export()?;
        fresh_export.push(us(start.elapsed()));
        drop((export, buffer));
    }
    b.say(format!("\nAllocation latency ({} buffers, p50 / p99):", size_name(ALLOC_SIZE)));
    for (name, s) in [
        ("pooled DEVICE_LOCAL", &pooled),
        ("pooled HOST_VISIBLE", &pooled_host),
        ("fresh exportable arena (DEVICE_LOCAL)", &fresh),
        ("fresh arena + export fd", &fresh_export),
    ] {
        b.say(format!("  {name:<40} {:9.2} / {:9.2} µs", median(s), percentile(s, 0.99)));
    }

    // The first allocation of each kind in fresh processes.
    let runs = if b.o.quick { 3 } else { 5 };
    let uuid = to_hex(&b.device.device_uuid());
    let mut firsts: Vec<Value> = Vec::new();
    let mut first_error = None;
    for _ in 0..runs {
        match run_child(&["first-alloc".into(), "--uuid".into(), uuid.clone()]) {
            Ok(v) => firsts.push(v),
            Err(e) => {
                first_error = Some(e);
                break;
            }
        }
    }
    let field = |key: &str| -> Result<Vec<f64>, String> {
        match &first_error {
            Some(e) => Err(format!("the first-allocation child failed: {e}")),
            None => Ok(firsts.iter().filter_map(|v| v[key].as_f64()).collect()),
        }
    };
    let first_json = |key: &str| -> Value {
        match field(key) {
            Ok(v) => {
                json!({ "p50": num(median(&v)), "max": num(v.iter().copied().fold(f64::NAN, f64::max)), "runs": v })
            }
            Err(e) => json!({ "unavailable": e }),
        }
    };
    let first_hv = field("first_host_visible_us").map(|v| median(&v));
    b.say(format!(
        "  first allocation in a fresh process (p50 of {runs} processes; device open and allocator not counted):"
    ));
    match &first_error {
        Some(e) => b.say(format!("    unavailable: {e}")),
        None => {
            for (name, key) in [
                ("first DEVICE_LOCAL", "first_device_local_us"),
                ("first HOST_VISIBLE (after the DEVICE_LOCAL one)", "first_host_visible_us"),
                ("second DEVICE_LOCAL (pooled)", "second_device_local_us"),
                ("second HOST_VISIBLE (pooled)", "second_host_visible_us"),
                ("(Vulkan device open)", "device_open_us"),
                ("(GpuAllocator::new)", "allocator_new_us"),
            ] {
                let v = field(key).unwrap_or_default();
                b.say(format!(
                    "    {name:<48} {:9.2} µs (max {:.2})",
                    median(&v),
                    v.iter().copied().fold(f64::NAN, f64::max)
                ));
            }
        }
    }
    let json = json!({
        "size": ALLOC_SIZE,
        "pooled_device_local_us": stats(&pooled, n_pooled),
        "pooled_host_visible_us": stats(&pooled_host, n_pooled),
        "fresh_exportable_arena_us": stats(&fresh, n_fresh),
        "fresh_exportable_arena_plus_export_us": stats(&fresh_export, n_fresh),
        "first_in_fresh_process": {
            "device_local_us": first_json("first_device_local_us"),
            "host_visible_us": first_json("first_host_visible_us"),
            "second_device_local_us": first_json("second_device_local_us"),
            "second_host_visible_us": first_json("second_host_visible_us"),
            "device_open_us": first_json("device_open_us"),
            "allocator_new_us": first_json("allocator_new_us"),
        },
    });
    let summary = AllocSummary {
        pooled_p50_us: vec![
            (GpuMemoryKind::DeviceLocal, median(&pooled)),
            (GpuMemoryKind::HostVisible, median(&pooled_host)),
        ],
        fresh_p50_us: median(&fresh),
        first_host_visible_us: first_hv,
    };
    Ok((json, summary))
}

/// The device the parent uses, by its deviceUUID (`--uuid HEX`).
pub fn child_device(args: &ChildArgs) -> Result<VulkanDevice, String> {
    let uuid: [u8; 16] = from_hex(ChildArgs::need(&args.uuid, "--uuid")?)?
        .try_into()
        .map_err(|_| "--uuid needs 16 bytes".to_string())?;
    VulkanDevice::open(&GpuConfig::with_device(DeviceSelector::Uuid(uuid))).map_err(|e| e.to_string())
}

/// `--child first-alloc --uuid HEX`: times the first allocation of each kind in this fresh
/// process and prints them as JSON.
pub fn child_first_alloc(args: &ChildArgs) -> Result<(), String> {
    let start = Instant::now();
    let device = child_device(args)?;
    let device_open = us(start.elapsed());
    let start = Instant::now();
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).map_err(|e| e.to_string())?;
    let allocator_new = us(start.elapsed());
    let mut times = Vec::new();
    let mut keep = Vec::new();
    for kind in
        [GpuMemoryKind::DeviceLocal, GpuMemoryKind::HostVisible, GpuMemoryKind::DeviceLocal, GpuMemoryKind::HostVisible]
    {
        let start = Instant::now();
        let buffer = allocator.allocate(ALLOC_SIZE, kind).map_err(|e| format!("{kind} of {ALLOC_SIZE} bytes: {e}"))?;
        times.push(us(start.elapsed()));
        keep.push(buffer);
    }
    child_reply(&json!({
        "device_open_us": device_open,
        "allocator_new_us": allocator_new,
        "first_device_local_us": times[0],
        "first_host_visible_us": times[1],
        "second_device_local_us": times[2],
        "second_host_visible_us": times[3],
    }));
    Ok(())
}

/// What the driver's free memory says (with CUDA), or why it cannot.
fn free_memory(b: &Bench) -> Result<u64, String> {
    b.cuda()?.mem_info().map(|(free, _)| free)
}

pub struct TrimSummary {
    /// Whether memory came back: judged on the pooled case (arenas 0 after trim, trim > 0, and
    /// with CUDA the driver's free memory back within an arena of where it was).
    pub given_back: Result<bool, String>,
    pub detail: String,
}

/// Allocates 8 x 64 MiB DEVICE_LOCAL buffers (each an arena of its own), frees them and
/// trims; then fills 8 pooled 64 MiB arenas with 16 MiB buffers (a quarter of an arena, the
/// largest size that is pooled), frees them and trims. Counts arenas, the bytes `trim`
/// reports and, with CUDA, the driver's free memory after each step.
pub fn memory_given_back(b: &Bench) -> Result<(Value, TrimSummary), Error> {
    let allocator = GpuAllocator::new(&b.device, GpuAllocatorConfig::default())?;
    let kind = GpuMemoryKind::DeviceLocal;
    let arena = allocator.config().arena_size;
    b.say("\nMemory given back (DEVICE_LOCAL; driver's free memory from cuMemGetInfo where CUDA is present):");
    let mut cases = Vec::new();
    let mut judged = None;
    for (name, size, count) in [("own arenas", 64 * MIB, 8usize), ("pooled", arena / 4, 8 * 4)] {
        let mut steps = Vec::new();
        let mut step = |what: &str, arenas: usize, trimmed: Option<u64>| {
            let free = free_memory(b);
            steps.push((what.to_string(), arenas, trimmed, free));
        };
        step("before", allocator.arena_count(kind), None);
        let buffers: Vec<GpuBuffer> = (0..count).map(|_| allocator.allocate(size, kind)).collect::<Result<_, _>>()?;
        for buffer in &buffers {
            buffer.write(0, &[1u8; 4096])?; // touched, as an application would
        }
        step("allocated", allocator.arena_count(kind), None);
        drop(buffers);
        step("freed", allocator.arena_count(kind), None);
        let trimmed = allocator.trim();
        step("trimmed", allocator.arena_count(kind), Some(trimmed));
        b.say(format!(
            "  {count} x {} ({name}{}):",
            size_name(size),
            if name == "own arenas" { ": not pooled, given back when freed" } else { "" }
        ));
        for (what, arenas, trimmed, free) in &steps {
            b.say(format!(
                "    {what:<10} pooled arenas {arenas:3}{}{}",
                trimmed.map_or(String::new(), |t| format!(", trim() gave back {}", size_name(t))),
                match free {
                    Ok(f) => format!(", driver free {:.1} MiB", *f as f64 / MIB as f64),
                    Err(_) => String::new(),
                }
            ));
        }
        let before = steps[0].3.clone();
        let after = steps[3].3.clone();
        if name == "pooled" {
            let arenas_gone = steps[3].1 == 0;
            let free_back = match (&before, &after) {
                (Ok(before), Ok(after)) => Some(*after + arena >= *before),
                _ => None,
            };
            let ok = arenas_gone && trimmed > 0 && free_back.unwrap_or(true);
            judged = Some((
                ok,
                format!(
                    "after trim: {} pooled arenas, trim() gave back {}{}",
                    steps[3].1,
                    size_name(trimmed),
                    match (&before, &after) {
                        (Ok(x), Ok(y)) => format!(
                            ", driver free memory {:.1} MiB after vs {:.1} MiB before",
                            *y as f64 / MIB as f64,
                            *x as f64 / MIB as f64
                        ),
                        (Err(e), _) | (_, Err(e)) => format!(" (driver free memory not measured: {})", brief(e)),
                    }
                ),
            ));
        }
        cases.push(json!({
            "case": name,
            "buffer_size": size,
            "buffers": count,
            "steps": steps.iter().map(|(what, arenas, trimmed, free)| json!({
                "step": what,
                "pooled_arenas": arenas,
                "trim_bytes": trimmed,
                "driver_free_bytes": match free { Ok(f) => json!(f), Err(e) => json!({ "unavailable": e }) },
            })).collect::<Vec<_>>(),
        }));
    }
    let (ok, detail) = judged.expect("the pooled case ran");
    Ok((json!({ "arena_size": arena, "cases": cases }), TrimSummary { given_back: Ok(ok), detail }))
}
