//! Streams between processes on Windows: a byte-mode named pipe per connection, at
//! `\\.\pipe\lava-flow.<user SID>.<name>`, carrying framed messages with handles.
//!
//! A frame is: the payload's length (u32, little-endian), the number of handles (u32), each
//! handle's value in the receiver's process (u64), then the payload. The sender duplicates
//! each handle into the receiver's process (`DuplicateHandle`, which needs the peer's process
//! opened for handle duplication), so the values are the receiver's own handles, which it
//! wraps as owned. What the receiver reads is checked: the lengths and count are bounded, a
//! value must be a handle open in this process, and a frame that breaks a rule is `Corrupt`.
//! A peer that may duplicate handles into this process could close or replace any of its
//! handles anyway; so only a peer of the same user (see [`Stream::peer`]) is to be trusted
//! with a stream, as on Unix.
//!
//! The pipe is overlapped, so that a send can be tried without waiting: a write the pipe's
//! buffer cannot take at once stays in flight (one at a time), and the next try reports
//! `WouldBlock` until the peer has read it. The listener keeps one instance waiting for a
//! client at all times, the first made with `FILE_FLAG_FIRST_PIPE_INSTANCE`, so that a second
//! listener of a live name is refused; the pipe's DACL admits only this user.

use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use windows_sys::Win32::Foundation::{
    DuplicateHandle, GetHandleInformation, GetLastError, LocalFree, DUPLICATE_CLOSE_SOURCE, DUPLICATE_SAME_ACCESS,
    ERROR_ACCESS_DENIED, ERROR_BROKEN_PIPE, ERROR_FILE_NOT_FOUND, ERROR_IO_INCOMPLETE, ERROR_IO_PENDING, ERROR_NO_DATA,
    ERROR_PIPE_BUSY, ERROR_PIPE_CONNECTED, ERROR_PIPE_NOT_CONNECTED, ERROR_SEM_TIMEOUT, GENERIC_READ, GENERIC_WRITE,
    HANDLE, INVALID_HANDLE_VALUE, WAIT_OBJECT_0, WAIT_TIMEOUT,
};
use windows_sys::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows_sys::Win32::Security::{PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES};
use windows_sys::Win32::Storage::FileSystem::{
    CreateFileW, ReadFile, WriteFile, FILE_FLAG_FIRST_PIPE_INSTANCE, FILE_FLAG_OVERLAPPED, OPEN_EXISTING,
    PIPE_ACCESS_DUPLEX, SECURITY_IDENTIFICATION, SECURITY_SQOS_PRESENT,
};
use windows_sys::Win32::System::Pipes::{
    ConnectNamedPipe, CreateNamedPipeW, DisconnectNamedPipe, GetNamedPipeClientProcessId, GetNamedPipeServerProcessId,
    PeekNamedPipe, WaitNamedPipeW, PIPE_READMODE_BYTE, PIPE_REJECT_REMOTE_CLIENTS, PIPE_TYPE_BYTE,
    PIPE_UNLIMITED_INSTANCES, PIPE_WAIT,
};
use windows_sys::Win32::System::Threading::{
    CreateEventW, GetCurrentProcess, OpenProcess, ResetEvent, WaitForSingleObject, PROCESS_DUP_HANDLE,
    PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SYNCHRONIZE,
};
use windows_sys::Win32::System::IO::{CancelIoEx, GetOverlappedResult, OVERLAPPED};

use super::runtime::{process_user_sid, user_sid};
use super::{last_error, os_error, owned, wide};
use crate::error::{Error, Result};

/// The most handles one message carries; more are a protocol error.
pub const MAX_HANDLES: usize = 16;
/// The largest payload of one message.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// Each direction's pipe buffer.
const PIPE_BUFFER: u32 = 64 * 1024;
const HEADER: usize = 8;

/// Who is at the other end of a [`Stream`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Its process id (as `i32`, the type every platform shares).
    pub pid: i32,
    /// Whether the peer's process runs as this process's user (its token's user SID).
    pub same_user: bool,
    /// The user it runs as, as a number for messages ([`super::user::sid_digest`] of its SID;
    /// `u32::MAX` where its process could not be asked).
    pub uid: u32,
}

/// The pipe's path of the listener `name`: one namespace per user.
fn pipe_path(name: &str) -> Result<String> {
    let valid = !name.is_empty() && name.len() <= 200;
    if !valid || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err(Error::invalid(format!(
            "stream name {name:?}: use 1 to 200 characters of letters, digits, '.', '_' and '-'"
        )));
    }
    Ok(format!(r"\\.\pipe\lava-flow.{}.{name}", user_sid()?))
}

