//! lf-gpu-bench: lava-flow's GPU memory against the hardware's baselines, measured in the
//! same run, on the device `LF_VULKAN_DEVICE` selects (default: the first discrete GPU).
//!
//! ```text
//! lf-gpu-bench [--json] [--quick] [--max-size BYTES] [--reps N] [--only SECTIONS]
//! ```
//!
//! - `alloc.rs`: allocation latency, pooled and fresh exportable arenas; the first allocation
//!   of each kind in a fresh process; the memory given back after free and `trim`.
//! - `d2d.rs`: device-to-device copies, `cuMemcpyDtoD` against each lava-flow copy method.
//! - `host.rs`: host transfers, `cuMemcpyHtoD`/`DtoH` from pinned and pageable memory against
//!   lava-flow's write/read paths and GPU-pinned memory, and a host memcpy.
//! - `import.rs`: the first import of an arena in another process, against the driver's raw
//!   import and `cuIpcOpenMemHandle`.
//! - `submit.rs`: one synchronous round trip taken apart: the driver's submission and wait
//!   alone, against lava-flow's and CUDA's smallest copies (for information).
//! - `targets.rs`: PASS, FAIL or not measured for each target.
//!
//! CUDA (`cuda.rs`) is loaded at run time: without it (no NVIDIA driver, or
//! `LF_DISABLE_CUDA=1`) the CUDA rows say why they are missing and everything else runs.
//! A baseline or case that fails is reported as such and the run goes on. The bench runs
//! itself as a child (`--child first-alloc`, `--child import`) for what must happen in a
//! fresh process. `--json` prints one JSON object (rows, targets, machine) instead of text.

mod alloc;
mod cuda;
mod d2d;
mod host;
mod import;
mod submit;
mod targets;
mod util;

use lava_flow::memory::gpu::{
    format_uuid, DeviceType, GpuAllocator, GpuAllocatorConfig, GpuConfig, GpuImporter, VulkanDevice,
};
use lava_flow::Error;
use serde_json::{json, Value};

use cuda::Cuda;
use util::{child_reply, parse_size, size_name, GIB, MIB};

const USAGE: &str = "usage: lf-gpu-bench [--json] [--quick] [--max-size BYTES (e.g. 256M)] [--reps N]
  --quick     small sizes and few repetitions (for CI: under a minute on lavapipe)
  --max-size  largest copy (default 1G on a GPU; 64M with --quick or on a CPU driver)
  --reps      repetitions of each copy case (default 30/15, 7 for host transfers, 5/3 with --quick)
  --json      one JSON object on stdout instead of the tables
  --only      comma-separated sections to run (default all): alloc,d2d,submit,host,import,trim
device: LF_VULKAN_DEVICE=<index|deviceUUID> (default: first discrete GPU, else first device)
CUDA baselines: libcuda.so.1 when present (LF_DISABLE_CUDA=1 skips them)";

pub struct Options {
    pub json: bool,
    pub quick: bool,
    pub max_size: Option<u64>,
    pub reps: Option<usize>,
    /// The sections to run; empty: all.
    pub only: Vec<String>,
}

const SECTIONS: [&str; 6] = ["alloc", "d2d", "submit", "host", "import", "trim"];

