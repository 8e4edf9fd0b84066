//! An owned view of memory on Windows, released on drop: a view of a section
//! (`MapViewOfFile`), private memory (`VirtualAlloc`), or two views back to back in one range
//! (placeholders).

use std::os::windows::io::{AsHandle, AsRawHandle};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_INVALID_PARAMETER, HANDLE};
use windows_sys::Win32::System::Memory::{
    MapViewOfFile, MapViewOfFileEx, UnmapViewOfFile, VirtualAlloc, VirtualFree, FILE_MAP_READ, FILE_MAP_WRITE,
    MEMORY_MAPPED_VIEW_ADDRESS, MEM_COMMIT, MEM_RELEASE, MEM_REPLACE_PLACEHOLDER, MEM_RESERVE, MEM_RESERVE_PLACEHOLDER,
    PAGE_NOACCESS, PAGE_READONLY, PAGE_READWRITE,
};
use windows_sys::Win32::System::SystemInformation::{GetSystemInfo, SYSTEM_INFO};
use windows_sys::Win32::System::Threading::GetCurrentProcess;

use super::{last_error, system_function, SystemFunction};
use crate::error::{Error, Result};

/// `VirtualFree`'s flag that splits a placeholder instead of freeing it.
const MEM_PRESERVE_PLACEHOLDER: u32 = 0x2;

/// How a [`Mapping`] gives its range back.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// One view of a section.
    View,
    /// Private memory from `VirtualAlloc`.
    Private,
    /// Two views, the second at this offset.
    Pair { second_at: usize },
}

/// A mapping that this value owns.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    kind: Kind,
    /// How many bytes from the start may be written.
    writable_len: usize,
}

