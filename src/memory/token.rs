//! This process's token: with the pid it names an exporter uniquely, in CPU and GPU export
//! records alike.

use std::sync::OnceLock;

/// This process's random token, drawn once: with the pid it names the exporter uniquely even
/// when pids are reused.
pub fn process_token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| {
        crate::os::system::random_u64().unwrap_or_else(|| {
            // No entropy source: the time and pid still make the token unlikely to repeat.
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            nanos ^ (u64::from(std::process::id()) << 32)
        })
    })
}
