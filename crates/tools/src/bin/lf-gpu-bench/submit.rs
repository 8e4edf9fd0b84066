//! The cost of one synchronous GPU round trip, taken apart (for information): what the
//! Vulkan driver alone takes to run a submission and report it done, against lava-flow's
//! copies of the same sizes and CUDA's. A small copy costs this much whatever its size, so
//! it bounds the speed of copies up to a few MiB.
//!
//! The raw cases use their own command pool, fence and semaphore on the device's queue (the
//! one lava-flow submits on: the bench is single-threaded, so no two submissions race).

use std::time::Instant;

use ash::vk;
use lava_flow::memory::gpu::{copy_buffer, copy_buffer_timed, CopyTiming, GpuBuffer, GpuMemoryKind};
use lava_flow::Error;
use serde_json::{json, Value};

use crate::util::{block, median, num, percentile, size_name, MIB, ROUNDS};
use crate::Bench;

/// The raw Vulkan objects of the probe.
struct Raw<'a> {
    d: &'a ash::Device,
    queue: vk::Queue,
    pool: vk::CommandPool,
    /// Recorded once: a copy of `len` bytes between the two buffers.
    recorded: vk::CommandBuffer,
    /// Recorded before each submission.
    fresh: vk::CommandBuffer,
    fence: vk::Fence,
    timeline: vk::Semaphore,
    value: u64,
    region: vk::BufferCopy,
    buffers: (vk::Buffer, vk::Buffer),
}

fn vk_err(what: &'static str) -> impl Fn(vk::Result) -> Error {
    move |r| Error::Vulkan(format!("{what}: {r}"))
}

