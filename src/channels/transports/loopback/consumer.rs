//! The consumer half of a loopback channel: the name producers attach to, and each producer's
//! session.

use crate::os::{BorrowedHandle, OwnedHandle};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use super::session::Session;
use super::{duplicate, taken, wait_for_meeting, with_meeting};
use crate::channels::peers::kind_mismatch;
use crate::channels::transport::{Attachment, ConsumerSession, ConsumerTransport, RawView, Release, TransportInfo};
use crate::channels::{ChannelConfig, ChannelKind, Peer};
use crate::error::{Error, Result};
use crate::os::event;

/// The consumer half of a loopback channel. It keeps the name: producers of the name that
/// attach later are taken up as sessions of their own.
pub(crate) struct LoopbackConsumer {
    info: TransportInfo,
    name: String,
    /// This consumer's answers for the routes, given to every producer.
    answers: Vec<Attachment>,
    /// The notification fd once asked for: readable while a watched session has a message or
    /// its producer's end to say.
    notify: Option<Arc<OwnedHandle>>,
    /// A fan-out's consumer, which joined its producer and holds no name of its own.
    joined: bool,
}

/// One producer's session at a loopback consumer.
pub(crate) struct LoopbackSession {
    name: String,
    session: Arc<Session>,
    /// The producer's sections for the routes, until taken.
    offers: Option<Vec<Attachment>>,
    notify: Option<Arc<OwnedHandle>>,
}

