//! How each side of an established channel learns that its peer has gone: a handle of the
//! peer's process (`os::process`) and the rendezvous socket, watched by the process's watcher or polled.

use crate::os::BorrowedHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::channels::wait::{LIVENESS_PERIOD, SLEEP_SLICE};
use crate::error::Result;
use crate::os::process::PeerProcess;
use crate::os::stream::Stream;
use crate::os::watcher::{Interest, SharedHandle, Watch};

/// Watches the peer of an established channel: its process and its end of the socket.
/// Polled by [`is_gone`](Self::is_gone); once [`arm`](Self::arm)ed, also reported by the
/// process's watcher (`os::watcher`) the moment the peer's end comes, without polling.
#[derive(Debug)]
pub struct PeerWatch {
    /// Shared with the watcher while it watches them, so that they stay open under it.
    sock: Arc<Stream>,
    process: Option<Arc<PeerProcess>>,
    pub pid: i32,
    gone: bool,
    alarm: Result<Alarm, String>,
    /// When [`check`](Self::check) last polled.
    last_poll: Instant,
}

/// The watcher's registration for one peer, and the flag it sets when the peer's end comes.
#[derive(Debug)]
struct Alarm {
    _watch: Watch,
    rang: Arc<AtomicBool>,
}

impl PeerWatch {
    pub fn new(sock: Stream, pid: i32) -> Self {
        let alarm = Err("not armed".to_owned());
        let last_poll = Instant::now();
        let process = PeerProcess::open(pid).map(Arc::new);
        PeerWatch { sock: Arc::new(sock), process, pid, gone: false, alarm, last_poll }
    }

    /// Asks the process's watcher to report the peer's end as it happens: when the peer's
    /// process exits or its socket hangs up, the watcher marks this watch
    /// [`alarmed`](Self::alarmed), then calls `wake`, which must wake whatever this side may be
    /// sleeping on (it runs on the watcher's thread: short, and owning what it touches).
    /// Returns [`prompt`](Self::prompt).
    pub fn arm(&mut self, wake: impl FnOnce() + Send + 'static) -> bool {
        let mut fds: Vec<(SharedHandle, Interest)> = vec![(Arc::clone(&self.sock) as SharedHandle, Interest::HangUp)];
        if let Some(process) = &self.process {
            fds.push((Arc::clone(process) as SharedHandle, Interest::Readable));
        }
        let rang = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&rang);
        self.alarm = Watch::new(fds, move || {
            // Before the wake-up: a side woken by it must find the flag set.
            flag.store(true, Ordering::SeqCst);
            wake();
        })
        .map(|watch| Alarm { _watch: watch, rang })
        .map_err(|e| format!("the process's watcher could not start ({e})"));
        if let Err(why) = &self.alarm {
            log::warn!(
                "{why}: the end of the peer process {} is noticed by polling instead of at once (blocked waits \
                 wake every {} ms to check it); check the limits on open files and threads",
                self.pid,
                SLEEP_SLICE.as_millis()
            );
        }
        self.prompt()
    }

    /// Whether the peer's end is reported without polling: armed, with a pidfd of the peer.
    /// Where it is not, a waiting side must poll [`is_gone`](Self::is_gone) periodically;
    /// [`polled_because`](Self::polled_because) says why.
    pub fn prompt(&self) -> bool {
        self.alarm.is_ok() && self.process.is_some()
    }

    /// Why the peer's end is not [`prompt`](Self::prompt)ly reported, if it is not.
    pub fn polled_because(&self) -> Option<String> {
        match &self.alarm {
            Err(why) => Some(why.clone()),
            Ok(_) if self.process.is_none() => Some(format!(
                "no pidfd of the peer (pid {}) could be opened: it runs in another PID namespace, or the kernel is older than 5.3",
                self.pid
            )),
            Ok(_) => None,
        }
    }

    /// Whether the watcher has reported the peer's end (no syscall).
    #[inline]
    pub fn alarmed(&self) -> bool {
        self.alarm.as_ref().is_ok_and(|a| a.rang.load(Ordering::Acquire))
    }

    pub fn socket(&self) -> &Stream {
        &self.sock
    }

    pub fn socket_fd(&self) -> BorrowedHandle<'_> {
        crate::os::borrow(&self.sock)
    }

    /// The handle of the peer's process, readable once it has exited.
    pub fn process_handle(&self) -> Option<BorrowedHandle<'_>> {
        self.process.as_ref().map(|p| crate::os::borrow(p))
    }

    /// Whether the peer's process has exited; `false` where there is no handle of it, or
    /// while the process lives.
    pub fn has_exited(&self) -> bool {
        self.process.as_ref().is_some_and(|p| p.has_exited())
    }

    /// Waits up to `timeout` for the peer's process to exit (sleeps that long without a handle
    /// of it).
    pub fn wait_for_exit(&self, timeout: Duration) {
        match &self.process {
            Some(process) => {
                process.wait_for_exit(timeout);
            }
            None => std::thread::sleep(timeout),
        }
    }

    /// Whether the peer has gone, as cheaply as this watch allows: where its end is
    /// [`prompt`](Self::prompt)ly reported, the watcher's report alone (no syscall); elsewhere
    /// [`is_gone`](Self::is_gone) at most every `LIVENESS_PERIOD`. `force`: poll now.
    pub fn check(&mut self, force: bool) -> bool {
        if !(force || self.gone || self.alarmed()) {
            if self.prompt() {
                return false;
            }
            let now = Instant::now();
            if now.duration_since(self.last_poll) < LIVENESS_PERIOD {
                return false;
            }
            self.last_poll = now;
        }
        self.is_gone()
    }

    /// Whether an earlier check found the peer gone (no syscall).
    pub fn known_gone(&self) -> bool {
        self.gone
    }

    /// Whether the peer has exited or closed its end (one `poll` syscall; none once gone or
    /// [`alarmed`](Self::alarmed)).
    pub fn is_gone(&mut self) -> bool {
        if self.gone {
            return true;
        }
        if self.alarmed() {
            self.gone = true;
            return true;
        }
        if crate::os::stream::peer_gone(&self.sock, self.process.as_deref()) {
            self.gone = true;
        }
        self.gone
    }
}

