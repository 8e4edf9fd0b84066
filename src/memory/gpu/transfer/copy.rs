//! Copies between GPU buffers ([`copy_buffer`] and its variants): the choice of method
//! (engine, shader or CUDA) and the submissions that make them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use super::submitter::{transfer_queue, ShaderState, Submitter};
use crate::error::{Error, Result};
use crate::memory::gpu::allocator::GpuBuffer;
use crate::memory::gpu::copy_method::{CopyMethod, GPU_COPY_ENV};
use crate::memory::gpu::cuda::{cuda_copy, cuda_in_use, CudaArena};
use crate::memory::gpu::device::{vk_err, DeviceType, VulkanDevice};
use crate::memory::gpu::semaphore::TimelineSemaphore;
use crate::memory::gpu::shader_copy::{self, ShaderCopy, SETS_PER_SUBMIT};

/// How long a timed copy took.
#[derive(Clone, Copy, Debug)]
pub struct CopyTiming {
    /// From submission to the fence wait returning, as the host sees it.
    pub wall: Duration,
    /// Between GPU timestamps around the copy, where the queue has timestamps.
    pub gpu: Option<Duration>,
    /// How the copy was made: `Engine`, or `Shader` where the shader moved the bulk of it.
    pub method: CopyMethod,
}

impl Submitter {
    /// The copy shader's pipelines, made on first use; why they cannot be made otherwise.
    fn shader_copy(&mut self, device: &VulkanDevice) -> std::result::Result<ShaderCopy, String> {
        if let ShaderState::Untried = self.shader {
            self.shader = match ShaderCopy::new(device) {
                Ok(shader) => ShaderState::Ready(shader),
                Err(why) => {
                    let info = device.info();
                    log::info!(
                        "Vulkan device {} ({}) cannot run lava-flow's copy shader ({why}): copies between GPU buffers \
                         use its copy engine, which moves large copies more slowly on GPUs. Update the GPU driver, or \
                         set {GPU_COPY_ENV}=engine to choose the copy engine explicitly",
                        info.index,
                        info.name
                    );
                    ShaderState::Unavailable(why)
                }
            };
        }
        match &self.shader {
            ShaderState::Ready(shader) => Ok(*shader),
            ShaderState::Unavailable(why) => Err(why.clone()),
            ShaderState::Untried => unreachable!("set above"),
        }
    }

    /// One submission of a copy: the engine's `regions`, and `dispatches` of the copy shader
    /// (with `width`) from `src` to `dst`, after the regions are done where `engine_first`;
    /// waits for it. `timed`: between GPU timestamps. `dst_host_visible`: the host may access
    /// the destination.
    #[allow(clippy::too_many_arguments)]
    fn submit_copy(
        &mut self,
        device: &VulkanDevice,
        timed: bool,
        waits: &[(vk::Semaphore, u64)],
        (src, dst, dst_host_visible): (vk::Buffer, vk::Buffer, bool),
        regions: &[vk::BufferCopy],
        shader: Option<&ShaderCopy>,
        (width, dispatches, engine_first): (shader_copy::Width, &[shader_copy::Dispatch], bool),
    ) -> Result<Option<Duration>> {
        self.check_usable(device)?;
        let sets = match shader.filter(|_| !dispatches.is_empty()) {
            // SAFETY: no submission is pending (each is waited for, and `hung` was checked), so
            // the pool's sets are free; both buffers are live, made with STORAGE_BUFFER usage
            // (BUFFER_USAGE, see the device), and cover the planned ranges.
            Some(shader) => unsafe { shader.prepare(&device.shared.device, src, dst, dispatches) }
                .map_err(vk_err("descriptor sets for the copy shader"))?,
            None => Vec::new(),
        };
        self.submit(device, timed, waits, !sets.is_empty(), dst_host_visible, |d, cmd| {
            // SAFETY: both buffers are live for the submission, which is waited for; the
            // regions and dispatches lie in them (checked by the caller).
            unsafe {
                if !regions.is_empty() {
                    d.cmd_copy_buffer(cmd, src, dst, regions);
                }
                if engine_first && !regions.is_empty() && !sets.is_empty() {
                    let done = [vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)
                        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
                    let (from, to) = (vk::PipelineStageFlags::TRANSFER, vk::PipelineStageFlags::COMPUTE_SHADER);
                    d.cmd_pipeline_barrier(cmd, from, to, vk::DependencyFlags::empty(), &done, &[], &[]);
                }
                if let Some(shader) = shader.filter(|_| !sets.is_empty()) {
                    shader.record(d, cmd, width, dispatches, &sets);
                }
            }
        })
    }
}