impl LoopbackConsumer {
    /// Registers as the consumer of `name` in this process and waits for a producer (up to the
    /// config's rendezvous timeout), answering its offers with `answers`.
    pub(crate) fn listen(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<(Self, LoopbackSession)> {
        with_meeting(name, |m| match m.consumer_live {
            true => Err(taken(name, "consumer")),
            // A fan-out's producer is joined, by consumers of a fan-out.
            false if m.fan_out.is_some() => {
                Err(Error::InvalidState(kind_mismatch(name, config.kind, ChannelKind::FanOut)))
            }
            false => {
                (m.consumer_live, m.consumer_kind, m.max_peers) = (true, config.kind, config.max_peers);
                // A fan-in's producers are answered as they arrive, while the consumer is busy.
                if config.kind == ChannelKind::FanIn {
                    m.answers = Some(duplicate(&answers)?);
                }
                Ok(())
            }
        })?;
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let arrived = wait_for_meeting(name, deadline, |m| (!m.arrived.is_empty()).then(|| m.arrived.remove(0)));
        let consumer = LoopbackConsumer { info, name: name.to_owned(), answers, notify: None, joined: false };
        let Some(session) = arrived else {
            return Err(Error::Timeout(format!("no producer of channel {name:?} attached in this process in time")));
        };
        let session = consumer.take_up(session)?;
        Ok((consumer, session))
    }

    /// Joins the fan-out producer of `name` in this process (waiting for it up to the
    /// config's rendezvous timeout; refused where its slots are all taken), answering its
    /// offers with `answers`.
    pub(crate) fn join(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<(Self, LoopbackSession)> {
        let session = super::fan_out::join(name, config, answers)?;
        let offers = session.offers.lock().take();
        let session = LoopbackSession { name: name.to_owned(), session, offers, notify: None };
        let consumer =
            LoopbackConsumer { info, name: name.to_owned(), answers: Vec::new(), notify: None, joined: true };
        Ok((consumer, session))
    }

    /// A session over `session`: its producer gets the answers, the session its offers.
    fn take_up(&self, session: Arc<Session>) -> Result<LoopbackSession> {
        {
            let mut answers = session.answers.lock();
            if answers.is_none() {
                *answers = Some(duplicate(&self.answers)?);
            }
        }
        let offers = session.offers.lock().take();
        // Wake the producer waiting for the answer.
        with_meeting(&self.name, |_| ());
        Ok(LoopbackSession { name: self.name.clone(), session, offers, notify: None })
    }
}

impl ConsumerTransport for LoopbackConsumer {
    type Session = LoopbackSession;

    fn info(&self) -> &TransportInfo {
        &self.info
    }

    fn try_accept(&mut self) -> Result<Option<LoopbackSession>> {
        if self.joined {
            // A fan-out's consumer joined one producer: no other comes to it.
            return Ok(None);
        }
        match with_meeting(&self.name, |m| (!m.arrived.is_empty()).then(|| m.arrived.remove(0))) {
            Some(session) => Ok(Some(self.take_up(session)?)),
            None => Ok(None),
        }
    }

    fn notify_fd(&mut self) -> Result<BorrowedHandle<'_>> {
        if self.notify.is_none() {
            let fd = Arc::new(event::new()?);
            if self.joined {
                self.notify = Some(fd);
                return Ok(crate::os::borrow(self.notify.as_ref().expect("set just now")));
            }
            // Readable when a producer arrives too (a fan-in takes it up at its next receive).
            with_meeting(&self.name, |m| {
                if !m.arrived.is_empty() {
                    event::signal(crate::os::borrow(&fd));
                }
                m.notify = Some(Arc::clone(&fd));
            });
            self.notify = Some(fd);
        }
        Ok(crate::os::borrow(self.notify.as_ref().expect("set up above")))
    }

    fn watch(&mut self, session: &mut LoopbackSession) -> Result<()> {
        let Some(fd) = &self.notify else { return Ok(()) };
        let mut state = session.session.lock();
        state.notify = Some(Arc::clone(fd));
        if state.received < state.head || state.producer_closed {
            event::signal(crate::os::borrow(&fd));
        }
        drop(state);
        session.notify = Some(Arc::clone(fd));
        Ok(())
    }

    fn unwatch(&mut self, session: &mut LoopbackSession) {
        session.session.lock().notify = None;
        session.notify = None;
    }
}

impl Drop for LoopbackConsumer {
    fn drop(&mut self) {
        if self.joined {
            // Its session's drop tells the fan-out.
            return;
        }
        let waiting = with_meeting(&self.name, |m| {
            (m.consumer_live, m.notify, m.answers) = (false, None, None);
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

impl LoopbackSession {
    /// A session whose producer has closed without a message: what a consumer holds where
    /// it has no current session (a fan-in, whose sessions are its slots').
    pub(crate) fn ended(name: &str) -> LoopbackSession {
        let session = Arc::new(Session::new(u64::MAX, name, 0, 1, 0, Vec::new()));
        session.close_producer();
        LoopbackSession { name: name.to_owned(), session, offers: None, notify: None }
    }

    fn would_block(&self) -> Error {
        Error::WouldBlock(format!("no message waiting on channel {:?}", self.name))
    }
}

impl ConsumerSession for LoopbackSession {
    fn id(&self) -> u64 {
        self.session.id
    }

    fn peer(&self) -> Peer {
        let gone = self.session.lock().producer_closed;
        self.session.peer(gone)
    }

    fn try_recv(&mut self) -> Result<RawView> {
        let mut state = self.session.lock();
        if let Some(view) = self.session.take_next(&mut state) {
            return Ok(view);
        }
        if !state.producer_closed {
            drop(state);
            let Some(fd) = &self.notify else { return Err(self.would_block()) };
            // Level-triggered: the fd is reset only when the ring is seen empty, and looked at
            // once more after the reset.
            event::drain(crate::os::borrow(&fd));
            let mut state = self.session.lock();
            if let Some(view) = self.session.take_next(&mut state) {
                return Ok(view);
            }
            if !state.producer_closed {
                return Err(self.would_block());
            }
        }
        if let Some(fd) = &self.notify {
            // Readable while there is something to say: the end.
            event::signal(crate::os::borrow(&fd));
        }
        Err(Error::PeerGone(format!("the producer of channel {:?} closed it", self.name)))
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
        self.session.release(view)
    }

    fn holds_views(&self) -> bool {
        self.session.holds_views()
    }

    fn released_below(&self) -> u64 {
        self.session.released_below()
    }

    fn keep_while_held(&mut self, keep: Box<dyn Any + Send + Sync>) {
        self.session.keep_while_held(keep);
    }

    fn take_offers(&mut self) -> Option<Vec<Attachment>> {
        self.offers.take()
    }

    fn take_attachments(&mut self) -> Result<Vec<Attachment>> {
        Ok(std::mem::take(&mut self.session.lock().attachments))
    }
}

impl Drop for LoopbackSession {
    fn drop(&mut self) {
        self.session.close_consumer();
    }
}
