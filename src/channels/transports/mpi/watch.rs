//! How an MPI fan-in's consumer learns of messages while it sleeps on its notification fd,
//! without giving up the receives its sessions keep posted ahead: one thread for the whole
//! carrier (a [`Prober`]) probes the sessions that sleep (each a [`Watch`]) and makes the fd
//! readable while a message waits in one of them.
//!
//! A probe sees only messages that no receive has taken: a session that sleeps takes its
//! receives posted ahead back first (keeping what they received, which says that it need not
//! sleep), and posts them again once awake. A consumer whose application asked for the fd
//! keeps its sessions asleep for good: each then reads by probing, as a pair's watched
//! session does.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::mpi::PrivateComm;
use crate::os::event;

/// How often the thread probes the sessions that sleep.
const PERIOD: Duration = Duration::from_micros(100);

/// What the thread and the sessions share.
struct Shared {
    comm: Arc<PrivateComm>,
    fd: Arc<OwnedFd>,
    watches: Mutex<Vec<Weak<Watch>>>,
    /// A session fell asleep, or the prober stops.
    wake: Condvar,
    stop: AtomicBool,
}

/// The carrier's probing thread; stopped when dropped.
pub(super) struct Prober {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Prober {
    /// Starts the thread that makes `fd` readable while a sleeping session's message waits.
    pub(super) fn start(comm: Arc<PrivateComm>, fd: Arc<OwnedFd>) -> Result<Prober> {
        let shared = Arc::new(Shared {
            comm,
            fd,
            watches: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("lava-flow-mpi-watch".into())
                .spawn(move || probe_sleepers(&shared))
                .map_err(|e| Error::os("spawning the MPI fan-in's probing thread", e))?
        };
        Ok(Prober { shared, thread: Some(thread) })
    }

    /// A watch of the messages from `peer` on `tag`, for one session.
    pub(super) fn watch(&self, peer: u32, tag: i32) -> Arc<Watch> {
        let watch = Arc::new(Watch {
            peer,
            tag,
            probing: AtomicBool::new(false),
            taken: AtomicU64::new(0),
            signalling: Mutex::new(()),
            shared: Arc::clone(&self.shared),
        });
        self.shared.watches.lock().push(Arc::downgrade(&watch));
        watch
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        {
            let _watches = self.shared.watches.lock();
            self.shared.wake.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One session's watch: probed while the session sleeps.
pub(super) struct Watch {
    peer: u32,
    tag: i32,
    probing: AtomicBool,
    /// Messages the session took off MPI's queue by probing: a message the thread probed and
    /// the session took meanwhile is not signalled (readable means that the next receive has
    /// something to say).
    taken: AtomicU64,
    /// Held while the thread signals, and while the session resets the fd.
    signalling: Mutex<()>,
    shared: Arc<Shared>,
}

impl Watch {
    /// The session sleeps (its receives posted ahead taken back): the fd is readable from now
    /// on while a message of its waits. What the fd said before is forgotten: whatever still
    /// waits, in this session or another, is signalled again at the thread's next look.
    pub(super) fn sleep(&self) {
        self.reset();
        self.probing.store(true, Ordering::Release);
        let _watches = self.shared.watches.lock();
        self.shared.wake.notify_one();
    }

    /// The session is awake: its receives go posted ahead again.
    pub(super) fn wake(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// The session took a message off MPI's queue.
    pub(super) fn took(&self) {
        self.taken.fetch_add(1, Ordering::Release);
    }

    /// Makes the fd readable (a message of the session's waits already).
    pub(super) fn signal(&self) {
        event::signal(self.shared.fd.as_fd());
    }

    /// Resets the fd: nothing of this session's waits (a message arriving meanwhile is
    /// signalled again by the thread).
    pub(super) fn reset(&self) {
        let _signalling = self.signalling.lock();
        event::drain(self.shared.fd.as_fd());
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.probing.store(false, Ordering::Relaxed);
    }
}

/// The thread: probes the sleeping sessions every `PERIOD`, and waits for one to sleep while
/// none does.
fn probe_sleepers(shared: &Shared) {
    loop {
        let sleepers: Vec<Arc<Watch>> = {
            let mut watches = shared.watches.lock();
            loop {
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                watches.retain(|w| w.strong_count() > 0);
                let sleepers: Vec<Arc<Watch>> =
                    watches.iter().filter_map(Weak::upgrade).filter(|w| w.probing.load(Ordering::Acquire)).collect();
                if !sleepers.is_empty() {
                    break sleepers;
                }
                // Woken when a session falls asleep; the timeout only bounds a missed wake.
                shared.wake.wait_for(&mut watches, Duration::from_millis(100));
            }
        };
        for watch in &sleepers {
            let taken = watch.taken.load(Ordering::Acquire);
            // An error here shows again at the session's next receive.
            if let Ok(Some(_)) = shared.comm.iprobe(watch.peer, watch.tag) {
                let _signalling = watch.signalling.lock();
                if watch.probing.load(Ordering::Acquire) && watch.taken.load(Ordering::Acquire) == taken {
                    event::signal(shared.fd.as_fd());
                }
            }
        }
        drop(sleepers);
        std::thread::sleep(PERIOD);
    }
}
