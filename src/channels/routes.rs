//! A channel's route table: the routes that serve payloads its carrier cannot hold itself,
//! several of one payload class side by side, and the choice among them per message. The
//! producer picks by the message's memory kind (the first route, in the plan's order of
//! preference, that serves the kind to this peer); the consumer by the route id the message's
//! descriptor names.

use super::ready::NO_SHARED_READY;
use super::transport::{
    ConsumerSession, MemoryKind, Packed, RawView, Route, RouteReceiver, RouteSender, RoutedPayload, TransportId,
    TransportInfo,
};
use crate::error::{Error, Result};

/// No route serves the kind.
const NONE: u8 = u8::MAX;

/// The producer's routes, and which serves each memory kind.
pub(crate) struct SenderTable<S> {
    routes: Vec<S>,
    /// Per memory kind (`MemoryKind::index`), the index of the route that serves it.
    by_kind: [u8; MemoryKind::ALL.len()],
}

impl<S: RouteSender> SenderTable<S> {
    /// The table of `routes`, in order of preference: a kind goes to the first that serves it.
    pub(crate) fn new(mut routes: Vec<S>) -> Self {
        if let Some(share) = routes.iter().find_map(|r| r.ready_share()) {
            for route in routes.iter_mut() {
                route.share_ready(&share);
            }
        }
        let mut by_kind = [NONE; MemoryKind::ALL.len()];
        for kind in MemoryKind::ALL {
            if let Some(i) = routes.iter().position(|r| r.serves(kind)) {
                by_kind[kind.index()] = i as u8;
            }
        }
        SenderTable { routes, by_kind }
    }

    /// Puts each route's account of itself into `info`, made before the table: linking the
    /// routes (the ready semaphore one shares with the others) may change what another says.
    pub(crate) fn report_into(&self, info: &mut TransportInfo) {
        for route in &self.routes {
            info.set_route(route.route().clone());
        }
    }

    /// Adds `route` last: it serves the kinds no route before it serves.
    #[cfg(test)]
    pub(crate) fn push(&mut self, route: S) {
        let routes = std::mem::take(&mut self.routes);
        *self = SenderTable::new(routes.into_iter().chain(std::iter::once(route)).collect());
    }

    /// The route that serves memory of `kind` to this peer, if one does.
    #[inline]
    pub(crate) fn for_kind(&mut self, kind: MemoryKind) -> Option<&mut S> {
        match self.by_kind[kind.index()] {
            NONE => None,
            i => self.routes.get_mut(i as usize),
        }
    }

    /// The route that serves memory of `kind`, to read its state.
    pub(crate) fn get(&self, kind: MemoryKind) -> Option<&S> {
        match self.by_kind[kind.index()] {
            NONE => None,
            i => self.routes.get(i as usize),
        }
    }
}

/// The consumer's routes, found by the id a routed message names.
pub(crate) struct ReceiverTable<R> {
    routes: Vec<R>,
}

impl<R> Default for ReceiverTable<R> {
    fn default() -> Self {
        ReceiverTable { routes: Vec::new() }
    }
}

impl<R: RouteReceiver> ReceiverTable<R> {
    /// The table of `routes`, whose current sessions (if any: the first producer's is started
    /// as the channel connects) learn whether their producer shares a ready semaphore.
    pub(crate) fn new(routes: Vec<R>) -> Self {
        let mut table = ReceiverTable { routes };
        table.link_ready();
        table
    }

    /// Hands the current producer's ready semaphore, as the route that imported it shares it,
    /// to every route (or why the producer shares none).
    fn link_ready(&mut self) {
        let share = self.routes.iter().find_map(|r| r.ready_share());
        let share = share.unwrap_or_else(|| Err(NO_SHARED_READY.to_owned()));
        for route in self.routes.iter_mut() {
            route.share_ready(&share);
        }
    }

    #[cfg(test)]
    pub(crate) fn push(&mut self, route: R) {
        self.routes.push(route);
    }

