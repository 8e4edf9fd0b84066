//! Logging as a user sees it: each test re-executes this test binary (`current_exe()`) as a
//! child process with `LF_LOG_LEVEL` set, lets it take a fallback (GPU memory asked of a context
//! without a GPU) and create a channel (the transport choice), and reads the child's stderr.
//!
//! A child is the same test function, run with `LF_TEST_LOG_CHILD=<role>`; it reports on
//! stdout with lines `@@ <key> <value>`.

use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::ProcessLocation;
use lava_flow_c_api::logging::{lf_log_level, lf_set_log_callback, lf_set_log_level};
use lava_flow_c_api::status::lf_status;

const CHILD_ENV: &str = "LF_TEST_LOG_CHILD";

fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// What a child printed, and its pid.
struct Run {
    pid: u32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The lines lava-flow's logger wrote.
    fn log_lines(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.starts_with("lava-flow[")).collect()
    }

    fn report(&self, key: &str) -> Option<&str> {
        let tag = format!("@@ {key} ");
        self.stdout.lines().find_map(|l| l.find(&tag).map(|at| l[at + tag.len()..].trim()))
    }
}

/// Runs `test` in a child process as `role` with `LF_LOG_LEVEL` set to `level` (`None`: unset),
/// in a runtime dir of its own, and checks that it passed.
fn run_child(test: &str, role: &str, level: Option<&str>) -> Run {
    use std::os::unix::fs::DirBuilderExt;
    let dir = PathBuf::from(format!("/tmp/lf-log-{}-{test}-{role}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env("LF_RUNTIME_DIR", &dir)
        .env_remove("LF_TRANSPORTS")
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match level {
        Some(level) => cmd.env("LF_LOG_LEVEL", level),
        None => cmd.env_remove("LF_LOG_LEVEL"),
    };
    let child = cmd.spawn().expect("re-executing the test binary");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let run = Run {
        pid,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(out.status.success(), "child {test}:{role} failed ({}):\n{}\n{}", out.status, run.stdout, run.stderr);
    assert!(run.stdout.contains("1 passed"), "child {test}:{role} ran no test:\n{}\n{}", run.stdout, run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    run
}

fn no_gpu() -> ContextConfig {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    config
}

/// What every child does: a fallback (GPU memory of a context without a GPU), then a channel
/// between two threads (the transport choice), one message through it, and both ends closed.
fn fallback_and_channel(name: &str) {
    let context = Context::new(no_gpu()).unwrap();
    let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    assert_eq!(buffer.location(), MemoryLocation::CpuStandard, "the fallback was taken");
    let here = ProcessLocation::from_hostname().unwrap();
    let config = ChannelConfig {
        wait: WaitStrategy::Block,
        capacity: 4,
        pool_size: 1 << 16,
        rendezvous_timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let consumer = {
        let (context, here, config, name) = (context.clone(), here.clone(), config.clone(), name.to_owned());
        std::thread::spawn(move || -> Consumer { Consumer::create(&context, &name, &here, &here, &config).unwrap() })
    };
    let mut producer = Producer::create(&context, name, &here, &here, &config).unwrap();
    let mut consumer = consumer.join().unwrap();
    producer.send(b"hello").unwrap();
    let message = consumer.recv().unwrap();
    assert_eq!(&message[..], b"hello");
    drop(message);
    drop(producer);
    drop(consumer);
}

/// A logged line is `lava-flow[PID] LEVEL TARGET: MESSAGE`, with the child's pid, a level
/// name and one of lava-flow's targets.
fn check_format(run: &Run) {
    for line in run.log_lines() {
        let prefix = format!("lava-flow[{}] ", run.pid);
        let rest = line.strip_prefix(&prefix).unwrap_or_else(|| panic!("not the child's pid {}: {line}", run.pid));
        let (level, rest) = rest.split_once(' ').unwrap_or_else(|| panic!("no level: {line}"));
        assert!(["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level), "level {level:?}: {line}");
        let (target, message) = rest.split_once(": ").unwrap_or_else(|| panic!("no target: {line}"));
        assert!(target.starts_with("lava_flow::"), "target {target:?}: {line}");
        assert!(!message.trim().is_empty(), "empty message: {line}");
    }
}

fn has(run: &Run, level: &str, target: &str, text: &str) -> bool {
    run.log_lines().iter().any(|l| l.contains(&format!(" {level} {target}")) && l.contains(text))
}

#[test]
fn info_logs_the_fallback_and_the_transport_choice() {
    if child_role().is_some() {
        fallback_and_channel("log-info");
        return;
    }
    let run = run_child("info_logs_the_fallback_and_the_transport_choice", "info", Some("info"));
    check_format(&run);
    assert!(
        has(&run, "WARN", "lava_flow::memory", "was asked for, but this context has no Vulkan device"),
        "no fallback logged:\n{}",
        run.stderr
    );
    for end in ["(producer)", "(consumer)"] {
        assert!(
            has(&run, "INFO", "lava_flow::channels", &format!("channel \"log-info\" {end}: transport shm: same host")),
            "no transport choice logged for the {end}:\n{}",
            run.stderr
        );
    }
    assert!(!run.stderr.contains(" DEBUG "), "debug records at level info:\n{}", run.stderr);
}

#[test]
fn debug_adds_each_channel_ends_lifecycle() {
    if child_role().is_some() {
        fallback_and_channel("log-debug");
        return;
    }
    let run = run_child("debug_adds_each_channel_ends_lifecycle", "debug", Some("DEBUG"));
    check_format(&run);
    for end in ["producer", "consumer"] {
        assert!(
            has(&run, "DEBUG", "lava_flow::channels", &format!("channel \"log-debug\" ({end}): creating over shm")),
            "{}",
            run.stderr
        );
        assert!(
            has(&run, "DEBUG", "lava_flow::channels", &format!("channel \"log-debug\" ({end}): closed")),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn off_logs_nothing() {
    if child_role().is_some() {
        fallback_and_channel("log-off");
        return;
    }
    let run = run_child("off_logs_nothing", "off", Some("off"));
    assert!(run.stderr.trim().is_empty(), "LF_LOG_LEVEL=off, yet stderr has:\n{}", run.stderr);
}

#[test]
fn the_default_is_warn() {
    if child_role().is_some() {
        fallback_and_channel("log-default");
        return;
    }
    let run = run_child("the_default_is_warn", "default", None);
    check_format(&run);
    assert!(has(&run, "WARN", "lava_flow::memory", "no Vulkan device"), "{}", run.stderr);
    assert!(!run.stderr.contains(" INFO "), "info records by default:\n{}", run.stderr);
}

#[test]
fn an_unknown_level_is_reported_once_and_the_default_applies() {
    if child_role().is_some() {
        // Two contexts and a channel: the report must come once all the same.
        drop(Context::new(no_gpu()).unwrap());
        fallback_and_channel("log-unknown");
        return;
    }
    let run = run_child("an_unknown_level_is_reported_once_and_the_default_applies", "unknown", Some("chatty"));
    check_format(&run);
    let reports: Vec<&str> = run.stderr.lines().filter(|l| l.contains("LF_LOG_LEVEL=\"chatty\"")).collect();
    assert_eq!(reports.len(), 1, "the unknown level is reported once:\n{}", run.stderr);
    assert!(
        reports[0].contains("off, error, warn, info, debug, trace"),
        "the accepted values are named: {}",
        reports[0]
    );
    assert!(has(&run, "WARN", "lava_flow::memory", "no Vulkan device"), "warn still applies:\n{}", run.stderr);
    assert!(!run.stderr.contains(" INFO "), "info records under the default:\n{}", run.stderr);
}

/// The application's logger, installed before lava-flow's first use.
struct AppLogger(Mutex<Vec<(log::Level, String, String)>>);

impl log::Log for AppLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push((record.level(), record.target().to_owned(), record.args().to_string()));
    }
    fn flush(&self) {}
}

static APP_LOGGER: AppLogger = AppLogger(Mutex::new(Vec::new()));

#[test]
fn an_applications_own_logger_is_kept() {
    if child_role().is_some() {
        log::set_logger(&APP_LOGGER).unwrap();
        log::set_max_level(log::LevelFilter::Info);
        fallback_and_channel("log-app");
        assert!(!lava_flow::logging::installed_ours());
        let records = APP_LOGGER.0.lock().unwrap();
        let seen = |level: log::Level, text: &str| {
            records.iter().any(|(l, t, m)| *l == level && t.starts_with("lava_flow::") && m.contains(text))
        };
        assert!(seen(log::Level::Warn, "no Vulkan device"), "{records:?}");
        assert!(seen(log::Level::Info, "transport shm"), "{records:?}");
        println!("@@ records {}", records.len());
        return;
    }
    // LF_LOG_LEVEL=off would not tell: the application's logger decides, at info here.
    let run = run_child("an_applications_own_logger_is_kept", "app", Some("error"));
    assert!(run.report("records").is_some_and(|n| n.parse::<usize>().unwrap() > 0), "{}", run.stdout);
    assert!(run.log_lines().is_empty(), "lava-flow's logger wrote while the application has its own:\n{}", run.stderr);
}

/// What the callback received, and what replacing it from inside itself gave.
static RECEIVED: Mutex<Vec<(lf_log_level, String, String, usize)>> = Mutex::new(Vec::new());
static INSIDE: Mutex<Option<lf_status>> = Mutex::new(None);

unsafe extern "C" fn callback(
    user_data: *mut c_void,
    level: lf_log_level,
    target: *const c_char,
    message: *const c_char,
) {
    // SAFETY: lava-flow passes NUL-terminated strings valid during the call.
    let (target, message) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(message)) };
    let mut inside = INSIDE.lock().unwrap();
    if inside.is_none() {
        // SAFETY: NULL restores stderr; refused here, inside the callback.
        *inside = Some(unsafe { lf_set_log_callback(None, std::ptr::null_mut()) });
    }
    RECEIVED.lock().unwrap().push((
        level,
        target.to_string_lossy().into_owned(),
        message.to_string_lossy().into_owned(),
        user_data as usize,
    ));
}

#[test]
fn the_c_callback_gets_records_and_null_restores_stderr() {
    if child_role().is_some() {
        assert_eq!(lf_set_log_level(lf_log_level::LF_LOG_INFO as u32), lf_status::LF_OK);
        // SAFETY: the callback has the signature and lives as long as the process.
        assert_eq!(unsafe { lf_set_log_callback(Some(callback), 0x5eed as *mut c_void) }, lf_status::LF_OK);
        fallback_and_channel("log-callback");
        {
            let received = RECEIVED.lock().unwrap();
            let transport =
                received.iter().find(|(_, _, m, _)| m.contains("channel \"log-callback\" (producer): transport shm"));
            let (level, target, _, user_data) =
                transport.unwrap_or_else(|| panic!("no transport choice: {received:?}"));
            assert_eq!((*level, *user_data), (lf_log_level::LF_LOG_INFO, 0x5eed));
            assert_eq!(target, "lava_flow::channels");
            assert!(
                received.iter().any(|(l, _, m, _)| *l == lf_log_level::LF_LOG_WARN && m.contains("no Vulkan device")),
                "{received:?}"
            );
            assert!(received.iter().all(|(_, _, m, _)| !m.contains('\n')), "{received:?}");
        }
        assert_eq!(*INSIDE.lock().unwrap(), Some(lf_status::LF_ERR_INVALID_STATE), "replaced from inside the callback");
        // SAFETY: NULL is always allowed.
        assert_eq!(unsafe { lf_set_log_callback(None, std::ptr::null_mut()) }, lf_status::LF_OK);
        let before = RECEIVED.lock().unwrap().len();
        fallback_and_channel("log-stderr-again");
        assert_eq!(RECEIVED.lock().unwrap().len(), before, "the callback was called after it was removed");
        return;
    }
    // LF_LOG_LEVEL=error: lf_set_log_level overrides it.
    let run = run_child("the_c_callback_gets_records_and_null_restores_stderr", "callback", Some("error"));
    check_format(&run);
    assert!(!run.stderr.contains("\"log-callback\""), "records of the callback's time on stderr:\n{}", run.stderr);
    assert!(
        has(&run, "INFO", "lava_flow::channels", "channel \"log-stderr-again\" (consumer): transport shm"),
        "{}",
        run.stderr
    );
}
