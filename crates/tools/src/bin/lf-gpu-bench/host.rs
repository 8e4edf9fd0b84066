//! Host transfers at 1 MiB (for information), 16 MiB and 256 MiB (up to `--max-size`): CUDA's
//! `cuMemcpyHtoD`/`cuMemcpyDtoH` from and to pinned memory (`cuMemAllocHost`) and pageable
//! memory (a `Vec`), against lava-flow's ways to move the same bytes:
//!
//! - DEVICE_LOCAL `GpuBuffer::write`/`read` from and to a `Vec` (the auto path: direct where
//!   the memory is mappable, else staged), and `write_staged`/`read_staged` (staging forced);
//! - HOST_VISIBLE `write`/`read` (a memcpy into or out of the mapping);
//! - GPU-pinned CPU memory (`MemoryLocation::CpuGpuPinned` from a [`Context`] on the same
//!   device) copied to and from a DEVICE_LOCAL buffer of that context with `Context::copy`,
//!   which copies on the GPU where the pinned memory is imported into the device;
//! - and a plain memcpy between two `Vec`s of the same size, what HOST_VISIBLE writes and
//!   reads compare to.
//!
//! The application's side is touched as a user's would be: sources are filled once before
//! timing, destinations are real, pre-faulted buffers. Every case is warmed up, then the cases
//! take turns in blocks (`util::block`); each lava-flow write-read pair is checked once (round trip).

use lava_flow::memory::gpu::{describe_memory_flags, GpuBuffer, GpuMemoryKind};
use lava_flow::memory::{
    Buffer, Context, ContextConfig, DeviceRegistration, DeviceSelector, GpuPolicy, MemoryLocation,
};
use lava_flow::Error;
use serde_json::{json, Value};

use crate::cuda::{Cuda, DeviceMemory, PinnedHost};
use crate::util::{block, brief, gbps, median, num_or, size_name, timed, MIB, ROUNDS};
use crate::Bench;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    H2D,
    D2H,
    /// The host memcpy (no device).
    Host,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Memcpy,
    CudaPinned(Dir),
    CudaPageable(Dir),
    LfAuto(Dir),
    LfStaged(Dir),
    LfHostVisible(Dir),
    LfPinned(Dir),
}

use Dir::{D2H, H2D};

const METHODS: [Method; 13] = [
    Method::Memcpy,
    Method::CudaPinned(H2D),
    Method::CudaPageable(H2D),
    Method::LfAuto(H2D),
    Method::LfStaged(H2D),
    Method::LfHostVisible(H2D),
    Method::LfPinned(H2D),
    Method::CudaPinned(D2H),
    Method::CudaPageable(D2H),
    Method::LfAuto(D2H),
    Method::LfStaged(D2H),
    Method::LfHostVisible(D2H),
    Method::LfPinned(D2H),
];

impl Method {
    fn dir(self) -> Dir {
        match self {
            Method::Memcpy => Dir::Host,
            Method::CudaPinned(d)
            | Method::CudaPageable(d)
            | Method::LfAuto(d)
            | Method::LfStaged(d)
            | Method::LfHostVisible(d)
            | Method::LfPinned(d) => d,
        }
    }

    fn is_lava_flow(self) -> bool {
        matches!(self, Method::LfAuto(_) | Method::LfStaged(_) | Method::LfHostVisible(_) | Method::LfPinned(_))
    }

    /// Whether the application's side is pageable memory (a `Vec`).
    fn pageable(self) -> bool {
        matches!(self, Method::LfAuto(_) | Method::LfStaged(_) | Method::LfHostVisible(_))
    }

