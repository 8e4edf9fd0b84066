//! The default view: every capability, available or not, why, and how to fix it. Each row is
//! answered by doing what an application would do with the library: open a context as
//! `Context::new` opens it, allocate each kind of memory, export and import it, probe
//! semaphore sharing, create a channel between two threads, join MPI.

use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, PayloadClass, Producer, TransportInfo, TransportKind};
use lava_flow::env::{self, Source};
use lava_flow::memory::{
    hugepage_pool, memlock_limit, reserve_command, Buffer, Context, ContextConfig, DeviceRegistration, GpuPolicy,
    HugePageSize, HugepagePolicy, MemoryLocation, MEMLOCK_FIX,
};
use lava_flow::mpi::{Communicator, MpiWorld};
use lava_flow::ProcessLocation;
use serde_json::{json, Value};

use crate::text;

/// Whether a capability can be used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Available,
    Unavailable,
    /// Not looked at (the user asked lf-info not to).
    NotProbed,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Available => "available",
            Status::Unavailable => "unavailable",
            Status::NotProbed => "not probed",
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Capability {
    /// A stable name for scripts (`cpu.hugepages_2m`).
    pub key: &'static str,
    pub title: &'static str,
    pub status: Status,
    /// What was found, or why it is unavailable.
    pub detail: String,
    /// How to make it available (unavailable rows).
    pub fix: Option<String>,
}

impl Capability {
    fn available(key: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Capability { key, title, status: Status::Available, detail: detail.into(), fix: None }
    }

    fn unavailable(key: &'static str, title: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Capability { key, title, status: Status::Unavailable, detail: detail.into(), fix: Some(fix.into()) }
    }

    fn to_json(&self) -> Value {
        json!({
            "key": self.key,
            "title": self.title,
            "status": self.status.as_str(),
            "available": self.status == Status::Available,
            "detail": self.detail,
            "fix": self.fix,
        })
    }
}

/// The context the probes use: the one an application gets with the default config (the GPU
/// opened as `LF_VULKAN_DEVICE` and `LF_GPU_COPY` say), and why that failed if it did, in
/// which case the CPU probes use a context without a GPU.
struct Probe {
    context: Context,
    context_error: Option<String>,
}

impl Probe {
    fn open() -> Result<Probe, String> {
        match Context::new(ContextConfig::default()) {
            Ok(context) => Ok(Probe { context, context_error: None }),
            Err(e) => {
                let mut config = ContextConfig::default();
                config.gpu = GpuPolicy::Disabled;
                let context = Context::new(config).map_err(|again| {
                    format!("a memory context cannot be created: {e}; without a GPU either: {again}")
                })?;
                Ok(Probe { context, context_error: Some(e.to_string()) })
            }
        }
    }

    /// What a row probed on the fallback context must say.
    fn without_gpu_note(&self) -> &'static str {
        if self.context_error.is_some() {
            " (probed on a context without a GPU: the default one cannot be created, see the Vulkan row)"
        } else {
            ""
        }
    }

    /// Why the context has no GPU, if it has none.
    fn gpu_missing(&self) -> Option<String> {
        self.context_error.clone().or_else(|| self.context.gpu_unavailable_reason().map(str::to_owned))
    }
}

/// How to get a GPU where `why` says there is none: fix the variable the message names, or
/// install a driver.
fn gpu_fix(why: &str) -> String {
    if let Some(var) = env::VARS.iter().find(|v| why.contains(v.name) && env::setting(v).source == Source::Environment)
    {
        return format!("fix or unset {} (`lf-info -c` shows it; `lf-info -d` lists the devices)", var.name);
    }
    #[cfg(feature = "vulkan")]
    {
        lava_flow::memory::gpu::FIX_HINT.to_owned()
    }
    #[cfg(not(feature = "vulkan"))]
    {
        "rebuild lava-flow with the cargo feature `vulkan` (on by default; cmake builds it)".into()
    }
}

