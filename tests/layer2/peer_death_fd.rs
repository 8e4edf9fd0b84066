//! kill -9 of a producer while the consumer waits in an event loop on its notification fd:
//! every wake-up that the death causes is answered by `try_recv` with `PeerGone`, never with
//! `WouldBlock`. Readable means the next `try_recv` has something to say: an event loop told
//! `WouldBlock` by a readable fd would spin until the news reached `try_recv` by other ways.
//!
//! The fd polls readable the moment the kernel knows of the death (the producer's end of
//! the notification pair hangs up, its socket hangs up, its pidfd turns readable), which can
//! be before the process's watcher thread has reported it; these tests race the two many
//! times over, a fresh channel each round, the wait strategies in turn.

use std::os::fd::AsRawFd;
use std::time::Duration;

use lava_flow::channels::{Consumer, Producer};
use lava_flow::Error;

use crate::common::*;

const ROUNDS: usize = 20;
const MESSAGES: u64 = 3;
/// The most wake-ups one round waits through for `PeerGone` (an event loop that spins, if
/// `try_recv` never says it).
const MAX_WAKES: u32 = 100_000;

fn wait_of(round: usize) -> &'static str {
    STRATEGIES[round % STRATEGIES.len()]
}

fn channel_of(round: usize) -> String {
    format!("fdwake-{round}")
}

/// Whether `fd` is readable within `timeout_ms`.
fn readable(fd: i32, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1
}

