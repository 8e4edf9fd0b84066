//! Waiting on a 32-bit word in shared memory until another process changes it.
//!
//! Windows has no wait on an address that crosses processes: `WaitOnAddress` keys its waits
//! on the virtual address in one process, and a store in another process wakes no one. So a
//! waiter polls the word: a short spin (a change within about a microsecond costs nothing
//! more), then `SwitchToThread` a few times (another runnable thread gets the core), then
//! sleeps that grow to 1 ms, re-checking the word after each. The cost: a waiter that goes to
//! sleep notices a change up to one sleep late, which is 1 ms as asked but often the timer
//! resolution (up to 15.6 ms) unless the process raised it (`timeBeginPeriod`); and a
//! sleeping waiter wakes about a thousand times a second while the word does not change.
//! [`wake`] has nothing to do.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use windows_sys::Win32::System::Threading::{Sleep, SwitchToThread};

const SPINS: u32 = 200;
const YIELDS: u32 = 20;

/// Returns once `*word != expected` or after `timeout` (`None`: no limit). Callers re-check
/// their condition, as after a futex wait.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let changed = || word.load(Ordering::Acquire) != expected;
    for _ in 0..SPINS {
        if changed() {
            return;
        }
        std::hint::spin_loop();
    }
    let mut round = 0u32;
    loop {
        if changed() {
            return;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return;
        }
        if round < YIELDS {
            // SAFETY: no preconditions.
            unsafe { SwitchToThread() };
        } else {
            // Sleep(0) gives up the rest of the time slice; from then on 1 ms, the least
            // a sleep can ask for, or what is left of the timeout.
            let step = if round < YIELDS + 4 { 0 } else { 1 };
            let left = deadline.map_or(step, |d| (d - now).as_millis().min(step as u128) as u32);
            // SAFETY: no preconditions.
            unsafe { Sleep(left) };
        }
        round = round.saturating_add(1);
    }
}

/// Wakes waiters: nothing to do, they poll (see the module doc).
#[inline]
pub fn wake(_word: &AtomicU32, _count: u32) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn wait_times_out_and_sees_a_change() {
        let word = Arc::new(AtomicU32::new(0));
        let start = Instant::now();
        wait(&word, 0, Some(Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
        // A differing value returns at once.
        wait(&word, 1, None);
        let w = word.clone();
        let t = std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                wait(&w, 0, None);
            }
        });
        std::thread::sleep(Duration::from_millis(30));
        word.store(1, Ordering::Release);
        wake(&word, 1);
        t.join().unwrap();
    }
}
