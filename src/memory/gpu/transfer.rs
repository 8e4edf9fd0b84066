//! Moving data without writing Vulkan code: host writes and reads (direct for mappable memory,
//! staged through a host-visible buffer otherwise), GPU copies between buffers, and mapping.
//!
//! Every operation is synchronous: it submits one command buffer on the device's transfer
//! queue and waits for its fence, so the data is in place when the call returns.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ash::vk;

use super::allocator::GpuBuffer;
use super::arena;
use super::device::{vk_err, VulkanDevice};
use super::semaphore::TimelineSemaphore;
use crate::error::{Error, Result};

/// Largest staging buffer kept per device; bigger transfers go through it in pieces.
const STAGING_MAX: u64 = 64 << 20;
const STAGING_MIN: u64 = 1 << 20;
/// How long a single transfer may take before the device counts as hung.
const FENCE_TIMEOUT: Duration = Duration::from_secs(120);

struct Staging {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: NonNull<u8>,
    size: u64,
}

/// The transfer queue and what submitting on it needs. Lives behind the device's mutex.
pub(crate) struct Submitter {
    queue: vk::Queue,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    timestamps: Option<vk::QueryPool>,
    staging: Option<Staging>,
    /// Set when a fence wait timed out: the command buffer may still be pending, so it must
    /// not be reused.
    hung: bool,
}

// SAFETY: the only non-Send member is the staging mapping pointer, which is plain memory that
// the Submitter owns; the Submitter is only used under the device's mutex.
unsafe impl Send for Submitter {}

