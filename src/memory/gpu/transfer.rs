//! Moving data without writing Vulkan code: host writes and reads, GPU copies between
//! buffers, and mapping.
//!
//! - Host writes go straight into memory the host may write (host memory, and the GPU's own
//!   memory behind a resizable BAR); host reads straight out of memory the host caches.
//!   Everything else is staged: in pieces through a few pinned staging buffers, the host's
//!   copy of one piece overlapping the GPU's copy of another.
//! - Large host copies run on several threads (`LF_COPY_THREADS`).
//!
//! Every operation is synchronous: it submits its command buffers on the device's queue and
//! waits for their fences, so the data is in place when the call returns.
//!
//! GPU copies between buffers ([`copy_buffer`] and its variants, and so `Context::copy`,
//! `lf_buffer_copy` and the GPU channel route) are made one of three ways ([`CopyMethod`]):
//! by the copy engine (`vkCmdCopyBuffer`), which on an NVIDIA H200 moves large copies at about
//! a fifth of cudaMemcpy's rate, or by a compute shader in which every shader core
//! reads and writes 16-byte vectors (4-byte words where the offsets are congruent mod 4 only;
//! `super::shader_copy`), the engine copying the unaligned bytes at the ends.
//! [`CopyMethod::Auto`] gives the shader copies of [`SHADER_COPY_MIN`] bytes and more between
//! `DEVICE_LOCAL` memory on GPUs, and the engine the rest: small copies, host memory, offsets
//! not congruent mod 4, CPU devices (lavapipe, whose engine is a `memcpy`). Or, where the
//! process already uses CUDA on the device ([`copies_by_cuda`]), by CUDA (`super::cuda`) for
//! every copy between `DEVICE_LOCAL` memory that waits on no semaphore. [`GPU_COPY_ENV`]
//! (`LF_GPU_COPY=auto|engine|shader|cuda`, read when the device opens) forces one method for
//! every `Auto` copy; [`copy_buffer_timed_with`] takes one per call.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;
use parking_lot::Mutex;

use super::allocator::GpuBuffer;
use super::arena;
use super::copy_method::{CopyMethod, GPU_COPY_ENV};
use super::cuda::{cuda_copy, cuda_in_use, CudaArena};
use super::device::{vk_err, DeviceState, DeviceType, VulkanDevice};
use super::semaphore::TimelineSemaphore;
use super::shader_copy::{self, ShaderCopy, SETS_PER_SUBMIT};
use crate::error::{Error, Result};
use crate::os::parallel_copy::{self, Stores};

/// Staged transfers go through `STAGING_SLOTS` host-visible buffers of up to `STAGING_CHUNK`
/// bytes each, in pieces, so that the host's copy of one piece overlaps the GPU's copy of the
/// next (and a transfer never needs one staging buffer as large as itself). On the H200 host,
/// 8 MiB slots, the pieces of [`piece_len`] and the submission overlapped with the next piece's
/// host copy moved 256 MiB from pageable memory at 0.78-0.82x (to the GPU) and 0.83-0.86x (from
/// it) of pinned cudaMemcpy; 4 MiB slots in pieces of 4 MiB at 0.44-0.68x. Smaller slots lost
/// at every size: each piece costs the GPU about 15 us of submission.
const STAGING_CHUNK: u64 = 8 << 20;
const STAGING_MIN: u64 = 1 << 20;
const STAGING_SLOTS: usize = 4;
// The pipeline copies one piece into a slot while the GPU copies another out of the one before.
const _: () = assert!(STAGING_SLOTS >= 2);
/// The smallest piece of a staged transfer (but its last), and the copy size from which a
/// piece's host copy is shared out among the copy threads.
const PIECE_MIN: usize = 1 << 20;
const PIECE_PARALLEL_MIN: usize = 512 << 10;

/// The length of a staged transfer's next piece: `PIECE_MIN` first, doubling up to `chunk`,
/// and no more than half of what remains, so that the two sides' copies overlap from the first
/// piece to the last (the GPU's copy of the first piece waits for the host's, to the device, and
/// the host's copy of the last waits for the GPU's, to the host).
fn piece_len(index: usize, remaining: usize, chunk: usize) -> usize {
    let rising = PIECE_MIN << index.min(16);
    let falling = (remaining / 2).next_multiple_of(64 << 10);
    let n = rising.min(falling).max(PIECE_MIN).min(chunk);
    if remaining <= chunk && remaining < n + PIECE_MIN / 2 {
        remaining
    } else {
        n.min(remaining)
    }
}

