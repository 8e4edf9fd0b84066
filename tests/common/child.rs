//! The one harness of the cross-process tests (layer 1 and layer 2): a test re-executes its own
//! test binary (`current_exe()`), running only itself, as a child in a named role, optionally
//! with a socket to talk to its parent over; the child learns its role from the environment.

#![allow(dead_code)]

use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `<test>:<role>` in a child.
const CHILD_ENV: &str = "LF_TEST_CHILD";
/// Set in a child given a socket: the socket is this descriptor.
const SOCKET_ENV: &str = "LF_TEST_SOCKET_FD";
/// Where a child finds its socket (high, so that nothing else opened early takes it).
const CHILD_SOCKET_FD: RawFd = 200;

/// The role this process plays when it is a child of `test` (its path in the test binary,
/// `module::name`, or its name alone).
pub fn role_in(test: &str) -> Option<String> {
    let value = std::env::var(CHILD_ENV).ok()?;
    let (name, role) = value.rsplit_once(':')?;
    (name == test || name.strip_suffix(test).is_some_and(|module| module.ends_with("::"))).then(|| role.to_owned())
}

/// The role this process plays when it is a child, of whichever test.
pub fn role() -> Option<String> {
    let value = std::env::var(CHILD_ENV).ok()?;
    Some(value.rsplit_once(':')?.1.to_owned())
}

/// How to start a child.
pub struct Spawn<'a> {
    pub test: &'a str,
    pub role: &'a str,
    pub envs: &'a [(&'a str, String)],
    /// A socket to the parent, as [`parent_socket`] in the child.
    pub socket: bool,
    /// The child's stderr goes to a pipe (read with its output) rather than the parent's.
    pub capture_stderr: bool,
}

impl Spawn<'_> {
    /// Starts the child, its stdout piped; returns it with the parent's end of its socket.
    pub fn start(&self) -> (Child, Option<UnixStream>) {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", self.test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{}:{}", self.test, self.role))
            .stdout(Stdio::piped())
            .stderr(if self.capture_stderr { Stdio::piped() } else { Stdio::inherit() })
            // Transports are the test's choice, not the environment's.
            .env_remove("LF_TRANSPORTS");
        for (key, value) in self.envs {
            command.env(key, value);
        }
        if !self.socket {
            return (command.spawn().expect("re-executing the test binary"), None);
        }
        let (mine, theirs) = UnixStream::pair().unwrap();
        let raw = theirs.as_raw_fd();
        command.env(SOCKET_ENV, CHILD_SOCKET_FD.to_string());
        // SAFETY: dup2 is async-signal-safe; the new descriptor (without CLOEXEC) survives
        // the exec, and `theirs` stays open in the parent until the spawn has returned.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(raw, CHILD_SOCKET_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("re-executing the test binary");
        drop(theirs);
        mine.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        (child, Some(mine))
    }
}

/// In a child started with a socket: its end, owned by the caller (call it once).
pub fn parent_socket() -> UnixStream {
    let fd: RawFd = std::env::var(SOCKET_ENV).expect("child started without a socket").parse().unwrap();
    // SAFETY: the parent put the socket at this descriptor for this process to own, and this
    // (called once) is its only owner.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    stream
}

/// Waits for a child (its output captured), fails the test with that output unless it
/// succeeded and ran its one test, and returns its stdout.
pub fn expect_success(child: Child, what: &str) -> String {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child {what} failed ({}):\n{stdout}\n{stderr}", out.status);
    // A child whose filter matched nothing "succeeds" with 0 tests: make sure it ran one.
    assert!(stdout.contains("1 passed"), "child {what} ran no test:\n{stdout}\n{stderr}");
    stdout
}

/// The child's exit status, or `None` if it has not exited within `limit`.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills a child with SIGKILL and reaps it.
pub fn kill9(child: &mut Child) {
    // SAFETY: kill with a pid we spawned and have not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}
