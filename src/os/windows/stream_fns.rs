//! The stream interface's free functions, as Unix has them (a Unix stream is std's
//! `UnixStream`, which cannot take methods of lava-flow's): each calls [`Stream`]'s method.

use std::os::windows::io::{BorrowedHandle, OwnedHandle};

use super::{PeerIdentity, Stream, MAX_PAYLOAD};
use crate::error::{Error, Result};

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

/// Sends `bytes` as a byte stream (as a Unix socket's plain send of them all): in messages of
/// at most [`MAX_PAYLOAD`] bytes without handles, which [`recv_exact`] reads as one stream.
pub fn send_all(sock: &Stream, bytes: &[u8]) -> std::io::Result<()> {
    for chunk in bytes.chunks(MAX_PAYLOAD) {
        sock.send_with_handles(chunk, &[]).map_err(io_error)?;
    }
    Ok(())
}

/// Fills `buf` from what [`send_all`] sent, as `Read::read_exact` of a Unix socket: an error
/// of kind `UnexpectedEof` when the stream ends first, `WouldBlock` past the read timeout.
pub fn recv_exact(sock: &Stream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut unread = sock.unread.lock().unwrap_or_else(|e| e.into_inner());
    let mut got = 0;
    while got < buf.len() {
        if unread.is_empty() {
            let mut message = vec![0u8; MAX_PAYLOAD];
            let (n, handles) = sock.recv_with_handles(&mut message).map_err(io_error)?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the peer closed the stream"));
            }
            if !handles.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the peer sent handles where only bytes belong",
                ));
            }
            message.truncate(n);
            *unread = message;
        }
        let take = unread.len().min(buf.len() - got);
        buf[got..got + take].copy_from_slice(&unread[..take]);
        unread.drain(..take);
        got += take;
    }
    Ok(())
}

/// A stream error as the `std::io::Error` a Unix socket would give, keeping its kind.
fn io_error(e: Error) -> std::io::Error {
    match e {
        Error::Io { context, source } => std::io::Error::new(source.kind(), format!("{context}: {source}")),
        Error::PeerGone(why) => std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why),
        Error::WouldBlock(why) => std::io::Error::new(std::io::ErrorKind::WouldBlock, why),
        other => std::io::Error::other(other.to_string()),
    }
}

/// Whether the peer on `sock` has gone: its process (`process`, where there is a handle of
/// it) has exited, or its end of the pipe is closed (a peek of nothing fails so).
pub fn peer_gone(sock: &Stream, process: Option<&crate::os::process::PeerProcess>) -> bool {
    if process.is_some_and(|p| p.has_exited()) {
        return true;
    }
    let (mut read, mut available) = (0u32, 0u32);
    // SAFETY: a pipe handle the stream owns; no buffer is given, so nothing is written but
    // the two counts, which live through the call.
    let ok = unsafe {
        windows_sys::Win32::System::Pipes::PeekNamedPipe(
            std::os::windows::io::AsRawHandle::as_raw_handle(&sock.pipe),
            std::ptr::null_mut(),
            0,
            &mut read,
            &mut available,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: no preconditions; read right after the failed call.
    ok == 0 && super::pipe_broken(unsafe { windows_sys::Win32::Foundation::GetLastError() })
}
