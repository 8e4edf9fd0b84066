//! The consumer half of a loopback channel.

use std::any::Any;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use super::session::Session;
use super::{taken, wait_for_meeting, with_meeting};
use crate::channels::transport::{Attachment, ConsumerTransport, RawView, Release, TransportInfo};
use crate::channels::ChannelConfig;
use crate::error::{Error, Result};
use crate::os::eventfd::{eventfd, eventfd_drain, eventfd_signal};

/// The consumer half of a loopback channel. It keeps the name: once its producer has gone
/// (and that was reported), the next producer of the name is taken up.
pub(crate) struct LoopbackConsumer {
    info: TransportInfo,
    name: String,
    session: Arc<Session>,
    /// Earlier sessions whose views are still held.
    old: Vec<Arc<Session>>,
    /// This consumer's answers for the routes, given to every producer.
    answers: Vec<Attachment>,
    /// The current producer's sections for the routes, until taken.
    offers: Option<Vec<Attachment>>,
    /// The end of the current producer has been reported.
    gone_reported: bool,
    notify: Option<Arc<std::os::fd::OwnedFd>>,
}

/// A copy of `attachments` (their descriptors duplicated), for another producer.
fn duplicate(attachments: &[Attachment]) -> Result<Vec<Attachment>> {
    attachments
        .iter()
        .map(|a| {
            let fds = a
                .fds
                .iter()
                .map(|fd| fd.try_clone().map_err(|e| Error::os("duplicating a route's answer descriptor", e)))
                .collect::<Result<Vec<_>>>()?;
            Ok(Attachment { route: a.route, bytes: a.bytes.clone(), fds })
        })
        .collect()
}

