//! Meeting by name: either start order, timeouts, transport choice and its report, refusals.

use std::time::{Duration, Instant};

use lava_flow::channels::{Channel, ChannelConfig, Consumer, Producer, Role, TransportKind, WaitStrategy};
use lava_flow::{Error, ProcessLocation};

use crate::common::*;

fn exchange(role: &str) {
    let cfg = config(WaitStrategy::Block);
    if arg("delay") == role {
        std::thread::sleep(Duration::from_millis(300));
    }
    match role {
        "producer" => {
            let ch = Channel::create(&ctx(), "order", Role::Producer, &here(), &here(), &cfg).unwrap();
            assert_eq!(ch.role(), Role::Producer);
            let mut p = ch.into_producer().unwrap();
            for i in 0..100u32 {
                p.send(&i.to_le_bytes()).unwrap();
            }
            p.wait_completed(99, Some(Duration::from_secs(20))).unwrap();
        }
        _ => {
            let ch = Channel::create(&ctx(), "order", Role::Consumer, &here(), &here(), &cfg).unwrap();
            let info = ch.transport().clone();
            assert_eq!(info.kind, TransportKind::Shm);
            assert!(info.reason.contains("scope local"), "{}", info.reason);
            report("transport", format!("{} ({})", info.kind, info.reason));
            let mut c = ch.into_consumer().unwrap();
            for i in 0..100u32 {
                assert_eq!(&*c.recv().unwrap(), &i.to_le_bytes());
            }
        }
    }
}

#[test]
fn either_start_order() {
    const TEST: &str = "rendezvous::either_start_order";
    match child_role().as_deref() {
        Some(role) => exchange(role),
        None => {
            for first in ["consumer", "producer"] {
                let args = [("delay", if first == "consumer" { "producer" } else { "consumer" }.to_owned())];
                run_pair_with(TEST, &format!("order-{first}"), &args);
            }
        }
    }
}

