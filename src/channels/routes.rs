//! A channel's route table: the routes that serve payloads its carrier cannot hold itself,
//! several of one payload class side by side, and the choice among them per message. The
//! producer picks by the message's memory kind (the first route, in the plan's order of
//! preference, that serves the kind to this peer); the consumer by the route id the message's
//! descriptor names.

use super::transport::{MemoryKind, RouteReceiver, RouteSender};

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
    pub(crate) fn new(routes: Vec<S>) -> Self {
        let mut by_kind = [NONE; MemoryKind::ALL.len()];
        for kind in MemoryKind::ALL {
            if let Some(i) = routes.iter().position(|r| r.serves(kind)) {
                by_kind[kind.index()] = i as u8;
            }
        }
        SenderTable { routes, by_kind }
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

impl<R: RouteReceiver> ReceiverTable<R> {
    pub(crate) fn new(routes: Vec<R>) -> Self {
        ReceiverTable { routes }
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

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut R> {
        self.routes.iter_mut()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}
