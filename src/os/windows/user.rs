//! The user this process runs as and its default runtime directory, on Windows (from
//! [`super::runtime`]).

/// A number standing for this process's user in messages and same-user checks: Windows
/// identifies users by SID, so this is a digest of the SID (equal SIDs, equal ids); the SID
/// itself is in [`super::runtime::user_sid`].
pub fn id() -> u32 {
    sid_digest(super::runtime::user_sid().unwrap_or(""))
}

/// A SID string's number for messages: FNV-1a, stable across processes and builds (std's
/// hasher is seeded per process).
pub fn sid_digest(sid: &str) -> u32 {
    sid.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// The default runtime directory, `%LOCALAPPDATA%\lava-flow` (else the temporary directory's
/// `lava-flow`). No environment variable is passed over on Windows.
pub fn default_runtime_dir() -> (std::path::PathBuf, Option<std::ffi::OsString>) {
    let base = std::env::var_os("LOCALAPPDATA").filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    (base.unwrap_or_else(std::env::temp_dir).join("lava-flow"), None)
}

/// Creates the directory `dir`; it takes its access from its parent (`%LOCALAPPDATA%` is the
/// user's own).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().create(dir)
}

/// What is wrong with a directory where this user's processes meet, or `None`. Nothing is
/// checked of it on Windows: what keeps other users out is the pipes' own access (this user
/// only) and the peer's SID checked at every connection, not the directory.
pub fn private_dir_problem(_meta: &std::fs::Metadata) -> Option<String> {
    None
}
