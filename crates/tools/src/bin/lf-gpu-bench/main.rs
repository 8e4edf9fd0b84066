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
//! itself as a child (`--child first-alloc`, `--child import`: hidden options, `ChildArgs`)
//! for what must happen in a fresh process. `--json` prints one JSON object (rows, targets, machine) instead of text.

mod alloc;
mod cuda;
mod d2d;
mod host;
mod import;
mod submit;
mod targets;
mod util;

use clap::{ArgAction, Parser};
use lava_flow::memory::gpu::{
    format_uuid, DeviceType, GpuAllocator, GpuAllocatorConfig, GpuConfig, GpuImporter, VulkanDevice,
};
use lava_flow::Error;
use lava_flow_tools::cli::{self, LIST};
use serde_json::{json, Value};

use cuda::Cuda;
use util::{child_reply, size_name, GIB, MIB};

const SECTIONS: [&str; 6] = ["alloc", "d2d", "submit", "host", "import", "trim"];

/// lf-gpu-bench: lava-flow's GPU memory against the hardware's baselines, measured in the same
/// run: allocation, device-to-device copies, host transfers, the first import in another
/// process, one round trip taken apart, and the memory given back.
///
/// The device: LF_VULKAN_DEVICE=<index|deviceUUID> (default: the first discrete GPU, else the
/// first device). CUDA baselines: libcuda.so.1 where present (LF_DISABLE_CUDA=1 skips them).
#[derive(Parser, Debug)]
#[command(name = "lf-gpu-bench")]
pub struct Options {
    /// One JSON object on stdout instead of the tables
    #[arg(long)]
    pub json: bool,
    /// Small sizes and few repetitions (for CI: under a minute on lavapipe)
    #[arg(long)]
    pub quick: bool,
    /// Largest copy, like 256M (default 1G on a GPU; 64M with --quick or on a CPU driver)
    #[arg(long, value_name = "BYTES", value_parser = cli::nonzero_size)]
    pub max_size: Option<usize>,
    /// Repetitions of each copy case (default 30/15, 7 for host transfers, 5/3 with --quick)
    #[arg(long, value_name = "N", value_parser = cli::positive)]
    pub reps: Option<usize>,
    /// Sections to run, like d2d,host (default: all)
    #[arg(long, value_name = "SECTIONS", value_delimiter = LIST, action = ArgAction::Set, value_parser = SECTIONS)]
    pub only: Vec<String>,
    /// What a child process the bench started is here for (never given by hand).
    #[command(flatten)]
    child: ChildArgs,
}

/// The part of the bench that must happen in a fresh process: the bench runs itself as a
/// child with these (`util::run_child`). Hidden from --help; none is taken without `--child`.
#[derive(clap::Args, Debug, Default)]
#[group(id = "child-args", multiple = true, requires = "role")]
pub struct ChildArgs {
    /// The child's part: time the first allocations, or import the parent's exports
    #[arg(long = "child", value_enum, hide = true)]
    pub role: Option<Role>,
    /// The parent's device, by its deviceUUID in hex
    #[arg(long, hide = true)]
    pub uuid: Option<String>,
    /// Which import goes first: lava-flow-first or driver-first
    #[arg(long, hide = true)]
    pub order: Option<String>,
    /// The inherited descriptor of lava-flow's export
    #[arg(long, hide = true)]
    pub lf_fd: Option<i32>,
    /// lava-flow's export description, in hex
    #[arg(long, hide = true)]
    pub lf_desc: Option<String>,
    /// The inherited descriptor of the driver's export
    #[arg(long, hide = true)]
    pub driver_fd: Option<i32>,
    /// The driver's export description, in hex
    #[arg(long, hide = true)]
    pub driver_desc: Option<String>,
    /// The CUDA IPC handle of the same size, in hex
    #[arg(long, hide = true)]
    pub cuda_ipc: Option<String>,
}

/// What a child process does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    FirstAlloc,
    Import,
}

impl ChildArgs {
    /// A value the child needs, or why it cannot go on without it.
    pub fn need<'a, T>(value: &'a Option<T>, name: &str) -> Result<&'a T, String> {
        value.as_ref().ok_or_else(|| format!("the child needs {name}"))
    }
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
    let max_size = o.max_size.map_or(if cpu_device || o.quick { 64 * MIB } else { GIB }, |s| s as u64);
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

/// `--child <role> ...`: the parts that need a fresh process.
fn child(role: Role, args: &ChildArgs) -> ! {
    let result = match role {
        Role::FirstAlloc => alloc::child_first_alloc(args),
        Role::Import => import::child_import(args),
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
    let o = cli::parse::<Options>();
    if let Some(role) = o.child.role {
        child(role, &o.child);
    }
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