/// How long a single transfer may take before the device counts as hung.
const FENCE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a fence is polled before the host sleeps on it: a sleeping wait wakes up to a
/// hundred microseconds late, as long as a copy of hundreds of MiB takes on a GPU. After
/// [`FENCE_SPIN`] the poll yields the core between looks.
const FENCE_POLL: Duration = Duration::from_millis(20);
const FENCE_SPIN: Duration = Duration::from_micros(200);

/// Waits for `fence`: polls it for up to [`FENCE_POLL`], then sleeps on it for up to
/// [`FENCE_TIMEOUT`].
fn wait_fence(d: &ash::Device, fence: vk::Fence) -> std::result::Result<(), vk::Result> {
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
struct Staging {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: NonNull<u8>,
    size: u64,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
}

/// Which way a staged transfer goes.
#[derive(Clone, Copy, PartialEq)]
enum Direction {
    ToDevice,
    ToHost,
}

/// What submitting transfers on the device's queue needs. Lives behind its
/// [`TransferQueue`]'s mutex.
pub(crate) struct Submitter {
    /// Whether the queue runs compute shaders: then earlier submissions may have written
    /// with shaders as well as transfers.
    compute: bool,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    timestamps: Option<vk::QueryPool>,
    /// The staging slots, all of one size (made on first use, remade larger when needed).
    staging: Vec<Staging>,
    /// Set when a fence wait timed out: the command buffer may still be pending, so it must
    /// not be reused.
    hung: bool,
    /// The copy shader's pipelines, made on the first shader copy.
    shader: ShaderState,
}

/// Whether the copy shader's pipelines have been made.
enum ShaderState {
    Untried,
    Ready(ShaderCopy),
    /// They could not be made: why.
    Unavailable(String),
}

// SAFETY: the only non-Send member is the staging mapping pointer, which is plain memory that
// the Submitter owns; the Submitter is only used under its `TransferQueue`'s mutex.
unsafe impl Send for Submitter {}

/// The device's transfer state: its submitter, made at the device's first transfer.
struct TransferQueue(Mutex<Submitter>);

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
fn transfer_queue(device: &VulkanDevice) -> Result<Arc<TransferQueue>> {
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
    fn earlier_writes(&self) -> (vk::PipelineStageFlags, vk::AccessFlags) {
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
    unsafe fn destroy_staging(device: &ash::Device, s: Staging) {
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

    /// Makes sure there are `STAGING_SLOTS` staging slots of at least `min(want,
    /// STAGING_CHUNK)` bytes (rounded up to MiB); returns their size.
    fn ensure_staging(&mut self, device: &VulkanDevice, want: u64) -> Result<u64> {
        let size = want.clamp(STAGING_MIN, STAGING_CHUNK).next_multiple_of(STAGING_MIN);
        if self.staging.first().is_some_and(|s| s.size >= size) {
            return Ok(self.staging[0].size);
        }
        let ash_device = &device.shared.device;
        for old in self.staging.drain(..) {
            // SAFETY: every staged transfer waits for all its pieces before returning (or
            // marks the device hung), so no slot is in use.
            unsafe {
                ash_device.free_command_buffers(self.pool, &[old.cmd]);
                Self::destroy_staging(ash_device, old);
            }
        }
        for _ in 0..STAGING_SLOTS {
            let slot = self.new_staging(device, size)?;
            self.staging.push(slot);
        }
        Ok(size)
    }

    fn new_staging(&self, device: &VulkanDevice, size: u64) -> Result<Staging> {
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

    /// Moves `len` bytes between host memory at `host` and `buffer` from `buffer_offset`,
    /// through the staging slots in pieces ([`piece_len`]): while the GPU copies one piece,
    /// the copy threads copy the next one in (to the device) or the one before out (to the
    /// host), and this thread submits the GPU's next copy meanwhile. Returns once every piece
    /// is in place; after an error, once every piece submitted has finished.
    ///
    /// # Safety
    /// `host` is valid for `len` bytes (readable for `ToDevice`, writable for `ToHost`) and
    /// distinct from GPU memory; `buffer` is a live buffer of this device with
    /// `buffer_offset + len` in range.
    unsafe fn staged(
        &mut self,
        device: &VulkanDevice,
        buffer: vk::Buffer,
        buffer_offset: u64,
        host: *mut u8,
        len: usize,
        direction: Direction,
    ) -> Result<()> {
        if self.hung {
            return Err(Error::InvalidState(format!(
                "an earlier transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}; the device is unusable",
                device.info().name
            )));
        }
        let size = self.ensure_staging(device, len as u64)? as usize;
        let slot_ptrs: Vec<*mut u8> = self.staging.iter().map(|s| s.ptr.as_ptr()).collect();
        let slots = slot_ptrs.len();
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < len {
            let n = piece_len(pieces.len(), len - at, size);
            pieces.push((at, n));
            at += n;
        }
        let count = pieces.len();
        // Piece k's host copy, started on the copy threads: into its slot, or out of it.
        let host_copy = |k: usize| {
            let (at, n) = pieces[k];
            let slot = slot_ptrs[k % slots];
            // SAFETY: the piece lies in the host range (the caller's contract) and fits its
            // slot, which no GPU copy uses (the pipeline below waits for the slot's last one
            // first); the copy is joined before the slot is submitted or the call returns.
            unsafe {
                match direction {
                    // Ordinary stores: the GPU then reads the piece from the host's cache
                    // (streaming stores, which send it to memory first, made 256 MiB transfers
                    // slower on the H200 host: 0.57-0.62x pinned, against 0.80-0.81x).
                    Direction::ToDevice => {
                        parallel_copy::start_with(host.add(at), slot, n, Stores::Cached, PIECE_PARALLEL_MIN)
                    }
                    // Streaming stores, as the GPU's own writes to host memory: they do not read
                    // each line of the destination first (256 MiB on the H200 host: 0.84-0.85x
                    // pinned, against 0.70-0.74x with ordinary stores).
                    Direction::ToHost => {
                        parallel_copy::start_with(slot, host.add(at), n, Stores::Streaming, PIECE_PARALLEL_MIN)
                    }
                }
            }
        };
        let submit = |this: &mut Self, k: usize| {
            let (at, n) = pieces[k];
            // SAFETY: the piece lies in the buffer's range (the caller's contract) and its slot
            // is idle (the pipeline's order).
            unsafe { this.submit_piece(device, k % slots, (buffer, buffer_offset + at as u64), n, direction) }
        };
        let (mut submitted, mut waited) = (0, 0);
        let mut result = Ok(());
        match direction {
            Direction::ToDevice => {
                drop(host_copy(0));
                for k in 0..count {
                    let next = k + 1;
                    // The next piece's slot is free once the piece before it there is done.
                    while next < count && waited + slots <= next && result.is_ok() {
                        result = self.finish_piece(device, waited % slots);
                        waited += 1;
                    }
                    if result.is_err() {
                        break;
                    }
                    let copying = if next < count { host_copy(next) } else { None };
                    result = submit(self, k);
                    drop(copying);
                    if result.is_err() {
                        break;
                    }
                    submitted += 1;
                }
            }
            Direction::ToHost => {
                while submitted < slots.min(count) && result.is_ok() {
                    result = submit(self, submitted);
                    submitted += usize::from(result.is_ok());
                }
                for k in 0..count {
                    if result.is_err() {
                        break;
                    }
                    result = self.finish_piece(device, k % slots);
                    waited += 1;
                    if result.is_err() {
                        break;
                    }
                    let copying = host_copy(k);
                    // The slot of piece k - 1, copied out already, takes its next piece meanwhile.
                    if k >= 1 && submitted == k - 1 + slots && submitted < count {
                        result = submit(self, submitted);
                        submitted += usize::from(result.is_ok());
                    }
                    drop(copying);
                }
            }
        }
        // Every piece submitted is waited for, even after an error: the slots must be idle.
        while waited < submitted {
            let finished = self.finish_piece(device, waited % slots);
            if result.is_ok() {
                result = finished;
            }
            waited += 1;
        }
        result
    }

    /// Submits one piece's GPU copy on its slot, which is idle and (to the device) holds the
    /// piece's bytes.
    unsafe fn submit_piece(
        &mut self,
        device: &VulkanDevice,
        slot: usize,
        (buffer, offset): (vk::Buffer, u64),
        len: usize,
        direction: Direction,
    ) -> Result<()> {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            let d = &device.shared.device;
            let s = &self.staging[slot];
            let region = [match direction {
                Direction::ToDevice => vk::BufferCopy { src_offset: 0, dst_offset: offset, size: len as u64 },
                Direction::ToHost => vk::BufferCopy { src_offset: offset, dst_offset: 0, size: len as u64 },
            }];
            let cmd = s.cmd;
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            d.begin_command_buffer(
                cmd,
                &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(vk_err("vkBeginCommandBuffer"))?;
            // Earlier copies before this one (host writes to the staging slot are made visible
            // by the submission itself).
            let (earlier, writes) = self.earlier_writes();
            let before = [vk::MemoryBarrier::default()
                .src_access_mask(writes)
                .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
            d.cmd_pipeline_barrier(
                cmd,
                earlier,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &before,
                &[],
                &[],
            );
            match direction {
                Direction::ToDevice => d.cmd_copy_buffer(cmd, s.buffer, buffer, &region),
                Direction::ToHost => {
                    d.cmd_copy_buffer(cmd, buffer, s.buffer, &region);
                    let after = [vk::MemoryBarrier::default()
                        .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                        .dst_access_mask(vk::AccessFlags::HOST_READ)];
                    d.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::TRANSFER,
                        vk::PipelineStageFlags::HOST,
                        vk::DependencyFlags::empty(),
                        &after,
                        &[],
                        &[],
                    );
                }
            }
            d.end_command_buffer(cmd).map_err(vk_err("vkEndCommandBuffer"))?;
            d.reset_fences(&[s.fence]).map_err(vk_err("vkResetFences"))?;
            let cmds = [cmd];
            let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
            device.queue_submit(&submit, s.fence)
        }
    }

    /// Waits for the piece last submitted on `slot`.
    fn finish_piece(&mut self, device: &VulkanDevice, slot: usize) -> Result<()> {
        wait_fence(&device.shared.device, self.staging[slot].fence).map_err(|r| {
            self.hung = true;
            match r {
                vk::Result::TIMEOUT => Error::Timeout(format!(
                    "a transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}",
                    device.info().name
                )),
                r => vk_err("vkWaitForFences")(r),
            }
        })
    }

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

    /// Fails once a submission has timed out: its command buffer may still be pending.
    fn check_usable(&self, device: &VulkanDevice) -> Result<()> {
        if self.hung {
            return Err(Error::InvalidState(format!(
                "an earlier transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}; the device is unusable",
                device.info().name
            )));
        }
        Ok(())
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

    /// Records `record` after a barrier from earlier submissions, submits, and waits. Returns
    /// the GPU time between the timestamps around `record` when `timed` and the queue has
    /// timestamps. `compute`: `record` runs compute shaders as well as transfers (the queue
    /// must have compute). `host_access`: the host may access what `record` writes (it writes
    /// host-visible memory).
    #[allow(clippy::too_many_arguments)]
    fn submit(
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

impl GpuBuffer {
    fn check_range(&self, offset: u64, len: u64, what: &str) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::invalid(format!(
                "{what} of {len} bytes at offset {offset} overruns a GPU buffer of {} bytes",
                self.size
            ))),
        }
    }

    /// Copies `data` into the buffer at `offset`: a plain memcpy when the host may write the
    /// memory, else through the device's staging buffers and a GPU copy. Returns when the data is in
    /// place. Concurrent access to the same bytes (from threads, the GPU or other processes)
    /// must be ordered by the caller.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_inner(offset, data, true)
    }

    /// [`GpuBuffer::write`] through the staging buffer and a GPU copy even where the memory is
    /// mappable (e.g. to keep the CPU off write-combined memory).
    pub fn write_staged(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_inner(offset, data, false)
    }

    fn write_inner(&self, offset: u64, data: &[u8], direct: bool) -> Result<()> {
        self.check_range(offset, data.len() as u64, "write")?;
        if data.is_empty() {
            return Ok(());
        }
        if direct && self.arena.host_writable() {
            let base = self.arena.map()?;
            // SAFETY: the mapping covers the whole arena and self.offset + offset + len lies
            // within this buffer's part of it (checked above); `data` cannot overlap device
            // memory that Rust code borrows.
            unsafe {
                parallel_copy::copy(data.as_ptr(), base.as_ptr().add((self.offset + offset) as usize), data.len())
            };
            return Ok(());
        }
        let device = self.device().clone();
        let queue = transfer_queue(&device)?;
        let mut submitter = queue.0.lock();
        // SAFETY: `data` is readable for its length and is not GPU memory Rust borrows; the
        // range lies in the buffer (checked above), which lives through the call.
        unsafe {
            submitter.staged(
                &device,
                self.buffer,
                self.vk_offset + offset,
                data.as_ptr().cast_mut(),
                data.len(),
                Direction::ToDevice,
            )
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the buffer (memcpy or staged, as `write`).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_inner(offset, out, true)
    }

    /// [`GpuBuffer::read`] through a GPU copy into the staging buffer even where the memory
    /// is mappable (reads of uncached, write-combined memory are slow for the CPU).
    pub fn read_staged(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_inner(offset, out, false)
    }

    fn read_inner(&self, offset: u64, out: &mut [u8], direct: bool) -> Result<()> {
        self.check_range(offset, out.len() as u64, "read")?;
        if out.is_empty() {
            return Ok(());
        }
        if direct && self.arena.host_mappable() {
            let base = self.arena.map()?;
            // SAFETY: as in `write`; `out` is ordinary host memory distinct from the mapping.
            unsafe {
                parallel_copy::copy(base.as_ptr().add((self.offset + offset) as usize), out.as_mut_ptr(), out.len())
            };
            return Ok(());
        }
        let device = self.device().clone();
        let queue = transfer_queue(&device)?;
        let mut submitter = queue.0.lock();
        // SAFETY: `out` is writable for its length and is not GPU memory; the range lies in
        // the buffer (checked above), which lives through the call.
        unsafe {
            submitter.staged(
                &device,
                self.buffer,
                self.vk_offset + offset,
                out.as_mut_ptr(),
                out.len(),
                Direction::ToHost,
            )
        }
    }

    /// The buffer's bytes in this process's address space (a persistent mapping of its
    /// arena). Only for memory the host reads and writes at memory speed
    /// ([`GpuBuffer::is_host_mappable`]): not for the GPU's own memory behind a resizable
    /// BAR, which [`GpuBuffer::write`] still writes directly.
    pub fn map(&self) -> Result<MappedRange<'_>> {
        if !self.arena.host_mappable() {
            return Err(Error::InvalidState(format!(
                "a {} buffer of memory type {} ({}) is not mapped for the host: host reads of it crawl; \
                 use write/read, which move its data at the bus's speed",
                self.arena.kind,
                self.arena.memory_type_index,
                super::device::describe_memory_flags(self.arena.property_flags.as_raw())
            )));
        }
        let base = self.arena.map()?;
        // SAFETY: the arena mapping covers offset..offset + size of this buffer.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(self.offset as usize)) };
        Ok(MappedRange { ptr, len: self.size as usize, _buffer: PhantomData })
    }
}

/// A host view of a mapped buffer, valid while the buffer lives.
#[derive(Debug)]
pub struct MappedRange<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _buffer: PhantomData<&'a GpuBuffer>,
}

impl MappedRange<'_> {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// # Safety
    /// No one (thread, GPU, other process) may write these bytes while the slice lives.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping covers `len` bytes from `ptr` while `self` lives; the caller keeps
        // writers off them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// # Safety
    /// No one else may read or write these bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the caller keeps everyone else off the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces cover a transfer exactly, none empty or larger than a staging slot; they rise
    /// from `PIECE_MIN` and fall again towards the end.
    #[test]
    fn pieces_cover_the_transfer_within_the_slots() {
        let mib: usize = 1 << 20;
        for chunk in [mib, 2 * mib, 8 * mib] {
            for len in [1, 4095, mib, mib + 1, 3 * mib / 2, 2 * mib, 16 * mib + 7, 256 * mib, 1000 * mib + 3] {
                // Slots are at least the transfer's length (rounded up to MiB) or `chunk`.
                let chunk = chunk.max(len.min(8 * mib).next_multiple_of(mib)).min(8 * mib);
                let mut pieces = Vec::new();
                let mut start = 0;
                while start < len {
                    let n = piece_len(pieces.len(), len - start, chunk);
                    assert!(n > 0 && n <= chunk, "len {len} chunk {chunk}: piece {n}");
                    pieces.push(n);
                    start += n;
                }
                assert_eq!(start, len, "len {len} chunk {chunk}: {pieces:?}");
                if len >= 16 * mib {
                    assert_eq!(pieces[0], PIECE_MIN, "len {len}: {pieces:?}");
                    assert!(*pieces.last().unwrap() <= 2 * PIECE_MIN, "len {len}: {pieces:?}");
                    assert!(len < 64 * mib || pieces.contains(&chunk), "len {len} chunk {chunk}: {pieces:?}");
                }
            }
        }
    }
}
