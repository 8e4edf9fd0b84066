//! Waiting on a word across processes. macOS 14.4 offers `os_sync_wait_on_address` with
//! `OS_SYNC_WAIT_ON_ADDRESS_SHARED`, which keys the wait on the memory, not the address, so
//! it works between processes mapping the same object; it is looked up at run time, so that
//! one build runs on older systems too. Where it is missing, a waiter spins a little, then
//! sleeps in steps growing to 1 ms, re-checking the word after each: a wake is then a no-op,
//! and a waiter sees a change up to about 1 ms late (and wakes up to 1000 times a second
//! while it waits).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type WaitFn = unsafe extern "C" fn(*mut libc::c_void, u64, libc::size_t, u32) -> libc::c_int;
type WaitTimeoutFn = unsafe extern "C" fn(*mut libc::c_void, u64, libc::size_t, u32, u32, u64) -> libc::c_int;
type WakeFn = unsafe extern "C" fn(*mut libc::c_void, libc::size_t, u32) -> libc::c_int;

/// `OS_SYNC_WAIT_ON_ADDRESS_SHARED` and `OS_SYNC_WAKE_BY_ADDRESS_SHARED`.
const SHARED: u32 = 1;
/// `OS_CLOCK_MACH_ABSOLUTE_TIME`, the one clock the timeout variant takes.
const CLOCK_MACH_ABSOLUTE_TIME: u32 = 32;

struct Api {
    wait: WaitFn,
    wait_timeout: WaitTimeoutFn,
    wake_any: WakeFn,
    wake_all: WakeFn,
}

/// The address-wait functions, where this macOS has them (14.4 and later).
fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| {
        let find = |name: &std::ffi::CStr| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks it up.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let wait = find(c"os_sync_wait_on_address")?;
        let wait_timeout = find(c"os_sync_wait_on_address_with_timeout")?;
        let wake_any = find(c"os_sync_wake_by_address_any")?;
        let wake_all = find(c"os_sync_wake_by_address_all")?;
        // SAFETY: each symbol is the libSystem function of that name, whose C signature the
        // types above spell.
        unsafe {
            Some(Api {
                wait: std::mem::transmute::<*mut libc::c_void, WaitFn>(wait),
                wait_timeout: std::mem::transmute::<*mut libc::c_void, WaitTimeoutFn>(wait_timeout),
                wake_any: std::mem::transmute::<*mut libc::c_void, WakeFn>(wake_any),
                wake_all: std::mem::transmute::<*mut libc::c_void, WakeFn>(wake_all),
            })
        }
    })
    .as_ref()
}

/// Sleeps while `*word == expected`, for at most `timeout` (`None`: until woken). Returns
/// early on a wake-up, an interruption, a spurious wake or when the word already differs;
/// callers re-check their condition in every case, so the outcome is not reported.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let addr = word.as_ptr().cast::<libc::c_void>();
    match (api(), timeout) {
        // SAFETY: `addr` is a live 4-byte word (borrowed for the call); the kernel only reads it.
        (Some(api), None) => unsafe {
            (api.wait)(addr, u64::from(expected), 4, SHARED);
        },
        (Some(api), Some(t)) => {
            let nanos = u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1);
            // SAFETY: as above.
            unsafe { (api.wait_timeout)(addr, u64::from(expected), 4, SHARED, CLOCK_MACH_ABSOLUTE_TIME, nanos) };
        }
        (None, timeout) => sleep_while(word, expected, timeout),
    }
}

/// The fallback: spin, then yield, then sleep in growing steps up to 1 ms, until the word
/// differs or `timeout` has passed.
fn sleep_while(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let start = Instant::now();
    let mut step = Duration::from_micros(1);
    for round in 0u32.. {
        if word.load(Ordering::Acquire) != expected {
            return;
        }
        let elapsed = start.elapsed();
        if timeout.is_some_and(|t| elapsed >= t) {
            return;
        }
        if round < 64 {
            std::hint::spin_loop();
        } else if round < 80 {
            std::thread::yield_now();
        } else {
            let left = timeout.map_or(step, |t| t.saturating_sub(elapsed));
            std::thread::sleep(step.min(left));
            step = (step * 2).min(Duration::from_millis(1));
        }
    }
}

/// Wakes up to `count` processes sleeping on `word` (one, or all: the call wakes one or
/// every waiter). A no-op where the waiters poll.
pub fn wake(word: &AtomicU32, count: u32) {
    let Some(api) = api() else { return };
    let addr = word.as_ptr().cast::<libc::c_void>();
    // SAFETY: `addr` is a live 4-byte word; waking reads nothing through it. ENOENT (no
    // waiter) is no error here.
    unsafe {
        if count == 1 {
            (api.wake_any)(addr, 4, SHARED);
        } else {
            (api.wake_all)(addr, 4, SHARED);
        }
    }
}