impl<'a> Raw<'a> {
    fn new(b: &'a Bench, src: &GpuBuffer, dst: &GpuBuffer, len: u64) -> Result<Self, Error> {
        let d = b.device.ash_device();
        let family = b.device.info().queue_family_index;
        // SAFETY: objects made on the live device, destroyed in Drop once idle; the queue
        // was created with the device (family, index 0).
        unsafe {
            let queue = d.get_device_queue(family, 0);
            let pool = d
                .create_command_pool(
                    &vk::CommandPoolCreateInfo::default()
                        .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
                        .queue_family_index(family),
                    None,
                )
                .map_err(vk_err("vkCreateCommandPool"))?;
            let mut raw = Raw {
                d,
                queue,
                pool,
                recorded: vk::CommandBuffer::null(),
                fresh: vk::CommandBuffer::null(),
                fence: vk::Fence::null(),
                timeline: vk::Semaphore::null(),
                value: 0,
                region: vk::BufferCopy {
                    src_offset: src.raw_buffer_offset(),
                    dst_offset: dst.raw_buffer_offset(),
                    size: len,
                },
                buffers: (src.raw_buffer(), dst.raw_buffer()),
            };
            let cmds = d
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default().command_pool(pool).command_buffer_count(2),
                )
                .map_err(vk_err("vkAllocateCommandBuffers"))?;
            (raw.recorded, raw.fresh) = (cmds[0], cmds[1]);
            raw.fence = d.create_fence(&vk::FenceCreateInfo::default(), None).map_err(vk_err("vkCreateFence"))?;
            let mut kind = vk::SemaphoreTypeCreateInfo::default().semaphore_type(vk::SemaphoreType::TIMELINE);
            raw.timeline = d
                .create_semaphore(&vk::SemaphoreCreateInfo::default().push_next(&mut kind), None)
                .map_err(vk_err("vkCreateSemaphore (timeline)"))?;
            raw.record(raw.recorded, vk::CommandBufferUsageFlags::empty(), Barriers::None)?;
            Ok(raw)
        }
    }

    /// Records the copy into `cmd`, between barriers as `barriers` says.
    unsafe fn record(
        &self,
        cmd: vk::CommandBuffer,
        flags: vk::CommandBufferUsageFlags,
        barriers: Barriers,
    ) -> Result<(), Error> {
        use vk::AccessFlags as A;
        use vk::PipelineStageFlags as S;
        let d = self.d;
        d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty()).map_err(vk_err("vkResetCommandBuffer"))?;
        d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default().flags(flags))
            .map_err(vk_err("vkBeginCommandBuffer"))?;
        if matches!(barriers, Barriers::Before | Barriers::Both) {
            let before = [vk::MemoryBarrier::default()
                .src_access_mask(A::HOST_WRITE | A::TRANSFER_WRITE)
                .dst_access_mask(A::TRANSFER_READ | A::TRANSFER_WRITE)];
            d.cmd_pipeline_barrier(
                cmd,
                S::HOST | S::TRANSFER,
                S::TRANSFER,
                vk::DependencyFlags::empty(),
                &before,
                &[],
                &[],
            );
        }
        d.cmd_copy_buffer(cmd, self.buffers.0, self.buffers.1, &[self.region]);
        if matches!(barriers, Barriers::After | Barriers::Both) {
            let after = [vk::MemoryBarrier::default()
                .src_access_mask(A::TRANSFER_WRITE)
                .dst_access_mask(A::HOST_READ | A::HOST_WRITE)];
            d.cmd_pipeline_barrier(cmd, S::TRANSFER, S::HOST, vk::DependencyFlags::empty(), &after, &[], &[]);
        }
        d.end_command_buffer(cmd).map_err(vk_err("vkEndCommandBuffer"))
    }

    /// One submission of `cmd` (none: an empty submission), waited for as `wait` says;
    /// returns how long `vkQueueSubmit` itself took (µs).
    fn round_trip(&mut self, cmd: Option<vk::CommandBuffer>, wait: Wait) -> Result<f64, Error> {
        let d = self.d;
        let cmds: Vec<vk::CommandBuffer> = cmd.into_iter().collect();
        // SAFETY: every submission is waited for before the next, so no command buffer is
        // pending when reused and the fence is unsignalled when submitted.
        unsafe {
            match wait {
                Wait::FenceSpin | Wait::FenceSleep => {
                    let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
                    let start = Instant::now();
                    d.queue_submit(self.queue, &submit, self.fence).map_err(vk_err("vkQueueSubmit"))?;
                    let submitted = start.elapsed().as_secs_f64() * 1e6;
                    if wait == Wait::FenceSpin {
                        while !d.get_fence_status(self.fence).map_err(vk_err("vkGetFenceStatus"))? {
                            std::hint::spin_loop();
                        }
                    } else {
                        d.wait_for_fences(&[self.fence], true, u64::MAX).map_err(vk_err("vkWaitForFences"))?;
                    }
                    d.reset_fences(&[self.fence]).map_err(vk_err("vkResetFences"))?;
                    Ok(submitted)
                }
                Wait::TimelineSpin | Wait::TimelineChained => {
                    self.value += 1;
                    let values = [self.value];
                    let semaphores = [self.timeline];
                    let earlier = [self.value - 1];
                    let stages = [vk::PipelineStageFlags::ALL_COMMANDS];
                    let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
                    let mut submit_info =
                        vk::SubmitInfo::default().command_buffers(&cmds).signal_semaphores(&semaphores);
                    if wait == Wait::TimelineChained {
                        timeline = timeline.wait_semaphore_values(&earlier);
                        submit_info = submit_info.wait_semaphores(&semaphores).wait_dst_stage_mask(&stages);
                    }
                    let submit = [submit_info.push_next(&mut timeline)];
                    let start = Instant::now();
                    d.queue_submit(self.queue, &submit, vk::Fence::null()).map_err(vk_err("vkQueueSubmit"))?;
                    let submitted = start.elapsed().as_secs_f64() * 1e6;
                    while d.get_semaphore_counter_value(self.timeline).map_err(vk_err("vkGetSemaphoreCounterValue"))?
                        < self.value
                    {
                        std::hint::spin_loop();
                    }
                    Ok(submitted)
                }
            }
        }
    }
}

impl Drop for Raw<'_> {
    fn drop(&mut self) {
        // SAFETY: the queue is idled first, so nothing made here is in use.
        unsafe {
            let _ = self.d.queue_wait_idle(self.queue);
            self.d.destroy_semaphore(self.timeline, None);
            self.d.destroy_fence(self.fence, None);
            self.d.destroy_command_pool(self.pool, None);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    FenceSpin,
    FenceSleep,
    TimelineSpin,
    /// Waits on the previous submission's value (a memory dependency between the two, in
    /// place of a barrier) and signals the next; the host polls.
    TimelineChained,
}

/// The barriers around a raw copy: lava-flow's (host writes and earlier copies before it, the
/// copy before host access), or some of them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Barriers {
    None,
    Before,
    After,
    Both,
}

