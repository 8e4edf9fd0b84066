//! Spawning child roles and small helpers shared by the tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout};
use std::time::Duration;

use crate::child::Spawn;
pub use crate::child::{kill9, wait_timeout};

use lava_flow::channels::{ChannelConfig, WaitStrategy};
use lava_flow::memory::{Context, ContextConfig, GpuPolicy};
use lava_flow::ProcessLocation;

/// The role this process plays, when it is a child.
pub fn child_role() -> Option<String> {
    crate::child::role()
}

/// A test argument passed by the orchestrator.
pub fn arg(name: &str) -> String {
    std::env::var(format!("LF_TEST_ARG_{name}")).unwrap_or_else(|_| panic!("missing test argument {name}"))
}

/// A fresh, empty runtime dir for one test (0700), which [`assert_dir_empty`] removes.
pub fn test_dir(test: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(&format!("lf-l2-{test}-"))
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .unwrap()
        .keep()
}

/// This process's mapping of shared-memory channel `name`'s region (its control part and, right
/// after it, its data part), as /proc/self/maps shows it: its address and length. For tests
/// that play a hostile peer, writing where the peer would.
pub fn region_of(name: &str) -> (*mut u8, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    // "start-end perms offset dev inode path": the ranges of each memfd of the channel.
    let ranges = |file: &str| -> Vec<(usize, usize)> {
        maps.lines()
            .filter(|line| line.ends_with(&format!("/memfd:{file} (deleted)")))
            .map(|line| {
                let (start, end) = line.split_whitespace().next().unwrap().split_once('-').unwrap();
                (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap())
            })
            .collect()
    };
    let data = ranges(&format!("lava-flow:{name}:data"));
    // The region maps its control part directly before its data part (a second mapping of
    // the control part, for waking sleepers, lies elsewhere).
    let (start, end) = ranges(&format!("lava-flow:{name}"))
        .into_iter()
        .find_map(|(start, end)| data.iter().find(|d| d.0 == end).map(|d| (start, d.1)))
        .unwrap_or_else(|| panic!("no region of channel {name:?} is mapped here:\n{maps}"));
    (start as *mut u8, end - start)
}

/// A scratch dir for files the test's processes share (flags), removed when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("lf-l2-scratch-").tempdir().unwrap()
}

/// Starts `test` in a child process as `role`, with arguments as `LF_TEST_ARG_*`.
pub fn spawn(test: &str, role: &str, dir: &Path, args: &[(&str, String)]) -> Child {
    spawn_with_env(test, role, dir, args, &[])
}

/// [`spawn`], with `env` set in the child's environment as well.
fn spawn_with_env(test: &str, role: &str, dir: &Path, args: &[(&str, String)], env: &[(&str, &str)]) -> Child {
    let mut envs: Vec<(&str, String)> = vec![("LF_RUNTIME_DIR", dir.display().to_string())];
    let named: Vec<(String, String)> = args.iter().map(|(k, v)| (format!("LF_TEST_ARG_{k}"), v.clone())).collect();
    envs.extend(named.iter().map(|(k, v)| (k.as_str(), v.clone())));
    envs.extend(env.iter().map(|&(k, v)| (k, v.to_string())));
    Spawn { test, role, envs: &envs, socket: false, capture_stderr: false }.start().0
}

/// Reads the child's stdout until a line `@@ <key> <value>` and returns the value.
pub fn expect_line(out: &mut BufReader<ChildStdout>, key: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "child ended before printing {key}");
        // libtest may have printed "test name ... " on the same line first.
        let tag = format!("@@ {key} ");
        if let Some(at) = line.find(&tag) {
            return line[at + tag.len()..].trim().to_owned();
        }
    }
}

/// Prints a line for the orchestrator.
pub fn report(key: &str, value: impl std::fmt::Display) {
    use std::io::Write;
    println!("@@ {key} {value}");
    std::io::stdout().flush().unwrap();
}

pub fn stdout_of(child: &mut Child) -> BufReader<ChildStdout> {
    BufReader::new(child.stdout.take().unwrap())
}

/// [`spawn`], with the child's stdout to read its reports from.
pub fn spawn_reporting(test: &str, role: &str, dir: &Path, args: &[(&str, String)]) -> (Child, BufReader<ChildStdout>) {
    let mut child = spawn(test, role, dir, args);
    let out = stdout_of(&mut child);
    (child, out)
}

