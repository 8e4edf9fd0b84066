//! Device-to-device copies, 1 MiB up to `--max-size` in steps of 4: CUDA's `cuMemcpyDtoD`
//! between two `cuMemAlloc` buffers (the hardware baseline) against lava-flow's
//! `copy_buffer_timed_with` by each [`CopyMethod`] (Auto, as users copy, takes CUDA's path here,
//! since the bench uses CUDA on the device), from an exportable pooled DEVICE_LOCAL
//! buffer into one exported and imported again (zero copy: the memory another process would
//! see), and, as extra information, the in-process `vkCmdCopyBuffer` between two plain
//! DEVICE_LOCAL buffers (the former "ceiling").
//!
//! Every source holds random bytes (no memory compression shrinks them). Every case is warmed
//! up, then the cases take turns in blocks ([`block`]). Every case is timed the
//! same way: host wall time around the synchronous call (as a user sees it; CUDA's copy is
//! followed by `cuCtxSynchronize`); lava-flow's GPU timestamps are reported beside it. Before
//! timing, each lava-flow method's copy is checked: the first and last MiB of the destination
//! must equal the source's after one copy.

use std::time::Instant;

use lava_flow::memory::gpu::{
    chosen_copy_method, copy_buffer, copy_buffer_timed, copy_buffer_timed_with, CopyMethod, GpuBuffer, GpuMemoryKind,
};
use lava_flow::Error;
use serde_json::{json, Value};

use crate::util::{block, brief, gbps, median, num, size_name, MIB, ROUNDS};
use crate::Bench;

/// The Auto method's ratio to `cuMemcpyDtoD` per size (or why there is none): the target.
pub struct D2dSummary {
    pub auto_ratio: Vec<(u64, Result<f64, String>)>,
    /// Sizes where the Auto method's copy did not move the data, with what was seen.
    pub auto_wrong: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    Cuda,
    Lf(CopyMethod),
    InProcess,
}

impl Case {
    const ALL: [Case; 6] = [
        Case::Cuda,
        Case::Lf(CopyMethod::Auto),
        Case::Lf(CopyMethod::Engine),
        Case::Lf(CopyMethod::Shader),
        Case::Lf(CopyMethod::Cuda),
        Case::InProcess,
    ];

    fn key(self) -> &'static str {
        match self {
            Case::Cuda => "cuda_memcpy_dtod",
            Case::Lf(CopyMethod::Auto) => "auto",
            Case::Lf(CopyMethod::Engine) => "engine",
            Case::Lf(CopyMethod::Shader) => "shader",
            Case::Lf(CopyMethod::Cuda) => "cuda",
            Case::InProcess => "in_process_vkcmdcopybuffer",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Case::Cuda => "cuMemcpyDtoD",
            Case::Lf(CopyMethod::Auto) => "lf auto",
            Case::Lf(CopyMethod::Engine) => "lf engine",
            Case::Lf(CopyMethod::Shader) => "lf shader",
            Case::Lf(CopyMethod::Cuda) => "lf cuda",
            Case::InProcess => "vkCmdCopyBuffer*",
        }
    }
}

/// One case's samples (seconds), or why it has none.
struct Samples {
    wall: Vec<f64>,
    gpu: Vec<f64>,
    verified: Option<Result<(), String>>,
}

/// The bytes the check writes at the start and end of the source.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Random bytes (xorshift), which no memory compression shrinks: the sources are filled with
/// them, so that a copy moves as many bytes through memory as it says (fresh memory holds
/// zeros, which the GPU's memory compression may move for less, and not equally for every
/// kind of allocation).
pub fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Whether one copy by `method` moves the checked regions (first and last MiB).
fn verify(src: &GpuBuffer, dst: &GpuBuffer, size: u64, method: CopyMethod) -> Result<(), String> {
    let piece = size.min(MIB);
    let mut regions = vec![0];
    if size >= 2 * piece {
        regions.push(size - piece);
    }
    let zeros = vec![0u8; piece as usize];
    let run = || -> Result<(), Error> {
        for (i, &at) in regions.iter().enumerate() {
            src.write(at, &pattern(piece as usize, 7 + i as u8))?;
            dst.write(at, &zeros)?;
        }
        copy_buffer_timed_with(src, 0, dst, 0, size, method)?;
        Ok(())
    };
    run().map_err(|e| e.to_string())?;
    let mut out = vec![0u8; piece as usize];
    for (i, &at) in regions.iter().enumerate() {
        dst.read(at, &mut out).map_err(|e| e.to_string())?;
        if out != pattern(piece as usize, 7 + i as u8) {
            let first = out.iter().zip(pattern(piece as usize, 7 + i as u8)).position(|(a, b)| *a != b).unwrap_or(0);
            return Err(format!("wrong data: the destination differs from the source at byte {}", at + first as u64));
        }
    }
    Ok(())
}

