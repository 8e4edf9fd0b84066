//! An in-process event on Windows: a manual-reset event object, signalled by [`signal`],
//! unset by [`drain`], waited on by `WaitForMultipleObjects` (the watcher, a loop's wait).

use std::os::windows::io::{AsRawHandle, BorrowedHandle, OwnedHandle};

use windows_sys::Win32::System::Threading::{CreateEventW, ResetEvent, SetEvent};

use super::owned;
use crate::error::Result;

/// A new event, unset, not inherited.
pub fn new() -> Result<OwnedHandle> {
    // SAFETY: no security attributes, manual reset, initially unset, no name.
    owned(unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) }, || {
        "CreateEventW for an event (the process is out of handles: check for leaked channels)".into()
    })
}

/// Sets the event; a waiter wakes. Never waits.
pub fn signal(handle: BorrowedHandle<'_>) {
    // SAFETY: SetEvent on any handle value at most fails.
    unsafe { SetEvent(handle.as_raw_handle()) };
}

/// Unsets the event until the next [`signal`].
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn drain(handle: BorrowedHandle<'_>) {
    // SAFETY: ResetEvent on any handle value at most fails.
    unsafe { ResetEvent(handle.as_raw_handle()) };
}

/// Whether the event is set (without waiting).
pub fn is_set(handle: BorrowedHandle<'_>) -> bool {
    use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
    use windows_sys::Win32::System::Threading::WaitForSingleObject;
    // SAFETY: a zero-timeout wait on a handle the caller keeps open.
    unsafe { WaitForSingleObject(handle.as_raw_handle(), 0) == WAIT_OBJECT_0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::windows::io::AsHandle;

    #[test]
    fn an_event_is_set_by_signal_and_unset_by_drain() {
        let event = new().unwrap();
        assert!(!is_set(event.as_handle()));
        signal(event.as_handle());
        assert!(is_set(event.as_handle()));
        assert!(is_set(event.as_handle()), "a manual-reset event stays set until drained");
        drain(event.as_handle());
        assert!(!is_set(event.as_handle()));
    }
}