fn options(args: &[String]) -> Result<Options, String> {
    let mut o = Options { json: false, quick: false, max_size: None, reps: None, only: Vec::new() };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => o.json = true,
            "--quick" => o.quick = true,
            "--max-size" => o.max_size = Some(parse_size(args.next().ok_or("--max-size needs a value")?)?),
            "--reps" => {
                let n: usize =
                    args.next().ok_or("--reps needs a value")?.parse().map_err(|e| format!("--reps: {e}"))?;
                o.reps = Some(n.max(1));
            }
            "--only" => {
                for name in args.next().ok_or("--only needs a list of sections")?.split(',') {
                    if !SECTIONS.contains(&name) {
                        return Err(format!("--only: unknown section {name:?} (sections: {})", SECTIONS.join(",")));
                    }
                    o.only.push(name.to_string());
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(o)
}

/// What every section uses: the options, the device and its allocators, and CUDA (or why
/// there is none).
pub struct Bench {
    pub o: Options,
    pub device: VulkanDevice,
    /// Exportable pooled arenas: lava-flow as users get it.
    pub exportable: GpuAllocator,
    /// Plain (not exportable) memory, for the in-process copy.
    pub plain: GpuAllocator,
    pub importer: GpuImporter,
    pub max_size: u64,
    pub cuda: Result<Cuda, String>,
}

impl Bench {
    /// A line of the human-readable report (nothing with `--json`).
    pub fn say(&self, text: impl AsRef<str>) {
        if !self.o.json {
            println!("{}", text.as_ref());
        }
    }

    /// CUDA, or why the CUDA baselines are unavailable.
    pub fn cuda(&self) -> Result<&Cuda, String> {
        self.cuda.as_ref().map_err(|e| format!("CUDA unavailable: {e}"))
    }
}

fn cuda_json(cuda: &Result<Cuda, String>) -> Value {
    match cuda {
        Ok(c) => json!({
            "available": true,
            "driver_version": format!("{}.{}", c.driver_version / 1000, c.driver_version % 1000 / 10),
            "driver_version_raw": c.driver_version,
            "device": c.name,
            "ordinal": c.ordinal,
        }),
        Err(e) => json!({ "available": false, "reason": e }),
    }
}

/// A section's JSON and summary, or its error (reported, recorded, and the run goes on), or
/// that `--only` left it out.
fn section<T>(
    b: &Bench,
    errors: &mut Vec<String>,
    (key, name): (&str, &str),
    run: impl FnOnce(&Bench) -> Result<(Value, T), Error>,
) -> (Value, Result<T, String>) {
    if !b.o.only.is_empty() && !b.o.only.iter().any(|o| o == key) {
        return (json!({ "skipped": "not among --only" }), Err(targets::SKIPPED.into()));
    }
    match run(b) {
        Ok((v, summary)) => (v, Ok(summary)),
        Err(e) => {
            b.say(format!("  the {name} section failed: {e}"));
            errors.push(format!("{name}: {e}"));
            (json!({ "error": e.to_string() }), Err(e.to_string()))
        }
    }
}

fn run(o: Options) -> Result<Value, Error> {
    let device = VulkanDevice::open(&GpuConfig::default())?;
    let info = device.info().clone();
    let cuda = Cuda::open(&info.device_uuid);
    let cpu_device = info.device_type == DeviceType::Cpu;
    let max_size = o.max_size.unwrap_or(if cpu_device || o.quick { 64 * MIB } else { GIB });
    let exportable = GpuAllocator::new(&device, GpuAllocatorConfig::default())?;
    let plain = GpuAllocator::new(&device, GpuAllocatorConfig { exportable: false, ..GpuAllocatorConfig::default() })?;
    let importer = GpuImporter::new(&device);
    let b = Bench { o, device, exportable, plain, importer, max_size, cuda };

    let machine = util::machine();
    b.say(format!(
        "lf-gpu-bench on {} ({}, {} CPUs)",
        machine["hostname"].as_str().unwrap_or("?"),
        machine["cpu_model"].as_str().unwrap_or("unknown CPU"),
        machine["cpus"]
    ));
    b.say(format!("{info}"));
    match &b.cuda {
        Ok(c) => b.say(format!(
            "CUDA: driver {}.{}, device {} ({}) has the Vulkan device's UUID {}",
            c.driver_version / 1000,
            c.driver_version % 1000 / 10,
            c.ordinal,
            c.name,
            format_uuid(&info.device_uuid)
        )),
        Err(e) => b.say(format!("CUDA baselines unavailable: {e}")),
    }
    b.say(format!("largest copy {}{}", size_name(max_size), if b.o.quick { ", --quick" } else { "" }));

    let mut errors: Vec<String> = Vec::new();
    let (alloc_json, alloc) = section(&b, &mut errors, ("alloc", "allocation"), alloc::run);
    let (d2d_json, d2d) = section(&b, &mut errors, ("d2d", "device-to-device"), d2d::run);
    let (submit_json, _) = section(&b, &mut errors, ("submit", "round trip"), submit::run);
    let (host_json, host) = section(&b, &mut errors, ("host", "host transfer"), host::run);
    let (import_json, import) = section(&b, &mut errors, ("import", "import"), import::run);
    let (trim_json, trim) = section(&b, &mut errors, ("trim", "memory given back"), alloc::memory_given_back);

    let targets = targets::evaluate(&targets::Results { alloc, d2d, host, import, trim });
    b.say("\nTargets:");
    for line in targets::lines(&targets) {
        b.say(line);
    }
    if cpu_device {
        b.say("  note: this is a CPU Vulkan driver (lavapipe): the numbers show code paths, not GPU performance");
    }
    let mut machine = machine;
    machine["vulkan_device"] = info.to_json();
    machine["cuda"] = cuda_json(&b.cuda);
    Ok(json!({
        "tool": "lf-gpu-bench",
        "options": { "quick": b.o.quick, "max_size": max_size, "reps": b.o.reps },
        "machine": machine,
        "allocation": alloc_json,
        "d2d": d2d_json,
        "round_trip": submit_json,
        "host_transfers": host_json,
        "import": import_json,
        "memory_given_back": trim_json,
        "targets": targets::to_json(&targets),
        "errors": errors,
    }))
}

/// `--child <what> ...`: the parts that need a fresh process.
fn child(args: &[String]) -> ! {
    let result = match args.first().map(String::as_str) {
        Some("first-alloc") => alloc::child_first_alloc(&args[1..]),
        Some("import") => import::child_import(&args[1..]),
        other => Err(format!("unknown child {other:?}")),
    };
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            child_reply(&json!({ "error": e }));
            std::process::exit(1)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        child(&args[1..]);
    }
    let o = match options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("lf-gpu-bench: {e}");
            std::process::exit(2);
        }
    };
    let json_out = o.json;
    match run(o) {
        Ok(report) => {
            if json_out {
                println!("{}", serde_json::to_string_pretty(&report).expect("JSON values serialise"));
            }
        }
        Err(e) => {
            eprintln!("lf-gpu-bench: {e}");
            std::process::exit(1);
        }
    }
}