fn cpu_standard(p: &Probe) -> Capability {
    const KEY: &str = "cpu.standard";
    const TITLE: &str = "CPU memory: standard";
    match p.context.allocate(4096, MemoryLocation::CpuStandard) {
        Ok(buffer) => Capability::available(
            KEY,
            TITLE,
            format!("memfd shared memory on {} pages, shareable with processes of this host", text::bytes(buffer.page_size() as u64)),
        ),
        Err(e) => Capability::unavailable(
            KEY,
            TITLE,
            e.to_string(),
            "lava-flow needs memfd_create and shared mappings (Linux 3.17 or newer); a seccomp profile or sandbox may forbid them",
        ),
    }
}

fn cpu_numa(p: &Probe) -> Capability {
    const KEY: &str = "cpu.numa";
    const TITLE: &str = "CPU memory: NUMA-bound";
    let nodes = p.context.numa_nodes();
    let list: Vec<String> = nodes.iter().map(u32::to_string).collect();
    let seen = format!("NUMA nodes with memory: {}", list.join(", "));
    match p.context.allocate(4096, MemoryLocation::CpuNuma { node: None }) {
        Ok(buffer) => {
            let got = buffer.location().numa_node().map_or_else(|| "?".to_owned(), |n| n.to_string());
            let note = if nodes.len() == 1 { " (one node: binding changes nothing on this host)" } else { "" };
            Capability::available(KEY, TITLE, format!("{seen}{note}; a buffer was bound to node {got} (this thread's)"))
        }
        Err(e) => Capability::unavailable(
            KEY,
            TITLE,
            format!("{seen}; {e}"),
            "the kernel refused mbind: it needs NUMA support (CONFIG_NUMA), and a container's seccomp profile may forbid the call",
        ),
    }
}

fn cpu_hugepages(p: &Probe, page: HugePageSize) -> Capability {
    let (key, title, suggest) = match page {
        HugePageSize::Size2M => ("cpu.hugepages_2m", "CPU memory: huge pages (2 MiB)", 64),
        HugePageSize::Size1G => ("cpu.hugepages_1g", "CPU memory: huge pages (1 GiB)", 1),
    };
    let fallback = "; or ask for the best-effort hugepage policy, which falls back to ordinary pages";
    let Some(pool) = hugepage_pool(page) else {
        let fix = match page {
            HugePageSize::Size2M => "a kernel with hugetlbfs (CONFIG_HUGETLBFS)".to_owned(),
            HugePageSize::Size1G => {
                "a CPU with 1 GiB pages (pdpe1gb) and the kernel booted with `hugepagesz=1G hugepages=N`".to_owned()
            }
        };
        return Capability::unavailable(
            key,
            title,
            format!("this kernel or CPU offers no {page} huge pages"),
            fix + fallback,
        );
    };
    let counts = format!("{} reserved, {} free", pool.total, pool.free);
    let reserve = |more: u64| {
        let total = pool.total + more;
        format!(
            "reserve them as root: `{}` ({total} page{} of {page} in all){fallback}",
            reserve_command(page, total),
            if total == 1 { "" } else { "s" }
        )
    };
    if pool.free == 0 {
        let what = if pool.total == 0 { "no" } else { "no free" };
        return Capability::unavailable(key, title, format!("{what} {page} huge pages ({counts})"), reserve(suggest));
    }
    match p.context.allocate_with(page.bytes(), MemoryLocation::CpuHugepage { page }, HugepagePolicy::Strict) {
        Ok(_) => Capability::available(key, title, format!("{counts}; a buffer of one page was allocated")),
        Err(e) => Capability::unavailable(key, title, format!("{counts}; {e}"), reserve(suggest)),
    }
}

