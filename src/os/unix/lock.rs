//! Lock files: an exclusive lock on a file (`flock`), released by the OS when its holder closes
//! the file or dies.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// A lock file held: the lock goes when this closes (or the process dies).
#[derive(Debug)]
pub struct LockFile(File);

impl LockFile {
    /// Takes the exclusive lock of the file at `path` (created, mode 0600, if missing; never
    /// through a symlink) without waiting. `Err(file)` when another process holds it: `file`
    /// is open for reading what the holder wrote there. A file removed or replaced by its last
    /// holder between the open and the lock is not the one at `path` any more: taken again.
    pub fn try_take(path: &Path) -> std::io::Result<Result<LockFile, File>> {
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)?;
            if !try_lock(&file)? {
                return Ok(Err(file));
            }
            let locked = file.metadata().map(|m| (m.dev(), m.ino())).ok();
            let in_place = std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino())).ok();
            if locked.is_some() && locked == in_place {
                return Ok(Ok(LockFile(file)));
            }
        }
    }

    /// The locked file, to write who holds it.
    pub fn file(&mut self) -> &mut File {
        &mut self.0
    }
}

/// Takes the exclusive lock of the open file `file` without waiting: `Ok(false)` when another
/// open file description holds it.
pub fn try_lock(file: &impl AsFd) -> std::io::Result<bool> {
    // SAFETY: flock on a live descriptor the caller holds, with integer flags.
    if unsafe { libc::flock(file.as_fd().as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(err)
}

/// Identifies one file: inode numbers are reused at once on tmpfs, so the change time (ns) is
/// part of the identity.
pub type FileId = (u64, u64, i64, i64);

/// The identity of the file at `path` itself (never through a symlink), `None` if there is none.
pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Opens the lock file at `path` to read it (never through a symlink), to ask of its lock
/// without creating it.
pub fn open_existing(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_description_is_refused_until_the_first_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = std::fs::File::create(&path).unwrap();
        let second = std::fs::File::open(&path).unwrap();
        assert!(try_lock(&first).unwrap());
        assert!(!try_lock(&second).unwrap());
        drop(first);
        assert!(try_lock(&second).unwrap());
    }

    #[test]
    fn a_lock_file_is_taken_once_and_freed_by_its_close() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("end.lock");
        let mut held = LockFile::try_take(&path).unwrap().expect("a free lock");
        write!(held.file(), "42").unwrap();
        let mut refused = LockFile::try_take(&path).unwrap().expect_err("a held lock");
        let mut text = String::new();
        refused.read_to_string(&mut text).unwrap();
        assert_eq!(text, "42");
        drop(held);
        assert!(LockFile::try_take(&path).unwrap().is_ok());
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("link")).unwrap();
        assert!(LockFile::try_take(&dir.path().join("link")).is_err(), "never through a symlink");
    }
}
