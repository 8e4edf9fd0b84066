//! Notifications between processes on Windows: a manual-reset event. The notifier sets it
//! (an event loop waiting on it wakes), the waiter resets it. Each side holds its own handle
//! of the one event; the notifier's end is duplicated into the peer like any handle.
//!
//! An event does not tell when the other holder has gone (a socket pair's end does), so
//! [`drain_peer`] always says no: on Windows a peer's death is learnt from its process handle.

use std::os::windows::io::{AsRawHandle, BorrowedHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{DuplicateHandle, DUPLICATE_SAME_ACCESS, HANDLE};
use windows_sys::Win32::System::Threading::{CreateEventW, GetCurrentProcess, ResetEvent, SetEvent};

use super::{last_error, owned, system_function};
use crate::error::{Error, Result};

/// A notification pair: (the handle that is waited on, the handle that notifies), two handles
/// of one manual-reset event, unset, not inherited.
pub fn notify_pair() -> Result<(OwnedHandle, OwnedHandle)> {
    // SAFETY: no security attributes, manual reset, initially unset, no name.
    let waited = owned(unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) }, || {
        "CreateEventW for a notification".into()
    })?;
    let mut dup: HANDLE = std::ptr::null_mut();
    // SAFETY: duplicates a valid handle within this process, with the same access.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            waited.as_raw_handle(),
            GetCurrentProcess(),
            &mut dup,
            0,
            0,
            DUPLICATE_SAME_ACCESS,
        )
    };
    let notifier =
        owned(if ok != 0 { dup } else { std::ptr::null_mut() }, || "DuplicateHandle of a notification".into())?;
    Ok((waited, notifier))
}

/// Sets the event. Never waits; a handle that is not an event has nobody to tell, so errors
/// are ignored.
pub fn notify(end: BorrowedHandle<'_>) {
    // SAFETY: SetEvent on any handle value at most fails.
    unsafe { SetEvent(end.as_raw_handle()) };
}

/// Resets the event, so that it is not signalled until the next [`notify`].
pub fn drain(end: BorrowedHandle<'_>) {
    // SAFETY: ResetEvent on any handle value at most fails.
    unsafe { ResetEvent(end.as_raw_handle()) };
}

/// [`drain`]s, and says whether the notifier's holder has gone: an event cannot tell, so
/// never (see the module doc).
pub fn drain_peer(end: BorrowedHandle<'_>) -> bool {
    drain(end);
    false
}

/// `PUBLIC_OBJECT_TYPE_INFORMATION`'s start: the type's name.
#[repr(C)]
struct TypeName {
    length: u16,
    maximum_length: u16,
    buffer: *const u16,
}

type NtQueryObject = unsafe extern "system" fn(HANDLE, u32, *mut core::ffi::c_void, u32, *mut u32) -> i32;

/// Checks that `handle`, received from a peer as its notification end, is an event (what else
/// a peer could pass might block a wait, or not be resettable).
pub fn check_end(handle: &OwnedHandle, whose: &str) -> Result<()> {
    let query = system_function("ntdll.dll", c"NtQueryObject")
        .ok_or_else(|| Error::Unsupported("ntdll.dll lacks NtQueryObject: update Windows".into()))?;
    // SAFETY: NtQueryObject has had this signature since Windows NT.
    let query: NtQueryObject = unsafe { std::mem::transmute(query) };
    // The name's characters follow the structure in the same buffer, so it is pointer-aligned.
    let mut buf = vec![0usize; 128];
    let size = (buf.len() * std::mem::size_of::<usize>()) as u32;
    // SAFETY: the buffer is writable for `size` bytes; class 2 is ObjectTypeInformation.
    let status = unsafe { query(handle.as_raw_handle(), 2, buf.as_mut_ptr().cast(), size, std::ptr::null_mut()) };
    if status < 0 {
        return Err(last_error(format!("NtQueryObject of {whose} (status {status:#x})")));
    }
    // SAFETY: on success the buffer starts with the type's name, whose characters lie in the
    // buffer, which lives to the end of this function.
    let name = unsafe {
        let name = &*buf.as_ptr().cast::<TypeName>();
        String::from_utf16_lossy(std::slice::from_raw_parts(name.buffer, usize::from(name.length / 2)))
    };
    if name != "Event" {
        return Err(Error::Corrupt(format!("{whose} is a {name}, not an event")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::windows::io::AsHandle;
    use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
    use windows_sys::Win32::System::Threading::WaitForSingleObject;

    pub(crate) fn signalled(h: &OwnedHandle) -> bool {
        // SAFETY: a valid handle, no wait.
        unsafe { WaitForSingleObject(h.as_raw_handle(), 0) == WAIT_OBJECT_0 }
    }

    #[test]
    fn a_notification_signals_the_event_until_drained() {
        let (waited, notifier) = notify_pair().unwrap();
        check_end(&waited, "the test's end").unwrap();
        assert!(!signalled(&waited));
        for _ in 0..100 {
            notify(notifier.as_handle());
        }
        assert!(signalled(&waited));
        assert!(signalled(&waited), "a wait consumed a manual-reset event");
        drain(waited.as_handle());
        assert!(!signalled(&waited));
        notify(notifier.as_handle());
        drop(notifier);
        assert!(!drain_peer(waited.as_handle()));
        assert!(!signalled(&waited));
    }

    #[test]
    fn only_an_event_is_accepted() {
        let section = crate::os::windows::shm::create("lf-not-an-event", 65536, Default::default()).unwrap();
        match check_end(&section, "a section") {
            Err(Error::Corrupt(m)) => assert!(m.contains("not an event"), "{m}"),
            other => panic!("a section passed as an event: {other:?}"),
        }
    }
}
