//! Waiting for any of a few handles to be ready on Windows: `WaitForMultipleObjects` over
//! them (an event set, a process exited), as Unix polls them.

use std::os::windows::io::{AsRawHandle, BorrowedHandle};
use std::time::Duration;

use windows_sys::Win32::Foundation::{HANDLE, WAIT_FAILED, WAIT_OBJECT_0, WAIT_TIMEOUT};
use windows_sys::Win32::System::Threading::{WaitForMultipleObjects, WaitForSingleObject, INFINITE};

use super::stream::Listener;
use crate::error::{Error, Result};

/// How often [`wait_listener`] looks for a client: a named pipe's listener is not a handle
/// that a wait can take without accepting.
const LISTENER_SLICE_MS: u32 = 10;

fn millis(timeout: Option<Duration>) -> u32 {
    timeout.map_or(INFINITE, |t| u32::try_from(t.as_millis()).unwrap_or(INFINITE - 1).min(INFINITE - 1))
}

/// Waits until one of `handles` (at most 64) is signalled or `timeout` passes (`None`: no
/// limit); whether one is.
pub fn wait_readable(handles: &[BorrowedHandle<'_>], timeout: Option<Duration>) -> Result<bool> {
    if handles.is_empty() || handles.len() > 64 {
        return Err(Error::invalid(format!(
            "a wait over {} handles: Windows waits on 1 to 64 at once; wait on fewer",
            handles.len()
        )));
    }
    let raw: Vec<HANDLE> = handles.iter().map(|h| h.as_raw_handle()).collect();
    // SAFETY: `raw` holds handles borrowed for the call's whole length; wait for any one.
    let got = unsafe { WaitForMultipleObjects(raw.len() as u32, raw.as_ptr(), 0, millis(timeout)) };
    match got {
        WAIT_TIMEOUT => Ok(false),
        WAIT_FAILED => Err(Error::os("WaitForMultipleObjects", std::io::Error::last_os_error())),
        n if n < WAIT_OBJECT_0 + raw.len() as u32 => Ok(true),
        // An abandoned mutex: none is waited on here; count it as ready.
        _ => Ok(true),
    }
}

/// Waits until `stop` is signalled (false) or a slice has passed (true: the caller tries to
/// accept without waiting, and asks again if none came). The listener is not waited on
/// directly, so a client waits at most a slice more than on Unix.
pub fn wait_listener(_listener: &Listener, stop: BorrowedHandle<'_>) -> Result<bool> {
    // SAFETY: a handle borrowed for the call.
    Ok(unsafe { WaitForSingleObject(stop.as_raw_handle(), LISTENER_SLICE_MS) } != WAIT_OBJECT_0)
}
