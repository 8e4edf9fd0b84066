//! `poll(2)`: waiting for any of a few handles to become ready.

use std::time::Duration;

pub use rustix::event::{PollFd, PollFlags};

use crate::error::{Error, Result};

/// `poll`'s flag for a stream socket whose peer closed its end (Linux `POLLRDHUP`; macOS
/// reports the end of stream as `POLLIN`/`POLLHUP`, so nothing more is asked there).
pub const HANG_UP: PollFlags = crate::os::platform::POLL_HANG_UP;

/// `poll(2)` over `fds`, retried on EINTR with the same timeout (`None` waits forever).
/// Returns how many entries have events.
pub fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> Result<usize> {
    let timeout = timeout.map(crate::os::timespec);
    loop {
        match rustix::event::poll(fds, timeout.as_ref()) {
            Ok(n) => return Ok(n),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::os("poll", e.into())),
        }
    }
}
