//! The platform layer on Windows, with `windows-sys`: the same concepts as the Unix
//! implementations, built from the kernel objects Windows has for them.
//!
//! - **handle**: `std::os::windows::io::{OwnedHandle, BorrowedHandle, AsHandle, RawHandle}`.
//! - **shared memory** ([`shm`]): pagefile-backed sections. A section never changes size, so
//!   its size is fixed from the start; the read-only handle is a duplicate with map-read access
//!   only, through which the kernel refuses a writable view.
//! - **mapping** ([`mapping`]): views of sections (`MapViewOfFile`), private memory
//!   (`VirtualAlloc`); two sections back to back through placeholders (`VirtualAlloc2`,
//!   `MapViewOfFile3`, Windows 10 1803), looked up at run time. Offsets and the parts of a
//!   pair are multiples of [`mapping::map_granularity`] (64 KiB), not of the page size.
//! - **wait on a word** ([`wait`]): Windows has no wait on an address that crosses processes,
//!   so a waiter spins, yields and sleeps, re-checking the word; a wake is a no-op.
//! - **notification** ([`notify`]): a manual-reset event, one handle per side.
//! - **stream** ([`stream`]): a byte-mode named pipe per connection; handles travel by
//!   `DuplicateHandle` into the peer's process, their values in the message.
//! - **process** ([`process`]) and **watcher** ([`watcher`]): process handles, which are
//!   signalled when the process exits, waited on by `WaitForMultipleObjects`.
//! - **lock file** ([`lock`]): `LockFileEx`, released by the kernel when the holder dies.
//! - **runtime dir and user** ([`runtime`]): `%LOCALAPPDATA%\lava-flow`, the user's SID.
//!
//! The tests run under Wine (`scripts/wine-tests.sh`). Wine 8.0 differs from Windows in two
//! ways that the code allows for: its `VirtualAlloc2` refuses placeholders, so `shared_pair`
//! maps its two views at a range it found free (retrying if another thread takes it), and it ignores `FILE_FLAG_FIRST_PIPE_INSTANCE`, so
//! `Listener::bind` also refuses a name that already has an instance before creating one.

pub mod event;
pub mod facts;
pub mod lock;
pub mod mapping;
pub mod membarrier;
pub mod notify;
pub mod poller;
pub mod process;
pub mod ready;
pub mod runtime;
pub mod shm;
pub mod stream;
pub mod system;
pub mod user;
pub mod wait;
pub mod watcher;

use std::ffi::OsStr;
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::{FromRawHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{ERROR_ACCESS_DENIED, ERROR_COMMITMENT_LIMIT, ERROR_NOT_ENOUGH_MEMORY, HANDLE};

use crate::error::Error;

/// The error of the last failed Windows call, with what was being attempted. Access denied
/// and lack of memory get their own variants (the crate's errno classes do not know Windows
/// codes).
pub(crate) fn last_error(context: impl Into<String>) -> Error {
    os_error(context, io::Error::last_os_error())
}

/// As [`last_error`], for an error already taken.
pub(crate) fn os_error(context: impl Into<String>, source: io::Error) -> Error {
    let context = context.into();
    match source.raw_os_error().map(|c| c as u32) {
        Some(ERROR_ACCESS_DENIED) => Error::PermissionDenied(format!("{context}: {source}")),
        Some(ERROR_NOT_ENOUGH_MEMORY | ERROR_COMMITMENT_LIMIT) => Error::OutOfMemory(format!("{context}: {source}")),
        // Not Error::os: it classifies by errno values, which mean other things as Windows codes.
        _ => Error::Io { context, source },
    }
}

/// `s` as a NUL-terminated UTF-16 string, for the `W` functions.
pub(crate) fn wide(s: impl AsRef<OsStr>) -> Vec<u16> {
    s.as_ref().encode_wide().chain(std::iter::once(0)).collect()
}

/// Takes ownership of a handle a call returned, or the last error when it returned NULL (or
/// `INVALID_HANDLE_VALUE`, which the file and pipe functions return instead).
pub(crate) fn owned(raw: HANDLE, context: impl FnOnce() -> String) -> crate::error::Result<OwnedHandle> {
    if raw.is_null() || raw == windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE {
        return Err(last_error(context()));
    }
    // SAFETY: the handle was just returned by a call that creates or opens a kernel object,
    // so this process owns it and nothing else will close it.
    Ok(unsafe { OwnedHandle::from_raw_handle(raw) })
}

/// A function looked up by name, to be transmuted to its real signature.
pub(crate) type SystemFunction = unsafe extern "system" fn() -> isize;

/// Looks up `function` in a system DLL that every process has loaded (`kernelbase.dll`,
/// `ntdll.dll`), for what older Windows versions (or Wine) may lack.
pub(crate) fn system_function(dll: &str, function: &std::ffi::CStr) -> Option<SystemFunction> {
    use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleW, GetProcAddress};
    let dll = wide(dll);
    // SAFETY: a NUL-terminated name; no reference count is taken, and these DLLs stay
    // loaded for the process's life.
    let module = unsafe { GetModuleHandleW(dll.as_ptr()) };
    if module.is_null() {
        return None;
    }
    // SAFETY: a module handle from above and a NUL-terminated name.
    unsafe { GetProcAddress(module, function.as_ptr().cast()) }
}

/// Spawning this test binary again as a child process that runs one role of a test.
#[cfg(test)]
pub(crate) mod test_child {
    use std::process::{Child, Command, Stdio};

    /// The environment variable that carries the child's role.
    pub const ROLE: &str = "LF_WINDOWS_TEST_CHILD";

    /// The role this process plays, when it is a child.
    pub fn role() -> Option<String> {
        std::env::var(ROLE).ok()
    }

    /// The harness's name of the test `name` in `module` (`module_path!()`): without the
    /// crate's name, wherever the layer sits in the crate.
    pub fn test_path(module: &str, name: &str) -> String {
        format!("{}::{name}", module.split_once("::").map_or(module, |(_, rest)| rest))
    }

    /// Runs the test `test` of this binary again in a child, with `role` and `env`.
    pub fn spawn(test: &str, role: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut command = Command::new(exe);
        command.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, role);
        for (k, v) in env {
            command.env(k, v);
        }
        command.stdout(Stdio::inherit()).stderr(Stdio::inherit()).spawn().expect("spawning the test child")
    }

    /// A name no other test run uses.
    pub fn unique(what: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!("{what}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
    }
}