#[derive(Clone, Copy)]
enum Case {
    SubmitCall,
    Empty(Wait),
    Recorded(Wait),
    RecordEach(Barriers),
    /// Recorded each time with no barrier, chained to the previous submission by the timeline.
    RecordChained,
    Lf,
    /// Wall time less the GPU timestamps' time of the same copies.
    LfOverGpu,
    Cuda,
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::SubmitCall => "the vkQueueSubmit call alone (empty submission)",
            Case::Empty(Wait::FenceSpin) => "empty vkQueueSubmit, fence polled",
            Case::Empty(Wait::FenceSleep) => "empty vkQueueSubmit, vkWaitForFences",
            Case::Empty(Wait::TimelineSpin | Wait::TimelineChained) => "empty vkQueueSubmit, timeline semaphore polled",
            Case::Recorded(Wait::FenceSpin) => "copy recorded once, fence polled",
            Case::Recorded(Wait::FenceSleep) => "copy recorded once, vkWaitForFences",
            Case::Recorded(Wait::TimelineSpin | Wait::TimelineChained) => {
                "copy recorded once, timeline semaphore polled"
            }
            Case::RecordEach(Barriers::None) => "copy recorded each time, fence polled",
            Case::RecordEach(Barriers::Before) => "  + lava-flow's barrier before",
            Case::RecordEach(Barriers::After) => "  + lava-flow's barrier after",
            Case::RecordEach(Barriers::Both) => "  + both barriers",
            Case::RecordChained => "  no barrier, chained by a timeline semaphore",
            Case::Lf => "lava-flow copy_buffer",
            Case::LfOverGpu => "lava-flow copy_buffer_timed, wall less GPU time",
            Case::Cuda => "cuMemcpyDtoD + cuCtxSynchronize",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Case::SubmitCall => "submit_call",
            Case::Empty(Wait::FenceSpin) => "empty_fence_poll",
            Case::Empty(Wait::FenceSleep) => "empty_fence_wait",
            Case::Empty(Wait::TimelineSpin | Wait::TimelineChained) => "empty_timeline_poll",
            Case::Recorded(Wait::FenceSpin) => "recorded_fence_poll",
            Case::Recorded(Wait::FenceSleep) => "recorded_fence_wait",
            Case::Recorded(Wait::TimelineSpin | Wait::TimelineChained) => "recorded_timeline_poll",
            Case::RecordEach(Barriers::None) => "record_each_fence_poll",
            Case::RecordEach(Barriers::Before) => "record_each_barrier_before",
            Case::RecordEach(Barriers::After) => "record_each_barrier_after",
            Case::RecordEach(Barriers::Both) => "record_each_barriers",
            Case::RecordChained => "record_each_timeline_chained",
            Case::Lf => "lf_copy_buffer",
            Case::LfOverGpu => "lf_wall_less_gpu",
            Case::Cuda => "cuda_memcpy_dtod",
        }
    }
}

const CASES: [Case; 15] = [
    Case::SubmitCall,
    Case::Empty(Wait::FenceSpin),
    Case::Empty(Wait::FenceSleep),
    Case::Empty(Wait::TimelineSpin),
    Case::Recorded(Wait::FenceSpin),
    Case::Recorded(Wait::FenceSleep),
    Case::Recorded(Wait::TimelineSpin),
    Case::RecordEach(Barriers::None),
    Case::RecordEach(Barriers::Before),
    Case::RecordEach(Barriers::After),
    Case::RecordEach(Barriers::Both),
    Case::RecordChained,
    Case::Lf,
    Case::LfOverGpu,
    Case::Cuda,
];

