//! Waiting for any of a few handles to be ready, in the terms every platform can give: a
//! wait over a list with a timeout (`poll(2)` here; Windows waits on its handles).

use std::time::Duration;

use super::poll::{poll, PollFd, PollFlags};
use super::stream::Listener;
use crate::error::Result;
use crate::os::BorrowedHandle;

/// Waits until one of `handles` is readable (an event set, a socket with data) or `timeout`
/// passes (`None`: no limit); whether one is.
pub fn wait_readable(handles: &[BorrowedHandle<'_>], timeout: Option<Duration>) -> Result<bool> {
    let mut fds: Vec<PollFd<'_>> = handles.iter().map(|h| PollFd::from_borrowed_fd(*h, PollFlags::IN)).collect();
    Ok(poll(&mut fds, timeout)? > 0)
}

/// Waits until a client waits at `listener` (true: accept it now) or `stop` is signalled
/// (false). True may also come with no client left to take (the caller accepts without
/// waiting and asks again).
pub fn wait_listener(listener: &Listener, stop: BorrowedHandle<'_>) -> Result<bool> {
    let mut fds = [PollFd::from_borrowed_fd(stop, PollFlags::IN), PollFd::new(listener, PollFlags::IN)];
    poll(&mut fds, None)?;
    Ok(fds[0].revents().is_empty())
}