/// A security descriptor that admits only this user (`LocalFree`d on drop).
struct OnlyThisUser(PSECURITY_DESCRIPTOR);

impl OnlyThisUser {
    fn new() -> Result<Self> {
        let sddl = wide(format!("D:P(A;;GA;;;{})", user_sid()?));
        let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string; the descriptor is allocated by the call.
        let ok = unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                sddl.as_ptr(),
                SDDL_REVISION_1,
                &mut sd,
                std::ptr::null_mut(),
            )
        };
        if ok == 0 {
            return Err(last_error("making a pipe's security descriptor"));
        }
        Ok(OnlyThisUser(sd))
    }
}

impl Drop for OnlyThisUser {
    fn drop(&mut self) {
        // SAFETY: allocated by ConvertStringSecurityDescriptorToSecurityDescriptorW.
        unsafe { LocalFree(self.0) };
    }
}

// SAFETY: the descriptor is immutable memory owned by this value.
unsafe impl Send for OnlyThisUser {}
// SAFETY: see Send.
unsafe impl Sync for OnlyThisUser {}

/// A manual-reset event for overlapped I/O.
fn io_event() -> Result<OwnedHandle> {
    // SAFETY: no security attributes, manual reset, initially unset, no name.
    owned(unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) }, || "CreateEventW for pipe I/O".into())
}

/// A listening name: clients [`connect`] to it, [`Listener::accept`] takes them.
pub struct Listener {
    name: String,
    path: Vec<u16>,
    security: OnlyThisUser,
    /// The instance waiting for the next client (the name exists while one does).
    waiting: Mutex<Option<OwnedHandle>>,
    event: OwnedHandle,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("name", &self.name).finish()
    }
}

impl Listener {
    /// Listens at `path`, as a Unix listener binds a socket file there: the pipe's name is
    /// the path's file name and a digest of the whole path ([`pipe_name_of`]); no file is made.
    /// Refused while another listener of this user has the name.
    pub fn bind(path: &Path) -> Result<Listener> {
        Self::bind_name(&pipe_name_of(path))
    }

    /// Listens on `name` (letters, digits, '.', '_', '-'). Refused while another listener of
    /// this user has the name.
    pub fn bind_name(name: &str) -> Result<Listener> {
        let path = wide(pipe_path(name)?);
        let listener = Listener {
            name: name.to_owned(),
            path,
            security: OnlyThisUser::new()?,
            waiting: Mutex::new(None),
            event: io_event()?,
        };
        // FILE_FLAG_FIRST_PIPE_INSTANCE refuses a live name atomically; Wine ignores the flag,
        // so a name that answers a wait is refused first (racy only where the flag is ignored).
        // SAFETY: a NUL-terminated name.
        let answers = unsafe { WaitNamedPipeW(listener.path.as_ptr(), 1) } != 0;
        // SAFETY: no preconditions; read right after the call.
        if answers || matches!(unsafe { GetLastError() }, ERROR_SEM_TIMEOUT | ERROR_PIPE_BUSY) {
            return Err(listener.live_already());
        }
        let first = listener.instance(true)?;
        *listener.waiting.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
        Ok(listener)
    }

    /// A new instance of the pipe, waiting for a client.
    fn instance(&self, first: bool) -> Result<OwnedHandle> {
        let attributes = SECURITY_ATTRIBUTES {
            nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
            lpSecurityDescriptor: self.security.0,
            bInheritHandle: 0,
        };
        let open_mode =
            PIPE_ACCESS_DUPLEX | FILE_FLAG_OVERLAPPED | if first { FILE_FLAG_FIRST_PIPE_INSTANCE } else { 0 };
        let pipe_mode = PIPE_TYPE_BYTE | PIPE_READMODE_BYTE | PIPE_WAIT | PIPE_REJECT_REMOTE_CLIENTS;
        // SAFETY: a NUL-terminated name and attributes that live through the call.
        let raw = unsafe {
            CreateNamedPipeW(
                self.path.as_ptr(),
                open_mode,
                pipe_mode,
                PIPE_UNLIMITED_INSTANCES,
                PIPE_BUFFER,
                PIPE_BUFFER,
                0,
                &attributes,
            )
        };
        if raw == INVALID_HANDLE_VALUE {
            // SAFETY: no preconditions; read right after the failed call.
            let code = unsafe { GetLastError() };
            if first && code == ERROR_ACCESS_DENIED {
                return Err(self.live_already());
            }
            let e = std::io::Error::from_raw_os_error(code as i32);
            return Err(os_error(format!("CreateNamedPipeW for the listener {:?}", self.name), e));
        }
        owned(raw, || format!("CreateNamedPipeW for the listener {:?}", self.name))
    }