// SAFETY: a Mapping is a plain region of memory; sharing the pointer between threads is as
// safe as sharing any raw memory, and the users of the bytes synchronise their own access.
unsafe impl Send for Mapping {}
// SAFETY: see Send; &Mapping only hands out the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of the section `handle` from `offset` (a multiple of
    /// [`map_granularity`]), read-write and shared.
    pub fn shared(handle: &impl AsHandle, offset: u64, len: usize) -> Result<Self> {
        Self::view(handle.as_handle().as_raw_handle(), offset, len, true)
    }

    /// As [`Mapping::shared`], readable only: for memory this process must never write.
    pub fn shared_read_only(handle: &impl AsHandle, offset: u64, len: usize) -> Result<Self> {
        Self::view(handle.as_handle().as_raw_handle(), offset, len, false)
    }

    /// `len` bytes of fresh, private, zeroed memory.
    pub fn anonymous(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("cannot map 0 bytes"));
        }
        // SAFETY: a NULL address lets the system choose a fresh range.
        let ptr = unsafe { VirtualAlloc(std::ptr::null(), len, MEM_RESERVE | MEM_COMMIT, PAGE_READWRITE) };
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| last_error(format!("VirtualAlloc({len} bytes)")))?;
        Ok(Mapping { ptr, len, kind: Kind::Private, writable_len: len })
    }

    /// Maps two sections back to back in one range: the first `first.1` bytes of `first.0`
    /// read-write, then the first `second.1` bytes of `second.0`, read-write only if
    /// `second_writable`. Both lengths must be multiples of [`map_granularity`]. One value
    /// owns (and unmaps) both. With placeholders (`VirtualAlloc2`, `MapViewOfFile3`: Windows
    /// 10 1803 or later) the range is never free in between; without them (older Windows,
    /// Wine 8) see [`Mapping::pair_at_a_free_range`].
    pub fn shared_pair(
        first: (&impl AsHandle, usize),
        second: (&impl AsHandle, usize),
        second_writable: bool,
    ) -> Result<Self> {
        let granularity = map_granularity();
        let (first_len, second_len) = (first.1, second.1);
        if first_len % granularity != 0 || second_len % granularity != 0 {
            return Err(Error::invalid(format!(
                "mapping parts of {first_len} and {second_len} bytes: on Windows each must be a multiple of {granularity} bytes"
            )));
        }
        let total = first_len
            .checked_add(second_len)
            .ok_or_else(|| Error::invalid(format!("mapping parts of {first_len} and {second_len} bytes overflow")))?;
        let (first, second) = (first.0.as_handle().as_raw_handle(), second.0.as_handle().as_raw_handle());
        if second_len == 0 {
            return Self::view(first, 0, first_len, true);
        }
        if first_len == 0 {
            return Self::view(second, 0, second_len, second_writable);
        }
        let Ok(api) = placeholders() else {
            return Self::pair_at_a_free_range((first, first_len), (second, second_len), second_writable);
        };
        // SAFETY: reserves a fresh range chosen by the system, as one placeholder.
        let base = unsafe {
            (api.virtual_alloc2)(
                GetCurrentProcess(),
                std::ptr::null(),
                total,
                MEM_RESERVE | MEM_RESERVE_PLACEHOLDER,
                PAGE_NOACCESS,
                std::ptr::null_mut(),
                0,
            )
        };
        if base.is_null() {
            let e = std::io::Error::last_os_error();
            // The arguments are valid where placeholders exist; a system that has the
            // function but not the flag (Wine 8) refuses them as invalid.
            if e.raw_os_error() == Some(ERROR_INVALID_PARAMETER as i32) {
                return Self::pair_at_a_free_range((first, first_len), (second, second_len), second_writable);
            }
            return Err(super::os_error(format!("VirtualAlloc2 (a placeholder of {total} bytes)"), e));
        }
        // SAFETY: splits the placeholder reserved above into [0, first_len) and the rest.
        if unsafe { VirtualFree(base, first_len, MEM_RELEASE | MEM_PRESERVE_PLACEHOLDER) } == 0 {
            let e = last_error("VirtualFree splitting a placeholder");
            // SAFETY: frees the placeholder reserved above, whole.
            unsafe { VirtualFree(base, 0, MEM_RELEASE) };
            return Err(e);
        }
        let second_base = base.cast::<u8>().wrapping_add(first_len).cast::<core::ffi::c_void>();
        let second_prot = if second_writable { PAGE_READWRITE } else { PAGE_READONLY };
        let mut mapped = [false; 2];
        for (i, (section, at, len, prot)) in
            [(first, base, first_len, PAGE_READWRITE), (second, second_base, second_len, second_prot)]
                .into_iter()
                .enumerate()
        {
            // SAFETY: replaces exactly one of the two placeholders made above with a view.
            let view = unsafe {
                (api.map_view_of_file3)(
                    section,
                    GetCurrentProcess(),
                    at,
                    0,
                    len,
                    MEM_REPLACE_PLACEHOLDER,
                    prot,
                    std::ptr::null_mut(),
                    0,
                )
            };
            if view.is_null() {
                let e = view_error(
                    format!("MapViewOfFile3 (part {} of a pair, {len} bytes)", i + 1),
                    prot == PAGE_READWRITE,
                );
                for (j, at) in [base, second_base].into_iter().enumerate() {
                    // SAFETY: each part is either a view mapped above or a placeholder made
                    // above; both are released whole.
                    unsafe {
                        if mapped[j] {
                            UnmapViewOfFile(MEMORY_MAPPED_VIEW_ADDRESS { Value: at });
                        } else {
                            VirtualFree(at, 0, MEM_RELEASE);
                        }
                    }
                }
                return Err(e);
            }
            mapped[i] = true;
        }
        let ptr = NonNull::new(base.cast()).expect("checked above");
        let writable_len = if second_writable { total } else { first_len };
        Ok(Mapping { ptr, len: total, kind: Kind::Pair { second_at: first_len }, writable_len })
    }

    /// [`Mapping::shared_pair`] without placeholders: finds a free range of the whole length
    /// (reserving it, then freeing it), then maps the two views at its two addresses
    /// (`MapViewOfFileEx`). Between the free and the maps another thread may take part of the
    /// range; then the views are undone and another range is tried, a few times.
    fn pair_at_a_free_range(
        (first, first_len): (HANDLE, usize),
        (second, second_len): (HANDLE, usize),
        second_writable: bool,
    ) -> Result<Self> {
        const ATTEMPTS: usize = 16;
        let total = first_len + second_len;
        let second_access = if second_writable { FILE_MAP_READ | FILE_MAP_WRITE } else { FILE_MAP_READ };
        for _ in 0..ATTEMPTS {
            // SAFETY: reserves a fresh range the system chooses, freed at once: only its
            // address is wanted.
            let base = unsafe { VirtualAlloc(std::ptr::null(), total, MEM_RESERVE, PAGE_NOACCESS) };
            if base.is_null() {
                return Err(last_error(format!("VirtualAlloc (reserving {total} bytes for a pair of views)")));
            }
            // SAFETY: releases the reservation made above, whole.
            unsafe { VirtualFree(base, 0, MEM_RELEASE) };
            let second_base = base.cast::<u8>().wrapping_add(first_len).cast::<core::ffi::c_void>();
            // SAFETY: a view at a given address either lands there or fails; it never
            // replaces a mapping.
            let a = unsafe { MapViewOfFileEx(first, FILE_MAP_READ | FILE_MAP_WRITE, 0, 0, first_len, base) };
            if a.Value.is_null() {
                match taken_or_error(format!("MapViewOfFileEx (part 1 of a pair, {first_len} bytes)"), true) {
                    None => continue,
                    Some(e) => return Err(e),
                }
            }
            // SAFETY: as above, at the address right after the first view.
            let b = unsafe { MapViewOfFileEx(second, second_access, 0, 0, second_len, second_base) };
            if b.Value.is_null() {
                let outcome =
                    taken_or_error(format!("MapViewOfFileEx (part 2 of a pair, {second_len} bytes)"), second_writable);
                // SAFETY: the first view, mapped above, owned by nothing else.
                unsafe { UnmapViewOfFile(a) };
                match outcome {
                    None => continue,
                    Some(e) => return Err(e),
                }
            }
            let ptr = NonNull::new(base.cast()).expect("checked above");
            let writable_len = if second_writable { total } else { first_len };
            return Ok(Mapping { ptr, len: total, kind: Kind::Pair { second_at: first_len }, writable_len });
        }
        Err(Error::InvalidState(format!(
            "mapping two sections back to back ({total} bytes): another thread took the free range {ATTEMPTS} times \
             in a row; retry, or run on Windows 10 1803 or later (placeholders)"
        )))
    }

    /// Faults in `len` bytes from `offset` now (for writing, or only for reading), so that
    /// first touches later do not: one touch per page (an atomic add of nothing, for writing,
    /// so that a concurrent writer's bytes are kept). Whether it was done: not for a range
    /// outside the mapping, nor for writing a range that is not writable throughout.
    pub fn populate(&self, offset: usize, len: usize, write: bool) -> bool {
        let limit = if write { self.writable_len } else { self.len };
        if offset.checked_add(len).map_or(true, |end| end > limit) || len == 0 {
            return false;
        }
        let page = page_size();
        let start = self.ptr.as_ptr() as usize + offset;
        let mut at = start & !(page - 1);
        while at < start + len {
            let byte = at.max(start) as *mut u8;
            // SAFETY: `byte` lies inside this live mapping (checked above), which is readable,
            // and writable when `write` is; an atomic access races with no other access.
            unsafe {
                if write {
                    AtomicU8::from_ptr(byte).fetch_add(0, Ordering::Relaxed);
                } else {
                    std::ptr::read_volatile(byte);
                }
            }
            at += page;
        }
        true
    }

    fn view(section: HANDLE, offset: u64, len: usize, writable: bool) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid("cannot map 0 bytes"));
        }
        let granularity = map_granularity() as u64;
        if offset % granularity != 0 {
            return Err(Error::invalid(format!(
                "mapping offset {offset}: on Windows an offset must be a multiple of {granularity} bytes"
            )));
        }
        let access = if writable { FILE_MAP_READ | FILE_MAP_WRITE } else { FILE_MAP_READ };
        // SAFETY: a view at an address the system chooses, so no existing mapping is
        // replaced; the other arguments are plain values the system validates.
        let view = unsafe { MapViewOfFile(section, access, (offset >> 32) as u32, offset as u32, len) };
        let ptr = NonNull::new(view.Value.cast())
            .ok_or_else(|| view_error(format!("MapViewOfFile({len} bytes at offset {offset})"), writable))?;
        Ok(Mapping { ptr, len, kind: Kind::View, writable_len: if writable { len } else { 0 } })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `[addr, addr + len)` lies inside this mapping.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.ptr.as_ptr() as usize;
        addr >= base && addr.checked_add(len).is_some_and(|end| end <= base + self.len)
    }
}

