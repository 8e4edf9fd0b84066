//! Log records of the binding's own, for what happens where no exception can say it: PyTorch's
//! allocator hooks (`torch_pool`) answer a refusal with NULL, which PyTorch reports as out of
//! memory, so the reason is logged. The C API takes no records from outside, so they are
//! written as lava-flow writes its own on stderr (`lava-flow[pid] LEVEL target: message`),
//! filtered by the same level: `LF_LOG_LEVEL` (`warn` by default), or the last
//! `lava_flow.set_log_level`.
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::ffi;

/// The level let through (an `LF_LOG_*` value), or `UNREAD` until `LF_LOG_LEVEL` was read.
static LEVEL: AtomicU32 = AtomicU32::new(UNREAD);
const UNREAD: u32 = u32::MAX;

fn level() -> u32 {
    let l = LEVEL.load(Ordering::Relaxed);
    if l != UNREAD {
        return l;
    }
    let names = [
        ("off", ffi::LF_LOG_OFF),
        ("error", ffi::LF_LOG_ERROR),
        ("warn", ffi::LF_LOG_WARN),
        ("info", ffi::LF_LOG_INFO),
        ("debug", ffi::LF_LOG_DEBUG),
        ("trace", ffi::LF_LOG_TRACE),
    ];
    // An unknown value is lava-flow's to report (it reads the same variable): the default here.
    let from_env = std::env::var("LF_LOG_LEVEL").ok().and_then(|v| {
        let v = v.trim().to_ascii_lowercase();
        names.iter().find(|(n, _)| *n == v).map(|&(_, l)| l)
    });
    let l = from_env.unwrap_or(ffi::LF_LOG_WARN);
    // A level set meanwhile wins.
    let _ = LEVEL.compare_exchange(UNREAD, l, Ordering::Relaxed, Ordering::Relaxed);
    LEVEL.load(Ordering::Relaxed)
}

/// Follows `lava_flow.set_log_level` (after lava-flow accepted the level).
pub fn set_level(level: u32) {
    LEVEL.store(level, Ordering::Relaxed);
}

/// Writes a `warn` record of `target` (a name under `lava_flow`), if the level lets it through.
pub fn warn(target: &str, message: &str) {
    if level() < ffi::LF_LOG_WARN {
        return;
    }
    let line = format!("lava-flow[{}] WARN {target}: {message}\n", std::process::id());
    // One write, so that records of several threads do not interleave.
    let _ = std::io::stderr().write_all(line.as_bytes());
}
