//! The process's watcher of descriptors: one thread that sleeps on the platform's readiness
//! set (epoll on Linux, kqueue on macOS) until a
//! watched descriptor reports its event (a pidfd becomes readable when its process exits, a
//! socket reports a hang-up when its peer closes it or dies), then calls that watch's
//! callback, once. It lets a thread that sleeps on something else, a futex in shared memory,
//! learn of such an event at once, without waking up periodically to poll for it.
//!
//! The thread starts with the first watch and stops (joined, its descriptors closed) when the
//! last one is dropped: a process without watches has neither thread nor descriptors of the
//! watcher's, and one with many watches has one thread and one epoll set for all of them. A
//! watch keeps the descriptors it watches open (it holds shared references to them) until it
//! is dropped or has fired, so a descriptor number is never reused under it; the callback
//! owns whatever it touches, so nothing the watch's owner frees can be reached by it.
//!
//! Callbacks run on the watcher's thread under its lock, which is also what makes dropping a
//! watch wait for a callback in progress: they must be short (set a flag, wake a futex, let go
//! of memory kept for a dead peer) and must neither create nor drop watches. The thread blocks every signal, so that a host
//! program's process-directed signals never land on it.
//!
//! A child of `fork` inherits the state but not the thread: its first use of the watcher
//! forgets the parent's watches (they are the parent's to report) and starts afresh. The
//! parent's epoll and stop descriptors stay open in such a child until it execs (they are
//! close-on-exec).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::os::event;
use crate::os::poller::{EventFlags, Poller};

/// What a watch waits for on one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Readable: a pidfd whose process has exited.
    Readable,
    /// Hung up or failed: a socket whose peer closed its end. Data waiting is no event.
    HangUp,
}

/// A descriptor that a watch keeps open while it watches it.
pub type SharedFd = Arc<dyn AsFd + Send + Sync>;
/// The name callers use on every platform.
pub type SharedHandle = SharedFd;

/// A registration with the watcher; dropping it unregisters. Once the drop has returned, the
/// callback is not running and never will, and it has been dropped.
#[derive(Debug)]
pub struct Watch {
    id: u64,
}

struct Entry {
    fds: Vec<SharedFd>,
    on_event: Box<dyn FnOnce() + Send>,
}

/// The watcher's thread with its epoll set and the eventfd that tells it to stop.
struct Running {
    set: Arc<WatchSet>,
    thread: JoinHandle<()>,
}

struct WatchSet {
    epoll: Poller,
    stop: OwnedFd,
}

struct State {
    running: Option<Running>,
    entries: BTreeMap<u64, Entry>,
    next_id: u64,
    /// The process this state belongs to (see the module doc on fork).
    pid: u32,
}

static STATE: Mutex<State> = Mutex::new(State { running: None, entries: BTreeMap::new(), next_id: FIRST_ID, pid: 0 });

/// The token of the stop eventfd; watches have ids from [`FIRST_ID`] on.
const STOP_TOKEN: u64 = 0;
const FIRST_ID: u64 = 1;

/// The watcher's state, reset first in a child of fork.
fn state() -> MutexGuard<'static, State> {
    let mut state = STATE.lock();
    let pid = std::process::id();
    if state.pid != pid {
        // The parent's thread does not exist here, and its watches are the parent's: joining
        // or dropping them could block or run the parent's callbacks.
        std::mem::forget(state.running.take());
        std::mem::forget(std::mem::take(&mut state.entries));
        state.pid = pid;
    }
    state
}

impl State {
    /// Takes the running thread out when no watch is left, for the caller to stop it outside
    /// the lock.
    fn take_if_idle(&mut self) -> Option<Running> {
        if self.entries.is_empty() {
            self.running.take()
        } else {
            None
        }
    }
}

impl Watch {
    /// Watches `fds`, each for its [`Interest`], and calls `on_event` from the watcher's
    /// thread at the first event on any of them; the watch has then fired and lets its
    /// descriptors go. Starts the watcher's thread if it is not running. Errors: the thread
    /// or its descriptors could not be made (the caller falls back on polling).
    pub fn new(fds: Vec<(SharedFd, Interest)>, on_event: impl FnOnce() + Send + 'static) -> Result<Watch> {
        let mut state = state();
        if state.running.is_none() {
            state.running = Some(Running::start()?);
        }
        let id = state.next_id;
        state.next_id += 1;
        let set = Arc::clone(&state.running.as_ref().expect("started above").set);
        for (i, (fd, interest)) in fds.iter().enumerate() {
            let events = match interest {
                Interest::Readable => EventFlags::IN,
                Interest::HangUp => EventFlags::RDHUP,
            } | EventFlags::ONESHOT;
            if let Err(e) = set.epoll.add(fd.as_fd(), events, id, "a watched descriptor") {
                for (added, _) in &fds[..i] {
                    set.epoll.delete(added.as_fd());
                }
                let idle = state.take_if_idle();
                drop(state);
                if let Some(running) = idle {
                    running.stop();
                }
                return Err(e);
            }
        }
        let fds = fds.into_iter().map(|(fd, _)| fd).collect();
        state.entries.insert(id, Entry { fds, on_event: Box::new(on_event) });
        Ok(Watch { id })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut state = state();
        let entry = state.entries.remove(&self.id);
        if let (Some(entry), Some(running)) = (&entry, &state.running) {
            for fd in &entry.fds {
                running.set.epoll.delete(fd.as_fd());
            }
        }
        let idle = state.take_if_idle();
        drop(state);
        // Outside the lock: what the callback owned, and the descriptors.
        drop(entry);
        if let Some(running) = idle {
            running.stop();
        }
    }
}