/// The victim: the producer of round `arg("round")`'s channel, which sends [`MESSAGES`] and
/// waits to be killed.
fn victim(before_report: impl FnOnce()) -> ! {
    let cfg = config(strategy(&arg("wait")));
    let mut p = Producer::create(&ctx(), &channel_of(arg("round").parse().unwrap()), &here(), &here(), &cfg).unwrap();
    for i in 0..MESSAGES {
        p.send(&i.to_le_bytes()).unwrap();
    }
    before_report();
    report("sent", MESSAGES);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The survivor: the consumer of each round's channel, in an event loop on its fd. It reads
/// the messages, reports `drained` once the fd is quiet, then counts the `WouldBlock` answers
/// to the death's wake-ups until `PeerGone`, checks that the fd, while still readable, keeps
/// saying `PeerGone`, calls `after_gone(round)` and reports the count (`would_block`).
fn survivor(after_gone: impl Fn(usize)) {
    for round in 0..ROUNDS {
        let cfg = config(strategy(wait_of(round)));
        let mut c = Consumer::create(&ctx(), &channel_of(round), &here(), &here(), &cfg).unwrap();
        let fd = c.notify_fd().unwrap().as_raw_fd();
        let mut got = 0u64;
        while got < MESSAGES {
            assert!(readable(fd, 20_000), "round {round}: message {got} never made the fd readable");
            match c.try_recv() {
                Ok(m) => {
                    assert_eq!(&*m, &got.to_le_bytes());
                    got += 1;
                }
                Err(Error::WouldBlock(_)) => {}
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        // All read: this quiets the fd until the producer's end.
        assert!(matches!(c.try_recv(), Err(Error::WouldBlock(_))), "round {round}: a message too many");
        report("drained", round);
        // Every wake-up from here on is the death's.
        let mut would_block = 0u32;
        let mut wakes = 0u32;
        loop {
            assert!(readable(fd, 20_000), "round {round}: the producer's death never made the fd readable");
            wakes += 1;
            match c.try_recv() {
                Err(Error::PeerGone(_)) => break,
                Err(Error::WouldBlock(_)) => would_block += 1,
                Ok(_) => panic!("round {round}: a message after the last one sent"),
                Err(e) => panic!("round {round}: {e}"),
            }
            assert!(wakes < MAX_WAKES, "round {round}: {wakes} wake-ups and still no PeerGone");
        }
        for _ in 0..3 {
            if readable(fd, 0) {
                let again = c.try_recv();
                assert!(matches!(again, Err(Error::PeerGone(_))), "round {round}: readable after PeerGone, {again:?}");
            }
        }
        after_gone(round);
        report("would_block", would_block);
    }
}

/// The orchestrator: the survivor, and each round a victim killed once the survivor waits
/// for it; fails with the rounds where a wake-up of the death got `WouldBlock`.
fn orchestrate(test: &str, dir_name: &str, args: &[(&str, String)]) {
    let dir = test_dir(dir_name);
    let (survivor, mut c_out) = spawn_reporting(test, "survivor", &dir, args);
    let mut answers = Vec::new();
    for round in 0..ROUNDS {
        let mut victim_args = vec![("round", round.to_string()), ("wait", wait_of(round).to_owned())];
        victim_args.extend(args.iter().cloned());
        let (mut p, mut p_out) = spawn_reporting(test, "victim", &dir, &victim_args);
        expect_line(&mut p_out, "sent");
        assert_eq!(expect_line(&mut c_out, "drained"), round.to_string());
        // The survivor asleep in poll, most likely, when the death comes.
        std::thread::sleep(Duration::from_millis(20));
        kill9(&mut p);
        answers.push(expect_line(&mut c_out, "would_block").parse::<u32>().unwrap());
    }
    wait_ok(survivor, "survivor");
    assert_dir_empty(&dir);
    let failed = answers.iter().filter(|&&n| n != 0).count();
    assert_eq!(
        failed, 0,
        "try_recv answered WouldBlock after the fd woke for the producer's death in {failed} of {ROUNDS} rounds \
         (WouldBlock answers per round: {answers:?})"
    );
}

/// A plain producer: its death closes its descriptors and ends its process.
#[test]
fn a_wake_up_for_the_producers_death_says_peer_gone() {
    const TEST: &str = "peer_death_fd::a_wake_up_for_the_producers_death_says_peer_gone";
    match child_role().as_deref() {
        Some("victim") => victim(|| {}),
        Some("survivor") => survivor(|_| {}),
        Some(_) => {}
        None => orchestrate(TEST, "fdwake", &[]),
    }
}

/// A producer that forked: its child holds the producer's descriptors (its socket, its end of
/// the notification pair, its lock) past its death, so that only its pidfd tells of the death.
/// The child is killed by the survivor once the death has been seen, and pauses meanwhile (at
/// most 60 s, should the test fail before).
#[test]
fn a_wake_up_for_the_death_of_a_producer_whose_child_holds_its_descriptors_says_peer_gone() {
    const TEST: &str =
        "peer_death_fd::a_wake_up_for_the_death_of_a_producer_whose_child_holds_its_descriptors_says_peer_gone";
    let pid_file = |round: usize| format!("{}/child-{round}", arg("scratch"));
    match child_role().as_deref() {
        Some("victim") => victim(|| {
            // SAFETY: the child calls only async-signal-safe functions (alarm, pause), as it
            // must after a fork of a process with several threads.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
            if pid == 0 {
                // SAFETY: alarm and pause are async-signal-safe; SIGALRM ends the child.
                unsafe {
                    libc::alarm(60);
                    loop {
                        libc::pause();
                    }
                }
            }
            std::fs::write(pid_file(arg("round").parse().unwrap()), pid.to_string()).unwrap();
        }),
        Some("survivor") => survivor(|round| {
            // The producer's lock goes with its child: killed and gone before the consumer's
            // drop removes what the producer left.
            let pid: i32 = std::fs::read_to_string(pid_file(round)).unwrap().parse().unwrap();
            // SAFETY: pidfd_open with a pid and no flags; the result is checked.
            let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
            assert!(pidfd >= 0, "pidfd_open of the producer's child: {}", std::io::Error::last_os_error());
            // SAFETY: kill with the pid the pidfd was opened for, which lives until killed.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            assert!(readable(pidfd, 20_000), "round {round}: the producer's child did not exit");
            // SAFETY: the pidfd was opened above and is closed once.
            unsafe { libc::close(pidfd) };
        }),
        Some(_) => {}
        None => {
            let scratch = scratch_dir();
            orchestrate(TEST, "fdwake-fork", &[("scratch", scratch.path().display().to_string())]);
        }
    }
}