/// The registrations of a pinned buffer, in words.
fn registrations(buffer: &Buffer) -> String {
    let mut parts = Vec::new();
    for r in buffer.registrations() {
        parts.push(match r {
            DeviceRegistration::Vulkan { .. } => {
                "registered with the Vulkan device (VK_EXT_external_memory_host)".to_owned()
            }
            DeviceRegistration::Cuda { device } => format!("registered with CUDA device {device} (cuMemHostRegister)"),
            _ => format!("registered with {r:?}"),
        });
    }
    for failure in buffer.registration_failures() {
        parts.push(format!("not with {failure}"));
    }
    parts.join("; ")
}

fn cpu_gpu_pinned(p: &Probe) -> Capability {
    const KEY: &str = "cpu.gpu_pinned";
    const TITLE: &str = "CPU memory: GPU-pinned";
    let limit = match memlock_limit() {
        None => "unlimited".to_owned(),
        Some(bytes) => format!("{} (`ulimit -l` {})", text::bytes(bytes), bytes / 1024),
    };
    let privilege =
        if lava_flow::memory::has_ipc_lock() { ", but this process has CAP_IPC_LOCK, so no limit applies" } else { "" };
    let arena = text::bytes(ContextConfig::DEFAULT_ARENA_SIZE as u64);
    match p.context.allocate(4096, MemoryLocation::CpuGpuPinned) {
        Ok(buffer) => Capability::available(
            KEY,
            TITLE,
            format!(
                "locked with mlock in arenas of {arena} (RLIMIT_MEMLOCK {limit}{privilege}); {}{}",
                registrations(&buffer),
                p.without_gpu_note()
            ),
        ),
        Err(e) => Capability::unavailable(
            KEY,
            TITLE,
            format!("RLIMIT_MEMLOCK {limit}: {e}"),
            format!("pinned memory is locked in arenas of {arena} at least: {MEMLOCK_FIX}"),
        ),
    }
}

fn gpu_vulkan(p: &Probe) -> Capability {
    const KEY: &str = "gpu.vulkan";
    const TITLE: &str = "GPU memory (Vulkan)";
    #[cfg(feature = "vulkan")]
    if let Some(info) = p.context.device_info() {
        let driver = [info.driver_name.as_str(), info.driver_info.as_str()].join(" ");
        return Capability::available(
            KEY,
            TITLE,
            format!(
                "device {} of {}: {} ({}, Vulkan {}, driver {}), deviceUUID {}",
                info.index,
                info.all_devices.len(),
                info.name,
                info.device_type.as_str(),
                lava_flow::memory::gpu::format_api_version(info.api_version),
                driver.trim(),
                lava_flow::memory::format_uuid(&info.device_uuid)
            ),
        );
    }
    let why = p.gpu_missing().unwrap_or_else(|| "no Vulkan device".into());
    Capability::unavailable(KEY, TITLE, why.clone(), gpu_fix(&why))
}

/// Writes a pattern, exports the buffer, imports it again and reads the pattern back: what
/// a peer process does, in this one.
fn round_trip(context: &Context, buffer: &Buffer) -> Result<(), String> {
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    buffer.write_at(0, &pattern).map_err(|e| format!("writing the buffer failed: {e}"))?;
    let handle = buffer.export().map_err(|e| format!("exporting failed: {e}"))?;
    let imported = context.import(handle).map_err(|e| format!("importing the export failed: {e}"))?;
    let mut back = vec![0u8; pattern.len()];
    imported.read_at(0, &mut back).map_err(|e| format!("reading the imported buffer failed: {e}"))?;
    if back != pattern {
        return Err("the imported buffer does not hold what was written into the exported one".into());
    }
    Ok(())
}