    fn live_already(&self) -> Error {
        Error::InvalidState(format!(
            "a listener named {:?} is live already (another process of this user, or this one): stop it or choose \
             another name",
            self.name
        ))
    }

    /// The next client if one is waiting, without waiting (as a Unix listener's
    /// `try_accept`): `Ok(None)` when none is.
    pub fn try_accept(&self) -> std::io::Result<Option<Stream>> {
        match self.accept(Some(Duration::ZERO)) {
            Ok(stream) => Ok(Some(stream)),
            Err(Error::Timeout(_)) => Ok(None),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }

    /// The next client, waiting for it at most `timeout` (`None`: no limit; zero: only one
    /// already waiting), as a Unix listener's `accept_within`: `Ok(None)` when none came.
    pub fn accept_within(&self, timeout: Option<Duration>) -> std::io::Result<Option<Stream>> {
        match self.accept(timeout) {
            Ok(stream) => Ok(Some(stream)),
            Err(Error::Timeout(_)) => Ok(None),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }

    /// Waits for the next client, at most `timeout` (`None`: no limit): `Timeout` when none
    /// came.
    pub fn accept(&self, timeout: Option<Duration>) -> Result<Stream> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let pipe = match waiting.take() {
                Some(pipe) => pipe,
                None => self.instance(false)?,
            };
            match self.wait_for_client(&pipe, timeout) {
                Ok(Client::Connected) => {
                    // The next client's instance, so that the name stays taken; if it cannot
                    // be made now, the next accept makes it.
                    *waiting = self.instance(false).ok();
                    return Stream::new(pipe, true);
                }
                Ok(Client::CameAndWent) => *waiting = Some(pipe),
                Ok(Client::None) => {
                    *waiting = Some(pipe);
                    return Err(Error::Timeout(format!(
                        "no client connected to the listener {:?} within {:?} (is the peer running?)",
                        self.name,
                        timeout.unwrap_or_default()
                    )));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits for a client to connect to `pipe`, an instance of this listener's.
    fn wait_for_client(&self, pipe: &OwnedHandle, timeout: Option<Duration>) -> Result<Client> {
        let context = || format!("ConnectNamedPipe of the listener {:?}", self.name);
        // SAFETY: zeroed is a valid OVERLAPPED.
        let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
        ov.hEvent = self.event.as_raw_handle();
        // SAFETY: the event is this listener's.
        unsafe { ResetEvent(ov.hEvent) };
        // SAFETY: the pipe and the event are valid; `ov` outlives the operation: below, it
        // completes, or is cancelled and waited for, before this function returns.
        let started = unsafe { ConnectNamedPipe(pipe.as_raw_handle(), &mut ov) } != 0;
        // SAFETY: no preconditions; read right after the call.
        let code = if started { 0 } else { unsafe { GetLastError() } };
        match code {
            0 | ERROR_PIPE_CONNECTED => return Ok(Client::Connected),
            ERROR_NO_DATA => {
                // SAFETY: a pipe instance this listener made.
                unsafe { DisconnectNamedPipe(pipe.as_raw_handle()) };
                return Ok(Client::CameAndWent);
            }
            ERROR_IO_PENDING => {}
            code => return Err(os_error(context(), std::io::Error::from_raw_os_error(code as i32))),
        }
        // SAFETY: the event is this listener's.
        let signalled = unsafe { WaitForSingleObject(ov.hEvent, millis(timeout)) } == WAIT_OBJECT_0;
        if !signalled {
            // SAFETY: cancels only the operation of `ov`, which is still alive.
            unsafe { CancelIoEx(pipe.as_raw_handle(), &ov) };
        }
        let mut n = 0u32;
        // SAFETY: waits for the operation of `ov` to end, so that `ov` may go. It reports
        // success also when the client connected just before the cancel.
        if unsafe { GetOverlappedResult(pipe.as_raw_handle(), &ov, &mut n, 1) } != 0 {
            Ok(Client::Connected)
        } else if !signalled {
            Ok(Client::None)
        } else {
            Err(last_error(context()))
        }
    }
}

/// What came of waiting for a client.
enum Client {
    Connected,
    /// A client connected and closed before the wait: the instance is free again.
    CameAndWent,
    /// None within the timeout.
    None,
}

/// A timeout as the wait functions take it, in whole milliseconds rounded up.
fn millis(timeout: Option<Duration>) -> u32 {
    use windows_sys::Win32::System::Threading::INFINITE;
    timeout.map_or(INFINITE, |t| {
        let ms = t.as_nanos().div_ceil(1_000_000);
        u32::try_from(ms).unwrap_or(INFINITE - 1).min(INFINITE - 1)
    })
}

/// The pipe name of the listener at `path`: its file name (characters a pipe name may not
/// hold made '_', at most 100) and an FNV-1a digest of the whole path, so that two runtime
/// directories never share a name.
pub fn pipe_name_of(path: &Path) -> String {
    let whole = path.to_string_lossy();
    let digest = whole.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let file: String = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(100)
        .collect();
    format!("{file}.{digest:016x}")
}

/// Connects once to the listener at `path` (as a Unix stream connects to a socket file):
/// `NotFound` when no listener is there or none takes the connection now, for the caller to
/// retry.
pub fn connect(path: &Path) -> std::io::Result<Stream> {
    match connect_name(&pipe_name_of(path), Instant::now()) {
        Ok(stream) => Ok(stream),
        Err(Error::Timeout(m)) => Err(std::io::Error::new(std::io::ErrorKind::NotFound, m)),
        Err(e) => Err(std::io::Error::other(e.to_string())),
    }
}

/// Connects to the listener `name`, retrying until it is there or `deadline` passes.
pub fn connect_name(name: &str, deadline: Instant) -> Result<Stream> {
    let path = pipe_path(name)?;
    let wide_path = wide(&path);
    loop {
        // SAFETY: a NUL-terminated name; no security attributes, no template. The server
        // may identify this client but not impersonate it.
        let raw = unsafe {
            CreateFileW(
                wide_path.as_ptr(),
                GENERIC_READ | GENERIC_WRITE,
                0,
                std::ptr::null(),
                OPEN_EXISTING,
                FILE_FLAG_OVERLAPPED | SECURITY_SQOS_PRESENT | SECURITY_IDENTIFICATION,
                std::ptr::null_mut(),
            )
        };
        if let Ok(pipe) = owned(raw, String::new) {
            return Stream::new(pipe, false);
        }
        // SAFETY: no preconditions; read right after the failed call.
        let code = unsafe { GetLastError() };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(format!(
                "no listener named {name:?} took the connection in time ({path}; last error {code}): start the listener first"
            )));
        }
        match code {
            ERROR_FILE_NOT_FOUND => std::thread::sleep((deadline - now).min(Duration::from_millis(5))),
            // Every instance is taken: wait for the listener to make the next.
            // SAFETY: a NUL-terminated name.
            ERROR_PIPE_BUSY => unsafe {
                WaitNamedPipeW(wide_path.as_ptr(), millis(Some(deadline - now)).max(1));
            },
            _ => {
                return Err(os_error(format!("connecting to {path}"), std::io::Error::from_raw_os_error(code as i32)));
            }
        }
    }
}

/// The one write that may be in flight, with the frame it writes.
struct WriteSlot {
    ov: OVERLAPPED,
    frame: Vec<u8>,
    pending: bool,
}

/// A connected pipe to one peer.
pub struct Stream {
    pipe: OwnedHandle,
    peer: PeerIdentity,
    /// The peer's process, opened for duplicating handles into it; `None` when it may not be
    /// (another user's).
    peer_process: Option<OwnedHandle>,
    read_event: OwnedHandle,
    /// How long a read waits, in milliseconds (`INFINITE`: no limit), as a Unix socket's
    /// `SO_RCVTIMEO`.
    read_timeout_ms: std::sync::atomic::AtomicU32,
    reading: Mutex<()>,
    /// Bytes of a message read by [`recv_exact`] and not yet asked for.
    unread: Mutex<Vec<u8>>,
    /// Boxed: the system writes to the OVERLAPPED and reads the frame while a write is in
    /// flight, so they must not move.
    writing: Mutex<Box<WriteSlot>>,
    /// The event of the writes' OVERLAPPED (dropped after `Drop::drop` has reaped a write in
    /// flight).
    _write_event: OwnedHandle,
}

// SAFETY: the raw pointer in the OVERLAPPED (its event) is a handle value, usable from any
// thread; all mutable state is behind the mutexes.
unsafe impl Send for Stream {}
// SAFETY: see Send.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("peer", &self.peer).finish()
    }
}

