//! lava-flow's diagnostics: what it chose (transports, devices), every fallback it took, and
//! peers it lost, through the [`log`] crate's macros, under targets that start with
//! `lava_flow`.
//!
//! lava-flow installs a logger of its own the first time it is used ([`init`]: creating a
//! context, a channel, a Vulkan device, joining MPI, or any call of the C API that sets
//! logging up). It writes one line per record to stderr:
//!
//! ```text
//! lava-flow[4242] INFO lava_flow::channels::producer: channel "frames" (producer): transport shm: ...
//! ```
//!
//! or hands each record to a callback instead (the C API's `lf_set_log_callback`). It shows
//! lava-flow's records only, up to the level `LF_LOG_LEVEL` names: `off`, `error`, `warn`
//! (the default), `info`, `debug` or `trace` (any case). An unknown value is reported once on
//! stderr, naming the accepted ones, and the default applies. [`set_level`] (`lf_set_log_level`)
//! changes the level later: the last setting wins.
//!
//! A Rust program that installs its own `log` logger keeps it: lava-flow then installs
//! nothing, and its records go to that logger, filtered as the program decides (`LF_LOG_LEVEL`,
//! the level setting and the callback then have no effect). Install it before the first
//! lava-flow call, as is usual (first thing in `main`): after that call lava-flow's logger is
//! the process's, and `log` accepts only one. With `LF_LOG_LEVEL=off`, lava-flow installs no
//! logger at all until a level is set.
//!
//! Nothing is logged per message: events met on the message path (a peer's end, a new
//! producer) are logged once each, and the one `trace` record there sits behind a
//! [`log::log_enabled!`] check (one relaxed atomic load when trace is off).
//!
//! What is logged where: `info` for every transport choice, the device a context opened or
//! why it has none, capabilities a device lacks, stale files removed from the runtime dir, a
//! peer that closed its end and a new producer attaching; `warn` for what the user should act
//! on (a peer process that died without closing its end, a rendezvous that timed out, a GPU
//! request served with CPU memory, settings that were ignored); `debug` for the lifecycle of
//! each channel end. A fallback that can happen on every allocation is logged at its level the
//! first time in a process and at `debug` after that.

use std::cell::Cell;
use std::fmt;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Once;

use log::{Level, LevelFilter, Log, Metadata, Record};
use parking_lot::RwLock;

use crate::error::{Error, Result};

/// The environment variable that sets the level: `off`, `error`, `warn`, `info`, `debug` or
/// `trace`.
pub const LOG_LEVEL_ENV: &str = crate::env::LOG_LEVEL.name;

/// The level when `LF_LOG_LEVEL` is unset, empty or unknown.
pub const DEFAULT_LEVEL: LevelFilter = LevelFilter::Warn;

/// The accepted values of `LF_LOG_LEVEL`, in order of verbosity.
pub const LEVEL_NAMES: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Where records go instead of stderr (the C API's callback, or a Rust application's own
/// logging): each record's level, its target (the module, such as
/// `lava_flow::channels::producer`) and its message, on one line.
pub type Sink = Box<dyn Fn(Level, &str, &str) + Send + Sync>;

/// lava-flow's logger: stderr, or the sink.
struct Logger;

static LOGGER: Logger = Logger;
static INIT: Once = Once::new();
/// The level lava-flow's logger lets through, as `LevelFilter as usize`.
static LEVEL: AtomicUsize = AtomicUsize::new(DEFAULT_LEVEL as usize);
/// Whose logger the process has: [`NOT_YET`], [`OURS`] or [`FOREIGN`].
static INSTALLED: AtomicU8 = AtomicU8::new(NOT_YET);
const NOT_YET: u8 = 0;
const OURS: u8 = 1;
const FOREIGN: u8 = 2;
/// Where records go instead of stderr. Read-locked while a record is delivered, so that
/// replacing it waits for the calls in progress.
static SINK: RwLock<Option<Sink>> = parking_lot::const_rwlock(None);

thread_local! {
    /// This thread is inside the sink: records it makes go to stderr (no recursion), and it
    /// may not replace the sink (that would wait for itself).
    static IN_SINK: Cell<bool> = const { Cell::new(false) };
}

/// Sets logging up, once per process: reads `LF_LOG_LEVEL` (reporting an unknown value on
/// stderr) and installs lava-flow's logger unless the program has a logger of its own or the
/// level is `off`. Every lava-flow entry point that can log calls it; calling it again costs
/// an atomic load.
pub fn init() {
    INIT.call_once(|| {
        let level = match std::env::var(LOG_LEVEL_ENV) {
            Ok(value) if !value.trim().is_empty() => parse_level(&value).unwrap_or_else(|| {
                // Said once, on stderr whatever the sink: a mistyped setting must not pass unseen.
                let line = format!(
                    "lava-flow[{}] WARN lava_flow::logging: {LOG_LEVEL_ENV}={value:?} is not a log level; the accepted \
                     values are {}; using {}\n",
                    std::process::id(),
                    LEVEL_NAMES.join(", "),
                    level_name(DEFAULT_LEVEL)
                );
                let _ = std::io::stderr().write_all(line.as_bytes());
                DEFAULT_LEVEL
            }),
            _ => DEFAULT_LEVEL,
        };
        LEVEL.store(level as usize, Ordering::Relaxed);
        if level != LevelFilter::Off {
            install();
        }
    });
}

/// Makes lava-flow's logger the process's, unless another is already. Sets `log`'s maximum
/// level to lava-flow's when it is.
fn install() {
    if INSTALLED.load(Ordering::Acquire) == NOT_YET {
        let outcome = if log::set_logger(&LOGGER).is_ok() { OURS } else { FOREIGN };
        // Only the first outcome counts (two threads may race here; only one can win `log`).
        let _ = INSTALLED.compare_exchange(NOT_YET, outcome, Ordering::AcqRel, Ordering::Acquire);
    }
    if installed_ours() {
        log::set_max_level(level());
    }
}

/// Whether lava-flow's logger is the process's (false before [`init`], with `LF_LOG_LEVEL=off`
/// and no level set since, or where the program installed its own).
pub fn installed_ours() -> bool {
    INSTALLED.load(Ordering::Acquire) == OURS
}

/// The level lava-flow's logger lets through.
pub fn level() -> LevelFilter {
    filter_of(LEVEL.load(Ordering::Relaxed))
}

/// The filter stored as `n` (`LevelFilter as usize`, the order of [`LEVEL_NAMES`]).
fn filter_of(n: usize) -> LevelFilter {
    match n {
        0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    }
}

/// Sets the level lava-flow's logger lets through, overriding `LF_LOG_LEVEL`; the last setting
/// wins. No effect on a logger the program installed (its own settings decide).
pub fn set_level(level: LevelFilter) {
    init();
    LEVEL.store(level as usize, Ordering::Relaxed);
    if level != LevelFilter::Off {
        install();
    } else if installed_ours() {
        log::set_max_level(LevelFilter::Off);
    }
}

/// A level named as `LF_LOG_LEVEL` accepts it (any case, surrounding blanks ignored).
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    let text = text.trim();
    LEVEL_NAMES.iter().position(|name| name.eq_ignore_ascii_case(text)).map(filter_of)
}