fn export_cpu(p: &Probe) -> Capability {
    const KEY: &str = "memory.export_cpu";
    const TITLE: &str = "CPU memory export/import";
    let result = p
        .context
        .allocate(4096, MemoryLocation::CpuStandard)
        .map_err(|e| e.to_string())
        .and_then(|b| round_trip(&p.context, &b));
    match result {
        Ok(()) => Capability::available(KEY, TITLE, "a buffer was exported (memfd) and imported again, and read back"),
        Err(why) => Capability::unavailable(
            KEY,
            TITLE,
            why,
            "exports pass a memfd between processes of one user; a sandbox that forbids memfd_create or mmap of received files stops them",
        ),
    }
}

fn export_gpu(p: &Probe) -> Capability {
    const KEY: &str = "memory.export_gpu";
    const TITLE: &str = "GPU memory export/import";
    if let Some(why) = p.gpu_missing() {
        return Capability::unavailable(KEY, TITLE, format!("no Vulkan device: {why}"), gpu_fix(&why));
    }
    let result = p
        .context
        .allocate(4096, MemoryLocation::GpuDeviceLocal)
        .map_err(|e| e.to_string())
        .and_then(|b| round_trip(&p.context, &b));
    let handles = handle_types(p);
    match result {
        Ok(()) => Capability::available(
            KEY,
            TITLE,
            format!("a DEVICE_LOCAL buffer was exported as an opaque fd and imported on the same device, and read back{handles}"),
        ),
        Err(why) => Capability::unavailable(
            KEY,
            TITLE,
            format!("{why}{handles}"),
            "sharing GPU memory needs VK_KHR_external_memory_fd with exportable and importable opaque fds; update the GPU driver or pick another device with LF_VULKAN_DEVICE",
        ),
    }
}

/// `; opaque fd: ..., dma-buf: ...` for the context's device.
fn handle_types(p: &Probe) -> String {
    #[cfg(feature = "vulkan")]
    if let Some(info) = p.context.device_info() {
        return format!(" (external memory as opaque fd: {}; as dma-buf: {})", info.opaque_fd, info.dma_buf);
    }
    let _ = p;
    String::new()
}

fn semaphore_export(p: &Probe) -> Capability {
    const KEY: &str = "gpu.semaphore_export";
    const TITLE: &str = "Timeline semaphore export/import";
    const FIX: &str = "channels still carry GPU buffers by reference, synchronised on the host (buffers are complete when \
        sent); GPU-side synchronisation needs a driver with VK_KHR_external_semaphore_fd and timeline semaphores (Vulkan 1.2): \
        NVIDIA's, AMD's and Intel's drivers have them";
    if let Some(why) = p.gpu_missing() {
        return Capability::unavailable(KEY, TITLE, format!("no Vulkan device: {why}"), gpu_fix(&why));
    }
    #[cfg(feature = "vulkan")]
    if let Some(device) = p.context.gpu_device() {
        return match lava_flow::memory::gpu::probe_semaphore_sharing(device) {
            Ok(()) => Capability::available(
                KEY,
                TITLE,
                "a timeline semaphore was exported as an opaque fd, imported, signalled and waited on: channels synchronise GPU buffers on the GPU",
            ),
            Err(why) => Capability::unavailable(KEY, TITLE, why, FIX),
        };
    }
    Capability::unavailable(KEY, TITLE, "no Vulkan device", FIX)
}

fn cuda() -> Capability {
    const KEY: &str = "gpu.cuda";
    const TITLE: &str = "CUDA interop";
    #[cfg(feature = "vulkan")]
    {
        match lava_flow::memory::gpu::cuda_driver_version() {
            Ok(v) => Capability::available(
                KEY,
                TITLE,
                format!(
                    "CUDA driver {}.{}: GPU-pinned memory is registered with CUDA (cuMemHostRegister); GPU exports (opaque fds) \
                     import into CUDA with cudaImportExternalMemory",
                    v / 1000,
                    v % 1000 / 10
                ),
            ),
            Err(e) => {
                let disabled = env::setting(&env::DISABLE_CUDA).env_value.as_deref() == Some("1");
                let fix = if disabled {
                    format!("unset {}", env::DISABLE_CUDA.name)
                } else {
                    "on a host with an NVIDIA GPU, install the NVIDIA driver (it ships libcuda.so.1)".to_owned()
                };
                Capability::unavailable(KEY, TITLE, e.to_string(), fix)
            }
        }
    }
    #[cfg(not(feature = "vulkan"))]
    Capability::unavailable(
        KEY,
        TITLE,
        "this build has no GPU support (cargo feature `vulkan`), which CUDA interop is part of",
        "rebuild lava-flow with the cargo feature `vulkan` (on by default; cmake builds it)",
    )
}