// Unix sockets and descriptors throughout.
#[cfg(all(unix, test))]
mod tests {
    use super::*;

    #[test]
    fn data_on_the_socket_is_not_a_hang_up() {
        use std::io::Write;
        let (a, b) = Stream::pair().unwrap();
        let mut watch = PeerWatch::new(b, std::process::id() as i32);
        assert!(!watch.is_gone());
        (&a).write_all(b"record").unwrap();
        assert!(!watch.is_gone(), "pending data is not end-of-file");
        drop(a);
        assert!(watch.is_gone());
    }

    /// Armed with a pidfd, the peer's end is reported promptly; without one (pid 0 stands for
    /// a peer in another PID namespace) it is polled, says why, and a hang-up of its socket is
    /// still reported.
    #[test]
    fn the_watcher_reports_a_hang_up_and_says_when_it_cannot_see_the_process() {
        let (a, b) = Stream::pair().unwrap();
        let mut watch = PeerWatch::new(b, std::process::id() as i32);
        assert!(watch.arm(|| {}), "a pidfd of this process");
        assert_eq!(watch.polled_because(), None);
        let (a2, b2) = Stream::pair().unwrap();
        let mut blind = PeerWatch::new(b2, 0);
        let woken = Arc::new(AtomicBool::new(false));
        let w = Arc::clone(&woken);
        assert!(!blind.arm(move || w.store(true, Ordering::SeqCst)));
        assert!(
            blind.polled_because().is_some_and(|why| why.contains("PID namespace")),
            "{:?}",
            blind.polled_because()
        );
        assert!(!blind.alarmed() && !blind.is_gone());
        drop(a2);
        let start = Instant::now();
        while !woken.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(10), "the hang-up was not reported");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(blind.alarmed() && blind.is_gone() && blind.known_gone());
        assert!(!watch.alarmed());
        drop((a, watch));
    }
}