fn level_name(level: LevelFilter) -> &'static str {
    LEVEL_NAMES[level as usize]
}

/// Sends every record to `sink` instead of stderr (`None`: stderr again). Returns once no call
/// of the previous sink is in progress, so that what it uses may be freed. Refused from inside
/// the sink itself, which would wait for itself.
pub fn set_sink(sink: Option<Sink>) -> Result<()> {
    init();
    if IN_SINK.try_with(Cell::get).unwrap_or(false) {
        return Err(Error::InvalidState(
            "the log callback cannot be replaced from inside a call of the log callback; replace it from \
             another place in the program"
                .into(),
        ));
    }
    let old = std::mem::replace(&mut *SINK.write(), sink);
    drop(old);
    Ok(())
}

/// Whether `target` is one of lava-flow's.
fn ours(target: &str) -> bool {
    target.strip_prefix("lava_flow").is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= level() && ours(metadata.target())
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        // Logging runs inside drops and on lava-flow's own threads: nothing in it may unwind
        // into them.
        let _ = catch_unwind(AssertUnwindSafe(|| deliver(record.level(), record.target(), record.args())));
    }

    fn flush(&self) {}
}

/// Resets [`IN_SINK`] when the sink returns.
struct LeaveSink;

impl Drop for LeaveSink {
    fn drop(&mut self) {
        let _ = IN_SINK.try_with(|flag| flag.set(false));
    }
}

fn deliver(level: Level, target: &str, args: &fmt::Arguments<'_>) {
    let mut message = args.to_string();
    if message.contains('\n') {
        message = message.lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join("; ");
    }
    {
        let sink = SINK.read_recursive();
        if let Some(sink) = sink.as_ref() {
            // A record made inside the sink (or in a thread being torn down) goes to stderr.
            let entered = IN_SINK.try_with(|flag| !flag.replace(true)).unwrap_or(false);
            if entered {
                let _leave = LeaveSink;
                sink(level, target, &message);
                return;
            }
        }
    }
    write_line(level, target, &message);
}

/// One line on stderr, written at once (lines of several processes and threads do not mix).
fn write_line(level: Level, target: &str, message: &str) {
    let line = format!("lava-flow[{}] {level} {target}: {message}\n", std::process::id());
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Logs at `$level` the first time this call site runs in the process, and at debug after
/// that, saying so: for fallbacks that can happen on every allocation.
macro_rules! log_first {
    ($level:expr, $($arg:tt)+) => {{
        static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if SEEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
            log::debug!($($arg)+);
        } else {
            log::log!($level, "{} (further occurrences are logged at debug level)", format_args!($($arg)+));
        }
    }};
}
pub(crate) use log_first;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case_and_nothing_else_does() {
        assert_eq!(parse_level("off"), Some(LevelFilter::Off));
        assert_eq!(parse_level(" Info "), Some(LevelFilter::Info));
        assert_eq!(parse_level("TRACE"), Some(LevelFilter::Trace));
        for bad in ["", "verbose", "3", "warning", "in fo"] {
            assert_eq!(parse_level(bad), None, "{bad:?}");
        }
        for (i, name) in LEVEL_NAMES.iter().enumerate() {
            assert_eq!(parse_level(name).map(|l| l as usize), Some(i));
            assert_eq!(level_name(parse_level(name).unwrap()), *name);
        }
    }

    #[test]
    fn only_lava_flows_targets_are_shown() {
        assert!(ours("lava_flow"));
        assert!(ours("lava_flow::channels::producer"));
        assert!(!ours("lava_flower"));
        assert!(!ours("mpi"));
    }
}