    fn key(self) -> &'static str {
        match self {
            Method::Memcpy => "host_memcpy",
            Method::CudaPinned(H2D) => "cuda_htod_pinned",
            Method::CudaPinned(_) => "cuda_dtoh_pinned",
            Method::CudaPageable(H2D) => "cuda_htod_pageable",
            Method::CudaPageable(_) => "cuda_dtoh_pageable",
            Method::LfAuto(H2D) => "lf_device_local_write",
            Method::LfAuto(_) => "lf_device_local_read",
            Method::LfStaged(H2D) => "lf_device_local_write_staged",
            Method::LfStaged(_) => "lf_device_local_read_staged",
            Method::LfHostVisible(H2D) => "lf_host_visible_write",
            Method::LfHostVisible(_) => "lf_host_visible_read",
            Method::LfPinned(H2D) => "lf_pinned_to_device_local",
            Method::LfPinned(_) => "lf_device_local_to_pinned",
        }
    }

    fn label(self, bufs: &Buffers) -> String {
        let flags = describe_memory_flags(bufs.dl.memory_property_flags());
        let write_path = if bufs.dl.is_host_mappable() || flags.contains("HOST_VISIBLE") { "direct" } else { "staged" };
        let read_path = if bufs.dl.is_host_mappable() { "direct" } else { "staged" };
        match self {
            Method::Memcpy => "host memcpy, Vec -> Vec".into(),
            Method::CudaPinned(H2D) => "cuMemcpyHtoD from cuMemAllocHost memory (pinned)".into(),
            Method::CudaPinned(_) => "cuMemcpyDtoH into cuMemAllocHost memory (pinned)".into(),
            Method::CudaPageable(H2D) => "cuMemcpyHtoD from a Vec (pageable)".into(),
            Method::CudaPageable(_) => "cuMemcpyDtoH into a Vec (pageable)".into(),
            Method::LfAuto(H2D) => format!("lf DEVICE_LOCAL write from a Vec (auto: {write_path}; {flags})"),
            Method::LfAuto(_) => format!("lf DEVICE_LOCAL read into a Vec (auto: {read_path})"),
            Method::LfStaged(H2D) => "lf DEVICE_LOCAL write_staged from a Vec".into(),
            Method::LfStaged(_) => "lf DEVICE_LOCAL read_staged into a Vec".into(),
            Method::LfHostVisible(H2D) => "lf HOST_VISIBLE write from a Vec".into(),
            Method::LfHostVisible(_) => "lf HOST_VISIBLE read into a Vec".into(),
            Method::LfPinned(H2D) => format!("lf GPU-pinned -> DEVICE_LOCAL, Context::copy ({})", bufs.pinned_path()),
            Method::LfPinned(_) => format!("lf DEVICE_LOCAL -> GPU-pinned, Context::copy ({})", bufs.pinned_path()),
        }
    }
}

/// One measured row, for the targets.
#[derive(Clone)]
pub struct HostRow {
    pub size: u64,
    pub dir: Dir,
    pub key: &'static str,
    pub lava_flow: bool,
    /// From or to pageable memory through the auto path (`write`/`read` of DEVICE_LOCAL).
    pub auto_pageable: bool,
    pub host_visible: bool,
    /// What the round-trip check saw when the data was wrong.
    pub wrong: Option<String>,
    pub ratio_pinned: Result<f64, String>,
    pub ratio_memcpy: Option<Result<f64, String>>,
}

pub struct HostSummary {
    pub rows: Vec<HostRow>,
}

struct CudaBuffers<'c> {
    cuda: &'c Cuda,
    device: DeviceMemory<'c>,
    pinned_src: PinnedHost<'c>,
    pinned_dst: PinnedHost<'c>,
}

struct PinnedBuffers<'x> {
    context: &'x Context,
    src: Buffer,
    dst: Buffer,
    device_local: Buffer,
}

struct Buffers<'c, 'x> {
    src: Vec<u8>,
    dst: Vec<u8>,
    other: Vec<u8>,
    dl: GpuBuffer,
    hv: GpuBuffer,
    cuda: Result<CudaBuffers<'c>, String>,
    pinned: Result<PinnedBuffers<'x>, String>,
}

