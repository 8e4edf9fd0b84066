//! The readiness set that is itself a handle (Linux epoll, macOS kqueue): Windows has none (a
//! wait takes a list of handles, [`super::ready`]), so [`Poller::new`] answers `Unsupported`
//! and no value of it exists; what a caller would build on one (a channel's one pollable
//! handle over several) is unsupported there.

use std::os::windows::io::{AsHandle, BorrowedHandle};

use crate::error::{Error, Result};

/// What a readiness set reports of a handle, as on Unix (only the names callers use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventFlags(u32);

impl EventFlags {
    pub const IN: EventFlags = EventFlags(1);
    pub const RDHUP: EventFlags = EventFlags(2);
}

impl std::ops::BitOr for EventFlags {
    type Output = EventFlags;
    fn bitor(self, other: EventFlags) -> EventFlags {
        EventFlags(self.0 | other.0)
    }
}

#[derive(Debug)]
enum Never {}

/// A readiness set; none can be made on Windows.
#[derive(Debug)]
pub struct Poller(Never);

impl Poller {
    /// `Unsupported` on Windows, always.
    pub fn new() -> Result<Poller> {
        Err(Error::Unsupported(
            "one handle that stands for several (a readiness set, epoll or kqueue) does not exist on Windows: wait \
             on the channel with recv or try_recv and their timeouts instead"
                .into(),
        ))
    }

    pub fn add(&self, _handle: BorrowedHandle<'_>, _events: EventFlags, _token: u64, _what: &str) -> Result<()> {
        match self.0 {}
    }

    pub fn delete(&self, _handle: BorrowedHandle<'_>) {
        match self.0 {}
    }
}

impl AsHandle for Poller {
    fn as_handle(&self) -> BorrowedHandle<'_> {
        match self.0 {}
    }
}
