//! The runtime directory (where lock files and other per-user state live) and the user's
//! identity, its SID, for pipe names and same-user checks.

use std::os::windows::io::{AsRawHandle, BorrowedHandle};
use std::path::PathBuf;
use std::sync::OnceLock;

use windows_sys::Win32::Foundation::{LocalFree, HANDLE};
use windows_sys::Win32::Security::Authorization::ConvertSidToStringSidW;
use windows_sys::Win32::Security::{GetTokenInformation, TokenUser, TOKEN_QUERY, TOKEN_USER};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

use super::{last_error, owned};
use crate::error::{Error, Result};

/// The default runtime directory, `%LOCALAPPDATA%\lava-flow` (else the temporary directory's
/// `lava-flow`), created if missing. Both are per user on Windows.
pub fn default_dir() -> Result<PathBuf> {
    let base = std::env::var_os("LOCALAPPDATA").filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = base.unwrap_or_else(std::env::temp_dir).join("lava-flow");
    std::fs::create_dir_all(&dir).map_err(|e| {
        super::os_error(
            format!("creating the runtime directory {} (set LF_RUNTIME_DIR to a writable directory)", dir.display()),
            e,
        )
    })?;
    Ok(dir)
}

/// This process's user, as a SID string (`S-1-5-21-...`): unique per account, and made only of
/// characters a pipe name may hold.
pub fn user_sid() -> Result<&'static str> {
    static SID: OnceLock<String> = OnceLock::new();
    if let Some(sid) = SID.get() {
        return Ok(sid);
    }
    // SAFETY: the pseudo handle of this process needs no closing and is always valid.
    let me = unsafe { BorrowedHandle::borrow_raw(GetCurrentProcess()) };
    let sid = process_user_sid(me)?;
    Ok(SID.get_or_init(|| sid))
}

/// The user a process runs as, as a SID string; `process` needs query access (the limited
/// kind is enough).
pub fn process_user_sid(process: BorrowedHandle<'_>) -> Result<String> {
    let mut token: HANDLE = std::ptr::null_mut();
    // SAFETY: a valid process handle and a place for the token handle.
    let ok = unsafe { OpenProcessToken(process.as_raw_handle(), TOKEN_QUERY, &mut token) };
    let token = owned(if ok != 0 { token } else { std::ptr::null_mut() }, || "opening a process's token".into())?;
    // TOKEN_USER holds a pointer into the same buffer, so the buffer is u64-aligned.
    let mut buf = vec![0u64; 64];
    let mut needed = 0u32;
    // SAFETY: the buffer is writable for its whole length, which is what is passed.
    let ok = unsafe {
        GetTokenInformation(
            token.as_raw_handle(),
            TokenUser,
            buf.as_mut_ptr().cast(),
            (buf.len() * 8) as u32,
            &mut needed,
        )
    };
    if ok == 0 {
        return Err(last_error("reading the user of a process's token"));
    }
    // SAFETY: GetTokenInformation succeeded, so the buffer starts with a TOKEN_USER whose SID
    // points into the buffer, which lives to the end of this function.
    let sid = unsafe { (*buf.as_ptr().cast::<TOKEN_USER>()).User.Sid };
    let mut text: *mut u16 = std::ptr::null_mut();
    // SAFETY: a valid SID; the string is allocated by the call and freed below.
    if unsafe { ConvertSidToStringSidW(sid, &mut text) } == 0 {
        return Err(last_error("converting a user's SID to text"));
    }
    // SAFETY: ConvertSidToStringSidW returns a NUL-terminated string.
    let len = (0..).take_while(|&i| unsafe { *text.add(i) } != 0).count();
    // SAFETY: `len` characters were counted above, all inside the string.
    let sid = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(text, len) });
    // SAFETY: the string was allocated with LocalAlloc by ConvertSidToStringSidW.
    unsafe { LocalFree(text.cast()) };
    if sid.is_empty() {
        return Err(Error::InvalidState("a process's token names an empty SID".into()));
    }
    Ok(sid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_dir_exists_and_the_user_has_a_sid() {
        let dir = default_dir().unwrap();
        assert!(dir.is_dir(), "{} was not created", dir.display());
        assert!(dir.ends_with("lava-flow"));
        let sid = user_sid().unwrap();
        assert!(sid.starts_with("S-1-"), "{sid} is not a SID");
        assert!(sid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }
}
