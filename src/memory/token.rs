//! This process's token: with the pid it names an exporter uniquely, in CPU and GPU export
//! records alike.

use std::sync::OnceLock;

/// This process's random token, drawn once: with the pid it names the exporter uniquely even
/// when pids are reused.
pub fn process_token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| {
        let mut token = 0u64;
        // SAFETY: getrandom writes at most 8 bytes into the u64.
        let n = unsafe { libc::getrandom((&mut token as *mut u64).cast(), 8, 0) };
        if n != 8 {
            // No entropy source: the time and pid still make the token unlikely to repeat.
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            token = nanos ^ (u64::from(std::process::id()) << 32);
        }
        token
    })
}
