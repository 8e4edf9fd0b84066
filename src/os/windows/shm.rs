//! Shared memory on Windows: pagefile-backed sections (`CreateFileMappingW` on
//! `INVALID_HANDLE_VALUE`), unnamed, so that no other process can open one by name; other
//! processes get a handle only when one is passed to them.

use std::os::windows::io::{AsHandle, AsRawHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{DuplicateHandle, HANDLE, INVALID_HANDLE_VALUE};
use windows_sys::Win32::System::Memory::{
    CreateFileMappingW, MapViewOfFile, UnmapViewOfFile, VirtualQuery, FILE_MAP_READ, MEMORY_BASIC_INFORMATION,
    PAGE_READWRITE, SECTION_QUERY, SEC_COMMIT,
};
use windows_sys::Win32::System::Threading::GetCurrentProcess;

use super::{last_error, owned, system_function};
use crate::error::{Error, Result};
use crate::os::ShmOptions;

/// Creates a section of `size` bytes, zeroed, committed against the pagefile. `name_hint` is
/// for error messages only: a named section could be opened (or squatted) by any process of
/// the session. Huge pages (`SEC_LARGE_PAGES`) need the lock-memory privilege, which ordinary
/// accounts lack, so they are refused. `sealable` changes nothing: every section's size is
/// fixed, and every section can give a read-only handle.
pub fn create(name_hint: &str, size: u64, options: ShmOptions) -> Result<OwnedHandle> {
    if size == 0 {
        return Err(Error::invalid(format!("shared memory {name_hint:?} of 0 bytes: ask for at least one byte")));
    }
    if let Some(page) = options.huge_page_size {
        return Err(Error::Unsupported(format!(
            "shared memory {name_hint:?} on huge pages of {page} bytes: Windows gives large pages only to accounts \
             with the lock-memory privilege; ask for ordinary pages"
        )));
    }
    // SAFETY: INVALID_HANDLE_VALUE asks for a pagefile-backed section; no security attributes
    // (the handle is not inherited) and no name.
    let raw = unsafe {
        CreateFileMappingW(
            INVALID_HANDLE_VALUE,
            std::ptr::null(),
            PAGE_READWRITE | SEC_COMMIT,
            (size >> 32) as u32,
            size as u32,
            std::ptr::null(),
        )
    };
    owned(raw, || format!("CreateFileMappingW (shared memory {name_hint:?} of {size} bytes)"))
}

/// `SECTION_BASIC_INFORMATION`, what `NtQuerySection` reports of class 0.
#[repr(C)]
struct SectionBasicInformation {
    base_address: *mut core::ffi::c_void,
    allocation_attributes: u32,
    maximum_size: i64,
}

type NtQuerySection = unsafe extern "system" fn(HANDLE, u32, *mut core::ffi::c_void, usize, *mut usize) -> i32;

/// The size of the section behind `handle`: what it was created with (which Windows may
/// round up to whole pages). `NtQuerySection` where ntdll exports it; else the size of a
/// whole view of it, which is whole pages.
pub fn size_of(handle: &impl AsHandle) -> Result<u64> {
    let raw = handle.as_handle().as_raw_handle();
    if let Some(query) = system_function("ntdll.dll", c"NtQuerySection") {
        // SAFETY: NtQuerySection has had this signature since Windows NT.
        let query: NtQuerySection = unsafe { std::mem::transmute(query) };
        let mut info =
            SectionBasicInformation { base_address: std::ptr::null_mut(), allocation_attributes: 0, maximum_size: 0 };
        // SAFETY: `info` is writable for the size passed.
        let status = unsafe {
            query(
                raw,
                0,
                (&mut info as *mut SectionBasicInformation).cast(),
                std::mem::size_of_val(&info),
                std::ptr::null_mut(),
            )
        };
        if status >= 0 && info.maximum_size > 0 {
            return Ok(info.maximum_size as u64);
        }
    }
    // SAFETY: maps the whole section (size 0) for reading, unmapped below.
    let view = unsafe { MapViewOfFile(raw, FILE_MAP_READ, 0, 0, 0) };
    if view.Value.is_null() {
        return Err(last_error("mapping a section to learn its size (is the handle a section with map access?)"));
    }
    // SAFETY: zeroed is a valid MEMORY_BASIC_INFORMATION (integers and pointers).
    let mut info: MEMORY_BASIC_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is writable for the size passed; the address is the view's.
    let n = unsafe { VirtualQuery(view.Value, &mut info, std::mem::size_of_val(&info)) };
    // SAFETY: the view was mapped above and nothing else refers to it.
    unsafe { UnmapViewOfFile(view) };
    if n == 0 {
        return Err(last_error("VirtualQuery of a view of a section"));
    }
    Ok(info.RegionSize as u64)
}

/// Whether `handle` is a section (one whose size can be asked, and that can be mapped).
pub fn is_shm(handle: &impl AsHandle) -> bool {
    size_of(handle).is_ok()
}

/// Sections are unnamed (see the module doc), so there is no name to check: any section
/// passes, as on macOS.
pub fn has_name_prefix(handle: &impl AsHandle, _prefix: &str) -> bool {
    is_shm(handle)
}

/// The size of the pages backing a section: the base page size (huge pages are refused).
pub fn page_size_of(_handle: &impl AsHandle) -> Result<usize> {
    Ok(super::mapping::page_size())
}

/// Makes the size final. A section's size never changes, so there is nothing to do; `what`
/// names the memory on other platforms' errors.
pub fn fix_size(_handle: &impl AsHandle, _what: &str) -> Result<()> {
    Ok(())
}

/// Whether no one can change the size any more: always, for a section.
pub fn size_is_fixed(_handle: &impl AsHandle) -> bool {
    true
}

/// A handle of the same section through which the kernel lets no one write: map-read access
/// only (and query, for [`size_of`]); a writable view through it is refused with access
/// denied, in this process or any it is passed to. Views made before stay as they are.
pub fn read_only(handle: &impl AsHandle, what: &str) -> Result<OwnedHandle> {
    let mut dup: HANDLE = std::ptr::null_mut();
    // SAFETY: duplicates a valid handle within this process (pseudo handles need no closing);
    // the new handle is returned through `dup`.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            handle.as_handle().as_raw_handle(),
            GetCurrentProcess(),
            &mut dup,
            FILE_MAP_READ | SECTION_QUERY,
            0,
            0,
        )
    };
    owned(if ok != 0 { dup } else { std::ptr::null_mut() }, || {
        format!("DuplicateHandle of {what} with read access only")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::windows::mapping::Mapping;

    #[test]
    fn a_section_has_its_size_and_it_is_fixed() {
        for size in [65536u64, 3 << 20, 5 << 30] {
            let h = create("lf-test", size, ShmOptions::default()).unwrap();
            assert_eq!(size_of(&h).unwrap(), size);
            fix_size(&h, "the test's memory").unwrap();
            assert!(size_is_fixed(&h));
        }
        assert!(matches!(create("lf-test", 0, ShmOptions::default()), Err(Error::InvalidArgument(_))));
        let huge = ShmOptions { huge_page_size: Some(2 << 20), sealable: false };
        assert!(matches!(create("lf-test", 1 << 21, huge), Err(Error::Unsupported(_))));
    }

    #[test]
    fn the_read_only_handle_refuses_a_writable_view() {
        let h = create("lf-test", 65536, ShmOptions::default()).unwrap();
        let writable = Mapping::shared(&h, 0, 65536).unwrap();
        // SAFETY: the view is live and 65536 bytes long.
        unsafe { writable.as_ptr().add(100).write(0x5a) };
        let ro = read_only(&h, "a test section").unwrap();
        match Mapping::shared(&ro, 0, 65536) {
            Err(Error::PermissionDenied(m)) => assert!(m.contains("read-only"), "{m}"),
            other => panic!("a writable view through the read-only handle: {other:?}"),
        }
        let view = Mapping::shared_read_only(&ro, 0, 65536).unwrap();
        // SAFETY: the view is live and 65536 bytes long.
        assert_eq!(unsafe { view.as_ptr().add(100).read() }, 0x5a);
        assert_eq!(size_of(&ro).unwrap(), 65536);
        // A duplicate of the read-only handle cannot regain write access either.
        let again = read_only(&ro, "a test section").unwrap();
        assert!(Mapping::shared(&again, 0, 65536).is_err());
    }
}