impl LoopbackConsumer {
    /// Registers as the consumer of `name` in this process and waits for a producer (up to the
    /// config's rendezvous timeout), answering its offers with `answers`.
    pub(crate) fn listen(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<Self> {
        with_meeting(name, |m| match m.consumer_live {
            true => Err(taken(name, "consumer")),
            false => {
                m.consumer_live = true;
                Ok(())
            }
        })?;
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let arrived = wait_for_meeting(name, deadline, |m| (!m.arrived.is_empty()).then(|| m.arrived.remove(0)));
        let Some(session) = arrived else {
            with_meeting(name, |m| m.consumer_live = false);
            return Err(Error::Timeout(format!("no producer of channel {name:?} attached in this process in time")));
        };
        let mut consumer = LoopbackConsumer {
            info,
            name: name.to_owned(),
            offers: None,
            session: Arc::clone(&session),
            old: Vec::new(),
            answers,
            gone_reported: false,
            notify: None,
        };
        consumer.take_up(session)?;
        Ok(consumer)
    }

    /// Makes `session` the current one: answers its producer and keeps its offers.
    fn take_up(&mut self, session: Arc<Session>) -> Result<()> {
        *session.answers.lock() = Some(duplicate(&self.answers)?);
        self.offers = session.offers.lock().take();
        session.lock().notify.clone_from(&self.notify);
        let old = std::mem::replace(&mut self.session, session);
        if !Arc::ptr_eq(&old, &self.session) && old.holds_views() {
            self.old.push(old);
        }
        self.old.retain(|s| s.holds_views());
        self.gone_reported = false;
        // Wake the producer waiting for the answer.
        with_meeting(&self.name, |_| ());
        Ok(())
    }

    /// After the producer's end was reported: takes up the next producer if one attached.
    fn reattach(&mut self) -> Result<bool> {
        let next = with_meeting(&self.name, |m| (!m.arrived.is_empty()).then(|| m.arrived.remove(0)));
        match next {
            Some(session) => {
                log::info!(
                    "channel {:?} (consumer): a new producer attached after the last one had gone; its messages start \
                     again at sequence number 0",
                    self.name
                );
                self.take_up(session)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn gone_error(&self) -> Error {
        Error::PeerGone(format!("the producer of channel {:?} closed it", self.name))
    }

    /// The session that handed out `view`.
    fn session_of(&self, view: &RawView) -> Option<&Arc<Session>> {
        std::iter::once(&self.session).chain(self.old.iter()).find(|s| s.id == view.session)
    }
}

impl ConsumerTransport for LoopbackConsumer {
    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn try_recv(&mut self) -> Result<RawView> {
        loop {
            let mut state = self.session.lock();
            if let Some(view) = self.session.take_next(&mut state) {
                return Ok(view);
            }
            if !state.producer_closed {
                drop(state);
                if let Some(fd) = &self.notify {
                    // Level-triggered: the fd is reset only when the ring is seen empty, and
                    // looked at once more after the reset.
                    eventfd_drain(fd.as_fd());
                    let mut state = self.session.lock();
                    if let Some(view) = self.session.take_next(&mut state) {
                        return Ok(view);
                    }
                    if !state.producer_closed {
                        return Err(Error::WouldBlock(format!("no message waiting on channel {:?}", self.name)));
                    }
                } else {
                    return Err(Error::WouldBlock(format!("no message waiting on channel {:?}", self.name)));
                }
            } else {
                drop(state);
            }
            // Gone: a new producer is taken up only once the end of this one was reported.
            if self.gone_reported && self.reattach()? {
                continue;
            }
            self.gone_reported = true;
            if let Some(fd) = &self.notify {
                // Readable while there is something to say: the end.
                eventfd_signal(fd.as_fd());
            }
            return Err(self.gone_error());
        }
    }

    fn wait(&mut self, deadline: Option<Instant>) -> Result<()> {
        let mut state = self.session.lock();
        loop {
            if state.received < state.head || state.producer_closed {
                return Ok(());
            }
            if !self.session.wait(&mut state, true, deadline) {
                return Err(Error::Timeout(format!(
                    "no message arrived on channel {:?} before the deadline",
                    self.name
                )));
            }
        }
    }

    fn releaser(&self) -> Arc<dyn Release> {
        Arc::clone(&self.session) as Arc<dyn Release>
    }

    unsafe fn release(&mut self, view: &RawView) -> Result<()> {
        let result = match self.session_of(view) {
            Some(session) => session.release(view),
            None => Err(Error::InvalidState(format!(
                "message {} is not held by this consumer (already released, or from another channel)",
                view.token
            ))),
        };
        if view.session != self.session.id {
            self.old.retain(|s| s.holds_views());
        }
        result
    }

    fn take_peer_sections(&mut self) -> Option<(u64, Vec<Attachment>)> {
        Some((self.session.id, self.offers.take()?))
    }

    fn take_attachments(&mut self) -> Result<Vec<Attachment>> {
        Ok(std::mem::take(&mut self.session.lock().attachments))
    }

    fn released_below(&self) -> u64 {
        self.session.released_below()
    }

    fn keep_while_held(&mut self, session: u64, keep: Box<dyn Any + Send + Sync>) {
        // A session that is neither current nor among the old ones holds no view any more.
        if let Some(s) = std::iter::once(&self.session).chain(self.old.iter()).find(|s| s.id == session) {
            s.keep_while_held(keep);
        }
    }

    fn notify_fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.notify.is_none() {
            let fd = Arc::new(eventfd()?);
            let mut state = self.session.lock();
            state.notify = Some(Arc::clone(&fd));
            if state.received < state.head || state.producer_closed {
                eventfd_signal(fd.as_fd());
            }
            drop(state);
            self.notify = Some(fd);
        }
        Ok(self.notify.as_ref().expect("set up above").as_fd())
    }
}

impl Drop for LoopbackConsumer {
    fn drop(&mut self) {
        self.session.close_consumer();
        let waiting = with_meeting(&self.name, |m| {
            m.consumer_live = false;
            std::mem::take(&mut m.arrived)
        });
        // Producers that attached and were never taken up learn of the end at once.
        for session in waiting {
            session.close_consumer();
            *session.answers.lock() = Some(Vec::new());
        }
        with_meeting(&self.name, |_| ());
    }
}
