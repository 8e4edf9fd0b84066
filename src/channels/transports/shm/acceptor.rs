//! A fan-in consumer's acceptor: a thread that meets each producer as it connects (the
//! handshake, a refusal when the fan-in is full), so that producers attach, or learn that
//! they cannot, while the consumer is busy elsewhere. The consumer takes the producers met
//! up at its next receive; an eventfd, in the consumer's notification set, is readable while
//! one waits.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::handshake::{self, Link, Shape};
use super::rendezvous::Listener;
use crate::channels::transport::Attachment;
use crate::channels::WaitStrategy;
use crate::error::{Error, Result};
use crate::os::event;

/// How long a producer that connected has to send its hello (it makes and faults in its
/// region first); one that never does keeps the others waiting this long at most.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// What the thread hands the consumer.
struct Met {
    links: Mutex<Vec<Link>>,
    /// `links` is not empty (read without the lock on the receive path).
    waiting: AtomicBool,
    /// Readable while `links` is not empty.
    ready: OwnedHandle,
}

/// The acceptor of a fan-in consumer; dropping it stops the thread, which closes the socket.
pub(super) struct Acceptor {
    met: Arc<Met>,
    stop: OwnedHandle,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    /// Starts meeting the producers that connect to `listener`, answering each with `answers`.
    pub(super) fn start(
        listener: Listener,
        name: &str,
        wait: WaitStrategy,
        shape: Shape,
        answers: Vec<Attachment>,
    ) -> Result<Acceptor> {
        let met =
            Arc::new(Met { links: Mutex::new(Vec::new()), waiting: AtomicBool::new(false), ready: event::new()? });
        let stop = event::new()?;
        let thread = {
            let (met, stop, name) = (Arc::clone(&met), dup(&stop)?, name.to_owned());
            std::thread::Builder::new()
                .name("lava-flow-fan-in".into())
                .spawn(move || accept_producers(listener, &name, wait, shape, &answers, &met, &stop))
                .map_err(|e| Error::os("starting the fan-in's acceptor thread", e))?
        };
        Ok(Acceptor { met, stop, thread: Some(thread) })
    }

    /// A producer met, if one waits.
    #[inline]
    pub(super) fn take(&self) -> Option<Link> {
        if !self.met.waiting.load(Ordering::Acquire) {
            return None;
        }
        let mut links = self.met.links.lock();
        let link = links.pop();
        if links.is_empty() {
            self.met.waiting.store(false, Ordering::Release);
            event::drain(crate::os::borrow(&self.met.ready));
        }
        link
    }

    /// The first producer, waiting for it until `deadline`.
    pub(super) fn first(&self, deadline: Option<Instant>) -> Option<Link> {
        loop {
            if let Some(link) = self.take() {
                return Some(link);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            let _ = crate::os::ready::wait_readable(&[crate::os::borrow(&self.met.ready)], left);
        }
    }

    /// Readable while a producer met waits to be taken up.
    pub(super) fn ready_fd(&self) -> BorrowedHandle<'_> {
        crate::os::borrow(&self.met.ready)
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        event::signal(crate::os::borrow(&self.stop));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn dup(fd: &OwnedHandle) -> Result<OwnedHandle> {
    fd.try_clone().map_err(|e| Error::os("duplicating the acceptor's stop eventfd", e))
}

/// The thread: meets each producer that connects, until `stop` is signalled; then closes the
/// socket (its file and the consumer's claim go with it).
fn accept_producers(
    mut listener: Listener,
    name: &str,
    wait: WaitStrategy,
    shape: Shape,
    answers: &[Attachment],
    met: &Met,
    stop: &OwnedHandle,
) {
    let mut sessions = 0u64;
    loop {
        if !crate::os::ready::wait_listener(listener.inner(), crate::os::borrow(stop)).unwrap_or(false) {
            break;
        }
        let mut refused = Vec::new();
        let Ok(Some((sock, peer))) = listener.accept(Some(Instant::now()), &mut refused, name) else { continue };
        let deadline = Some(Instant::now() + HELLO_WAIT);
        // A refused producer (full, another kind) has been told why by the handshake.
        match handshake::accept(sock, peer, name, wait, shape, deadline, sessions + 1, answers) {
            Ok(link) => {
                sessions += 1;
                met.links.lock().insert(0, link);
                met.waiting.store(true, Ordering::Release);
                event::signal(crate::os::borrow(&met.ready));
            }
            Err(e) => log::info!("channel {name:?} (fan-in consumer): refused a producer (pid {}): {e}", peer.pid),
        }
    }
    listener.close();
}
