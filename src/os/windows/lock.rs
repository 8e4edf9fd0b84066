//! Lock files on Windows: an exclusive `LockFileEx` of one byte far beyond anything written
//! (so that the file's contents, what the holder wrote there, stay readable to everyone),
//! taken without waiting. The kernel releases it when the file's last handle closes, which
//! includes the holder's death.

use std::fs::{File, OpenOptions};
use std::os::windows::fs::OpenOptionsExt;
use std::os::windows::io::AsRawHandle;
use std::path::Path;

use windows_sys::Win32::Foundation::{ERROR_LOCK_VIOLATION, ERROR_SHARING_VIOLATION};
use windows_sys::Win32::Storage::FileSystem::{
    LockFileEx, FILE_SHARE_DELETE, FILE_SHARE_READ, FILE_SHARE_WRITE, LOCKFILE_EXCLUSIVE_LOCK,
    LOCKFILE_FAIL_IMMEDIATELY,
};
use windows_sys::Win32::System::IO::OVERLAPPED;

/// The offset of the locked byte: a lock excludes reads of its range, and no holder writes
/// this far.
const LOCKED_AT: u64 = 1 << 62;

/// An exclusive lock on a file, held while this value lives.
#[derive(Debug)]
pub struct LockFile(File);

impl LockFile {
    /// Takes the exclusive lock of the file at `path` (created if missing) without waiting.
    /// `Err(file)` when another holder has it (another process, or another `LockFile` in this
    /// one): `file` is open for reading what the holder wrote there.
    pub fn try_take(path: &Path) -> std::io::Result<Result<LockFile, File>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            // Others may open, rename or delete it: only the lock excludes.
            .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
            .open(path)?;
        Ok(if try_lock(&file)? { Ok(LockFile(file)) } else { Err(file) })
    }

    /// The locked file, to write who holds it.
    pub fn file(&mut self) -> &mut File {
        &mut self.0
    }
}

/// Takes the exclusive lock of the open file `file` without waiting: `Ok(false)` when another
/// handle holds it.
pub fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: zeroed is a valid OVERLAPPED; the offset is set below.
    let mut at: OVERLAPPED = unsafe { std::mem::zeroed() };
    at.Anonymous.Anonymous.Offset = LOCKED_AT as u32;
    at.Anonymous.Anonymous.OffsetHigh = (LOCKED_AT >> 32) as u32;
    // SAFETY: a file handle the caller holds; one byte at LOCKED_AT; with FAIL_IMMEDIATELY the
    // call never completes later, so `at` may live on the stack.
    let ok = unsafe {
        LockFileEx(file.as_raw_handle(), LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &mut at)
    };
    if ok != 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error().map(|c| c as u32) {
        Some(ERROR_LOCK_VIOLATION | ERROR_SHARING_VIOLATION) => Ok(false),
        _ => Err(e),
    }
}

/// Identifies one file: its creation and last write times (100 ns) and its size, as far as
/// std tells them (the file index is not stable there); a file replaced is created anew.
pub type FileId = (u64, u64, i64, i64);

/// The identity of the file at `path` itself (a link's own, not its target's), `None` if
/// there is none.
pub fn file_id(path: &Path) -> Option<FileId> {
    use std::os::windows::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.creation_time(), m.last_write_time(), m.file_size() as i64, 0))
}

/// Opens the lock file at `path` to read it, to ask of its lock without creating it; shared
/// as `try_take` shares it, so that its holder may still write, rename or remove it.
pub fn open_existing(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::windows::test_child;
    use std::time::{Duration, Instant};

    /// A lock is refused while another process holds it, also after the holder was killed
    /// it is free again; within one process a second take is refused too.
    #[test]
    fn a_lock_is_refused_while_held_and_free_after_the_holder_dies() {
        let test = test_child::test_path(module_path!(), "a_lock_is_refused_while_held_and_free_after_the_holder_dies");
        if test_child::role().is_some() {
            let path = std::env::var("LF_TEST_LOCK").unwrap();
            let mut held = LockFile::try_take(Path::new(&path)).unwrap().expect("the child takes the free lock");
            std::io::Write::write_all(held.file(), std::process::id().to_string().as_bytes()).unwrap();
            std::fs::write(format!("{path}.ready"), b"1").unwrap();
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        let dir = std::env::temp_dir().join(test_child::unique("lf-lock"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("end.lock");
        let mut child = test_child::spawn(&test, "hold", &[("LF_TEST_LOCK", path.display().to_string())]);
        let start = Instant::now();
        while !dir.join("end.lock.ready").exists() {
            assert!(start.elapsed() < Duration::from_secs(60), "the child never took the lock");
            std::thread::sleep(Duration::from_millis(5));
        }
        match LockFile::try_take(&path).unwrap() {
            Ok(_) => panic!("a lock held by another process was taken"),
            Err(mut file) => {
                let mut holder = String::new();
                std::io::Read::read_to_string(&mut file, &mut holder).unwrap();
                assert_eq!(holder, child.id().to_string(), "the holder's words are readable while it holds the lock");
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let start = Instant::now();
        let mine = loop {
            if let Ok(lock) = LockFile::try_take(&path).unwrap() {
                break lock;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "the dead holder's lock was never released");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(LockFile::try_take(&path).unwrap().is_err(), "a lock this process holds was taken again");
        drop(mine);
        assert!(LockFile::try_take(&path).unwrap().is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