/// After a view at a chosen address failed: `None` when the address was taken (try another
/// range), else the error.
fn taken_or_error(context: String, writable: bool) -> Option<Error> {
    let code = std::io::Error::last_os_error().raw_os_error();
    if code == Some(windows_sys::Win32::Foundation::ERROR_INVALID_ADDRESS as i32) {
        return None;
    }
    Some(view_error(context, writable))
}

/// The error of a failed view; access denied for a writable one means a read-only handle.
fn view_error(context: String, writable: bool) -> Error {
    let e = std::io::Error::last_os_error();
    if writable && e.raw_os_error() == Some(ERROR_ACCESS_DENIED as i32) {
        return Error::PermissionDenied(format!(
            "{context}: the section's handle is read-only; map it with shared_read_only"
        ));
    }
    super::os_error(context, e)
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let base = self.ptr.as_ptr().cast::<core::ffi::c_void>();
        // SAFETY: ptr/len/kind describe exactly what this value mapped and still owns.
        unsafe {
            match self.kind {
                Kind::View => {
                    UnmapViewOfFile(MEMORY_MAPPED_VIEW_ADDRESS { Value: base });
                }
                Kind::Private => {
                    VirtualFree(base, 0, MEM_RELEASE);
                }
                Kind::Pair { second_at } => {
                    UnmapViewOfFile(MEMORY_MAPPED_VIEW_ADDRESS { Value: base });
                    UnmapViewOfFile(MEMORY_MAPPED_VIEW_ADDRESS { Value: base.cast::<u8>().add(second_at).cast() });
                }
            }
        }
    }
}