/// The smallest copy that [`CopyMethod::Auto`] gives the shader on a GPU: below it the copy
/// engine, which needs no descriptor sets or shader launch, is as fast. A first guess, to be
/// tuned by measuring both methods on the GPU (`lf-gpu-bench` compares them by size).
pub const SHADER_COPY_MIN: u64 = 1 << 20;

/// Who decided a copy's method.
#[derive(Clone, Copy, PartialEq)]
enum Decided {
    /// [`CopyMethod::Auto`], by size, device and whether the process uses CUDA.
    Auto,
    /// The caller, asking for `Engine`, `Shader` or `Cuda`.
    Caller,
    /// [`GPU_COPY_ENV`].
    Env,
}

/// The method a copy of `len` bytes from `src` to `dst` asked to be made by `method` is made
/// by (`Shader` before alignment, which may leave it to the engine), and who decided.
/// `vulkan_only`: the copy waits on semaphores, which CUDA's copy cannot, or CUDA cannot take
/// the buffers. Such copies, and copies that involve host memory, are Vulkan's whatever was
/// asked, by the choice `Auto` makes.
fn resolve(src: &GpuBuffer, dst: &GpuBuffer, len: u64, method: CopyMethod, vulkan_only: bool) -> (CopyMethod, Decided) {
    let device = src.device();
    let (method, decided) = match (method, device.shared.copy_method) {
        (CopyMethod::Auto, CopyMethod::Auto) => (CopyMethod::Auto, Decided::Auto),
        (CopyMethod::Auto, forced) => (forced, Decided::Env),
        (asked, _) => (asked, Decided::Caller),
    };
    // The gains of the shader and of CUDA are the GPU memory's bandwidth and latency: host
    // memory (host-visible arenas, imported host pointers) is the copy engine's.
    let local = |b: &GpuBuffer| b.arena.property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL);
    let both_local = local(src) && local(dst);
    // On CPU devices (lavapipe) the engine is a memcpy, which the shader would only slow.
    let gpu = device.info().device_type != DeviceType::Cpu;
    let vulkan = if gpu && both_local && len >= SHADER_COPY_MIN { CopyMethod::Shader } else { CopyMethod::Engine };
    let cuda_may = !vulkan_only && both_local;
    match method {
        CopyMethod::Auto if cuda_may && gpu && copies_by_cuda(device) => (CopyMethod::Cuda, Decided::Auto),
        CopyMethod::Auto => (vulkan, Decided::Auto),
        CopyMethod::Cuda if !cuda_may => (vulkan, Decided::Auto),
        chosen => (chosen, decided),
    }
}

/// Whether [`CopyMethod::Auto`] copies between `DEVICE_LOCAL` buffers of `device` go through
/// CUDA now: the process uses CUDA on the device (libcuda is loaded and the device's primary
/// context is active). Once true, true for the rest of the process.
pub fn copies_by_cuda(device: &VulkanDevice) -> bool {
    cuda_in_use(device.info().device_uuid)
}

/// The shader's pipelines and the plan of a copy (offsets in the `VkBuffer`s) where the
/// shader makes it, `None` where the engine makes it alone; an error where the shader was
/// asked for or forced and the device cannot run it.
fn shader_plan(
    submitter: &mut Submitter,
    device: &VulkanDevice,
    (from, to, len): (u64, u64, u64),
    (method, decided): (CopyMethod, Decided),
) -> Result<Option<(ShaderCopy, shader_copy::Plan)>> {
    if method != CopyMethod::Shader {
        return Ok(None);
    }
    let shader = match (submitter.shader_copy(device), decided) {
        (Ok(shader), _) => shader,
        (Err(_), Decided::Auto) => return Ok(None),
        (Err(why), Decided::Caller) => {
            return Err(Error::Unsupported(format!(
                "a shader copy was asked for, but Vulkan device {} cannot make them: {why}; copy with \
                 CopyMethod::Engine or Auto instead",
                device.info().name
            )))
        }
        (Err(why), Decided::Env) => {
            return Err(Error::Unsupported(format!(
                "{GPU_COPY_ENV}=shader forces shader copies, but Vulkan device {} cannot make them: {why}; \
                 unset {GPU_COPY_ENV} or set it to auto or engine",
                device.info().name
            )))
        }
    };
    Ok(shader_copy::plan(from, to, len, &shader.limits).map(|plan| (shader, plan)))
}