impl Buffers<'_, '_> {
    fn pinned_path(&self) -> String {
        match &self.pinned {
            Ok(p) if p.src.registrations().iter().any(|r| matches!(r, DeviceRegistration::Vulkan { .. })) => {
                "a GPU copy".into()
            }
            Ok(p) => {
                format!("through the host: not imported into Vulkan: {}", p.src.registration_failures().join("; "))
            }
            Err(_) => "unavailable".into(),
        }
    }

    /// One transfer by `method`.
    fn run(&mut self, method: Method) -> Result<(), String> {
        let e = |e: Error| e.to_string();
        match method {
            Method::Memcpy => {
                self.other.copy_from_slice(&self.src);
                std::hint::black_box(&mut self.other);
                Ok(())
            }
            Method::CudaPinned(dir) | Method::CudaPageable(dir) => {
                let c = self.cuda.as_mut().map_err(|e| e.clone())?;
                let pinned = matches!(method, Method::CudaPinned(_));
                match (dir, pinned) {
                    (H2D, true) => c.cuda.copy_htod(&c.device, c.pinned_src.as_slice()),
                    (H2D, false) => c.cuda.copy_htod(&c.device, &self.src),
                    (_, true) => c.cuda.copy_dtoh(c.pinned_dst.as_mut(), &c.device),
                    (_, false) => c.cuda.copy_dtoh(&mut self.dst, &c.device),
                }
            }
            Method::LfAuto(H2D) => self.dl.write(0, &self.src).map_err(e),
            Method::LfAuto(_) => self.dl.read(0, &mut self.dst).map_err(e),
            Method::LfStaged(H2D) => self.dl.write_staged(0, &self.src).map_err(e),
            Method::LfStaged(_) => self.dl.read_staged(0, &mut self.dst).map_err(e),
            Method::LfHostVisible(H2D) => self.hv.write(0, &self.src).map_err(e),
            Method::LfHostVisible(_) => self.hv.read(0, &mut self.dst).map_err(e),
            Method::LfPinned(dir) => {
                let p = self.pinned.as_ref().map_err(|e| e.clone())?;
                let n = p.src.len();
                match dir {
                    H2D => p.context.copy(&p.device_local, 0, &p.src, 0, n).map_err(e),
                    _ => p.context.copy(&p.dst, 0, &p.device_local, 0, n).map_err(e),
                }
            }
        }
    }

    /// Writes by `write`, reads back by `read` into a cleared destination, and compares. The
    /// source is stamped with `stamp` first, so that a write that moved nothing shows.
    fn round_trip(&mut self, write: Method, read: Method, stamp: u8) -> Result<(), String> {
        self.src[..8].fill(stamp);
        if let (Ok(p), Method::LfPinned(_)) = (&self.pinned, write) {
            p.src.write_at(0, &self.src).map_err(|e| e.to_string())?;
            p.dst.write_at(0, &vec![0u8; p.dst.len()]).map_err(|e| e.to_string())?;
        }
        self.dst.fill(0);
        self.run(write)?;
        self.run(read)?;
        let got = match (&self.pinned, read) {
            (Ok(p), Method::LfPinned(_)) => {
                let mut out = vec![0u8; p.dst.len()];
                p.dst.read_at(0, &mut out).map_err(|e| e.to_string())?;
                out
            }
            _ => self.dst.clone(),
        };
        match got.iter().zip(&self.src).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(at) => Err(format!("wrong data: what was read back differs from what was written at byte {at}")),
        }
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(5)).collect()
}

/// The context for the pinned path: on the bench's device, or why there is none.
fn pinned_context(b: &Bench) -> Result<Context, String> {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    config.gpu_device = Some(DeviceSelector::Uuid(b.device.device_uuid()));
    Context::new(config).map_err(|e| format!("a Context on the bench's device: {e}"))
}

