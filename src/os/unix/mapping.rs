//! An owned memory mapping, unmapped on drop.

use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;

use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{Error, Result};

/// A `MAP_SHARED` (or anonymous) mapping that this value owns.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is a plain region of memory; sharing the pointer between threads is as
// safe as sharing any raw memory, and the users of the bytes synchronise their own access.
unsafe impl Send for Mapping {}
// SAFETY: see Send; &Mapping only hands out the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset` (a multiple of the page size), read-write and
    /// shared, so that every process mapping the same file sees the same bytes.
    pub fn shared(fd: &impl AsFd, offset: u64, len: usize) -> Result<Self> {
        Self::map(len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, Some(fd.as_fd()), offset)
    }

    /// As [`Mapping::shared`], readable only: for memory this process must never write.
    pub fn shared_read_only(fd: &impl AsFd, offset: u64, len: usize) -> Result<Self> {
        Self::map(len, ProtFlags::READ, MapFlags::SHARED, Some(fd.as_fd()), offset)
    }

    /// Maps `len` bytes of fresh, private, zeroed memory.
    #[cfg(test)]
    pub fn anonymous(len: usize) -> Result<Self> {
        Self::map(len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE, None, 0)
    }

    /// Maps two files back to back in one range, shared: the first `first.1` bytes of
    /// `first.0` read-write, then the first `second.1` bytes of `second.0`, read-write only if
    /// `second_writable`. Both lengths must be multiples of the page size. One value owns (and
    /// unmaps) the whole range.
    pub fn shared_pair(first: (&impl AsFd, usize), second: (&impl AsFd, usize), second_writable: bool) -> Result<Self> {
        let page = page_size();
        let (first_len, second_len) = (first.1, second.1);
        if first_len % page != 0 || second_len % page != 0 {
            return Err(Error::invalid(format!(
                "mapping parts of {first_len} and {second_len} bytes are not whole pages"
            )));
        }
        let total = first_len
            .checked_add(second_len)
            .ok_or_else(|| Error::invalid(format!("mapping parts of {first_len} and {second_len} bytes overflow")))?;
        // A reservation no one can touch, replaced part by part below.
        let reserved = Self::map(total, ProtFlags::empty(), MapFlags::PRIVATE | MapFlags::NORESERVE, None, 0)?;
        let second_prot = if second_writable { ProtFlags::READ | ProtFlags::WRITE } else { ProtFlags::READ };
        for (fd, at, len, prot) in [
            (first.0.as_fd(), 0, first_len, ProtFlags::READ | ProtFlags::WRITE),
            (second.0.as_fd(), first_len, second_len, second_prot),
        ] {
            if len == 0 {
                continue;
            }
            // SAFETY: MAP_FIXED replaces pages of `reserved`, a range this function mapped
            // itself and owns; `at + len <= total`, so nothing outside it is touched.
            unsafe {
                rustix::mm::mmap(reserved.as_ptr().add(at).cast(), len, prot, MapFlags::SHARED | MapFlags::FIXED, fd, 0)
            }
            .map_err(|e| Error::os(format!("mmap({len} bytes of a shared file at offset {at} of a pair)"), e.into()))?;
        }
        Ok(reserved)
    }

    /// Faults in `len` bytes from `offset` now (for writing, or only for reading), so that
    /// first touches later do not: `MADV_POPULATE_WRITE`/`_READ` (Linux 5.14; macOS has no
    /// such advice). Best effort: whether the kernel did it.
    pub fn populate(&self, offset: usize, len: usize, write: bool) -> bool {
        if offset.checked_add(len).map_or(true, |end| end > self.len) || len == 0 {
            return false;
        }
        let Some(advice) = crate::os::platform::populate_advice(write) else { return false };
        // SAFETY: the range lies inside this mapping (checked above); the advice only faults
        // pages in, as touching them would.
        unsafe { rustix::mm::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) }.is_ok()
    }

    /// Maps `len` bytes of `fd` from `offset`, or anonymous memory for `None`.
    fn map(len: usize, prot: ProtFlags, flags: MapFlags, fd: Option<BorrowedFd<'_>>, offset: u64) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("cannot map 0 bytes"));
        }
        if i64::try_from(offset).is_err() {
            return Err(Error::invalid(format!("mapping offset {offset} does not fit in off_t")));
        }
        // SAFETY: a NULL hint lets the kernel choose a fresh range, so no existing mapping is
        // replaced; the other arguments are plain values the kernel validates.
        let ptr = unsafe {
            match fd {
                Some(fd) => rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, fd, offset),
                None => rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, prot, flags),
            }
        }
        .map_err(|e| Error::os(format!("mmap({len} bytes at offset {offset})"), e.into()))?;
        Ok(Mapping { ptr: NonNull::new(ptr.cast()).expect("mmap never returns NULL on success"), len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `[addr, addr + len)` lies inside this mapping.
    #[cfg(test)]
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.ptr.as_ptr() as usize;
        addr >= base && addr.checked_add(len).is_some_and(|end| end <= base + self.len)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the range this value mapped and still owns.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The alignment of a mapping's offset into its file: the page size on Unix.
pub fn map_granularity() -> usize {
    page_size()
}

/// The system's base page size.
pub fn page_size() -> usize {
    // libc, not rustix::param::page_size: rustix reads the auxiliary vector through
    // PR_GET_AUXV and checks the vDSO it names, which a process under valgrind does not map
    // (it crashes there).
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::{shm, ShmOptions};

    #[test]
    fn two_mappings_of_one_memfd_share_bytes() {
        let fd = shm::create("lf-map", 8192, ShmOptions::default()).unwrap();
        let a = Mapping::shared(&fd, 0, 8192).unwrap();
        let b = Mapping::shared(&fd, 4096, 4096).unwrap();
        // SAFETY: both mappings are live and 4096..8192 of `a` is the start of `b`.
        unsafe {
            a.as_ptr().add(4096).write(42);
            assert_eq!(b.as_ptr().read(), 42);
        }
        assert!(a.contains(a.as_ptr() as usize + 8000, 192));
        assert!(!a.contains(a.as_ptr() as usize + 8000, 193));
    }

    #[test]
    fn zero_length_is_refused() {
        assert!(matches!(Mapping::anonymous(0), Err(Error::InvalidArgument(_))));
    }
}
