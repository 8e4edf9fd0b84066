//! The device's transfer queue: the [`Submitter`] that records command buffers, submits them
//! on the device's queue and waits for their fences, and the Vulkan objects it owns (command
//! pool, fences, timestamp queries, staging slots, the copy shader's pipelines).

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::memory::gpu::arena;
use crate::memory::gpu::device::{vk_err, DeviceState, VulkanDevice};
use crate::memory::gpu::shader_copy::ShaderCopy;

/// How long a single transfer may take before the device counts as hung.
pub(super) const FENCE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a fence is polled before the host sleeps on it: a sleeping wait wakes up to a
/// hundred microseconds late, as long as a copy of hundreds of MiB takes on a GPU. After
/// [`FENCE_SPIN`] the poll yields the core between looks.
const FENCE_POLL: Duration = Duration::from_millis(20);
const FENCE_SPIN: Duration = Duration::from_micros(200);

/// Waits for `fence`: polls it for up to [`FENCE_POLL`], then sleeps on it for up to
/// [`FENCE_TIMEOUT`].
pub(super) fn wait_fence(d: &ash::Device, fence: vk::Fence) -> std::result::Result<(), vk::Result> {
    let start = Instant::now();
    loop {
        // SAFETY: the fence is a live fence of this device, submitted with work.
        if unsafe { d.get_fence_status(fence) }? {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= FENCE_POLL {
            break;
        } else if waited >= FENCE_SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    // SAFETY: as above.
    unsafe { d.wait_for_fences(&[fence], true, FENCE_TIMEOUT.as_nanos() as u64) }
}

/// One staging buffer with its own command buffer and fence, so that several pieces of a
/// transfer can be in flight at once.
pub(super) struct Staging {
    pub(super) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub(super) ptr: NonNull<u8>,
    pub(super) size: u64,
    pub(super) cmd: vk::CommandBuffer,
    pub(super) fence: vk::Fence,
}

/// What submitting transfers on the device's queue needs. Lives behind its
/// [`TransferQueue`]'s mutex.
pub(crate) struct Submitter {
    /// Whether the queue runs compute shaders: then earlier submissions may have written
    /// with shaders as well as transfers.
    compute: bool,
    pub(super) pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    timestamps: Option<vk::QueryPool>,
    /// The staging slots, all of one size (made on first use, remade larger when needed).
    pub(super) staging: Vec<Staging>,
    /// Set when a fence wait timed out: the command buffer may still be pending, so it must
    /// not be reused.
    pub(super) hung: bool,
    /// The copy shader's pipelines, made on the first shader copy.
    pub(super) shader: ShaderState,
}

/// Whether the copy shader's pipelines have been made.
pub(super) enum ShaderState {
    Untried,
    Ready(ShaderCopy),
    /// They could not be made: why.
    Unavailable(String),
}

// SAFETY: the only non-Send member is the staging mapping pointer, which is plain memory that
// the Submitter owns; the Submitter is only used under its `TransferQueue`'s mutex.
unsafe impl Send for Submitter {}

/// The device's transfer state: its submitter, made at the device's first transfer.
pub(super) struct TransferQueue(pub(super) Mutex<Submitter>);

impl DeviceState for TransferQueue {
    unsafe fn destroy(&self, device: &ash::Device) {
        // SAFETY: the device is idle and nothing uses the submitter again (the trait's contract).
        unsafe { self.0.lock().destroy(device) }
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

/// The device's transfer queue (made on the first transfer): lock its submitter to record and
/// submit commands.
pub(super) fn transfer_queue(device: &VulkanDevice) -> Result<Arc<TransferQueue>> {
    device.state(|device| {
        let info = device.info();
        let submitter = Submitter::new(
            &device.shared.device,
            info.queue_family_index,
            device.shared.queue_compute,
            info.timestamp_period_ns.is_some(),
        )?;
        Ok(TransferQueue(Mutex::new(submitter)))
    })
}

impl Submitter {
    pub(crate) fn new(device: &ash::Device, family: u32, compute: bool, timestamps: bool) -> Result<Self> {
        let pool_info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(family);
        // SAFETY: plain object creation on a live device; each failure path below destroys
        // what was created before it.
        unsafe {
            let pool = device.create_command_pool(&pool_info, None).map_err(vk_err("vkCreateCommandPool"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            let cmd = match device.allocate_command_buffers(&alloc) {
                Ok(c) => c[0],
                Err(r) => {
                    device.destroy_command_pool(pool, None);
                    return Err(vk_err("vkAllocateCommandBuffers")(r));
                }
            };
            let fence = match device.create_fence(&vk::FenceCreateInfo::default(), None) {
                Ok(f) => f,
                Err(r) => {
                    device.destroy_command_pool(pool, None);
                    return Err(vk_err("vkCreateFence")(r));
                }
            };
            let timestamps = if timestamps {
                let info = vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(2);
                device.create_query_pool(&info, None).ok()
            } else {
                None
            };
            Ok(Submitter {
                compute,
                pool,
                cmd,
                fence,
                timestamps,
                staging: Vec::new(),
                hung: false,
                shader: ShaderState::Untried,
            })
        }
    }

    /// The stages and accesses by which lava-flow's earlier submissions on the queue may have
    /// written: transfers, and shaders on a compute queue. Every submission begins with a
    /// barrier from these to its own work: the host waits for each submission before the next,
    /// but only a barrier makes one's writes visible to the next (host writes before a
    /// submission are made visible by the submission itself).
    pub(super) fn earlier_writes(&self) -> (vk::PipelineStageFlags, vk::AccessFlags) {
        use vk::AccessFlags as A;
        use vk::PipelineStageFlags as S;
        if self.compute {
            (S::TRANSFER | S::COMPUTE_SHADER, A::TRANSFER_WRITE | A::SHADER_WRITE)
        } else {
            (S::TRANSFER, A::TRANSFER_WRITE)
        }
    }

    /// Destroys everything; the device must be idle.
    pub(crate) unsafe fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            for s in self.staging.drain(..) {
                Self::destroy_staging(device, s);
            }
            if let ShaderState::Ready(shader) = &mut self.shader {
                shader.destroy(device);
            }
            self.shader = ShaderState::Untried;
            if let Some(q) = self.timestamps.take() {
                device.destroy_query_pool(q, None);
            }
            device.destroy_fence(self.fence, None);
            device.destroy_command_pool(self.pool, None);
        }
    }

    /// Destroys a staging slot whose work has finished.
    pub(super) unsafe fn destroy_staging(device: &ash::Device, s: Staging) {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            device.destroy_fence(s.fence, None);
            device.destroy_buffer(s.buffer, None);
            device.unmap_memory(s.memory);
            device.free_memory(s.memory, None);
            // (The slot's command buffer goes back to the pool with it.)
        }
    }

    pub(super) fn new_staging(&self, device: &VulkanDevice, size: u64) -> Result<Staging> {
        let ash_device = &device.shared.device;
        let new = arena::create_buffer(device, size, vk::ExternalMemoryHandleTypeFlags::empty())?;
        use vk::MemoryPropertyFlags as F;
        // Cached where the device offers it: the host reads what comes back from the GPU.
        let Some(type_index) = device.find_memory_type(
            new.requirements.memory_type_bits,
            F::HOST_VISIBLE | F::HOST_COHERENT,
            &[F::HOST_CACHED],
            F::DEVICE_LOCAL,
        ) else {
            arena::destroy_buffer(device, new.buffer);
            return Err(Error::Unsupported(format!(
                "Vulkan device {} has no host-visible coherent memory to stage transfers through",
                device.info().name
            )));
        };
        let memory = match arena::allocate_memory(
            device,
            new.requirements.size,
            type_index,
            vk::ExternalMemoryHandleTypeFlags::empty(),
            None,
        ) {
            Ok(m) => m,
            Err(e) => {
                arena::destroy_buffer(device, new.buffer);
                return Err(e);
            }
        };
        // SAFETY: buffer and memory are fresh and compatible (type chosen from its bits);
        // the memory is host-visible, so mapping it is allowed; the command buffer and fence
        // are new objects of this device and pool.
        unsafe {
            let mapped = ash_device
                .bind_buffer_memory(new.buffer, memory, 0)
                .and_then(|()| ash_device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()));
            let ptr = match mapped.map(|p| NonNull::new(p.cast::<u8>())) {
                Ok(Some(p)) => p,
                other => {
                    ash_device.destroy_buffer(new.buffer, None);
                    ash_device.free_memory(memory, None);
                    return Err(match other {
                        Err(r) => vk_err("binding/mapping a staging buffer")(r),
                        _ => Error::Vulkan("vkMapMemory of a staging buffer returned NULL".into()),
                    });
                }
            };
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(self.pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            let made = ash_device.allocate_command_buffers(&alloc).map(|c| c[0]).and_then(|cmd| {
                match ash_device.create_fence(&vk::FenceCreateInfo::default(), None) {
                    Ok(fence) => Ok((cmd, fence)),
                    Err(r) => {
                        ash_device.free_command_buffers(self.pool, &[cmd]);
                        Err(r)
                    }
                }
            });
            match made {
                Ok((cmd, fence)) => Ok(Staging { buffer: new.buffer, memory, ptr, size, cmd, fence }),
                Err(r) => {
                    ash_device.destroy_buffer(new.buffer, None);
                    ash_device.unmap_memory(memory);
                    ash_device.free_memory(memory, None);
                    Err(vk_err("a staging command buffer or fence")(r))
                }
            }
        }
    }

    /// Fails once a submission has timed out: its command buffer may still be pending.
    pub(super) fn check_usable(&self, device: &VulkanDevice) -> Result<()> {
        if self.hung {
            return Err(Error::InvalidState(format!(
                "an earlier transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}; the device is unusable",
                device.info().name
            )));
        }
        Ok(())
    }

    /// Records `record` after a barrier from earlier submissions, submits, and waits. Returns
    /// the GPU time between the timestamps around `record` when `timed` and the queue has
    /// timestamps. `compute`: `record` runs compute shaders as well as transfers (the queue
    /// must have compute). `host_access`: the host may access what `record` writes (it writes
    /// host-visible memory).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &mut self,
        device: &VulkanDevice,
        timed: bool,
        waits: &[(vk::Semaphore, u64)],
        compute: bool,
        host_access: bool,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<Option<Duration>> {
        self.check_usable(device)?;
        let d = &device.shared.device;
        let timestamps = self.timestamps.filter(|_| timed);
        let cmd = self.cmd;
        use vk::AccessFlags as A;
        use vk::PipelineStageFlags as S;
        // The stages and accesses of this submission's work: transfers, and shaders with
        // `compute`.
        let (stages, reads, writes) = if compute {
            (S::TRANSFER | S::COMPUTE_SHADER, A::TRANSFER_READ | A::SHADER_READ, A::TRANSFER_WRITE | A::SHADER_WRITE)
        } else {
            (S::TRANSFER, A::TRANSFER_READ, A::TRANSFER_WRITE)
        };
        let (earlier, earlier_writes) = self.earlier_writes();
        let before = [vk::MemoryBarrier::default().src_access_mask(earlier_writes).dst_access_mask(reads | writes)];
        // Where the host may read or write what this copy writes: the copy before host access.
        // (Later submissions order themselves after it with their own first barrier.)
        let after =
            [vk::MemoryBarrier::default().src_access_mask(writes).dst_access_mask(A::HOST_READ | A::HOST_WRITE)];
        // SAFETY: the command buffer is not pending (every submission is waited for below, and
        // `hung` stops reuse after a timeout); all handles are of this device; the queue is
        // submitted to under its lock (`queue_submit`); the command pool is used only under
        // the transfer queue's mutex, which the caller holds (&mut self).
        unsafe {
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(vk_err("vkBeginCommandBuffer"))?;
            d.cmd_pipeline_barrier(cmd, earlier, stages, vk::DependencyFlags::empty(), &before, &[], &[]);
            if let Some(q) = timestamps {
                d.cmd_reset_query_pool(cmd, q, 0, 2);
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
            }
            record(d, cmd);
            if let Some(q) = timestamps {
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 1);
            }
            if host_access {
                d.cmd_pipeline_barrier(cmd, stages, S::HOST, vk::DependencyFlags::empty(), &after, &[], &[]);
            }
            d.end_command_buffer(cmd).map_err(vk_err("vkEndCommandBuffer"))?;
            d.reset_fences(&[self.fence]).map_err(vk_err("vkResetFences"))?;
            let cmds = [cmd];
            let wait_semaphores: Vec<vk::Semaphore> = waits.iter().map(|w| w.0).collect();
            let wait_values: Vec<u64> = waits.iter().map(|w| w.1).collect();
            let wait_stages = vec![stages; waits.len()];
            let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&wait_values);
            let mut submit_info = vk::SubmitInfo::default().command_buffers(&cmds);
            if !waits.is_empty() {
                submit_info = submit_info
                    .wait_semaphores(&wait_semaphores)
                    .wait_dst_stage_mask(&wait_stages)
                    .push_next(&mut timeline);
            }
            let submit = [submit_info];
            device.queue_submit(&submit, self.fence)?;
            match wait_fence(d, self.fence) {
                Ok(()) => {}
                Err(vk::Result::TIMEOUT) => {
                    self.hung = true;
                    return Err(Error::Timeout(format!(
                        "a transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}",
                        device.info().name
                    )));
                }
                Err(r) => {
                    self.hung = true;
                    return Err(vk_err("vkWaitForFences")(r));
                }
            }
            let Some(q) = timestamps else { return Ok(None) };
            let mut ticks = [0u64; 2];
            d.get_query_pool_results(q, 0, &mut ticks, vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT)
                .map_err(vk_err("vkGetQueryPoolResults"))?;
            let period = device.info().timestamp_period_ns.unwrap_or(1.0) as f64;
            Ok(Some(Duration::from_nanos((ticks[1].wrapping_sub(ticks[0]) as f64 * period) as u64)))
        }
    }
}
