//! The consumer half of a shared-memory channel: the socket producers attach to, and the
//! notification set an event loop waits on. Each producer's messages are read by its session
//! (`consumer_session`).

use crate::os::BorrowedHandle;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::acceptor::Acceptor;
use super::consumer_session::{Notify, ShmSession};
use super::handshake::{self, Link, Shape};
use super::rendezvous::Listener;
use crate::channels::transport::{Attachment, ConsumerTransport, Route, TransportInfo};
use crate::channels::{ChannelConfig, ChannelKind, WaitStrategy};
use crate::error::{Error, Result};
use crate::os::poller::EventFlags;

/// The consumer half of a shared-memory channel. It keeps listening, so that a new producer
/// can attach once the old one has gone.
pub(crate) struct ShmConsumer {
    info: TransportInfo,
    name: String,
    wait: WaitStrategy,
    /// Which producers this end takes.
    shape: Shape,
    /// Where producers attach: a pair's; none for a fan-out's consumer, which connects to
    /// its producer, or for a fan-in's, whose acceptor listens.
    listener: Option<Listener>,
    /// A fan-in's thread that meets producers as they connect.
    acceptor: Option<Acceptor>,
    /// Sessions begun, for the next one's id.
    sessions: u64,
    /// Set up by the first `notify_fd`: from then on, the channel keeps it readable while a
    /// message may wait in a watched session.
    notify: Option<Arc<Notify>>,
    /// This consumer's sections for the other routes, the answer to every producer's hello.
    answers: Vec<Attachment>,
}

impl ShmConsumer {
    /// Listens on `name` and waits for a producer, answering its hello with `answers` (the
    /// other routes' sections): the consumer and the producer's session.
    pub(crate) fn listen(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<(Self, ShmSession)> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let listener = Listener::bind(name)?;
        let shape = Shape { kind: config.kind, max_peers: config.max_peers };
        let mut consumer = ShmConsumer {
            info,
            name: name.to_owned(),
            wait: config.wait,
            shape,
            listener: None,
            acceptor: None,
            sessions: 1,
            notify: None,
            answers: Vec::new(),
        };
        let link = if config.kind == ChannelKind::FanIn {
            let path = listener.path().to_owned();
            let acceptor = consumer.acceptor.insert(Acceptor::start(listener, name, config.wait, shape, answers)?);
            acceptor.first(deadline).ok_or_else(|| {
                Error::Timeout(format!(
                    "no producer of fan-in channel {name:?} connected to {} in time",
                    path.display()
                ))
            })?
        } else {
            let link = Self::meet_first(&listener, name, config.wait, shape, deadline, &answers)?;
            (consumer.listener, consumer.answers) = (Some(listener), answers);
            link
        };
        let session = ShmSession::new(name, config.wait, link, consumer.carrier_route());
        Ok((consumer, session))
    }