    /// The route whose id is `id` (a channel has a few routes: a scan is the cheapest lookup).
    #[inline]
    pub(crate) fn by_id(&mut self, id: u32) -> Option<&mut R> {
        self.routes.iter_mut().find(|r| r.route_id() == id)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &R> {
        self.routes.iter()
    }

    /// Starts each route's session for `session`'s producer, handing each its offer from the
    /// producer's hello; returns how each route serves that producer, for the report.
    pub(crate) fn new_sessions(
        &mut self,
        session: &mut impl ConsumerSession,
        carrier: TransportId,
    ) -> Result<Vec<Route>> {
        let mut offers = session.take_offers().unwrap_or_default();
        for route in self.routes.iter_mut() {
            let id = route.route_id();
            let offer = offers.iter().position(|s| s.route == id).map(|at| offers.remove(at));
            route.new_session(session.id(), offer)?;
        }
        // Each producer's routes learn anew whether it shares a ready semaphore, before they
        // say how they serve it.
        self.link_ready();
        let mut routes = Vec::with_capacity(self.routes.len());
        for route in self.routes.iter().filter(|r| r.reported()) {
            routes.push(route.route(carrier));
            routes.extend(route.second_route(carrier));
        }
        settle_gpu_lines(&mut routes, carrier);
        Ok(routes)
    }

    /// Ends each route's session: what the producer's messages may still use goes to
    /// `session`, the carrier's, which keeps it while they are held.
    pub(crate) fn end_sessions(&mut self, session: &mut impl ConsumerSession) {
        for route in self.routes.iter_mut() {
            let (_, kept) = route.end_session();
            session.keep_while_held(kept);
        }
    }

    /// The payload routed view `view` of `session` names, reading the attachments that came
    /// before it. `channel` names the channel in errors.
    #[inline]
    pub(crate) fn resolve(
        &mut self,
        session: &mut impl ConsumerSession,
        view: &RawView,
        channel: &str,
    ) -> Result<RoutedPayload> {
        let Some(id) = view.route().filter(|_| view.len <= Packed::MAX_DESCRIPTOR) else {
            return Err(unroutable(view, channel));
        };
        let Some(route) = self.by_id(id) else { return Err(unroutable(view, channel)) };
        // SAFETY: the carrier validated that view.len bytes at view.ptr lie in its mapping,
        // which stays mapped while the view is held. The producer can still write them: the
        // route reads each field once and checks what it read.
        let descriptor = unsafe { std::slice::from_raw_parts(view.ptr, view.len) };
        match route.resolve(view.token, descriptor)? {
            Some(payload) => Ok(payload),
            None => self.resolve_after_attachments(session, id, view, descriptor, channel),
        }
    }

    /// A routed view whose memory its route does not know yet: the attachments that came
    /// before it say what it is.
    #[cold]
    fn resolve_after_attachments(
        &mut self,
        session: &mut impl ConsumerSession,
        id: u32,
        view: &RawView,
        descriptor: &[u8],
        channel: &str,
    ) -> Result<RoutedPayload> {
        loop {
            let attachments = session.take_attachments()?;
            if attachments.is_empty() {
                return Err(Error::Corrupt(format!(
                    "channel {channel:?}: message {} names GPU memory the producer never passed",
                    view.token
                )));
            }
            let released_below = session.released_below();
            for attachment in attachments {
                // An attachment for a route this channel does not have is the producer's error.
                let Some(route) = self.by_id(attachment.route) else {
                    return Err(Error::Corrupt(format!(
                        "channel {channel:?}: the producer passed an attachment for route {}, which this channel does not use",
                        attachment.route
                    )));
                };
                route.attach(attachment, released_below)?;
            }
            let route = self.by_id(id).expect("found by resolve");
            if let Some(payload) = route.resolve(view.token, descriptor)? {
                return Ok(payload);
            }
        }
    }
}

/// Keeps one line for GPU buffers among a report's `lines` where a route takes them by
/// reference (a line whose transport is not the carrier's): the first such, in the table's
/// order of preference; the lines of routes that stage them are left out then.
pub(crate) fn settle_gpu_lines(lines: &mut Vec<Route>, carrier: TransportId) {
    use super::transport::PayloadClass;
    let Some(first) = lines.iter().position(|r| r.class == PayloadClass::Gpu && r.kind != carrier) else { return };
    let mut at = 0;
    lines.retain(|r| {
        let keep = r.class != PayloadClass::Gpu || at == first;
        at += 1;
        keep
    });
}

/// The error of a routed view that names no route of the channel, or a descriptor too long.
#[cold]
pub(crate) fn unroutable(view: &RawView, channel: &str) -> Error {
    match view.route() {
        Some(route) if view.len <= Packed::MAX_DESCRIPTOR => Error::Corrupt(format!(
            "channel {channel:?}: message {} names route {route}, which this channel does not use",
            view.token
        )),
        _ => Error::Corrupt(format!(
            "channel {channel:?}: message {} has a {}-byte route descriptor",
            view.token, view.len
        )),
    }
}