/// How [`copy_buffer`] would make this copy (the arguments are its own): `Cuda`, `Engine` or
/// `Shader` (the shader moving the bulk, the engine perhaps a few bytes at the ends), as
/// [`CopyTiming::method`] reports it. `Engine` also where [`GPU_COPY_ENV`] forces a method
/// the device cannot make (the copy fails then). Makes the shader's pipelines, or imports the
/// buffers' arenas into CUDA, if not done yet, to know whether they can be.
pub fn chosen_copy_method(src: &GpuBuffer, src_offset: u64, dst: &GpuBuffer, dst_offset: u64, len: u64) -> CopyMethod {
    let Ok(queue) = transfer_queue(src.device()) else { return CopyMethod::Engine };
    let mut submitter = queue.0.lock();
    let mut resolved = resolve(src, dst, len, CopyMethod::Auto, false);
    if resolved.0 == CopyMethod::Cuda {
        match cuda_arenas(src, dst) {
            Ok(_) => return CopyMethod::Cuda,
            Err(_) if resolved.1 == Decided::Auto => resolved = resolve(src, dst, len, CopyMethod::Auto, true),
            Err(_) => return CopyMethod::Engine,
        }
    }
    let (from, to) = (src.vk_offset + src_offset, dst.vk_offset + dst_offset);
    match shader_plan(&mut submitter, src.device(), (from, to, len), resolved) {
        Ok(Some(_)) => CopyMethod::Shader,
        _ => CopyMethod::Engine,
    }
}

/// The two buffers' arenas imported into CUDA, or why they cannot be.
fn cuda_arenas<'a>(
    src: &'a GpuBuffer,
    dst: &'a GpuBuffer,
) -> std::result::Result<(&'a CudaArena, &'a CudaArena), String> {
    src.arena.cuda().and_then(|s| dst.arena.cuda().map(|d| (s, d))).map_err(str::to_owned)
}