#[test]
fn rendezvous_timeout_and_refusals() {
    const TEST: &str = "rendezvous::rendezvous_timeout_and_refusals";
    match child_role().as_deref() {
        Some("lonely") => {
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_millis(200)), ..Default::default() };
            let start = Instant::now();
            let err = Producer::create(&ctx(), "nobody-home", &here(), &here(), &cfg).unwrap_err();
            assert!(matches!(err, Error::Timeout(ref m) if m.contains("nobody-home")), "{err}");
            let waited = start.elapsed();
            assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5), "{waited:?}");
            let err = Consumer::create(&ctx(), "nobody-home", &here(), &here(), &cfg).unwrap_err();
            assert!(matches!(err, Error::Timeout(_)), "{err}");

            // Remote scope with a location that did not come from MPI discovery: a clear message.
            let far = ProcessLocation::new("some-other-host", None, None).unwrap();
            let err = Producer::create(&ctx(), "far", &here(), &far, &cfg).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported(ref m) if m.contains("no remote transport can reach the peer") && m.contains("lf_mpi_location")),
                "{err}"
            );

            // LF_TRANSPORTS names an unavailable transport: creation fails and says why.
            std::env::set_var("LF_TRANSPORTS", "mpi");
            let err = Consumer::create(&ctx(), "restricted", &here(), &here(), &cfg).unwrap_err();
            assert!(
                matches!(err, Error::Unsupported(ref m) if m.contains("LF_TRANSPORTS=mpi") && (m.contains("MPI discovery") || m.contains("mpi is not in this build"))),
                "{err}"
            );
            std::env::set_var("LF_TRANSPORTS", "bogus");
            assert!(matches!(
                Consumer::create(&ctx(), "restricted", &here(), &here(), &cfg),
                Err(Error::InvalidArgument(_))
            ));
            std::env::remove_var("LF_TRANSPORTS");

            assert!(matches!(
                Producer::create(&ctx(), "bad/name", &here(), &here(), &cfg),
                Err(Error::InvalidArgument(_))
            ));
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "taken", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            report("ready", 1);
            assert_eq!(&*c.recv().unwrap(), b"done");
        }
        Some("second-consumer") => {
            let err = Consumer::create(&ctx(), "taken", &here(), &here(), &config(WaitStrategy::Block)).unwrap_err();
            assert!(matches!(err, Error::InvalidState(ref m) if m.contains("already has a live consumer")), "{err}");
        }
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "taken", &here(), &here(), &config(WaitStrategy::Block)).unwrap();
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            p.send(b"done").unwrap();
            p.wait_completed(0, Some(Duration::from_secs(20))).unwrap();
        }
        Some(_) => {}
        None => {
            let dir = test_dir("lonely");
            wait_ok(spawn(TEST, "lonely", &dir, &[]), "lonely");
            assert_dir_empty(&dir);

            let dir = test_dir("taken");
            let scratch = scratch_dir();
            let flag = scratch.path().join("taken.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = [("flag", flag.clone())];
            let mut c = spawn(TEST, "consumer", &dir, &args);
            let mut out = stdout_of(&mut c);
            let p = spawn(TEST, "producer", &dir, &args);
            expect_line(&mut out, "ready");
            wait_ok(spawn(TEST, "second-consumer", &dir, &args), "second consumer");
            std::fs::write(&flag, b"go").unwrap();
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}

#[test]
fn runtime_dir_must_be_private() {
    const TEST: &str = "rendezvous::runtime_dir_must_be_private";
    use std::os::unix::fs::PermissionsExt;
    match child_role().as_deref() {
        Some("open-dir") => {
            let err = Consumer::create(&ctx(), "x", &here(), &here(), &ChannelConfig::default()).unwrap_err();
            assert!(matches!(err, Error::PermissionDenied(ref m) if m.contains("0700")), "{err}");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("open");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            wait_ok(spawn(TEST, "open-dir", &dir, &[]), "open-dir");
            assert_dir_empty(&dir);
        }
    }
}

/// A process of another user that reaches the socket (root can, through DAC override) is
/// refused by SO_PEERCRED. Runs only as root (it needs to switch the consumer to `nobody`).
#[test]
fn other_user_is_refused() {
    const TEST: &str = "rendezvous::other_user_is_refused";
    const NOBODY: u32 = 65534;
    match child_role().as_deref() {
        Some("nobody-consumer") => {
            // SAFETY: plain syscalls in a single-threaded child before any lava-flow call.
            unsafe {
                assert_eq!(libc::setgid(NOBODY), 0);
                assert_eq!(libc::setuid(NOBODY), 0);
            }
            let cfg = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(3)), ..Default::default() };
            let err = Consumer::create(&ctx(), "guarded", &here(), &here(), &cfg).unwrap_err();
            assert!(matches!(err, Error::Timeout(ref m) if m.contains("runs as uid 0")), "{err}");
        }
        Some(_) => {}
        None => {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("skipped: needs root to run a consumer as another user");
                return;
            }
            let dir = test_dir("guarded");
            std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
            let c = spawn(TEST, "nobody-consumer", &dir, &[]);
            let path = dir.join("guarded.sock");
            let start = Instant::now();
            // Root passes the 0700 directory; the consumer must still refuse it.
            while std::os::unix::net::UnixStream::connect(&path).is_err() {
                assert!(start.elapsed() < Duration::from_secs(3), "the consumer never listened");
                std::thread::sleep(Duration::from_millis(5));
            }
            wait_ok(c, "nobody consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// A second producer on a live channel is refused at once, saying so (as a second consumer
/// is), instead of waiting in the rendezvous to take over. Once the first has closed, the
/// consumer reports its end (PeerGone) before a new producer attaches, whose messages start
/// again at sequence number 0.
#[test]
fn a_second_producer_is_refused_at_once() {
    const TEST: &str = "rendezvous::a_second_producer_is_refused_at_once";
    let cfg = || ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(20)), ..config(WaitStrategy::Block) };
    match child_role().as_deref() {
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "one-producer", &here(), &here(), &cfg()).unwrap();
            for i in 0..3u64 {
                let m = c.recv_timeout(Duration::from_secs(20)).unwrap();
                assert_eq!((&*m, m.sequence()), (&b"first"[..], i));
            }
            let err = c.recv_timeout(Duration::from_secs(20)).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "the first producer's end is reported: {err}");
            report("first-gone", 1);
            let give_up = Instant::now() + Duration::from_secs(30);
            let m = loop {
                match c.recv_timeout(Duration::from_secs(20)) {
                    Err(Error::PeerGone(_)) if Instant::now() < give_up => std::thread::sleep(Duration::from_millis(2)),
                    other => break other.unwrap(),
                }
            };
            assert_eq!((&*m, m.sequence()), (&b"third"[..], 0));
        }
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "one-producer", &here(), &here(), &cfg()).unwrap();
            let what = arg("what");
            let count = if what == "first" { 3 } else { 1 };
            for _ in 0..count {
                p.send(what.as_bytes()).unwrap();
            }
            p.wait_completed(count - 1, Some(Duration::from_secs(20))).unwrap();
            report("sent", 1);
            if what == "first" {
                let flag = arg("flag");
                while !std::path::Path::new(&flag).exists() {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        Some("second-producer") => {
            let start = Instant::now();
            let err = Producer::create(&ctx(), "one-producer", &here(), &here(), &cfg()).unwrap_err();
            assert!(
                matches!(err, Error::InvalidState(ref m) if m.contains("already has a live producer (pid ") && m.contains("one producer at a time")),
                "{err}"
            );
            assert!(start.elapsed() < Duration::from_secs(2), "refused after {:?}, not at once", start.elapsed());
        }
        Some(_) => {}
        None => {
            let dir = test_dir("one-producer");
            let scratch = scratch_dir();
            let flag = scratch.path().join("one-producer.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = |what: &str| [("flag", flag.clone()), ("what", what.to_owned())];
            let mut c = spawn(TEST, "consumer", &dir, &args(""));
            let mut c_out = stdout_of(&mut c);
            let mut first = spawn(TEST, "producer", &dir, &args("first"));
            let mut first_out = stdout_of(&mut first);
            expect_line(&mut first_out, "sent");
            wait_ok(spawn(TEST, "second-producer", &dir, &args("")), "second producer");
            std::fs::write(&flag, b"close").unwrap();
            wait_ok(first, "first producer");
            drop(first_out);
            expect_line(&mut c_out, "first-gone");
            wait_ok(spawn(TEST, "producer", &dir, &args("third")), "third producer");
            wait_ok(c, "consumer");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}