/// Lets the survivor settle into its wait, kills `victim` with SIGKILL, and returns how many
/// milliseconds later the survivor saw the death: its report `gone_at` (a [`monotonic_ns`]).
pub fn ms_until_death_seen(victim: &mut Child, survivor_out: &mut BufReader<ChildStdout>) -> f64 {
    std::thread::sleep(Duration::from_millis(50));
    let killed_at = monotonic_ns();
    kill9(victim);
    let gone_at: u64 = expect_line(survivor_out, "gone_at").parse().unwrap();
    gone_at.saturating_sub(killed_at) as f64 / 1e6
}

/// Waits for a child and asserts that its part passed.
pub fn wait_ok(mut child: Child, what: &str) {
    let status = wait_timeout(&mut child, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("{what} did not finish in 120 s")
    });
    assert!(status.success(), "{what} failed: {status}");
}

/// CLOCK_MONOTONIC in ns: comparable between processes on one host.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's memory context (CPU only: these tests are about channels).
pub fn ctx() -> Context {
    static CONTEXT: std::sync::OnceLock<Context> = std::sync::OnceLock::new();
    CONTEXT
        .get_or_init(|| {
            let mut config = ContextConfig::default();
            config.gpu = GpuPolicy::Disabled;
            Context::new(config).expect("memory context")
        })
        .clone()
}

pub fn here() -> ProcessLocation {
    ProcessLocation::from_hostname().unwrap()
}

pub fn config(wait: WaitStrategy) -> ChannelConfig {
    ChannelConfig { wait, rendezvous_timeout: Some(Duration::from_secs(30)), ..Default::default() }
}

pub fn strategy(name: &str) -> WaitStrategy {
    match name {
        "busy" => WaitStrategy::BusyPoll,
        "spin" => WaitStrategy::SpinThenBlock { spin: Duration::from_micros(50) },
        "block" => WaitStrategy::Block,
        other => panic!("unknown strategy {other}"),
    }
}

pub const STRATEGIES: [&str; 3] = ["busy", "spin", "block"];

/// Asserts that a runtime dir holds nothing (no socket left behind), then removes it.
pub fn assert_dir_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
    std::fs::remove_dir(dir).unwrap();
}

/// Fills `buf` with bytes derived from `seq` and returns their checksum.
pub fn fill(buf: &mut [u8], seq: u64) {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Checks a message built by `message(seq, size)`.
pub fn check(msg: &[u8], expected_seq: u64) {
    assert!(msg.len() >= 16, "message {expected_seq} is {} bytes", msg.len());
    let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
    assert_eq!(seq, expected_seq, "out of order, lost or duplicated message");
    let sum = u64::from_le_bytes(msg[8..16].try_into().unwrap());
    assert_eq!(sum, checksum(&msg[16..]), "message {seq} damaged");
}

pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Writes message `seq` of `size` (>= 16) bytes into `buf`: sequence, checksum, payload.
pub fn message_into(buf: &mut [u8], seq: u64) {
    fill(&mut buf[16..], seq);
    let sum = checksum(&buf[16..]);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..16].copy_from_slice(&sum.to_le_bytes());
}

/// The size of message `seq` in the mixed-size streams: mostly small (inline), some medium,
/// a few large.
pub fn size_of(seq: u64) -> usize {
    match seq % 1000 {
        0 => 16 + (seq as usize * 7919) % (256 << 10),
        1..=99 => 16 + (seq as usize * 31) % 4000,
        _ => 16 + (seq as usize * 13) % 100,
    }
}

/// Runs a test's consumer and producer children and checks that they pass and leave nothing.
pub fn run_pair(test: &str, dir_name: &str) {
    run_pair_with(test, dir_name, &[]);
}

/// Runs `test`'s consumer and producer roles with `args`, in a fresh runtime dir that must be
/// left empty.
pub fn run_pair_with(test: &str, dir_name: &str, args: &[(&str, String)]) {
    run_pair_producer_env(test, dir_name, args, &[]);
}

/// [`run_pair_with`], with `producer_env` set in the producer's environment.
pub fn run_pair_producer_env(test: &str, dir_name: &str, args: &[(&str, String)], producer_env: &[(&str, &str)]) {
    let dir = test_dir(dir_name);
    let c = spawn(test, "consumer", &dir, args);
    let p = spawn_with_env(test, "producer", &dir, args, producer_env);
    wait_ok(p, "producer");
    wait_ok(c, "consumer");
    assert_dir_empty(&dir);
}