pub fn run(b: &Bench) -> Result<(Value, D2dSummary), Error> {
    b.say("\nDevice-to-device copy: median GB/s (bytes copied / s; memory traffic is twice that), host wall time");
    b.say("around each synchronous call; (x) = ratio to cuMemcpyDtoD of the same size, measured in turns");
    b.say(format!(
        "  {:>8}  {:>12}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}",
        "size", "cuMemcpyDtoD", "lf auto", "lf engine", "lf shader", "lf cuda", "vkCmdCopyBuffer*"
    ));
    let mut rows = Vec::new();
    let mut gpu_lines = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let mut summary = D2dSummary { auto_ratio: Vec::new(), auto_wrong: Vec::new() };
    let mut auto_methods = Vec::new();
    let random = noise(b.max_size as usize);
    let mut size = MIB;
    while size <= b.max_size {
        let reps = b.o.reps.unwrap_or(match (b.o.quick, size >= 256 * MIB) {
            (true, _) => 5,
            (false, true) => 15,
            (false, false) => 30,
        });
        let base_src = b.plain.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?;
        let base_dst = b.plain.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?;
        let lf_src = b.exportable.allocate(size, GpuMemoryKind::DeviceLocal)?;
        let exported_dst = b.exportable.allocate(size, GpuMemoryKind::DeviceLocal)?;
        // The destination as another process sees it: exported, then imported (here, into the
        // same device; a different process imports into its own device the same way).
        let (lf_dst, dst_path) = match b.importer.import(exported_dst.export()?) {
            Ok(imported) => (imported, "exported->imported".to_string()),
            Err(e) => (
                b.exportable.allocate(size, GpuMemoryKind::DeviceLocal)?,
                format!("exported->exported (self-import refused: {e})"),
            ),
        };
        let cuda = b.cuda();
        let cuda_buffers = cuda.and_then(|c| Ok((c, c.alloc(size as usize)?, c.alloc(size as usize)?)));
        let bytes = &random[..size as usize];
        lf_src.write(0, bytes)?;
        base_src.write(0, bytes)?;
        if let Ok((c, src, _)) = &cuda_buffers {
            c.copy_htod(src, bytes).map_err(Error::Unsupported)?;
        }

        // Each case once: the warm-up, and for lava-flow's methods the check of the copy.
        let mut state: Vec<(Case, Result<Samples, String>)> = Vec::new();
        for case in Case::ALL {
            let warm = match (case, &cuda_buffers) {
                (Case::Cuda, Ok((c, src, dst))) => c.copy_dtod(dst, src, size as usize).map(|()| None),
                (Case::Cuda, Err(e)) => Err(e.clone()),
                (Case::Lf(method), _) => verify(&lf_src, &lf_dst, size, method).map(|()| Some(Ok(()))).or_else(|e| {
                    if e.starts_with("wrong data") {
                        Ok(Some(Err(e)))
                    } else {
                        Err(e)
                    }
                }),
                (Case::InProcess, _) => {
                    copy_buffer_timed(&base_src, 0, &base_dst, 0, size).map(|_| None).map_err(|e| e.to_string())
                }
            };
            state.push((case, warm.map(|verified| Samples { wall: Vec::new(), gpu: Vec::new(), verified })));
        }
        for round in 0..ROUNDS {
            for (case, samples) in state.iter_mut() {
                for (rep, untimed) in block(reps, round) {
                    let Ok(s) = samples else { break };
                    let start = Instant::now();
                    let result = match (*case, &cuda_buffers) {
                        (Case::Cuda, Ok((c, src, dst))) => c.copy_dtod(dst, src, size as usize).map(|()| None),
                        (Case::Cuda, Err(e)) => Err(e.clone()),
                        // Auto as users copy (`copy_buffer`, `lf_buffer_copy`): no timestamps.
                        (Case::Lf(CopyMethod::Auto), _) => {
                            copy_buffer(&lf_src, 0, &lf_dst, 0, size).map(|()| None).map_err(|e| e.to_string())
                        }
                        (Case::Lf(method), _) => copy_buffer_timed_with(&lf_src, 0, &lf_dst, 0, size, method)
                            .map(|t| t.gpu)
                            .map_err(|e| e.to_string()),
                        (Case::InProcess, _) => copy_buffer_timed(&base_src, 0, &base_dst, 0, size)
                            .map(|t| t.gpu)
                            .map_err(|e| e.to_string()),
                    };
                    let wall = start.elapsed().as_secs_f64();
                    match result {
                        Ok(_) if untimed => {}
                        Ok(gpu) => {
                            s.wall.push(wall);
                            if let Some(gpu) = gpu.filter(|g| !g.is_zero()) {
                                s.gpu.push(gpu.as_secs_f64());
                            }
                        }
                        Err(e) => *samples = Err(format!("failed at rep {rep}: {e}")),
                    }
                }
            }
        }

        let rate = |s: &Samples| gbps(size, median(&s.wall));
        let cuda_gbps: Result<f64, String> = state[0].1.as_ref().map(rate).map_err(Clone::clone);
        let mut cells = Vec::new();
        let mut row = serde_json::Map::new();
        row.insert("size".into(), json!(size));
        row.insert("reps".into(), json!(reps));
        row.insert("destination".into(), json!(dst_path));
        let auto_method = chosen_copy_method(&lf_src, 0, &lf_dst, 0, size);
        row.insert("auto_method".into(), json!(auto_method.as_str()));
        if !auto_methods.contains(&auto_method) {
            auto_methods.push(auto_method);
        }
        let mut gpu_cells = Vec::new();
        for (case, samples) in &state {
            let value = match samples {
                Ok(s) => {
                    let g = rate(s);
                    let gpu = (!s.gpu.is_empty()).then(|| gbps(size, median(&s.gpu)));
                    let ratio = cuda_gbps.as_ref().ok().filter(|_| *case != Case::Cuda).map(|c| g / c);
                    cells.push(match ratio {
                        Some(r) => format!("{g:9.2} ({r:4.2}x)"),
                        None => format!("{g:9.2}"),
                    });
                    if let Some(gpu) = gpu {
                        gpu_cells.push(format!("{} {gpu:.2}", case.label()));
                    }
                    let mut v = json!({ "gbps": num(g), "median_wall_s": num(median(&s.wall)) });
                    if let Some(gpu) = gpu {
                        v["gpu_timestamp_gbps"] = num(gpu);
                    }
                    if let Some(r) = ratio {
                        v["ratio_to_cuda"] = num(r);
                    }
                    if let Some(verified) = &s.verified {
                        v["verified"] = match verified {
                            Ok(()) => json!(true),
                            Err(e) => json!(e),
                        };
                        if let Err(e) = verified {
                            notes.push(format!("{} at {}: {e}", case.label(), size_name(size)));
                            if *case == Case::Lf(CopyMethod::Auto) {
                                summary.auto_wrong.push(format!("{}: {e}", size_name(size)));
                            }
                        }
                    }
                    if *case == Case::Lf(CopyMethod::Auto) {
                        summary.auto_ratio.push((size, cuda_gbps.as_ref().map(|c| g / c).map_err(Clone::clone)));
                    }
                    v
                }
                Err(e) => {
                    let short = if e.starts_with("unsupported") {
                        "unsupported"
                    } else if *case == Case::Cuda {
                        "n/a"
                    } else {
                        "error"
                    };
                    cells.push(short.to_string());
                    let note = format!("{}: {}", case.label(), brief(e));
                    if !notes.contains(&note) {
                        notes.push(note);
                    }
                    if *case == Case::Lf(CopyMethod::Auto) {
                        summary.auto_ratio.push((size, Err(format!("lava-flow's auto copy: {e}"))));
                    }
                    json!({ "unavailable": e })
                }
            };
            row.insert(case.key().into(), value);
        }
        b.say(format!(
            "  {:>8}  {:>12}  {:>16}  {:>16}  {:>16}  {:>16}  {:>16}",
            size_name(size),
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5]
        ));
        if !gpu_cells.is_empty() {
            gpu_lines.push(format!("  {:>8}  {}", size_name(size), gpu_cells.join(", ")));
        }
        rows.push(Value::Object(row));
        drop((lf_dst, exported_dst, lf_src, base_src, base_dst, cuda_buffers));
        b.exportable.trim();
        b.plain.trim();
        size *= 4;
    }
    b.say(
        "  * the in-process vkCmdCopyBuffer between two plain (not exportable) DEVICE_LOCAL buffers, for information",
    );
    let names: Vec<&str> = auto_methods.iter().map(|m| m.as_str()).collect();
    b.say(format!(
        "  lf auto copied by: {} (CUDA where the process uses CUDA on the device, as this bench does)",
        names.join(", ")
    ));
    if !gpu_lines.is_empty() {
        b.say("  lava-flow's GPU timestamps of the same copies (GB/s):");
        for line in gpu_lines {
            b.say(line);
        }
    }
    for note in &notes {
        b.say(format!("  {note}"));
    }
    Ok((json!({ "rows": rows, "notes": notes }), summary))
}