fn pipe_broken(code: u32) -> bool {
    matches!(code, ERROR_BROKEN_PIPE | ERROR_PIPE_NOT_CONNECTED | ERROR_NO_DATA)
}

impl Stream {
    fn new(pipe: OwnedHandle, server: bool) -> Result<Stream> {
        let mut pid = 0u32;
        // SAFETY: a connected pipe handle and a place for the pid.
        let ok = unsafe {
            if server {
                GetNamedPipeClientProcessId(pipe.as_raw_handle(), &mut pid)
            } else {
                GetNamedPipeServerProcessId(pipe.as_raw_handle(), &mut pid)
            }
        };
        if ok == 0 {
            return Err(last_error("learning the pid of a pipe's peer"));
        }
        let access = PROCESS_DUP_HANDLE | PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_SYNCHRONIZE;
        // SAFETY: OpenProcess with plain values; the handle is owned below.
        let peer_process = owned(unsafe { OpenProcess(access, 0, pid) }, String::new).ok();
        let peer_sid = peer_process.as_ref().and_then(|p| process_user_sid(p.as_handle()).ok());
        let same_user = peer_sid.as_deref() == Some(user_sid()?);
        let uid = peer_sid.as_deref().map_or(u32::MAX, super::user::sid_digest);
        let write_event = io_event()?;
        // SAFETY: zeroed is a valid OVERLAPPED.
        let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
        ov.hEvent = write_event.as_raw_handle();
        Ok(Stream {
            pipe,
            peer: PeerIdentity { pid: pid as i32, same_user, uid },
            peer_process,
            read_event: io_event()?,
            read_timeout_ms: std::sync::atomic::AtomicU32::new(windows_sys::Win32::System::Threading::INFINITE),
            reading: Mutex::new(()),
            unread: Mutex::new(Vec::new()),
            writing: Mutex::new(Box::new(WriteSlot { ov, frame: Vec::new(), pending: false })),
            _write_event: write_event,
        })
    }

