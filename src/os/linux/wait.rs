//! Waiting on a word across processes: process-shared futexes, sleeping on a 32-bit word in
//! `MAP_SHARED` memory until another process changes it and wakes us.
//!
//! The private variants (`FUTEX_*_PRIVATE`) are deliberately not used: they key the wait
//! queue on the virtual address, which differs between the two processes mapping a region.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::thread::futex::{self, Flags};

/// Sleeps while `*word == expected`, for at most `timeout` (`None`: until woken). Returns
/// early on a wake-up, a signal, a spurious wake or when the word already differs; callers
/// re-check their condition in every case, so the outcome is not reported.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(crate::os::timespec);
    let _ = futex::wait(word, Flags::empty(), expected, ts.as_ref());
}

/// Wakes up to `count` processes sleeping on `word`.
pub fn wake(word: &AtomicU32, count: u32) {
    let _ = futex::wake(word, Flags::empty(), count.min(i32::MAX as u32));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_times_out_and_wake_wakes() {
        let word = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        wait(&word, 0, Some(Duration::from_millis(5)));
        assert!(start.elapsed() >= Duration::from_millis(4));
        // A differing value returns at once.
        wait(&word, 1, None);
        let w = word.clone();
        let t = std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                wait(&w, 0, None);
            }
        });
        std::thread::sleep(Duration::from_millis(10));
        word.store(1, Ordering::Release);
        wake(&word, 1);
        t.join().unwrap();
    }
}