type VirtualAlloc2 = unsafe extern "system" fn(
    HANDLE,
    *const core::ffi::c_void,
    usize,
    u32,
    u32,
    *mut core::ffi::c_void,
    u32,
) -> *mut core::ffi::c_void;
type MapViewOfFile3 = unsafe extern "system" fn(
    HANDLE,
    HANDLE,
    *const core::ffi::c_void,
    u64,
    usize,
    u32,
    u32,
    *mut core::ffi::c_void,
    u32,
) -> *mut core::ffi::c_void;

/// The placeholder functions, which Windows before 10 1803 (and some Wine versions) lack.
struct Placeholders {
    virtual_alloc2: VirtualAlloc2,
    map_view_of_file3: MapViewOfFile3,
}

fn placeholders() -> Result<&'static Placeholders> {
    static API: OnceLock<std::result::Result<Placeholders, String>> = OnceLock::new();
    API.get_or_init(|| {
        let find = |name: &std::ffi::CStr| {
            system_function("kernelbase.dll", name).ok_or_else(|| name.to_string_lossy().into_owned())
        };
        match (find(c"VirtualAlloc2"), find(c"MapViewOfFile3")) {
            // SAFETY: the documented signatures of these exports.
            (Ok(a), Ok(m)) => Ok(unsafe {
                Placeholders {
                    virtual_alloc2: std::mem::transmute::<SystemFunction, VirtualAlloc2>(a),
                    map_view_of_file3: std::mem::transmute::<SystemFunction, MapViewOfFile3>(m),
                }
            }),
            (a, m) => Err([a.err(), m.err()].into_iter().flatten().collect::<Vec<_>>().join(" and ")),
        }
    })
    .as_ref()
    .map_err(|missing| {
        Error::Unsupported(format!(
            "mapping two sections back to back needs placeholders (Windows 10 1803 or later); this system's \
             kernelbase.dll lacks {missing}: update Windows"
        ))
    })
}

/// (page size, allocation granularity), asked once.
fn system_info() -> (usize, usize) {
    static INFO: OnceLock<(usize, usize)> = OnceLock::new();
    *INFO.get_or_init(|| {
        // SAFETY: zeroed is a valid SYSTEM_INFO, which the call then fills.
        let mut info: SYSTEM_INFO = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is writable.
        unsafe { GetSystemInfo(&mut info) };
        let page = (info.dwPageSize as usize).max(4096);
        (page, (info.dwAllocationGranularity as usize).max(page))
    })
}

/// The system's page size.
pub fn page_size() -> usize {
    system_info().0
}

