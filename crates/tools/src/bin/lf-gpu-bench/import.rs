//! The first import of an arena in another process, 64 MiB and 1 GiB (up to `--max-size`).
//!
//! The parent allocates a DEVICE_LOCAL buffer with an arena of its own (`allocate_unpooled` at
//! 64 MiB, `allocate` at 1 GiB, which gives a buffer of that size its own arena too), exports
//! it twice and starts a child (this executable, `--child import`) that inherits both fds
//! (duplicates without `FD_CLOEXEC`, their numbers and `GpuExportDesc::to_bytes` in hex on the
//! command line). The child opens its device (not timed), then times:
//!
//! - lava-flow: `GpuImporter::new(&device).import(export)` (an importer made then, as a
//!   process that imports once would);
//! - the driver alone: the second fd imported with raw Vulkan calls through the same device
//!   (`vkCreateBuffer` with `VkExternalMemoryBufferCreateInfo`(OPAQUE_FD),
//!   `vkGetBufferMemoryRequirements`, `vkAllocateMemory` with `VkImportMemoryFdInfoKHR`, and
//!   `VkMemoryDedicatedAllocateInfo` where the export says dedicated, `vkBindBufferMemory`);
//! - with CUDA: `cuIpcOpenMemHandle` of a `cuMemAlloc` buffer of the same size that the
//!   parent made and passed as a `cuIpcGetMemHandle` handle (the child's CUDA context is
//!   created first, not timed).
//!
//! The largest size is measured once more from an allocation made dedicated (for
//! information).
//!
//! Children alternate which of the two Vulkan imports runs first; each is reported from the
//! children where it was the first import of the process.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::time::Instant;

use ash::vk;
use lava_flow::memory::gpu::{
    GpuAllocator, GpuAllocatorConfig, GpuExport, GpuExportDesc, GpuImporter, GpuMemoryKind, VulkanDevice,
};
use lava_flow::Error;
use serde_json::{json, Value};

use crate::alloc::child_device;
use crate::cuda::{Cuda, IPC_HANDLE_SIZE};
use crate::util::{brief, child_reply, from_hex, median, num, run_child, size_name, to_hex, us, GIB, MIB};
use crate::{Bench, ChildArgs};

pub struct ImportSummary {
    /// lava-flow's first import (ms, median over the children where it ran first) per size.
    pub lava_flow_ms: Vec<(u64, Result<f64, String>)>,
}