impl Submitter {
    pub(crate) fn new(device: &ash::Device, queue: vk::Queue, family: u32, timestamps: bool) -> Result<Self> {
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
            Ok(Submitter { queue, pool, cmd, fence, timestamps, staging: None, hung: false })
        }
    }

    /// Destroys everything; the device must be idle.
    pub(crate) unsafe fn destroy(&mut self, device: &ash::Device) {
        if let Some(s) = self.staging.take() {
            device.destroy_buffer(s.buffer, None);
            device.unmap_memory(s.memory);
            device.free_memory(s.memory, None);
        }
        if let Some(q) = self.timestamps.take() {
            device.destroy_query_pool(q, None);
        }
        device.destroy_fence(self.fence, None);
        device.destroy_command_pool(self.pool, None);
    }

    /// A staging buffer of at least `min(want, STAGING_MAX)` bytes; returns its size.
    fn staging(&mut self, device: &VulkanDevice, want: u64) -> Result<&Staging> {
        let size = want.clamp(STAGING_MIN, STAGING_MAX).next_multiple_of(STAGING_MIN).min(STAGING_MAX);
        if self.staging.as_ref().is_some_and(|s| s.size >= size) {
            return Ok(self.staging.as_ref().expect("checked"));
        }
        let ash_device = &device.shared.device;
        if let Some(old) = self.staging.take() {
            // SAFETY: no submission is pending (every submit waits), so the old staging
            // buffer is unused.
            unsafe {
                ash_device.destroy_buffer(old.buffer, None);
                ash_device.unmap_memory(old.memory);
                ash_device.free_memory(old.memory, None);
            }
        }
        let new = arena::create_buffer(device, size, vk::ExternalMemoryHandleTypeFlags::empty())?;
        use vk::MemoryPropertyFlags as F;
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
        // the memory is host-visible, so mapping it is allowed.
        let mapped = unsafe {
            ash_device
                .bind_buffer_memory(new.buffer, memory, 0)
                .and_then(|()| ash_device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()))
        };
        let ptr = match mapped.map(|p| NonNull::new(p.cast::<u8>())) {
            Ok(Some(p)) => p,
            other => {
                // SAFETY: unused fresh objects.
                unsafe {
                    ash_device.destroy_buffer(new.buffer, None);
                    ash_device.free_memory(memory, None);
                }
                return Err(match other {
                    Err(r) => vk_err("binding/mapping the staging buffer")(r),
                    _ => Error::Vulkan("vkMapMemory of the staging buffer returned NULL".into()),
                });
            }
        };
        self.staging = Some(Staging { buffer: new.buffer, memory, ptr, size });
        Ok(self.staging.as_ref().expect("just set"))
    }

    /// Records `record` between barriers, submits, and waits. Returns the GPU time between the
    /// timestamps around `record` when `timed` and the queue has timestamps.
    fn submit(
        &mut self,
        device: &VulkanDevice,
        timed: bool,
        waits: &[(vk::Semaphore, u64)],
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<Option<Duration>> {
        if self.hung {
            return Err(Error::InvalidState(format!(
                "an earlier transfer on Vulkan device {} did not finish within {FENCE_TIMEOUT:?}; the device is unusable",
                device.info().name
            )));
        }
        let d = &device.shared.device;
        let timestamps = self.timestamps.filter(|_| timed);
        let cmd = self.cmd;
        // Host writes and earlier transfers before this copy; this copy before host reads.
        let before = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::HOST_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
        let after = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE)];
        // SAFETY: the command buffer is not pending (every submission is waited for below, and
        // `hung` stops reuse after a timeout); all handles are of this device; the queue is
        // used only under the device mutex, which the caller holds (&mut self).
        unsafe {
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT))
                .map_err(vk_err("vkBeginCommandBuffer"))?;
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &before,
                &[],
                &[],
            );
            if let Some(q) = timestamps {
                d.cmd_reset_query_pool(cmd, q, 0, 2);
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q, 0);
            }
            record(d, cmd);
            if let Some(q) = timestamps {
                d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 1);
            }
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &after,
                &[],
                &[],
            );
            d.end_command_buffer(cmd).map_err(vk_err("vkEndCommandBuffer"))?;
            d.reset_fences(&[self.fence]).map_err(vk_err("vkResetFences"))?;
            let cmds = [cmd];
            let wait_semaphores: Vec<vk::Semaphore> = waits.iter().map(|w| w.0).collect();
            let wait_values: Vec<u64> = waits.iter().map(|w| w.1).collect();
            let wait_stages = vec![vk::PipelineStageFlags::TRANSFER; waits.len()];
            let mut timeline = vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&wait_values);
            let mut submit_info = vk::SubmitInfo::default().command_buffers(&cmds);
            if !waits.is_empty() {
                submit_info = submit_info
                    .wait_semaphores(&wait_semaphores)
                    .wait_dst_stage_mask(&wait_stages)
                    .push_next(&mut timeline);
            }
            let submit = [submit_info];
            d.queue_submit(self.queue, &submit, self.fence).map_err(vk_err("vkQueueSubmit"))?;
            match d.wait_for_fences(&[self.fence], true, FENCE_TIMEOUT.as_nanos() as u64) {
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

    /// Copies `data` into the buffer at `offset`: a plain memcpy when the memory is mappable,
    /// else through the device's staging buffer and a GPU copy. Returns when the data is in
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
        if direct && self.arena.host_coherent() {
            let base = self.arena.map()?;
            // SAFETY: the mapping covers the whole arena and self.offset + offset + len lies
            // within this buffer's part of it (checked above); `data` cannot overlap device
            // memory that Rust code borrows.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    base.as_ptr().add((self.offset + offset) as usize),
                    data.len(),
                )
            };
            return Ok(());
        }
        let device = self.device().clone();
        let mut submitter = device.shared.submitter.lock();
        let chunk = submitter.staging(&device, data.len() as u64)?.size as usize;
        let mut done = 0usize;
        for piece in data.chunks(chunk) {
            let staging = submitter.staging.as_ref().expect("made above");
            let (staging_buffer, staging_ptr) = (staging.buffer, staging.ptr);
            // SAFETY: the staging mapping is at least `chunk` >= piece.len() bytes and no GPU
            // work uses it (the last submission was waited for).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), staging_ptr.as_ptr(), piece.len()) };
            let region = [vk::BufferCopy {
                src_offset: 0,
                dst_offset: self.vk_offset + offset + done as u64,
                size: piece.len() as u64,
            }];
            let dst = self.buffer;
            submitter.submit(&device, false, &[], |d, cmd| {
                // SAFETY: both buffers are live for the submission, which is waited for.
                unsafe { d.cmd_copy_buffer(cmd, staging_buffer, dst, &region) }
            })?;
            done += piece.len();
        }
        Ok(())
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
        if direct && self.arena.host_coherent() {
            let base = self.arena.map()?;
            // SAFETY: as in `write`; `out` is ordinary host memory distinct from the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.as_ptr().add((self.offset + offset) as usize),
                    out.as_mut_ptr(),
                    out.len(),
                )
            };
            return Ok(());
        }
        let device = self.device().clone();
        let mut submitter = device.shared.submitter.lock();
        let chunk = submitter.staging(&device, out.len() as u64)?.size as usize;
        let mut done = 0usize;
        let src_vk_offset = self.vk_offset;
        for piece in out.chunks_mut(chunk) {
            let staging = submitter.staging.as_ref().expect("made above");
            let (staging_buffer, staging_ptr) = (staging.buffer, staging.ptr);
            let region = [vk::BufferCopy {
                src_offset: src_vk_offset + offset + done as u64,
                dst_offset: 0,
                size: piece.len() as u64,
            }];
            let src = self.buffer;
            submitter.submit(&device, false, &[], |d, cmd| {
                // SAFETY: both buffers are live for the submission, which is waited for.
                unsafe { d.cmd_copy_buffer(cmd, src, staging_buffer, &region) }
            })?;
            // SAFETY: the copy has finished (fence waited, HOST_READ barrier recorded).
            unsafe { std::ptr::copy_nonoverlapping(staging_ptr.as_ptr(), piece.as_mut_ptr(), piece.len()) };
            done += piece.len();
        }
        Ok(())
    }

    /// The buffer's bytes in this process's address space (a persistent mapping of its
    /// arena). Only for host-visible coherent memory ([`GpuBuffer::is_host_mappable`]).
    pub fn map(&self) -> Result<MappedRange<'_>> {
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
        std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
    }

    /// # Safety
    /// No one else may read or write these bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
    }
}