    /// Who the peer is: its pid (from the pipe) and whether it runs as this user.
    pub fn peer(&self) -> PeerIdentity {
        self.peer
    }

    /// Sends `payload` (1 to [`MAX_PAYLOAD`] bytes) with `handles` (at most [`MAX_HANDLES`]),
    /// waiting while the pipe is full. The handles stay open here; the peer gets its own.
    pub fn send_with_handles(&self, payload: &[u8], handles: &[BorrowedHandle<'_>]) -> Result<()> {
        self.send(payload, handles, true)
    }

    /// As [`Stream::send_with_handles`], but `WouldBlock` instead of waiting when the
    /// previous message is still in flight (the peer has not read enough of what was sent
    /// before); a message the pipe cannot take at once goes in flight, to be delivered.
    pub fn try_send_with_handles(&self, payload: &[u8], handles: &[BorrowedHandle<'_>]) -> Result<()> {
        self.send(payload, handles, false)
    }

    fn send(&self, payload: &[u8], handles: &[BorrowedHandle<'_>], wait: bool) -> Result<()> {
        if payload.is_empty() || payload.len() > MAX_PAYLOAD {
            return Err(Error::invalid(format!(
                "a stream message of {} bytes: send 1 to {MAX_PAYLOAD} bytes",
                payload.len()
            )));
        }
        if handles.len() > MAX_HANDLES {
            return Err(Error::invalid(format!(
                "{} handles in one message; the limit is {MAX_HANDLES}",
                handles.len()
            )));
        }
        let mut slot = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if !self.finish_write(&mut slot, wait)? {
            return Err(Error::WouldBlock("the peer has not yet read the previous message".into()));
        }
        let values = self.duplicate_into_peer(handles)?;
        let mut frame = std::mem::take(&mut slot.frame);
        frame.clear();
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&(values.len() as u32).to_le_bytes());
        for v in &values {
            frame.extend_from_slice(&v.to_le_bytes());
        }
        frame.extend_from_slice(payload);
        slot.frame = frame;
        self.start_write(&mut slot, wait).inspect_err(|_| self.close_in_peer(&values))
    }

    /// Writes the slot's frame; waits for it when `wait`, else leaves it in flight.
    fn start_write(&self, slot: &mut WriteSlot, wait: bool) -> Result<()> {
        let event = slot.ov.hEvent;
        // SAFETY: zeroed is a valid OVERLAPPED; its event is this stream's.
        slot.ov = unsafe { std::mem::zeroed() };
        slot.ov.hEvent = event;
        // SAFETY: the frame and the OVERLAPPED live in the boxed slot, which does not move or
        // change until the write has completed (finish_write, also on drop).
        let ok = unsafe {
            ResetEvent(event);
            WriteFile(
                self.pipe.as_raw_handle(),
                slot.frame.as_ptr(),
                slot.frame.len() as u32,
                std::ptr::null_mut(),
                &mut slot.ov,
            )
        };
        if ok == 0 {
            // SAFETY: no preconditions; read right after the failed call.
            let code = unsafe { GetLastError() };
            if code != ERROR_IO_PENDING {
                return Err(self.io_error("writing to the pipe", code));
            }
        }
        slot.pending = true;
        if wait || ok != 0 {
            self.finish_write(slot, true)?;
        }
        Ok(())
    }

    /// Reaps the write in flight, if any: whether none is left (false: still in flight and
    /// `wait` was false).
    fn finish_write(&self, slot: &mut WriteSlot, wait: bool) -> Result<bool> {
        if !slot.pending {
            return Ok(true);
        }
        let mut n = 0u32;
        // SAFETY: the OVERLAPPED of the write in flight on this pipe.
        if unsafe { GetOverlappedResult(self.pipe.as_raw_handle(), &slot.ov, &mut n, i32::from(wait)) } == 0 {
            // SAFETY: no preconditions; read right after the failed call.
            let code = unsafe { GetLastError() };
            if code == ERROR_IO_INCOMPLETE {
                return Ok(false);
            }
            slot.pending = false;
            return Err(self.io_error("writing to the pipe", code));
        }
        slot.pending = false;
        if n as usize != slot.frame.len() {
            return Err(Error::Io {
                context: "writing to the pipe".into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("{n} of {} bytes written", slot.frame.len()),
                ),
            });
        }
        Ok(true)
    }

    fn io_error(&self, what: &str, code: u32) -> Error {
        if pipe_broken(code) {
            Error::PeerGone(format!("{what}: the peer (pid {}) closed the stream or exited", self.peer.pid))
        } else {
            os_error(what.to_owned(), std::io::Error::from_raw_os_error(code as i32))
        }
    }

    /// Duplicates `handles` into the peer's process: their values there.
    fn duplicate_into_peer(&self, handles: &[BorrowedHandle<'_>]) -> Result<Vec<u64>> {
        if handles.is_empty() {
            return Ok(Vec::new());
        }
        let process = self.peer_process.as_ref().ok_or_else(|| {
            Error::PermissionDenied(format!(
                "passing handles to pid {}: its process may not be opened for handle duplication (run both as one user)",
                self.peer.pid
            ))
        })?;
        let mut values = Vec::with_capacity(handles.len());
        for h in handles {
            let mut remote: HANDLE = std::ptr::null_mut();
            // SAFETY: a handle of this process, duplicated into the peer's process with the
            // same access; the peer's value comes back in `remote`.
            let ok = unsafe {
                DuplicateHandle(
                    GetCurrentProcess(),
                    h.as_raw_handle(),
                    process.as_raw_handle(),
                    &mut remote,
                    0,
                    0,
                    DUPLICATE_SAME_ACCESS,
                )
            };
            if ok == 0 {
                let e = last_error(format!("DuplicateHandle into pid {}", self.peer.pid));
                self.close_in_peer(&values);
                return Err(e);
            }
            values.push(remote as usize as u64);
        }
        Ok(values)
    }

    /// Closes handles this process duplicated into the peer for a message that was not sent.
    fn close_in_peer(&self, values: &[u64]) {
        let Some(process) = &self.peer_process else { return };
        for &v in values {
            // SAFETY: closes a handle this process put into the peer's process.
            unsafe {
                DuplicateHandle(
                    process.as_raw_handle(),
                    v as usize as HANDLE,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    0,
                    DUPLICATE_CLOSE_SOURCE,
                )
            };
        }
    }

    /// Receives one message into `buf` and the handles that came with it, each owned.
    /// Returns the payload's length; 0 when the peer closed the stream or died.
    pub fn recv_with_handles(&self, buf: &mut [u8]) -> Result<(usize, Vec<OwnedHandle>)> {
        let _reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        let mut header = [0u8; HEADER];
        match self.read_exact(&mut header)? {
            0 => return Ok((0, Vec::new())),
            HEADER => {}
            _ => return Err(Error::PeerGone("the stream closed in the middle of a message".into())),
        }
        let (len, count) = parse_header(&header)?;
        let mut raw = [0u8; MAX_HANDLES * 8];
        if self.read_exact(&mut raw[..count * 8])? != count * 8 {
            return Err(Error::PeerGone("the stream closed in the middle of a message".into()));
        }
        let handles = adopt_handles(&raw[..count * 8])?;
        if len > buf.len() {
            let mut rest = vec![0u8; len];
            self.read_exact(&mut rest)?;
            return Err(Error::Corrupt(format!(
                "the peer sent a message of {len} bytes where at most {} fit",
                buf.len()
            )));
        }
        if self.read_exact(&mut buf[..len])? != len {
            return Err(Error::PeerGone("the stream closed in the middle of a message".into()));
        }
        Ok((len, handles))
    }

    /// As [`Stream::recv_with_handles`], without waiting: `None` while no whole message is
    /// there. End of stream is `Some` with length 0.
    pub fn try_recv_with_handles(&self, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedHandle>)>> {
        let mut header = [0u8; HEADER];
        let (mut read, mut available) = (0u32, 0u32);
        // SAFETY: the header buffer is writable for its length.
        let ok = unsafe {
            PeekNamedPipe(
                self.pipe.as_raw_handle(),
                header.as_mut_ptr().cast(),
                HEADER as u32,
                &mut read,
                &mut available,
                std::ptr::null_mut(),
            )
        };
        if ok == 0 {
            // SAFETY: no preconditions; read right after the failed call.
            let code = unsafe { GetLastError() };
            return if pipe_broken(code) {
                Ok(Some((0, Vec::new())))
            } else {
                Err(self.io_error("peeking at the pipe", code))
            };
        }
        if (read as usize) < HEADER {
            return Ok(None);
        }
        // A malformed header is reported by the read.
        let whole = parse_header(&header).map_or(true, |(len, count)| available as usize >= HEADER + count * 8 + len);
        if whole {
            self.recv_with_handles(buf).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Receives one message that must be exactly `buf.len()` bytes with exactly one handle
    /// (`what` names it in errors): `PeerGone` when the stream closed first, `Corrupt` for any
    /// other shape, whose handles are closed.
    pub fn recv_exact_with_handle(&self, buf: &mut [u8], what: &str) -> Result<OwnedHandle> {
        let (n, mut handles) = self.recv_with_handles(buf)?;
        if n == 0 {
            return Err(Error::PeerGone(format!("the stream closed before {what} arrived")));
        }
        if n != buf.len() || handles.len() != 1 {
            return Err(Error::Corrupt(format!(
                "expected {what} ({} bytes and 1 handle), got {n} bytes and {} handles",
                buf.len(),
                handles.len()
            )));
        }
        Ok(handles.pop().expect("one handle"))
    }

    /// Reads until `buf` is full or the stream ends: how much was read.
    fn read_exact(&self, buf: &mut [u8]) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_some(&mut buf[got..]) {
                Ok(0) => return Ok(got),
                Ok(n) => got += n,
                Err(code) if pipe_broken(code) => return Ok(got),
                Err(WAIT_TIMEOUT) => {
                    return Err(Error::Io {
                        context: format!("reading from the pipe of pid {}", self.peer.pid),
                        source: std::io::Error::new(std::io::ErrorKind::WouldBlock, "no data within the read timeout"),
                    })
                }
                Err(code) => return Err(self.io_error("reading from the pipe", code)),
            }
        }
        Ok(got)
    }

    /// Bounds how long each read waits (`None`: no limit), as `UnixStream::set_read_timeout`:
    /// a read that times out fails with an error of kind `WouldBlock`, and the stream's
    /// framing is then lost (drop it).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        if timeout == Some(Duration::ZERO) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a read timeout of zero"));
        }
        self.read_timeout_ms.store(millis(timeout), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// One read, waited for: how much came (0 at the end), or the error code (`WAIT_TIMEOUT`
    /// past the read timeout).
    fn read_some(&self, buf: &mut [u8]) -> std::result::Result<usize, u32> {
        // SAFETY: zeroed is a valid OVERLAPPED.
        let mut ov: OVERLAPPED = unsafe { std::mem::zeroed() };
        ov.hEvent = self.read_event.as_raw_handle();
        // SAFETY: the event is this stream's.
        unsafe { ResetEvent(ov.hEvent) };
        let want = buf.len().min(u32::MAX as usize) as u32;
        // SAFETY: the buffer is writable for `want` bytes; it and `ov` outlive the read, which
        // is waited for below before this function returns.
        let started =
            unsafe { ReadFile(self.pipe.as_raw_handle(), buf.as_mut_ptr(), want, std::ptr::null_mut(), &mut ov) };
        // SAFETY: no preconditions; read right after the call.
        let code = if started != 0 { 0 } else { unsafe { GetLastError() } };
        if code != 0 && code != ERROR_IO_PENDING {
            return Err(code);
        }
        let timeout = self.read_timeout_ms.load(std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the read's event, this stream's.
        let timed_out = unsafe { WaitForSingleObject(ov.hEvent, timeout) } == WAIT_TIMEOUT;
        if timed_out {
            // SAFETY: cancels only the read of `ov`, on this stream's pipe.
            unsafe { CancelIoEx(self.pipe.as_raw_handle(), &ov) };
        }
        let mut n = 0u32;
        // SAFETY: waits for the read of `ov` to end (cancelled or not), so that neither the
        // buffer nor `ov` is used after this returns.
        let done = unsafe { GetOverlappedResult(self.pipe.as_raw_handle(), &ov, &mut n, 1) } != 0;
        if timed_out && (!done || n == 0) {
            return Err(WAIT_TIMEOUT);
        }
        if !done {
            // SAFETY: no preconditions; read right after the failed call.
            return Err(unsafe { GetLastError() });
        }
        Ok(n as usize)
    }

    /// Writes `bytes` as they are, for tests that play a peer breaking the framing.
    #[cfg(test)]
    pub(crate) fn send_raw_for_tests(&self, bytes: &[u8]) -> Result<()> {
        let mut slot = self.writing.lock().unwrap();
        self.finish_write(&mut slot, true)?;
        slot.frame = bytes.to_vec();
        self.start_write(&mut slot, true)
    }
}

/// The payload length and handle count of a frame, checked against the limits.
fn parse_header(header: &[u8; HEADER]) -> Result<(usize, usize)> {
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let count = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return Err(Error::Corrupt(format!(
            "the peer announced a message of {len} bytes (1 to {MAX_PAYLOAD} allowed)"
        )));
    }
    if count > MAX_HANDLES {
        return Err(Error::Corrupt(format!(
            "the peer announced {count} handles in one message; the limit is {MAX_HANDLES}"
        )));
    }
    Ok((len, count))
}

/// Takes ownership of the handle values a peer duplicated into this process: each must be a
/// handle open here, and none twice. On error, the valid ones are closed.
fn adopt_handles(raw: &[u8]) -> Result<Vec<OwnedHandle>> {
    let mut handles: Vec<OwnedHandle> = Vec::with_capacity(raw.len() / 8);
    let mut bad = None;
    for chunk in raw.chunks_exact(8) {
        let value = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        // Real handles are multiples of 4 and positive; negative ones are pseudo handles.
        let plausible = value != 0 && value % 4 == 0 && value <= isize::MAX as u64;
        let mut flags = 0u32;
        // SAFETY: GetHandleInformation on any value at most fails.
        let open = plausible && unsafe { GetHandleInformation(value as usize as HANDLE, &mut flags) } != 0;
        let repeated = handles.iter().any(|h| h.as_raw_handle() as usize as u64 == value);
        if open && !repeated {
            // SAFETY: the peer duplicated this handle into this process for this message;
            // it is open (checked) and nothing else here was given its value.
            handles.push(unsafe { OwnedHandle::from_raw_handle(value as usize as HANDLE) });
        } else {
            bad.get_or_insert(value);
        }
    }
    match bad {
        Some(value) => {
            Err(Error::Corrupt(format!("the peer sent {value:#x}, which is not a handle it passed to this process")))
        }
        None => Ok(handles),
    }
}

impl AsHandle for Stream {
    fn as_handle(&self) -> BorrowedHandle<'_> {
        self.pipe.as_handle()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let slot = self.writing.get_mut().unwrap_or_else(|e| e.into_inner());
        if slot.pending {
            // A message in flight is delivered if the peer reads it within a second; else it
            // is cancelled, so that the frame's memory is not freed under the write.
            // SAFETY: the event and the OVERLAPPED of the write in flight on this pipe.
            unsafe {
                if WaitForSingleObject(slot.ov.hEvent, 1000) != WAIT_OBJECT_0 {
                    CancelIoEx(self.pipe.as_raw_handle(), &slot.ov);
                }
                let mut n = 0u32;
                GetOverlappedResult(self.pipe.as_raw_handle(), &slot.ov, &mut n, 1);
            }
        }
    }
}

// The interface's free functions, as Unix has them.
#[path = "stream_fns.rs"]
mod fns;
// Their callers, the channels, are not built on Windows yet.
#[allow(unused_imports)]
pub use fns::{
    peer, peer_gone, recv_exact, recv_exact_with_handle, recv_with_handles, send_all, send_with_handles,
    try_recv_with_handles, try_send_with_handles,
};

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
