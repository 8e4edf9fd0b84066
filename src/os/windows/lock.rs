//! Lock files on Windows: an exclusive `LockFileEx` on the whole file, taken without waiting.
//! The kernel releases it when the file's last handle closes, which includes the holder's
//! death.

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

use crate::error::Result;

/// An exclusive lock on a file, held while this value lives.
#[derive(Debug)]
pub struct LockFile {
    file: File,
}

impl LockFile {
    /// Takes the lock on `path` (created if missing), or `None` at once when another holder
    /// has it (another process, or another `LockFile` in this one).
    pub fn try_take(path: &Path) -> Result<Option<LockFile>> {
        let open = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            // Others may open, rename or delete it: only the lock excludes.
            .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
            .open(path);
        let file = match open {
            Ok(file) => file,
            Err(e) => {
                return Err(super::os_error(
                    format!("opening the lock file {} (is its directory writable?)", path.display()),
                    e,
                ))
            }
        };
        // SAFETY: zeroed is a valid OVERLAPPED: the lock starts at offset 0.
        let mut at: OVERLAPPED = unsafe { std::mem::zeroed() };
        // SAFETY: a file handle this function owns; the lock covers every byte (u64::MAX);
        // with FAIL_IMMEDIATELY the call never completes later, so `at` may live on the stack.
        let ok = unsafe {
            LockFileEx(
                file.as_raw_handle(),
                LOCKFILE_EXCLUSIVE_LOCK | LOCKFILE_FAIL_IMMEDIATELY,
                0,
                u32::MAX,
                u32::MAX,
                &mut at,
            )
        };
        if ok != 0 {
            return Ok(Some(LockFile { file }));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error().map(|c| c as u32) {
            Some(ERROR_LOCK_VIOLATION | ERROR_SHARING_VIOLATION) => Ok(None),
            _ => Err(super::os_error(format!("LockFileEx on {}", path.display()), e)),
        }
    }

    /// The locked file.
    pub fn file(&self) -> &File {
        &self.file
    }
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
            let _held = LockFile::try_take(Path::new(&path)).unwrap().expect("the child takes the free lock");
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
        assert!(LockFile::try_take(&path).unwrap().is_none(), "a lock held by another process was taken");
        child.kill().unwrap();
        child.wait().unwrap();
        let start = Instant::now();
        let mine = loop {
            if let Some(lock) = LockFile::try_take(&path).unwrap() {
                break lock;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "the dead holder's lock was never released");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(LockFile::try_take(&path).unwrap().is_none(), "a lock this process holds was taken again");
        drop(mine);
        assert!(LockFile::try_take(&path).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