    /// The consumer of fan-in channel `name`, for a consumer that also meets producers over
    /// other carriers: listens on its socket, where a thread of its own meets producers as they
    /// connect (`try_accept` takes them up), answering each with `answers`. Returns at once.
    pub(crate) fn fan_in(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<ShmConsumer> {
        let listener = Listener::bind(name)?;
        let shape = Shape { kind: config.kind, max_peers: config.max_peers };
        let acceptor = Acceptor::start(listener, name, config.wait, shape, answers)?;
        Ok(ShmConsumer {
            info,
            name: name.to_owned(),
            wait: config.wait,
            shape,
            listener: None,
            acceptor: Some(acceptor),
            sessions: 1,
            notify: None,
            answers: Vec::new(),
        })
    }

    /// A pair's first producer, met on `listener` by `deadline`.
    fn meet_first(
        listener: &Listener,
        name: &str,
        wait: WaitStrategy,
        shape: Shape,
        deadline: Option<Instant>,
        answers: &[Attachment],
    ) -> Result<Link> {
        let mut refused = Vec::new();
        loop {
            match listener.accept(deadline, &mut refused, name)? {
                None => {
                    let mut msg =
                        format!("no producer of channel {name:?} connected to {} in time", listener.path().display());
                    if !refused.is_empty() {
                        msg.push_str(&format!("; refused: {}", refused.join("; ")));
                    }
                    return Err(Error::Timeout(msg));
                }
                Some((sock, peer)) => match handshake::accept(sock, peer, name, wait, shape, deadline, 1, answers) {
                    Ok(link) => return Ok(link),
                    Err(e) => refused.push(e.to_string()),
                },
            }
        }
    }

    /// Joins fan-out channel `name`: connects to its producer (retrying until it listens or the
    /// config's rendezvous timeout) and takes the ring it offers, answering with `answers`.
    pub(crate) fn join(
        name: &str,
        info: TransportInfo,
        config: &ChannelConfig,
        answers: Vec<Attachment>,
    ) -> Result<(Self, ShmSession)> {
        let deadline = config.rendezvous_timeout.map(|t| Instant::now() + t);
        let shape = Shape { kind: config.kind, max_peers: config.max_peers };
        let link = loop {
            let (sock, peer) = super::rendezvous::connect(name, deadline)?;
            match handshake::accept(sock, peer, name, config.wait, shape, deadline, 1, &answers) {
                Ok(link) => break link,
                // The producer may be closing, or busy: tried again until the deadline.
                Err(Error::PeerGone(_) | Error::Io { .. }) if deadline.map_or(true, |d| Instant::now() < d) => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(Error::Timeout(_)) => {
                    return Err(Error::Timeout(format!(
                        "the producer of fan-out channel {name:?} did not answer in time: it may be stopped, or \
                         not a fan-out's producer"
                    )))
                }
                Err(e) => return Err(e),
            }
        };
        let consumer = ShmConsumer {
            info,
            name: name.to_owned(),
            wait: config.wait,
            shape,
            listener: None,
            acceptor: None,
            sessions: 1,
            notify: None,
            answers,
        };
        let session = ShmSession::new(name, config.wait, link, consumer.carrier_route());
        Ok((consumer, session))
    }

    /// The carrier's route as the plan gave it.
    fn carrier_route(&self) -> &Route {
        self.info.routes.first().expect("a plan's report starts with the carrier")
    }
}

impl ConsumerTransport for ShmConsumer {
    type Session = ShmSession;

    fn info(&self) -> &TransportInfo {
        &self.info
    }

    /// A producer waiting on the socket, attached as a new session.
    fn try_accept(&mut self) -> Result<Option<ShmSession>> {
        if let Some(acceptor) = &self.acceptor {
            return Ok(acceptor.take().map(|link| ShmSession::new(&self.name, self.wait, link, self.carrier_route())));
        }
        let Some(listener) = &self.listener else { return Ok(None) };
        let mut refused = Vec::new();
        let Some((sock, peer)) = listener.accept(Some(Instant::now()), &mut refused, &self.name)? else {
            return Ok(None);
        };
        let id = self.sessions + 1;
        let deadline = Some(Instant::now() + Duration::from_secs(2));
        let link = match handshake::accept(sock, peer, &self.name, self.wait, self.shape, deadline, id, &self.answers) {
            Ok(l) => l,
            Err(_) => return Ok(None),
        };
        self.sessions = id;
        Ok(Some(ShmSession::new(&self.name, self.wait, link, self.carrier_route())))
    }

    fn notify_fd(&mut self) -> Result<BorrowedHandle<'_>> {
        if self.notify.is_none() {
            let notify = Notify::new()?;
            if let Some(acceptor) = &self.acceptor {
                // Readable while a producer met waits to be taken up.
                let fd = acceptor.ready_fd();
                notify.epoll.add(fd, EventFlags::IN, crate::os::raw(&fd) as u64, "the channel's notification fd")?;
            }
            self.notify = Some(Arc::new(notify));
        }
        Ok(crate::os::borrow(&self.notify.as_ref().expect("set up above").epoll))
    }

    fn watch(&mut self, session: &mut ShmSession) -> Result<()> {
        let Some(notify) = &self.notify else { return Ok(()) };
        let what = "the channel's notification fd";
        for (fd, socket) in session.watched_fds() {
            let events = if socket { EventFlags::IN | EventFlags::RDHUP } else { EventFlags::IN };
            notify.epoll.add(fd, events, crate::os::raw(&fd) as u64, what)?;
        }
        session.notify = Some(Arc::clone(notify));
        // Make the fd reflect messages already waiting.
        if session.message_waits() {
            notify.signal();
        }
        Ok(())
    }

    fn unwatch(&mut self, session: &mut ShmSession) {
        if let Some(notify) = session.notify.take() {
            for (fd, _) in session.watched_fds() {
                notify.epoll.delete(fd);
            }
        }
    }
}

impl Drop for ShmConsumer {
    fn drop(&mut self) {
        // The socket file and this end's claim go first, so that a producer closing at the same
        // time never waits for us while we wait for it.
        if let Some(listener) = &mut self.listener {
            listener.close();
        }
        // The acceptor's thread closes its socket as it stops.
        drop(self.acceptor.take());
    }
}
