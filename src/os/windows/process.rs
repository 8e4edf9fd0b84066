//! A peer process, by a handle that is signalled when it exits.

use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, OwnedHandle};
use std::time::Duration;

use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
use windows_sys::Win32::System::Threading::{
    OpenProcess, WaitForSingleObject, INFINITE, PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SYNCHRONIZE,
};

/// A handle of another process that can tell whether it has exited.
#[derive(Debug)]
pub struct PeerProcess {
    handle: OwnedHandle,
}

impl PeerProcess {
    /// Opens process `pid` for waiting on its exit; `None` when it does not exist (or has
    /// exited and been reaped) or may not be opened. As with any pid, one that has exited
    /// may name a new process: open the pid of a peer known to be alive (a connected one).
    pub fn open(pid: i32) -> Option<PeerProcess> {
        let pid = u32::try_from(pid).ok()?;
        // SAFETY: OpenProcess with plain values; the handle is owned below.
        let raw = unsafe { OpenProcess(PROCESS_SYNCHRONIZE | PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
        super::owned(raw, String::new).ok().map(|handle| PeerProcess { handle })
    }

    /// Whether the process has exited.
    pub fn has_exited(&self) -> bool {
        self.wait_for_exit(Duration::ZERO)
    }

    /// Waits up to `timeout` for the process to exit; returns whether it has.
    pub fn wait_for_exit(&self, timeout: Duration) -> bool {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(INFINITE - 1).min(INFINITE - 1);
        // SAFETY: a valid process handle this value owns.
        unsafe { WaitForSingleObject(self.handle.as_raw_handle(), ms) == WAIT_OBJECT_0 }
    }
}

impl AsHandle for PeerProcess {
    fn as_handle(&self) -> BorrowedHandle<'_> {
        self.handle.as_handle()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::windows::test_child;

    #[test]
    fn a_child_is_seen_alive_then_exited() {
        if test_child::role().is_some() {
            std::thread::sleep(Duration::from_millis(300));
            return;
        }
        let mut child = test_child::spawn(
            &test_child::test_path(module_path!(), "a_child_is_seen_alive_then_exited"),
            "sleep",
            &[],
        );
        let peer = PeerProcess::open(child.id() as i32).expect("opening a live child");
        assert!(!peer.has_exited());
        assert!(peer.wait_for_exit(Duration::from_secs(30)), "the child did not exit");
        assert!(peer.has_exited());
        assert!(child.wait().unwrap().success());
        assert!(PeerProcess::open(i32::MAX - 3).is_none());
    }
}
