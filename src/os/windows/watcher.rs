//! Watches on Windows: a thread per watch in `WaitForMultipleObjects` on the watched handles
//! (a process handle is signalled when its process exits) and the watch's stop event, which
//! calls the watch's callback once, at the first handle signalled.
//!
//! A thread per watch, not one for the process as on Unix: a wait takes at most 64 handles,
//! so one thread could not serve many watches anyway, and a watch is made per peer, not per
//! message. Dropping the watch stops and joins its thread, so once the drop has returned the
//! callback is not running and never will. A callback must not drop its own watch.

use std::os::windows::io::{AsHandle, AsRawHandle, OwnedHandle};
use std::sync::Arc;
use std::thread::JoinHandle;

use windows_sys::Win32::Foundation::{HANDLE, WAIT_OBJECT_0};
use windows_sys::Win32::System::Threading::{CreateEventW, SetEvent, WaitForMultipleObjects, INFINITE};

use super::owned;
use crate::error::{Error, Result};

/// A handle that a watch keeps open while it watches it.
pub type SharedHandle = Arc<dyn AsHandle + Send + Sync>;

/// What a watch waits for on one handle, as on Unix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Signalled: a process handle whose process has exited, a set event.
    Readable,
    /// A stream whose peer closed its end. A pipe's handle is not signalled by that, so a
    /// watch only keeps such a handle open: the peer's end is learnt from its process handle
    /// (watched as `Readable`) and from the stream's next read.
    HangUp,
}

/// The most handles one watch takes: a wait takes 64, one of them the stop event.
pub const MAX_HANDLES: usize = 63;

/// A registration; dropping it stops the watch.
#[derive(Debug)]
pub struct Watch {
    stop: OwnedHandle,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// Watches the `Readable` handles of `handles` and calls `on_event` from the watch's thread
    /// when the first of them is signalled; `HangUp` ones are only kept open (see
    /// [`Interest::HangUp`]). Errors: no `Readable` handle or more than [`MAX_HANDLES`], or the
    /// thread or its stop event could not be made (the caller falls back on polling).
    pub fn new(handles: Vec<(SharedHandle, Interest)>, on_event: impl FnOnce() + Send + 'static) -> Result<Watch> {
        let readable = handles.iter().filter(|(_, interest)| *interest == Interest::Readable).count();
        if readable == 0 || readable > MAX_HANDLES {
            return Err(Error::invalid(format!(
                "a watch of {readable} signalled handles: watch between 1 and {MAX_HANDLES} (a stream's end alone \
                 cannot be waited on on Windows: watch its peer's process)"
            )));
        }
        // SAFETY: no security attributes, manual reset, initially unset, no name.
        let stop = owned(unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) }, || {
            "CreateEventW for a watch's stop event".into()
        })?;
        let stop_raw = SendHandle(stop.as_raw_handle());
        let thread = std::thread::Builder::new()
            .name("lava-flow-watch".into())
            .spawn(move || {
                let stop_raw = stop_raw;
                let mut waited: Vec<HANDLE> = vec![stop_raw.0];
                waited.extend(
                    handles
                        .iter()
                        .filter(|(_, interest)| *interest == Interest::Readable)
                        .map(|(h, _)| h.as_handle().as_raw_handle()),
                );
                // SAFETY: every handle in `waited` stays open while this thread runs: the
                // watched ones are held by `handles`, the stop event by the Watch, which joins
                // this thread before closing it.
                let r = unsafe { WaitForMultipleObjects(waited.len() as u32, waited.as_ptr(), 0, INFINITE) };
                let index = r.wrapping_sub(WAIT_OBJECT_0) as usize;
                // A failed wait (a handle that cannot be waited on) reports too: the watched
                // peer cannot be vouched for any more.
                if index != 0 {
                    on_event();
                }
                drop(handles);
            })
            .map_err(|e| super::os_error("starting a watch's thread", e))?;
        Ok(Watch { stop, thread: Some(thread) })
    }
}

/// A raw handle moved to the watch's thread.
struct SendHandle(HANDLE);
// SAFETY: a handle value is a process-wide index, usable from any thread.
unsafe impl Send for SendHandle {}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: the stop event this value owns.
        unsafe { SetEvent(self.stop.as_raw_handle()) };
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::windows::{event, notify};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn a_signalled_handle_calls_back_once_and_a_dropped_watch_never() {
        let (waited, notifier) = notify::notify_pair().unwrap();
        let (other, _other_notifier) = notify::notify_pair().unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let waited: SharedHandle = Arc::new(waited);
        let watch =
            Watch::new(vec![(Arc::new(other), Interest::Readable), (waited.clone(), Interest::Readable)], move || {
                c.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        notify::notify(notifier.as_handle());
        let start = Instant::now();
        while calls.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(watch);
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let quiet = Arc::new(AtomicU32::new(0));
        let q = quiet.clone();
        let (unset, notifier) = notify::notify_pair().unwrap();
        let watch = Watch::new(vec![(Arc::new(unset), Interest::Readable)], move || {
            q.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        drop(watch);
        notify::notify(notifier.as_handle());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(quiet.load(Ordering::SeqCst), 0);
        assert!(matches!(Watch::new(vec![], || ()), Err(Error::InvalidArgument(_))));
        let stream_only: SharedHandle = Arc::new(event::new().unwrap());
        assert!(
            matches!(Watch::new(vec![(stream_only, Interest::HangUp)], || ()), Err(Error::InvalidArgument(_))),
            "a watch with nothing a wait can report"
        );
    }
}