/// OpenCL, where an OpenCL driver is registered: lava-flow has no OpenCL code of its own.
fn opencl() -> Option<Capability> {
    let vendors = std::fs::read_dir("/etc/OpenCL/vendors").ok()?;
    let mut icds: Vec<String> =
        vendors.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if icds.is_empty() {
        return None;
    }
    icds.sort();
    Some(Capability::unavailable(
        "gpu.opencl",
        "OpenCL interop",
        format!("OpenCL drivers are registered ({}), but lava-flow has no OpenCL interop of its own", icds.join(", ")),
        "import lava-flow's GPU exports (opaque fds, lf_buffer_export) into OpenCL with cl_khr_external_memory_opaque_fd where \
         the OpenCL driver offers it",
    ))
}

/// Creates a channel between two threads of this process (shm carries it; a GPU buffer goes
/// by the GPU route), sends a message and, where there is a GPU, a GPU buffer. Returns the
/// producer's transport report and whether the GPU buffer came through by reference.
fn channel_probe(context: &Context) -> Result<(TransportInfo, Option<Result<(), String>>), String> {
    let name = format!("lf-info-probe-{}", std::process::id());
    let here = ProcessLocation::from_hostname().map_err(|e| format!("this process's location: {e}"))?;
    let config = ChannelConfig {
        capacity: 4,
        pool_size: 64 << 10,
        rendezvous_timeout: Some(Duration::from_secs(10)),
        prefault: false,
        ..ChannelConfig::default()
    };
    let gpu = if context.gpu_unavailable_reason().is_none() {
        Some(context.allocate(4096, MemoryLocation::GpuDeviceLocal).map_err(|e| format!("a GPU buffer to send: {e}"))?)
    } else {
        None
    };
    let pattern: Vec<u8> = (0..64u8).map(|i| i ^ 0xa5).collect();
    if let Some(buffer) = &gpu {
        buffer.write_at(0, &pattern).map_err(|e| format!("writing the GPU buffer to send: {e}"))?;
    }
    std::thread::scope(|scope| {
        let consumer = scope.spawn(|| -> Result<Option<Result<(), String>>, String> {
            let mut c = Consumer::create(context, &name, &here, &here, &config).map_err(|e| e.to_string())?;
            let m = c.recv_timeout(Duration::from_secs(10)).map_err(|e| format!("receiving: {e}"))?;
            if m.as_slice() != b"lf-info" {
                return Err("the message arrived changed".into());
            }
            drop(m);
            if gpu.is_none() {
                return Ok(None);
            }
            let m = c.recv_timeout(Duration::from_secs(10)).map_err(|e| format!("receiving a GPU buffer: {e}"))?;
            let by_reference = match m.buffer() {
                Some(buffer) => {
                    let mut back = vec![0u8; pattern.len()];
                    buffer.read_at(0, &mut back).map_err(|e| format!("reading the GPU buffer received: {e}"))?;
                    if back == pattern {
                        Ok(())
                    } else {
                        Err("the GPU buffer received does not hold what was sent".to_owned())
                    }
                }
                None => Err("the GPU buffer arrived as a copy in host memory".to_owned()),
            };
            Ok(Some(by_reference))
        });
        let producer = (|| -> Result<TransportInfo, String> {
            let mut p = Producer::create(context, &name, &here, &here, &config).map_err(|e| e.to_string())?;
            p.send(b"lf-info").map_err(|e| format!("sending: {e}"))?;
            if let Some(buffer) = &gpu {
                let seq = p.send_buffer(buffer, 0, pattern.len()).map_err(|e| format!("sending a GPU buffer: {e}"))?;
                p.wait_completed(seq, Some(Duration::from_secs(10)))
                    .map_err(|e| format!("waiting for the GPU buffer: {e}"))?;
            }
            Ok(p.transport().clone())
        })();
        let received = consumer.join().map_err(|_| "the probe's consumer thread panicked".to_owned())?;
        match (producer, received) {
            (Ok(info), Ok(gpu)) => Ok((info, gpu)),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    })
}

fn channel_rows(p: &Probe) -> [Capability; 2] {
    const SHM: (&str, &str) = ("channel.shm", "Channels: shared memory (same host)");
    const VK: (&str, &str) = ("channel.vulkan_ipc", "Channels: Vulkan IPC (GPU buffers)");
    let transports = env::setting(&env::TRANSPORTS);
    let restricted = |kind: &str| {
        transports
            .env_value
            .as_deref()
            .filter(|v| !v.split(',').any(|t| TransportKind::parse(t).is_ok_and(|k| k.name() == kind)))
    };
    let channel_fix = |kind: &str, otherwise: String| match restricted(kind) {
        Some(value) => {
            format!("{}={value} leaves {kind} out: add it, or unset {}", env::TRANSPORTS.name, env::TRANSPORTS.name)
        }
        None => otherwise,
    };
    if let Err(e) = lava_flow::channels::runtime_dir() {
        let why = format!("the runtime directory is unusable: {e}");
        let fix = format!("set {} to a directory of yours (mode 0700), or fix the one named", env::RUNTIME_DIR.name);
        return [
            Capability::unavailable(SHM.0, SHM.1, why.clone(), fix.clone()),
            Capability::unavailable(VK.0, VK.1, why, fix),
        ];
    }
    let (info, gpu) = match channel_probe(&p.context) {
        Ok(result) => result,
        Err(why) => {
            let detail = format!("a channel between two threads of lf-info failed: {why}");
            let shm_fix = channel_fix(
                "shm",
                "the error says what failed; `lf-info --channels` shows the runtime directory".into(),
            );
            let vk_fix = channel_fix("vulkan_ipc", "a channel is needed first (see the shared-memory row)".into());
            return [
                Capability::unavailable(SHM.0, SHM.1, detail.clone(), shm_fix),
                Capability::unavailable(VK.0, VK.1, detail, vk_fix),
            ];
        }
    };
    let shm = Capability::available(
        SHM.0,
        SHM.1,
        format!(
            "a channel between two threads of lf-info carried a message: {}",
            info.routes.first().map_or(info.reason.as_str(), |r| r.reason.as_str())
        ),
    );
    let route = info.routes.iter().find(|r| r.class == PayloadClass::Gpu);
    let vk = match (route, gpu) {
        (Some(route), Some(Ok(()))) if route.kind == TransportKind::VulkanIpc => Capability::available(
            VK.0,
            VK.1,
            format!("a GPU buffer went by reference and was read back: {}", route.reason),
        ),
        (route, gpu) => {
            let mut why = route.map_or_else(|| "the channel has no GPU route".to_owned(), |r| r.reason.clone())
                + p.without_gpu_note();
            if let Some(Err(e)) = gpu {
                why = format!("{why}; {e}");
            }
            let fix = match p.gpu_missing() {
                Some(missing) => gpu_fix(&missing),
                None => "GPU buffers go by reference between processes on the same GPU and driver; the reason above says what is missing".into(),
            };
            Capability::unavailable(VK.0, VK.1, why, channel_fix("vulkan_ipc", fix))
        }
    };
    [shm, vk]
}

fn mpi(probe: bool) -> Capability {
    const KEY: &str = "mpi";
    const TITLE: &str = "MPI (other hosts)";
    if !probe {
        return Capability {
            key: KEY,
            title: TITLE,
            status: Status::NotProbed,
            detail: "not probed (--no-mpi)".into(),
            fix: None,
        };
    }
    match MpiWorld::join(Communicator::World, None) {
        Ok(world) => Capability::available(
            KEY,
            TITLE,
            format!(
                "joined MPI{} as rank {} of {}: thread level {}, tag upper bound {}",
                if world.initialised_mpi() { " (initialised by lava-flow)" } else { "" },
                world.rank(),
                world.size(),
                world.thread_level(),
                world.tag_upper_bound()
            ),
        ),
        Err(e) => {
            let fix = if cfg!(feature = "mpi") {
                "check the MPI installation (`mpirun --version`), or run lf-info under mpirun as the application runs"
            } else {
                "rebuild lava-flow with MPI: cmake -DLAVA_FLOW_MPI=ON (CMake builds it in by itself where it finds a C MPI), or cargo build --features mpi"
            };
            Capability::unavailable(KEY, TITLE, e.to_string(), fix)
        }
    }
}

/// Every capability, probed.
pub fn probe_all(probe_mpi: bool) -> (Vec<Capability>, Option<String>) {
    let mut rows = Vec::new();
    let probe = match Probe::open() {
        Ok(probe) => probe,
        Err(why) => return (rows, Some(why)),
    };
    rows.push(cpu_standard(&probe));
    rows.push(cpu_numa(&probe));
    rows.push(cpu_hugepages(&probe, HugePageSize::Size2M));
    rows.push(cpu_hugepages(&probe, HugePageSize::Size1G));
    rows.push(cpu_gpu_pinned(&probe));
    rows.push(gpu_vulkan(&probe));
    rows.push(export_cpu(&probe));
    rows.push(export_gpu(&probe));
    rows.push(semaphore_export(&probe));
    rows.push(cuda());
    rows.extend(opencl());
    rows.extend(channel_rows(&probe));
    rows.push(mpi(probe_mpi));
    (rows, None)
}

/// The view: JSON and text.
pub fn view(probe_mpi: bool) -> (Value, String) {
    let (rows, failure) = probe_all(probe_mpi);
    let here = ProcessLocation::from_hostname();
    let host = match &here {
        Ok(l) => json!({ "hostname": l.hostname, "host_id": l.host_id, "numa_node": l.node_id }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let value = json!({
        "host": host,
        "rows": rows.iter().map(Capability::to_json).collect::<Vec<_>>(),
        "error": failure,
    });
    let width = text::width();
    let mut out = match &here {
        Ok(l) => format!(
            "Capabilities on {} (host identity {})\n\n",
            l.hostname,
            l.host_id.as_deref().unwrap_or("none: hostnames are compared")
        ),
        Err(e) => format!("Capabilities (this host's location: {e})\n\n"),
    };
    if let Some(why) = failure {
        out.push_str(&format!("  {why}\n"));
    }
    let title_w = rows.iter().map(|r| r.title.len()).max().unwrap_or(0);
    let state_w = "unavailable".len();
    out.push_str(&text::row(&["CAPABILITY", "STATE", "DETAILS"], &[title_w, state_w], width));
    for r in &rows {
        out.push_str(&text::row(&[r.title, r.status.as_str(), &r.detail], &[title_w, state_w], width));
        if let Some(fix) = &r.fix {
            out.push_str(&text::continuation(&format!("fix: {fix}"), 2 + title_w + 2 + state_w + 2, width));
        }
    }
    let available = rows.iter().filter(|r| r.status == Status::Available).count();
    out.push_str(&format!("\n{available} of {} available. `lf-info --help` lists the other views.\n", rows.len()));
    (value, out)
}