/// Copies `len` bytes from `src` at `src_offset` to `dst` at `dst_offset` on the GPU
/// (`vkCmdCopyBuffer`), waiting until done. Both buffers must be on the same device; the
/// ranges must not overlap.
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
    copy_inner(src, src_offset, dst, dst_offset, len, waits).map(|_| ())
}

/// [`copy_buffer`], also reporting how long it took (host wall time and GPU timestamps).
pub fn copy_buffer_timed(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
) -> Result<CopyTiming> {
    copy_inner(src, src_offset, dst, dst_offset, len, &[])
}

fn copy_inner(
    src: &GpuBuffer,
    src_offset: u64,
    dst: &GpuBuffer,
    dst_offset: u64,
    len: u64,
    waits: &[(&TimelineSemaphore, u64)],
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
    let region =
        [vk::BufferCopy { src_offset: src.vk_offset + src_offset, dst_offset: dst.vk_offset + dst_offset, size: len }];
    let (s, t) = (src.buffer, dst.buffer);
    let mut submitter = device.shared.submitter.lock();
    let start = Instant::now();
    let raw_waits: Vec<(vk::Semaphore, u64)> = waits.iter().map(|(s, v)| (s.raw(), *v)).collect();
    let gpu = submitter.submit(&device, true, &raw_waits, |d, cmd| {
        // SAFETY: both buffers are live for the submission, which is waited for.
        unsafe { d.cmd_copy_buffer(cmd, s, t, &region) }
    })?;
    Ok(CopyTiming { wall: start.elapsed(), gpu })
}
