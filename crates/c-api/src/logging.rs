//! Logging for C: the level (`lf_set_log_level`) and a callback that takes the records instead
//! of stderr (`lf_set_log_callback`). The Rust side is `lava_flow::logging`.

use std::ffi::{c_char, c_void, CString};

use super::abi::{c_enum, CEnum};
use super::raw;
use super::status::lf_status;
use super::{boundary, Failure};
use lava_flow::logging;

/// The level of a log record, and the levels `lf_set_log_level` accepts: each lets through
/// the records of its own level and the more severe ones. `LF_LOG_LEVEL` names them `off`,
/// `error`, `warn` (the default), `info`, `debug` and `trace`.
#[allow(non_camel_case_types)]
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lf_log_level {
    /// Nothing is logged (a level to set; no record has it).
    LF_LOG_OFF = 0,
    /// lava-flow failed at something it was not asked for directly (a cleanup, a helper thread).
    LF_LOG_ERROR = 1,
    /// Something the user should act on: a peer process died without closing its end, a
    /// rendezvous timed out, GPU memory was asked for and CPU memory given, a setting was ignored.
    LF_LOG_WARN = 2,
    /// What lava-flow chose and every fallback it took: each channel's transport and why, the
    /// GPU a context opened or why it has none, a peer that closed its end.
    LF_LOG_INFO = 3,
    /// Each channel end's lifecycle (created, closed), and repeats of fallbacks.
    LF_LOG_DEBUG = 4,
    /// Rare events on the message path (a producer that found the channel full).
    LF_LOG_TRACE = 5,
}
c_enum!(lf_log_level: LF_LOG_OFF, LF_LOG_ERROR, LF_LOG_WARN, LF_LOG_INFO, LF_LOG_DEBUG, LF_LOG_TRACE);

impl lf_log_level {
    fn from_rust(level: log::Level) -> Self {
        match level {
            log::Level::Error => lf_log_level::LF_LOG_ERROR,
            log::Level::Warn => lf_log_level::LF_LOG_WARN,
            log::Level::Info => lf_log_level::LF_LOG_INFO,
            log::Level::Debug => lf_log_level::LF_LOG_DEBUG,
            log::Level::Trace => lf_log_level::LF_LOG_TRACE,
        }
    }
}

/// A function that receives lava-flow's log records (see `lf_set_log_callback`): the
/// `user_data` given with it, the record's level (never LF_LOG_OFF), its target (the part of
/// lava-flow it comes from, such as `"lava_flow::channels::producer"`) and its message, one
/// line without a trailing newline. Both strings are NUL-terminated UTF-8 and valid only during
/// the call: copy them to keep them.
#[allow(non_camel_case_types)]
pub type lf_log_callback = Option<
    unsafe extern "C" fn(user_data: *mut c_void, level: lf_log_level, target: *const c_char, message: *const c_char),
>;

/// Strings for C: interior NULs (which no message should have) would cut them short.
fn c_text(text: &str) -> CString {
    CString::new(text.replace('\0', "\\0")).unwrap_or_default()
}

/// Sends lava-flow's log records to `callback` instead of stderr; NULL sends them to stderr
/// again. Records are filtered by level first (`LF_LOG_LEVEL`, `lf_set_log_level`; `warn` by
/// default).
///
/// The callback may be called from any thread, lava-flow's own included, and from several at
/// once: it must be thread-safe. It must return (not `longjmp` out, nor let a C++ exception
/// escape: lava-flow cannot catch either) and should return quickly: the thread that logs
/// waits for it, and nothing else. It must not call lava-flow functions (this one fails with
/// LF_ERR_INVALID_STATE there); should it make lava-flow log on its own thread, that record
/// goes to stderr. `user_data` is passed to it untouched.
///
/// When this function returns, no call of the previous callback is in progress (it waits for
/// those to return), so what the previous `user_data` points to may be freed. Thread-safe.
///
/// A Rust program that installed its own `log` logger before using lava-flow keeps it:
/// lava-flow's records go to that logger, and the callback is not called.
///
/// # Safety
/// `callback` must be NULL or a function of this signature that stays callable until it is
/// replaced; `user_data` must be valid for it for as long.
#[no_mangle]
pub unsafe extern "C" fn lf_set_log_callback(callback: lf_log_callback, user_data: *mut c_void) -> lf_status {
    boundary("lf_set_log_callback", || {
        let sink: Option<logging::Sink> = callback.map(|callback| {
            // The pointer is the C caller's to share between threads (see the contract above).
            let user_data = user_data as usize;
            Box::new(move |level: log::Level, target: &str, message: &str| {
                let (target, message) = (c_text(target), c_text(message));
                // SAFETY: the caller promised a callable function of this signature for as
                // long as it is installed, and a `user_data` valid for it; the strings live
                // until the call returns.
                unsafe {
                    callback(
                        user_data as *mut c_void,
                        lf_log_level::from_rust(level),
                        target.as_ptr(),
                        message.as_ptr(),
                    )
                }
            }) as logging::Sink
        });
        logging::set_sink(sink).map_err(Failure::from)
    })
}

/// Sets which records lava-flow logs: an `lf_log_level`, LF_LOG_OFF to LF_LOG_TRACE (taken as
/// an integer and checked: another value is LF_ERR_INVALID_ARGUMENT). Overrides `LF_LOG_LEVEL`;
/// the last setting wins. Applies to stderr and to the callback alike. Thread-safe.
#[no_mangle]
pub extern "C" fn lf_set_log_level(level: raw::lf_log_level) -> lf_status {
    boundary("lf_set_log_level", || {
        let filter = match lf_log_level::from_c(level, "level")? {
            lf_log_level::LF_LOG_OFF => log::LevelFilter::Off,
            lf_log_level::LF_LOG_ERROR => log::LevelFilter::Error,
            lf_log_level::LF_LOG_WARN => log::LevelFilter::Warn,
            lf_log_level::LF_LOG_INFO => log::LevelFilter::Info,
            lf_log_level::LF_LOG_DEBUG => log::LevelFilter::Debug,
            lf_log_level::LF_LOG_TRACE => log::LevelFilter::Trace,
        };
        logging::set_level(filter);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::last_error;

    #[test]
    fn levels_are_checked() {
        assert_eq!(lf_set_log_level(6), lf_status::LF_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("level is 6, not an lf_log_level: use LF_LOG_OFF (0),"), "{}", last_error());
        assert_eq!(lf_set_log_level(u32::MAX), lf_status::LF_ERR_INVALID_ARGUMENT);
        for (level, rust) in
            [(lf_log_level::LF_LOG_ERROR, log::Level::Error), (lf_log_level::LF_LOG_TRACE, log::Level::Trace)]
        {
            assert_eq!(lf_log_level::from_rust(rust), level);
        }
    }
}
