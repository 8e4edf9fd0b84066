//! The stream interface's free functions, as Unix has them (a Unix stream is std's
//! `UnixStream`, which cannot take methods of lava-flow's): each calls [`Stream`]'s method.

use std::os::windows::io::{BorrowedHandle, OwnedHandle};

use super::{PeerIdentity, Stream};
use crate::error::Result;

/// Who is on the other end of `sock`, as learnt when it connected.
pub fn peer(sock: &Stream) -> Result<PeerIdentity> {
    Ok(sock.peer())
}

/// [`Stream::send_with_handles`].
pub fn send_with_handles(sock: &Stream, payload: &[u8], handles: &[BorrowedHandle<'_>]) -> Result<()> {
    sock.send_with_handles(payload, handles)
}

/// [`Stream::try_send_with_handles`].
pub fn try_send_with_handles(sock: &Stream, payload: &[u8], handles: &[BorrowedHandle<'_>]) -> Result<()> {
    sock.try_send_with_handles(payload, handles)
}

/// [`Stream::recv_with_handles`].
pub fn recv_with_handles(sock: &Stream, buf: &mut [u8]) -> Result<(usize, Vec<OwnedHandle>)> {
    sock.recv_with_handles(buf)
}

/// [`Stream::try_recv_with_handles`].
pub fn try_recv_with_handles(sock: &Stream, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedHandle>)>> {
    sock.try_recv_with_handles(buf)
}

/// [`Stream::recv_exact_with_handle`].
pub fn recv_exact_with_handle(sock: &Stream, buf: &mut [u8], what: &str) -> Result<OwnedHandle> {
    sock.recv_exact_with_handle(buf, what)
}