pub fn run(b: &Bench) -> Result<(Value, HostSummary), Error> {
    let reps = b.o.reps.unwrap_or(if b.o.quick { 3 } else { 7 });
    b.say(format!("\nHost transfers: median GB/s of {reps} (host wall time; CUDA copies end with cuCtxSynchronize);"));
    b.say("(x) = ratio to CUDA pinned / CUDA pageable / host memcpy of the same size and direction");
    let context = pinned_context(b);
    let mut summary = HostSummary { rows: Vec::new() };
    let mut out_rows = Vec::new();
    let sizes: Vec<u64> = [MIB, 16 * MIB, 256 * MIB].into_iter().filter(|&s| s <= b.max_size).collect();
    for size in sizes {
        let n = size as usize;
        let cuda = b.cuda().and_then(|c| {
            Ok(CudaBuffers {
                cuda: c,
                device: c.alloc(n)?,
                pinned_src: c.alloc_host(n, 0x5a)?,
                pinned_dst: c.alloc_host(n, 1)?,
            })
        });
        let pinned = context.as_ref().map_err(Clone::clone).and_then(|context| {
            let alloc =
                |location| context.allocate(n, location).map_err(|e| format!("{location} of {}: {e}", size_name(size)));
            let (src, dst, device_local) = (
                alloc(MemoryLocation::CpuGpuPinned)?,
                alloc(MemoryLocation::CpuGpuPinned)?,
                alloc(MemoryLocation::GpuDeviceLocal)?,
            );
            if let Some(why) = device_local.fallback() {
                return Err(why.to_string());
            }
            Ok(PinnedBuffers { context, src, dst, device_local })
        });
        let mut bufs = Buffers {
            src: pattern(n),
            dst: vec![1u8; n],
            other: vec![1u8; n],
            dl: b.exportable.allocate(size, GpuMemoryKind::DeviceLocal)?,
            hv: b.exportable.allocate(size, GpuMemoryKind::HostVisible)?,
            cuda,
            pinned,
        };
        if let Ok(c) = bufs.cuda.as_mut() {
            c.pinned_src.as_mut().copy_from_slice(&bufs.src);
        }

        // Round trips (also the warm-up of the lava-flow cases), then the others' warm-up.
        let mut checks: Vec<(Method, Result<(), String>)> = Vec::new();
        for (i, (write, read)) in [
            (Method::LfAuto(H2D), Method::LfAuto(D2H)),
            (Method::LfStaged(H2D), Method::LfStaged(D2H)),
            (Method::LfHostVisible(H2D), Method::LfHostVisible(D2H)),
            (Method::LfPinned(H2D), Method::LfPinned(D2H)),
        ]
        .into_iter()
        .enumerate()
        {
            let checked = bufs.round_trip(write, read, 0xa0 + i as u8);
            checks.push((write, checked.clone()));
            checks.push((read, checked));
        }
        if let Ok(p) = &bufs.pinned {
            p.src.write_at(0, &bufs.src)?;
        }
        let mut state: Vec<(Method, Result<Vec<f64>, String>)> = METHODS
            .iter()
            .map(|&m| {
                let warm = match checks.iter().find(|(c, _)| *c == m) {
                    Some((_, Err(e))) if !e.starts_with("wrong data") => Err(e.clone()),
                    Some(_) => Ok(Vec::new()),
                    None => bufs.run(m).map(|()| Vec::new()),
                };
                (m, warm)
            })
            .collect();
        for round in 0..ROUNDS {
            for (m, samples) in state.iter_mut() {
                for (rep, untimed) in block(reps, round) {
                    let Ok(s) = samples else { break };
                    match timed(|| bufs.run(*m)) {
                        Ok(_) if untimed => {}
                        Ok((secs, ())) => s.push(secs),
                        Err(e) => *samples = Err(format!("failed at rep {rep}: {e}")),
                    }
                }
            }
        }

        let rate = |m: Method| -> Result<f64, String> {
            let (_, s) = state.iter().find(|(x, _)| *x == m).expect("every method has a state");
            s.as_ref().map(|s| gbps(size, median(s))).map_err(Clone::clone)
        };
        b.say(format!("  {}:", size_name(size)));
        let mut json_methods = serde_json::Map::new();
        for &m in &METHODS {
            let g = rate(m);
            let base = |b: Method| -> Result<f64, String> {
                let base = rate(b)?;
                g.as_ref().map(|g| g / base).map_err(Clone::clone)
            };
            let dir = m.dir();
            let (pinned, pageable) = match dir {
                Dir::Host => (Err("no device".to_string()), Err(String::new())),
                d => (base(Method::CudaPinned(d)), base(Method::CudaPageable(d))),
            };
            let memcpy = matches!(m, Method::LfHostVisible(_)).then(|| base(Method::Memcpy));
            let mut ratios = Vec::new();
            if m.is_lava_flow() {
                if let Ok(r) = &pinned {
                    ratios.push(format!("{r:4.2}x pinned"));
                }
                if m.pageable() && !matches!(m, Method::LfHostVisible(_)) {
                    if let Ok(r) = &pageable {
                        ratios.push(format!("{r:4.2}x pageable"));
                    }
                }
                if let Some(Ok(r)) = &memcpy {
                    ratios.push(format!("{r:4.2}x memcpy"));
                }
            }
            let check = checks.iter().find(|(c, _)| *c == m).map(|(_, r)| r.clone());
            let mut cell = match &g {
                Ok(g) => format!("{g:9.2}  {}", ratios.join("  ")),
                Err(e) => format!("      n/a  {}", brief(e)),
            };
            if let Some(Err(e)) = &check {
                if e.starts_with("wrong data") {
                    cell.push_str(&format!("  ({e})"));
                }
            }
            let heading = match (m, dir) {
                (Method::CudaPinned(_), H2D) => Some("host -> device"),
                (Method::CudaPinned(_), D2H) => Some("device -> host"),
                _ => None,
            };
            if let Some(h) = heading {
                b.say(format!("    {h}"));
            }
            let indent = if dir == Dir::Host { "    " } else { "      " };
            b.say(format!("{indent}{:<width$} {cell}", m.label(&bufs), width = 78 - indent.len()));
            let mut v = json!({
                "direction": match dir { H2D => "host_to_device", D2H => "device_to_host", Dir::Host => "host" },
                "label": m.label(&bufs),
                "gbps": num_or(&g),
            });
            if m.is_lava_flow() {
                v["ratio_to_cuda_pinned"] = num_or(&pinned);
                if m.pageable() {
                    v["ratio_to_cuda_pageable"] = num_or(&pageable);
                }
                if let Some(r) = &memcpy {
                    v["ratio_to_host_memcpy"] = num_or(r);
                }
                v["verified"] = match &check {
                    Some(Ok(())) => json!(true),
                    Some(Err(e)) => json!(e),
                    None => Value::Null,
                };
            }
            json_methods.insert(m.key().into(), v);
            summary.rows.push(HostRow {
                size,
                dir,
                key: m.key(),
                lava_flow: m.is_lava_flow(),
                auto_pageable: matches!(m, Method::LfAuto(_)),
                host_visible: matches!(m, Method::LfHostVisible(_)),
                wrong: match &check {
                    Some(Err(e)) if e.starts_with("wrong data") => Some(e.clone()),
                    _ => None,
                },
                ratio_pinned: pinned,
                ratio_memcpy: memcpy,
            });
        }
        out_rows.push(json!({
            "size": size,
            "reps": reps,
            "device_local_mappable": bufs.dl.is_host_mappable(),
            "pinned_path": bufs.pinned_path(),
            "methods": json_methods,
        }));
    }
    Ok((json!({ "rows": out_rows, "pinned_context": context.as_ref().err() }), summary))
}