/// Why the device cannot make shader copies (so [`CopyMethod::Auto`] uses the engine), or
/// `None` where it can. Makes the shader's pipelines if they are not made yet.
pub fn shader_copy_unavailable(device: &VulkanDevice) -> Option<String> {
    transfer_queue(device).map_err(|e| e.to_string()).and_then(|queue| queue.0.lock().shader_copy(device)).err()
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` on the GPU,
/// waiting until done. Both buffers must be on the same device; the ranges must not overlap.
/// Made as [`CopyMethod::Auto`] says.
pub fn copy_buffer(src: &GpuBuffer, src_offset: u64, dst: &GpuBuffer, dst_offset: u64, len: u64) -> Result<()> {
    copy_buffer_waiting(src, src_offset, dst, dst_offset, len, &[])
}

/// [`copy_buffer`] whose copy the GPU starts only once every semaphore of `waits` has reached
/// its value (the host does not wait for them; it waits for the copy to finish). The
/// semaphores must be of the buffers' device. A value that is never signalled makes the copy
/// fail after the device's transfer timeout (two minutes), after which the device is
/// unusable: signal every value waited for.
pub fn copy_buffer_waiting(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
    waits: &[(&TimelineSemaphore, u64)],
) -> Result<()> {
    copy_inner(src, src_offset, dst, dst_offset, len, waits, CopyMethod::Auto, false).map(|_| ())
}

/// [`copy_buffer`], also reporting how long it took (host wall time and GPU timestamps).
pub fn copy_buffer_timed(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
) -> Result<CopyTiming> {
    copy_inner(src, src_offset, dst, dst_offset, len, &[], CopyMethod::Auto, true)
}

/// [`copy_buffer_timed`] made by `method`, e.g. to compare the copy engine with the shader
/// (`Engine` and `Shader` here override [`GPU_COPY_ENV`]). `Shader` fails (`Unsupported`,
/// saying why) where the device cannot run the copy shader.
pub fn copy_buffer_timed_with(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
    method: CopyMethod,
) -> Result<CopyTiming> {
    copy_inner(src, src_offset, dst, dst_offset, len, &[], method, true)
}

/// The copy of every variant above; `timed`: between GPU timestamps as well.
#[allow(clippy::too_many_arguments)]
fn copy_inner(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
    waits: &[(&TimelineSemaphore, u64)],
    method: CopyMethod,
    timed: bool,
) -> Result<CopyTiming> {
    if let Some((semaphore, _)) = waits.iter().find(|(s, _)| !s.device().same_device(src.device())) {
        return Err(Error::invalid(format!(
            "a copy on {} cannot wait on a semaphore of another device ({}); import the semaphore on the \
             buffers' device first",
            src.device().info().name,
            semaphore.device().info().name
        )));
    }
    if !src.device().same_device(dst.device()) {
        return Err(Error::invalid(
            "copy between buffers of two different Vulkan devices; import the source on the destination's device first",
        ));
    }
    if len == 0 {
        return Err(Error::invalid("copy of 0 bytes"));
    }
    src.check_range(src_offset, len, "copy source")?;
    dst.check_range(dst_offset, len, "copy destination")?;
    if Arc::ptr_eq(&src.arena, &dst.arena) {
        let a = src.offset + src_offset;
        let b = dst.offset + dst_offset;
        if a < b + len && b < a + len {
            return Err(Error::invalid(format!(
                "copy source [{a}, +{len}) and destination [{b}, +{len}) overlap in arena {}",
                src.arena.id
            )));
        }
    }
    let device = src.device().clone();
    let (from, to) = (src.vk_offset + src_offset, dst.vk_offset + dst_offset);
    let whole = [vk::BufferCopy { src_offset: from, dst_offset: to, size: len }];
    let raw_waits: Vec<(vk::Semaphore, u64)> = waits.iter().map(|(s, v)| (s.raw(), *v)).collect();
    let buffers = (src.buffer, dst.buffer, dst.arena.host_accessible());
    let queue = transfer_queue(&device)?;
    // Held through a copy by CUDA too: no Vulkan transfer of lava-flow's runs meanwhile.
    let mut submitter = queue.0.lock();
    let start = Instant::now();
    let mut resolved = resolve(src, dst, len, method, !waits.is_empty());
    if resolved.0 == CopyMethod::Cuda {
        match (cuda_arenas(src, dst), resolved.1) {
            (Ok((s, d)), _) => {
                cuda_copy(s, src.offset + src_offset, d, dst.offset + dst_offset, len)?;
                return Ok(CopyTiming { wall: start.elapsed(), gpu: None, method: CopyMethod::Cuda });
            }
            (Err(why), Decided::Auto) => {
                crate::logging::log_first!(
                    log::Level::Info,
                    "GPU copies on {} are Vulkan's, not CUDA's, although the process uses CUDA: {why}",
                    device.info().name
                );
                resolved = resolve(src, dst, len, method, true);
            }
            (Err(why), Decided::Caller) => {
                return Err(Error::Unsupported(format!(
                    "a copy by CUDA was asked for, but CUDA cannot take these buffers: {why}; copy with \
                     CopyMethod::Auto, Engine or Shader instead"
                )))
            }
            (Err(why), Decided::Env) => {
                return Err(Error::Unsupported(format!(
                    "{GPU_COPY_ENV}=cuda forces copies by CUDA, but CUDA cannot take these buffers: {why}; unset \
                     {GPU_COPY_ENV} or set it to auto, engine or shader"
                )))
            }
        }
    }
    let plan = shader_plan(&mut submitter, &device, (from, to, len), resolved)?;
    let Some((shader, plan)) = plan else {
        let gpu = submitter.submit_copy(
            &device,
            timed,
            &raw_waits,
            buffers,
            &whole,
            None,
            (shader_copy::Width::Vec4, &[], false),
        )?;
        return Ok(CopyTiming { wall: start.elapsed(), gpu, method: CopyMethod::Engine });
    };
    // One submission per SETS_PER_SUBMIT dispatches, the first with the engine's part and the
    // waits; the host waits for each before recording the next.
    let engine_first = plan.engine_first(src.buffer == dst.buffer);
    let mut gpu = Some(Duration::ZERO);
    for (i, dispatches) in plan.dispatches.chunks(SETS_PER_SUBMIT).enumerate() {
        let (regions, waits) = if i == 0 { (&plan.engine[..], &raw_waits[..]) } else { (&[][..], &[][..]) };
        let shaded = (plan.width, dispatches, engine_first);
        let took = submitter.submit_copy(&device, timed, waits, buffers, regions, Some(&shader), shaded)?;
        gpu = gpu.zip(took).map(|(a, b)| a + b);
    }
    Ok(CopyTiming { wall: start.elapsed(), gpu, method: CopyMethod::Shader })
}