/// A duplicate of `fd` that a child inherits (no `FD_CLOEXEC`); closed here when dropped.
fn inheritable(fd: &OwnedFd) -> Result<OwnedFd, String> {
    // SAFETY: dup of a live descriptor returns a new one (without FD_CLOEXEC) or -1.
    let raw = unsafe { libc::dup(fd.as_raw_fd()) };
    if raw < 0 {
        return Err(format!("dup of an export fd: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: dup returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

pub fn run(b: &Bench) -> Result<(Value, ImportSummary), Error> {
    let sizes: Vec<u64> = [64 * MIB, GIB].into_iter().filter(|&s| s <= b.max_size).collect();
    let children = if b.o.quick { 2 } else { 6 };
    b.say(format!(
        "\nFirst import of an arena in another process ({} child processes a size, alternating which import \
         runs first; each timed where it ran first, median; device open not counted):",
        children
    ));
    let mut summary = ImportSummary { lava_flow_ms: Vec::new() };
    let mut rows = Vec::new();
    let uuid = to_hex(&b.device.device_uuid());
    // The largest size once more from a dedicated allocation (for information: whether the
    // driver imports those faster).
    let dedicated = GpuAllocator::new(
        &b.device,
        GpuAllocatorConfig { dedicated_own_arenas: true, ..GpuAllocatorConfig::default() },
    )?;
    let mut cases: Vec<(u64, bool)> = sizes.iter().map(|&s| (s, false)).collect();
    cases.extend(sizes.last().map(|&s| (s, true)));
    for (size, dedicated_case) in cases {
        let buffer = if dedicated_case {
            dedicated.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?
        } else if size >= GIB {
            b.exportable.allocate(size, GpuMemoryKind::DeviceLocal)?
        } else {
            b.exportable.allocate_unpooled(size, GpuMemoryKind::DeviceLocal)?
        };
        let cuda = b.cuda();
        let cuda_memory = cuda.and_then(|c| {
            let memory = c.alloc(size as usize)?;
            let handle = c.ipc_handle(&memory)?;
            Ok((memory, handle))
        });
        let mut results: Vec<Value> = Vec::new();
        let mut failure = None;
        for i in 0..children {
            let order = if i % 2 == 0 { "lava-flow-first" } else { "driver-first" };
            let attempt = (|| -> Result<Value, String> {
                let (lf, drv) =
                    (buffer.export().map_err(|e| e.to_string())?, buffer.export().map_err(|e| e.to_string())?);
                let (lf_fd, drv_fd) = (inheritable(&lf.fd)?, inheritable(&drv.fd)?);
                let mut args = vec![
                    "import".to_string(),
                    "--uuid".into(),
                    uuid.clone(),
                    "--order".into(),
                    order.into(),
                    "--lf-fd".into(),
                    lf_fd.as_raw_fd().to_string(),
                    "--lf-desc".into(),
                    to_hex(&lf.desc.to_bytes()),
                    "--driver-fd".into(),
                    drv_fd.as_raw_fd().to_string(),
                    "--driver-desc".into(),
                    to_hex(&drv.desc.to_bytes()),
                ];
                if let Ok((_, handle)) = &cuda_memory {
                    args.extend(["--cuda-ipc".to_string(), to_hex(handle)]);
                }
                let reply = run_child(&args);
                drop((lf_fd, drv_fd, lf, drv));
                reply
            })();
            match attempt {
                Ok(v) => results.push(v),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let pick = |key: &str, order: Option<&str>| -> Vec<f64> {
            results.iter().filter(|v| order.map_or(true, |o| v["order"] == o)).filter_map(|v| v[key].as_f64()).collect()
        };
        let first = |key: &str, order: &str| -> Result<f64, String> {
            if let Some(e) = &failure {
                return Err(format!("the import child failed: {e}"));
            }
            let v = pick(key, Some(order));
            if v.is_empty() {
                let why = results.iter().find_map(|r| r[format!("{key}_error")].as_str()).unwrap_or("no sample");
                return Err(why.to_string());
            }
            Ok(median(&v) / 1000.0)
        };
        let lf_ms = first("lava_flow_import_us", "lava-flow-first");
        let drv_ms = first("driver_import_us", "driver-first");
        let lf_second_ms = first("lava_flow_import_us", "driver-first");
        let drv_second_ms = first("driver_import_us", "lava-flow-first");
        let cuda_ms: Result<f64, String> = match (&cuda_memory, &failure) {
            (Err(e), _) => Err(e.clone()),
            (_, Some(e)) => Err(format!("the import child failed: {e}")),
            (Ok(_), None) => {
                let v = pick("cuda_ipc_open_us", None);
                if v.is_empty() {
                    Err(results
                        .iter()
                        .find_map(|r| r["cuda_ipc_open_us_error"].as_str())
                        .unwrap_or("no sample")
                        .to_string())
                } else {
                    Ok(median(&v) / 1000.0)
                }
            }
        };
        let adds = match (&lf_ms, &drv_ms) {
            (Ok(l), Ok(d)) => Ok(l - d),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        let ratio = match (&lf_ms, &cuda_ms) {
            (Ok(l), Ok(c)) => Ok(l / c),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        let show = |r: &Result<f64, String>| match r {
            Ok(ms) => format!("{ms:8.3} ms"),
            Err(e) => format!("unavailable: {}", brief(e)),
        };
        b.say(format!(
            "  {} (arena {}, dedicated: {}):",
            size_name(size),
            size_name(buffer.arena_size()),
            buffer.is_dedicated()
        ));
        b.say(format!("    lava-flow GpuImporter::import, first in the process   {}", show(&lf_ms)));
        b.say(format!("    driver alone (raw Vulkan import), first in the process {}", show(&drv_ms)));
        b.say(format!("    what lava-flow adds                                   {}", show(&adds)));
        b.say(format!("    cuIpcOpenMemHandle                                    {}", show(&cuda_ms)));
        if let Ok(r) = &ratio {
            b.say(format!("    ratio lava-flow / cuIpcOpenMemHandle                  {r:8.2}x"));
        }
        b.say(format!(
            "    (second in the process: lava-flow {}, driver {})",
            show(&lf_second_ms).trim(),
            show(&drv_second_ms).trim()
        ));
        let j = |r: &Result<f64, String>| match r {
            Ok(v) => num(*v),
            Err(e) => json!({ "unavailable": e }),
        };
        rows.push(json!({
            "size": size,
            "arena_size": buffer.arena_size(),
            "dedicated": buffer.is_dedicated(),
            "children": results.len(),
            "lava_flow_import_ms": j(&lf_ms),
            "driver_import_ms": j(&drv_ms),
            "lava_flow_adds_ms": j(&adds),
            "cuda_ipc_open_ms": j(&cuda_ms),
            "ratio_lava_flow_to_cuda_ipc": j(&ratio),
            "second_in_process": { "lava_flow_import_ms": j(&lf_second_ms), "driver_import_ms": j(&drv_second_ms) },
            "raw": results,
        }));
        if !dedicated_case {
            summary.lava_flow_ms.push((size, lf_ms));
        }
        drop((cuda_memory, buffer));
        b.exportable.trim();
    }
    Ok((json!({ "rows": rows }), summary))
}

/// An export whose fd this process inherited: `--<name>-fd N --<name>-desc HEX`.
fn inherited_export(args: &ChildArgs, name: &str) -> Result<GpuExport, String> {
    let (fd, desc) = if name == "lf" { (&args.lf_fd, &args.lf_desc) } else { (&args.driver_fd, &args.driver_desc) };
    let desc = GpuExportDesc::from_bytes(&from_hex(ChildArgs::need(desc, &format!("--{name}-desc"))?)?)
        .map_err(|e| e.to_string())?;
    let fd = *ChildArgs::need(fd, &format!("--{name}-fd"))?;
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails for a closed number.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!("--{name}-fd {fd} is not an open descriptor of this process"));
    }
    // SAFETY: the parent passed this descriptor to this process for this export alone;
    // nothing else here owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    GpuExport::from_parts(desc, fd).map_err(|e| e.to_string())
}

/// The raw Vulkan objects of the driver-only import, destroyed on drop.
struct RawImport<'d> {
    device: &'d ash::Device,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

impl Drop for RawImport<'_> {
    fn drop(&mut self) {
        // SAFETY: both objects were made on this device by `raw_import`, no GPU work uses
        // them, and each is destroyed once (null handles are ignored by Vulkan).
        unsafe {
            self.device.destroy_buffer(self.buffer, None);
            self.device.free_memory(self.memory, None);
        }
    }
}

/// The import as the driver alone does it: what lava-flow's import needs at the least.
fn raw_import<'d>(device: &'d VulkanDevice, export: GpuExport) -> Result<RawImport<'d>, String> {
    let d = device.ash_device();
    let GpuExport { desc, fd } = export;
    let handle = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
    // A dedicated allocation is imported with a buffer like the exporter's: the whole
    // allocation. Otherwise a buffer of the export's size at its offset.
    let (size, at) = if desc.is_dedicated() { (desc.arena_size, 0) } else { (desc.size, desc.offset) };
    let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(
            vk::BufferUsageFlags::TRANSFER_SRC
                | vk::BufferUsageFlags::TRANSFER_DST
                | vk::BufferUsageFlags::STORAGE_BUFFER,
        )
        .sharing_mode(vk::SharingMode::EXCLUSIVE)
        .push_next(&mut external);
    // SAFETY: the create info chain lives through the call.
    let buffer = unsafe { d.create_buffer(&info, None) }.map_err(|r| format!("vkCreateBuffer: {r}"))?;
    let mut raw = RawImport { device: d, buffer, memory: vk::DeviceMemory::null() };
    // SAFETY: buffer is a live buffer of this device.
    let requirements = unsafe { d.get_buffer_memory_requirements(buffer) };
    if requirements.memory_type_bits & (1 << desc.memory_type_index) == 0 {
        return Err(format!("memory type {} does not suit the buffer here", desc.memory_type_index));
    }
    let mut import = vk::ImportMemoryFdInfoKHR::default().handle_type(handle).fd(fd.as_raw_fd());
    let mut dedicated = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
    let mut allocate = vk::MemoryAllocateInfo::default()
        .allocation_size(desc.arena_size)
        .memory_type_index(desc.memory_type_index)
        .push_next(&mut import);
    if desc.is_dedicated() {
        allocate = allocate.push_next(&mut dedicated);
    }
    // SAFETY: the chain lives through the call; the export comes from the same GPU and driver
    // (the parent opened this device by its UUID) and names the exporter's memory type and size.
    raw.memory =
        unsafe { d.allocate_memory(&allocate, None) }.map_err(|r| format!("vkAllocateMemory (import): {r}"))?;
    // Vulkan owns the descriptor now and closes it with the memory.
    let _ = fd.into_raw_fd();
    // SAFETY: both are live; `at` is 0 or the export's offset, which the exporter bound a
    // buffer of the same usage at.
    unsafe { d.bind_buffer_memory(buffer, raw.memory, at) }.map_err(|r| format!("vkBindBufferMemory: {r}"))?;
    Ok(raw)
}

/// `--child import ...`: see the module's documentation. Prints the timings as JSON; a part
/// that fails is reported as `<key>_error` and the others still run.
pub fn child_import(args: &ChildArgs) -> Result<(), String> {
    let order = ChildArgs::need(&args.order, "--order")?.clone();
    let lf_export = inherited_export(args, "lf")?;
    let driver_export = inherited_export(args, "driver")?;
    let cuda_handle = match &args.cuda_ipc {
        Some(hex) => Some(
            <[u8; IPC_HANDLE_SIZE]>::try_from(from_hex(hex)?)
                .map_err(|_| format!("--cuda-ipc needs {IPC_HANDLE_SIZE} bytes"))?,
        ),
        None => None,
    };
    let device = child_device(args)?;
    let mut reply = serde_json::Map::new();
    reply.insert("order".into(), json!(order));
    let mut record = |key: &str, result: Result<f64, String>| match result {
        Ok(v) => {
            reply.insert(key.into(), json!(v));
        }
        Err(e) => {
            reply.insert(format!("{key}_error"), json!(e));
        }
    };
    let mut lf = Some(lf_export);
    let mut drv = Some(driver_export);
    let mut kept_lf = None;
    let mut kept_raw = None;
    let steps = if order == "driver-first" { ["driver", "lava-flow"] } else { ["lava-flow", "driver"] };
    for step in steps {
        if step == "lava-flow" {
            let export = lf.take().expect("once");
            let start = Instant::now();
            let imported = GpuImporter::new(&device).import(export);
            let t = us(start.elapsed());
            record("lava_flow_import_us", imported.as_ref().map(|_| t).map_err(|e| e.to_string()));
            kept_lf = imported.ok();
        } else {
            let export = drv.take().expect("once");
            let start = Instant::now();
            let imported = raw_import(&device, export);
            let t = us(start.elapsed());
            record("driver_import_us", imported.as_ref().map(|_| t).map_err(Clone::clone));
            kept_raw = imported.ok();
        }
    }
    if let Some(handle) = cuda_handle {
        let opened = Cuda::open(&device.device_uuid()).and_then(|cuda| {
            let start = Instant::now();
            let memory = cuda.ipc_open(&handle)?;
            let t = us(start.elapsed());
            drop(memory);
            Ok(t)
        });
        record("cuda_ipc_open_us", opened);
    }
    drop((kept_lf, kept_raw));
    child_reply(&Value::Object(reply));
    Ok(())
}
