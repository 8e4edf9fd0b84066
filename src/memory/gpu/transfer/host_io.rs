//! Host I/O on a [`GpuBuffer`]: writes from and reads into host memory (straight through the
//! mapping where the host may access the memory, else staged), and mapping for the host.

use std::marker::PhantomData;
use std::ptr::NonNull;

use super::staging::Direction;
use super::submitter::transfer_queue;
use crate::error::{Error, Result};
use crate::memory::gpu::allocator::GpuBuffer;
use crate::os::parallel_copy;

impl GpuBuffer {
    pub(super) fn check_range(&self, offset: u64, len: u64, what: &str) -> Result<()> {
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
                crate::memory::gpu::device::describe_memory_flags(self.arena.property_flags.as_raw())
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
