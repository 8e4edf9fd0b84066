//! Staged transfers between host memory and GPU memory the host cannot reach directly: in
//! pieces through the submitter's staging slots, the host's copy of one piece overlapping the
//! GPU's copy of another.

use ash::vk;

use super::submitter::{wait_fence, Submitter, FENCE_TIMEOUT};
use crate::error::{Error, Result};
use crate::memory::gpu::device::{vk_err, VulkanDevice};
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

/// Which way a staged transfer goes.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Direction {
    ToDevice,
    ToHost,
}

impl Submitter {
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
    pub(super) unsafe fn staged(
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