impl Running {
    fn start() -> Result<Running> {
        let set = Arc::new(WatchSet { epoll: Poller::new()?, stop: event::new()? });
        set.epoll.add(set.stop.as_fd(), EventFlags::IN, STOP_TOKEN, "the watcher's stop eventfd")?;
        let for_thread = Arc::clone(&set);
        let thread = spawn_without_signals(move || watch_loop(&for_thread))
            .map_err(|e| Error::os("spawning the lava-flow watcher thread", e))?;
        Ok(Running { set, thread })
    }

    /// Tells the thread to stop and waits for it (unless this is the thread itself); its
    /// descriptors close with the last reference to the set, here or as the thread ends.
    fn stop(self) {
        event::signal(self.set.stop.as_fd());
        if self.thread.thread().id() != std::thread::current().id() {
            let _ = self.thread.join();
        }
    }
}

/// The watcher's thread: waits for events and runs each fired watch's callback.
fn watch_loop(set: &WatchSet) {
    let mut events = Poller::events::<32>();
    loop {
        let n = set.epoll.wait(&mut events, None).expect("epoll_wait on the watcher's own set cannot fail");
        let mut fired = Vec::new();
        let mut state = STATE.lock();
        for event in &events[..n] {
            let id = event.data.u64();
            if id == STOP_TOKEN {
                return;
            }
            // Absent: dropped since the event (or fired on its other descriptor).
            if let Some(entry) = state.entries.remove(&id) {
                for fd in &entry.fds {
                    set.epoll.delete(fd.as_fd());
                }
                (entry.on_event)();
                fired.push(entry.fds);
            }
        }
        drop(state);
        drop(fired);
    }
}

/// Spawns the watcher's thread with every signal blocked (a new thread inherits its
/// creator's mask, which is restored at once).
fn spawn_without_signals(body: impl FnOnce() + Send + 'static) -> std::io::Result<JoinHandle<()>> {
    // SAFETY: sigset_t is plain data, filled by sigfillset before use; pthread_sigmask changes
    // only this thread's mask, from and back to live locals.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    let spawned = std::thread::Builder::new().name("lava-flow-watch".into()).spawn(body);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(10), "{what} did not happen within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A hang-up fires the callback once (the socket's data does not), a watch dropped before
    /// its event never fires, and a pidfd of a live process does not fire.
    #[test]
    fn a_hang_up_fires_once_and_a_dropped_watch_never() {
        let count = Arc::new(AtomicU32::new(0));
        let (mine, peer) = UnixStream::pair().unwrap();
        let (kept, peer2) = UnixStream::pair().unwrap();
        let own = crate::os::process::PeerProcess::open(std::process::id() as i32).expect("a handle of this process");
        let c = Arc::clone(&count);
        let watch = Watch::new(
            vec![(Arc::new(mine) as SharedFd, Interest::HangUp), (Arc::new(own) as SharedFd, Interest::Readable)],
            move || {
                c.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        let c = Arc::clone(&count);
        let dropped = Watch::new(vec![(Arc::new(kept) as SharedFd, Interest::HangUp)], move || {
            c.fetch_add(100, Ordering::SeqCst);
        })
        .unwrap();
        use std::io::Write;
        (&peer).write_all(b"data is not a hang-up").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(count.load(Ordering::SeqCst), 0);
        drop(dropped);
        drop(peer2);
        drop(peer);
        wait_for("the callback", || count.load(Ordering::SeqCst) != 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(count.load(Ordering::SeqCst), 1, "fired once, and the dropped watch never");
        drop(watch);
    }

    /// Watches registered and dropped from several threads at once, some firing while they
    /// are dropped: each callback runs at most once, and none after its watch's drop.
    #[test]
    fn watches_come_and_go_from_many_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for round in 0..200 {
                        let fired = Arc::new(AtomicU32::new(0));
                        let (mine, peer) = UnixStream::pair().unwrap();
                        let f = Arc::clone(&fired);
                        let watch = Watch::new(vec![(Arc::new(mine) as SharedFd, Interest::HangUp)], move || {
                            f.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                        if round % 2 == 0 {
                            drop(peer);
                            wait_for("the callback", || fired.load(Ordering::SeqCst) == 1);
                            drop(watch);
                        } else {
                            drop(watch);
                            let after = fired.load(Ordering::SeqCst);
                            drop(peer);
                            std::thread::sleep(Duration::from_micros(200));
                            assert_eq!(
                                fired.load(Ordering::SeqCst),
                                after,
                                "a callback ran after its watch was dropped"
                            );
                        }
                        assert!(fired.load(Ordering::SeqCst) <= 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}