/// The alignment of a view's offset and address: the allocation granularity, 64 KiB.
pub fn map_granularity() -> usize {
    system_info().1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::windows::shm;
    use crate::os::ShmOptions;

    #[test]
    fn two_views_of_one_section_share_bytes() {
        let g = map_granularity();
        assert_eq!(g, 65536);
        assert!(page_size() >= 4096 && g % page_size() == 0);
        let h = shm::create("lf-map", 2 * g as u64, ShmOptions::default()).unwrap();
        let a = Mapping::shared(&h, 0, 2 * g).unwrap();
        let b = Mapping::shared(&h, g as u64, g).unwrap();
        // SAFETY: both views are live and g..2g of `a` is the start of `b`.
        unsafe {
            a.as_ptr().add(g).write(42);
            assert_eq!(b.as_ptr().read(), 42);
        }
        assert!(a.contains(a.as_ptr() as usize + 2 * g - 192, 192));
        assert!(!a.contains(a.as_ptr() as usize + 2 * g - 192, 193));
        assert!(a.populate(0, 2 * g, true) && b.populate(0, g, false));
        assert!(!a.populate(g, 2 * g, false));
        let ro = Mapping::shared_read_only(&h, 0, g).unwrap();
        assert!(!ro.populate(0, g, true) && ro.populate(0, g, false));
        assert!(matches!(Mapping::shared(&h, 4096, 4096), Err(Error::InvalidArgument(_))));
        assert!(matches!(Mapping::shared(&h, 0, 0), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn private_memory_is_zeroed_and_writable() {
        let m = Mapping::anonymous(100_000).unwrap();
        // SAFETY: the mapping is live and 100000 bytes long.
        unsafe {
            assert_eq!(m.as_ptr().add(99_999).read(), 0);
            m.as_ptr().add(99_999).write(1);
        }
        assert!(m.populate(0, 100_000, true));
        assert!(matches!(Mapping::anonymous(0), Err(Error::InvalidArgument(_))));
    }

    /// The pair is one range with each section's bytes in its part and the second part
    /// read-only when asked, with placeholders or (Wine) at a free range.
    #[test]
    fn a_pair_is_two_sections_back_to_back() {
        let g = map_granularity();
        let a = shm::create("lf-pair-a", g as u64, ShmOptions::default()).unwrap();
        let b = shm::create("lf-pair-b", 2 * g as u64, ShmOptions::default()).unwrap();
        let b_view = Mapping::shared(&b, 0, 2 * g).unwrap();
        // SAFETY: the view is live and 2g long.
        unsafe { b_view.as_ptr().write(7) };
        match Mapping::shared_pair((&a, g), (&b, 2 * g), false) {
            Ok(pair) => {
                assert_eq!(pair.len(), 3 * g);
                // SAFETY: the pair is live and 3g long; the first part is writable.
                unsafe {
                    assert_eq!(pair.as_ptr().add(g).read(), 7);
                    pair.as_ptr().write(9);
                }
                let a_view = Mapping::shared_read_only(&a, 0, g).unwrap();
                // SAFETY: the view is live and g long.
                assert_eq!(unsafe { a_view.as_ptr().read() }, 9);
                assert!(!pair.populate(0, 3 * g, true), "the read-only part was populated for writing");
                assert!(pair.populate(0, g, true) && pair.populate(0, 3 * g, false));
            }
            Err(e) => panic!("shared_pair: {e}"),
        }
        assert!(matches!(Mapping::shared_pair((&a, 4096), (&b, g), true), Err(Error::InvalidArgument(_))));
    }

    /// The fallback without placeholders, called directly so that it runs on Windows too:
    /// both parts at their places, each seeing its own section.
    #[test]
    fn a_pair_at_a_free_range_maps_both_parts_in_place() {
        let g = map_granularity();
        let a = shm::create("lf-pair-a", g as u64, ShmOptions::default()).unwrap();
        let b = shm::create("lf-pair-b", g as u64, ShmOptions::default()).unwrap();
        let pairs: Vec<Mapping> = (0..8)
            .map(|_| {
                Mapping::pair_at_a_free_range(
                    (a.as_handle().as_raw_handle(), g),
                    (b.as_handle().as_raw_handle(), g),
                    true,
                )
                .unwrap()
            })
            .collect();
        // SAFETY: every pair is live and 2g long, writable throughout.
        unsafe {
            pairs[0].as_ptr().write(1);
            pairs[0].as_ptr().add(g).write(2);
            for pair in &pairs {
                assert_eq!((pair.as_ptr().read(), pair.as_ptr().add(g).read()), (1, 2));
            }
        }
    }
}