pub fn run(b: &Bench) -> Result<(Value, ()), Error> {
    let reps = b.o.reps.map(|r| r * 10).unwrap_or(if b.o.quick { 40 } else { 400 });
    b.say("\nOne synchronous round trip on the GPU, taken apart (for information): host wall time per call,");
    b.say("p50 / p10 in µs; the raw cases submit on the same queue as lava-flow, their copies are engine copies (vkCmdCopyBuffer);");
    b.say("lava-flow's copies are made as Auto chooses");
    let mut sizes_json = Vec::new();
    for len in [16, MIB, 64 * MIB] {
        let src = b.exportable.allocate(len.max(MIB), GpuMemoryKind::DeviceLocal)?;
        let dst = b.exportable.allocate(len.max(MIB), GpuMemoryKind::DeviceLocal)?;
        let mut raw = Raw::new(b, &src, &dst, len)?;
        let cuda = b.cuda().and_then(|c| Ok((c, c.alloc(len as usize)?, c.alloc(len as usize)?)));
        // Random bytes in every source (see `d2d::noise`).
        let bytes = crate::d2d::noise(len.max(MIB) as usize);
        src.write(0, &bytes)?;
        if let Ok((c, from, _)) = &cuda {
            c.copy_htod(from, &bytes[..len as usize]).map_err(Error::Unsupported)?;
        }
        let mut samples: Vec<Result<Vec<f64>, String>> = vec![Ok(Vec::new()); CASES.len()];
        for round in 0..ROUNDS {
            for (case, s) in CASES.iter().zip(samples.iter_mut()) {
                for (_, untimed) in block(reps, round) {
                    let Ok(v) = s else { break };
                    let start = Instant::now();
                    // Some cases say what to count instead of the wall time.
                    let done: Result<Option<f64>, String> = match case {
                        Case::SubmitCall => raw.round_trip(None, Wait::FenceSpin).map(Some).map_err(|e| e.to_string()),
                        Case::Empty(wait) => raw.round_trip(None, *wait).map(|_| None).map_err(|e| e.to_string()),
                        Case::Recorded(wait) => {
                            raw.round_trip(Some(raw.recorded), *wait).map(|_| None).map_err(|e| e.to_string())
                        }
                        Case::RecordEach(barriers) => {
                            // SAFETY: `fresh` is not pending (every round trip is waited for).
                            unsafe { raw.record(raw.fresh, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, *barriers) }
                                .and_then(|()| raw.round_trip(Some(raw.fresh), Wait::FenceSpin))
                                .map(|_| None)
                                .map_err(|e| e.to_string())
                        }
                        Case::RecordChained => {
                            // SAFETY: as above.
                            unsafe {
                                raw.record(raw.fresh, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT, Barriers::None)
                            }
                            .and_then(|()| raw.round_trip(Some(raw.fresh), Wait::TimelineChained))
                            .map(|_| None)
                            .map_err(|e| e.to_string())
                        }
                        Case::Lf => copy_buffer(&src, 0, &dst, 0, len).map(|()| None).map_err(|e| e.to_string()),
                        Case::LfOverGpu => match copy_buffer_timed(&src, 0, &dst, 0, len) {
                            Ok(CopyTiming { wall, gpu: Some(gpu), .. }) => {
                                Ok(Some((wall - gpu.min(wall)).as_secs_f64() * 1e6))
                            }
                            Ok(_) => Err("the queue has no timestamps".into()),
                            Err(e) => Err(e.to_string()),
                        },
                        Case::Cuda => match &cuda {
                            Ok((c, s, d)) => c.copy_dtod(d, s, len as usize).map(|()| None),
                            Err(e) => Err(e.clone()),
                        },
                    };
                    let took = start.elapsed().as_secs_f64() * 1e6;
                    match done {
                        Ok(counted) if !untimed => v.push(counted.unwrap_or(took)),
                        Ok(_) => {}
                        Err(e) => *s = Err(e),
                    }
                }
            }
        }
        let name = size_name(len);
        b.say(format!("  {name}:"));
        let mut cases_json = serde_json::Map::new();
        for (case, s) in CASES.iter().zip(&samples) {
            match s {
                Ok(v) => {
                    let (p50, p10) = (median(v), percentile(v, 0.1));
                    b.say(format!("    {:<48} {p50:8.2} / {p10:8.2}", case.label()));
                    cases_json.insert(case.key().into(), json!({ "p50_us": num(p50), "p10_us": num(p10) }));
                }
                Err(e) => {
                    b.say(format!("    {:<48} unavailable: {e}", case.label()));
                    cases_json.insert(case.key().into(), json!({ "unavailable": e }));
                }
            }
        }
        sizes_json.push(json!({ "size": len, "cases": cases_json }));
    }
    Ok((json!({ "reps": reps, "sizes": sizes_json }), ()))
}
