//! The stream's tests, in-process and across real processes (this test binary re-spawned as
//! the child, see `test_child`).

use super::*;
use crate::os::windows::mapping::Mapping;
use crate::os::windows::process::PeerProcess;
use crate::os::windows::watcher::{Interest, SharedHandle, Watch};
use crate::os::windows::{notify, shm, test_child, wait};
use crate::os::ShmOptions;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
use windows_sys::Win32::System::Threading::WaitForSingleObject;

/// A connected pair in this process: (the server's end, the client's end).
fn pair(name: &str) -> (Listener, Stream, Stream) {
    let listener = Listener::bind_name(name).unwrap();
    let n = name.to_owned();
    let client = std::thread::spawn(move || connect_name(&n, Instant::now() + Duration::from_secs(30)).unwrap());
    let server = listener.accept(Some(Duration::from_secs(30))).unwrap();
    (listener, server, client.join().unwrap())
}

#[test]
fn messages_and_handles_travel_in_order_and_the_end_is_seen() {
    let (_listener, server, client) = pair(&test_child::unique("lf-msg"));
    for end in [&server, &client] {
        assert_eq!(
            end.peer(),
            PeerIdentity { pid: std::process::id() as i32, same_user: true, uid: crate::os::windows::user::id() }
        );
    }
    let mut buf = [0u8; 64];
    assert!(client.try_recv_with_handles(&mut buf).unwrap().is_none());
    let section = shm::create("lf-msg", 65536, ShmOptions::default()).unwrap();
    let here = Mapping::shared(&section, 0, 65536).unwrap();
    server.send_with_handles(b"first", &[section.as_handle()]).unwrap();
    server.send_with_handles(b"second", &[]).unwrap();
    let (n, handles) = client.recv_with_handles(&mut buf).unwrap();
    assert_eq!((&buf[..n], handles.len()), (&b"first"[..], 1));
    assert_ne!(handles[0].as_raw_handle(), section.as_raw_handle(), "the receiver got its own handle");
    let there = Mapping::shared(&handles[0], 0, 65536).unwrap();
    // SAFETY: both views are live, 65536 bytes each.
    unsafe {
        here.as_ptr().write(7);
        assert_eq!(there.as_ptr().read(), 7);
    }
    let (n, handles) = client.try_recv_with_handles(&mut buf).unwrap().expect("a whole message waits");
    assert_eq!((&buf[..n], handles.len()), (&b"second"[..], 0));
    client.send_with_handles(b"back", &[]).unwrap();
    let mut exact = [0u8; 4];
    assert!(matches!(server.recv_exact_with_handle(&mut exact, "a reply"), Err(Error::Corrupt(_))));
    assert!(matches!(server.send_with_handles(b"", &[]), Err(Error::InvalidArgument(_))));
    let many: Vec<_> = (0..=MAX_HANDLES).map(|_| section.as_handle()).collect();
    assert!(matches!(server.send_with_handles(b"x", &many), Err(Error::InvalidArgument(_))));
    drop(server);
    assert_eq!(client.recv_with_handles(&mut buf).unwrap().0, 0);
    assert_eq!(client.try_recv_with_handles(&mut buf).unwrap().map(|(n, _)| n), Some(0));
    assert!(matches!(client.send_with_handles(b"late", &[]), Err(Error::PeerGone(_))));
}

#[test]
fn a_second_listener_of_a_live_name_is_refused() {
    let name = test_child::unique("lf-bind");
    let first = Listener::bind_name(&name).unwrap();
    match Listener::bind_name(&name) {
        Err(Error::InvalidState(m)) => assert!(m.contains("live already"), "{m}"),
        other => panic!("a second listener of a live name: {other:?}"),
    }
    drop(first);
    let _again = Listener::bind_name(&name).expect("the name is free once its listener is gone");
    assert!(matches!(Listener::bind_name("a/b"), Err(Error::InvalidArgument(_))));
    assert!(matches!(Listener::bind_name(""), Err(Error::InvalidArgument(_))));
}

#[test]
fn connect_waits_for_the_listener_and_gives_up_at_the_deadline() {
    let name = test_child::unique("lf-late");
    let start = Instant::now();
    assert!(matches!(connect_name(&name, start + Duration::from_millis(100)), Err(Error::Timeout(_))));
    assert!(start.elapsed() >= Duration::from_millis(100));
    let n = name.clone();
    let client = std::thread::spawn(move || connect_name(&n, Instant::now() + Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(100));
    let listener = Listener::bind_name(&name).unwrap();
    let server = listener.accept(Some(Duration::from_secs(30))).unwrap();
    let client = client.join().unwrap().unwrap();
    client.send_with_handles(b"hi", &[]).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(server.recv_with_handles(&mut buf).unwrap().0, 2);
    assert!(matches!(listener.accept(Some(Duration::from_millis(50))), Err(Error::Timeout(_))));
    // The listener still takes clients after a timed-out accept.
    let n = name.clone();
    let client = std::thread::spawn(move || connect_name(&n, Instant::now() + Duration::from_secs(30)).unwrap());
    let _server = listener.accept(Some(Duration::from_secs(30))).unwrap();
    client.join().unwrap();
}

/// Messages sent without waiting go until one has to wait for the reader: `WouldBlock`;
/// after the reader has caught up, every accepted message arrives, in order.
#[test]
fn a_try_send_to_a_full_pipe_would_block_and_loses_nothing() {
    let (_listener, server, client) = pair(&test_child::unique("lf-full"));
    let payload = [0xabu8; 4096];
    let mut sent = 0u32;
    loop {
        let mut message = payload;
        message[..4].copy_from_slice(&sent.to_le_bytes());
        match server.try_send_with_handles(&message, &[]) {
            Ok(()) => sent += 1,
            Err(Error::WouldBlock(_)) => break,
            Err(e) => panic!("try_send: {e}"),
        }
        assert!(sent < 10_000, "a pipe of 64 KiB took {sent} messages of 4 KiB without blocking");
    }
    assert!(sent >= 2, "only {sent} messages went before the pipe was full");
    let mut buf = [0u8; 4096];
    for i in 0..sent {
        let (n, _) = client.recv_with_handles(&mut buf).unwrap();
        assert_eq!((n, u32::from_le_bytes(buf[..4].try_into().unwrap())), (4096, i));
    }
    server.try_send_with_handles(b"after", &[]).unwrap();
    let (n, _) = client.recv_with_handles(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");
}

/// A message that has arrived in part is not taken by a try; once whole, it is.
#[test]
fn a_try_recv_waits_for_the_whole_message() {
    let (_listener, server, client) = pair(&test_child::unique("lf-part"));
    let mut frame = 10u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(b"01234");
    let mut buf = [0u8; 16];
    server.send_raw_for_tests(&frame[..3]).unwrap();
    assert!(client.try_recv_with_handles(&mut buf).unwrap().is_none());
    server.send_raw_for_tests(&frame[3..]).unwrap();
    assert!(client.try_recv_with_handles(&mut buf).unwrap().is_none());
    server.send_raw_for_tests(b"56789").unwrap();
    let (n, handles) = client.try_recv_with_handles(&mut buf).unwrap().expect("the whole message");
    assert_eq!((&buf[..n], handles.len()), (&b"0123456789"[..], 0));
}

/// A peer that breaks the framing: too many handles, a zero or oversized length, values that
/// are no handles of the receiver's, a message larger than the buffer.
#[test]
fn malformed_frames_are_corrupt() {
    let frame = |len: u32, values: &[u64], payload: &[u8]| {
        let mut f = len.to_le_bytes().to_vec();
        f.extend_from_slice(&(values.len() as u32).to_le_bytes());
        values.iter().for_each(|v| f.extend_from_slice(&v.to_le_bytes()));
        f.extend_from_slice(payload);
        f
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (frame(1, &[4; MAX_HANDLES + 1], b""), "handles"),
        (frame(0, &[], b""), "bytes"),
        (frame(MAX_PAYLOAD as u32 + 1, &[], b""), "bytes"),
        (frame(1, &[0xfff0_0000], b"x"), "not a handle"),
        (frame(1, &[u64::MAX - 1], b"x"), "not a handle"),
        (frame(20, &[], &[1; 20]), "at most"),
    ];
    for (bytes, expected) in cases {
        let (_listener, server, client) = pair(&test_child::unique("lf-bad"));
        server.send_raw_for_tests(&bytes).unwrap();
        let mut buf = [0u8; 16];
        match client.recv_with_handles(&mut buf) {
            Err(Error::Corrupt(m)) => assert!(m.contains(expected), "{m}"),
            other => panic!("a malformed frame ({expected}) was taken: {other:?}"),
        }
    }
}

/// Across processes: the parent passes a section (writable) and its read-only handle; the
/// child maps both, refuses a writable view through the read-only one, waits on a word the
/// parent then changes, writes its answer for the parent to read, and passes the parent an
/// event that the parent then sets.
#[test]
fn shared_memory_crosses_processes_through_the_stream() {
    let test = test_child::test_path(module_path!(), "shared_memory_crosses_processes_through_the_stream");
    if test_child::role().as_deref() == Some("shm") {
        let stream =
            connect_name(&std::env::var("LF_TEST_PIPE").unwrap(), Instant::now() + Duration::from_secs(60)).unwrap();
        assert!(stream.peer().same_user);
        let mut buf = [0u8; 8];
        let (n, handles) = stream.recv_with_handles(&mut buf).unwrap();
        assert_eq!((&buf[..n], handles.len()), (&b"memory"[..], 2));
        let size = shm::size_of(&handles[0]).unwrap() as usize;
        let view = Mapping::shared(&handles[0], 0, size).unwrap();
        assert!(matches!(Mapping::shared(&handles[1], 0, size), Err(Error::PermissionDenied(_))));
        let read_only = Mapping::shared_read_only(&handles[1], 0, size).unwrap();
        // SAFETY: both views are live and `size` bytes long; the word is 4-aligned.
        unsafe {
            assert_eq!(read_only.as_ptr().add(8).read(), 0x11);
            let word = AtomicU32::from_ptr(view.as_ptr().cast());
            word.store(1, Ordering::Release);
            while word.load(Ordering::Acquire) == 1 {
                wait::wait(word, 1, Some(Duration::from_secs(1)));
            }
            view.as_ptr().add(9).write(0x22);
        }
        let (waited, notifier) = notify::notify_pair().unwrap();
        stream.send_with_handles(b"done", &[notifier.as_handle()]).unwrap();
        drop(notifier);
        // SAFETY: a valid event handle.
        let r = unsafe { WaitForSingleObject(waited.as_raw_handle(), 60_000) };
        assert_eq!(r, WAIT_OBJECT_0, "the parent's notification never came");
        return;
    }
    let name = test_child::unique("lf-xshm");
    let listener = Listener::bind_name(&name).unwrap();
    let mut child = test_child::spawn(&test, "shm", &[("LF_TEST_PIPE", name)]);
    let stream = listener.accept(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(
        stream.peer(),
        PeerIdentity { pid: child.id() as i32, same_user: true, uid: crate::os::windows::user::id() }
    );
    let section = shm::create("lf-xshm", 65536, ShmOptions::default()).unwrap();
    let view = Mapping::shared(&section, 0, 65536).unwrap();
    // SAFETY: the view is live and 65536 bytes long; the word is 4-aligned.
    let word = unsafe {
        view.as_ptr().add(8).write(0x11);
        AtomicU32::from_ptr(view.as_ptr().cast())
    };
    let read_only = shm::read_only(&section, "a test section").unwrap();
    stream.send_with_handles(b"memory", &[section.as_handle(), read_only.as_handle()]).unwrap();
    let start = Instant::now();
    while word.load(Ordering::Acquire) != 1 {
        assert!(start.elapsed() < Duration::from_secs(60), "the child never wrote the word");
        wait::wait(word, 0, Some(Duration::from_millis(10)));
    }
    word.store(2, Ordering::Release);
    wait::wake(word, 1);
    let mut buf = [0u8; 8];
    let notifier = stream.recv_exact_with_handle(&mut buf[..4], "the child's notifier").unwrap();
    assert_eq!(&buf[..4], b"done");
    notify::check_end(&notifier, "the child's notifier").unwrap();
    notify::notify(notifier.as_handle());
    // SAFETY: the view is live and 65536 bytes long.
    assert_eq!(unsafe { view.as_ptr().add(9).read() }, 0x22);
    assert!(child.wait().unwrap().success());
    assert_eq!(stream.recv_with_handles(&mut buf).unwrap().0, 0, "the exited child's stream did not end");
}

/// A child killed with `TerminateProcess` (what `Child::kill` does) is seen by its process
/// handle and by a watch on it, and its stream ends.
#[test]
fn a_killed_peer_is_seen_by_its_process_the_watcher_and_the_stream() {
    let test = test_child::test_path(module_path!(), "a_killed_peer_is_seen_by_its_process_the_watcher_and_the_stream");
    if test_child::role().as_deref() == Some("victim") {
        let stream =
            connect_name(&std::env::var("LF_TEST_PIPE").unwrap(), Instant::now() + Duration::from_secs(60)).unwrap();
        stream.send_with_handles(b"up", &[]).unwrap();
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let name = test_child::unique("lf-kill");
    let listener = Listener::bind_name(&name).unwrap();
    let mut child = test_child::spawn(&test, "victim", &[("LF_TEST_PIPE", name)]);
    let stream = listener.accept(Some(Duration::from_secs(60))).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(stream.recv_with_handles(&mut buf).unwrap().0, 2);
    let pid = stream.peer().pid;
    assert_eq!(pid, child.id() as i32);
    let peer = Arc::new(PeerProcess::open(pid).expect("opening the live child"));
    assert!(!peer.has_exited());
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    let watched: SharedHandle = peer.clone();
    let _watch = Watch::new(vec![(watched, Interest::Readable)], move || f.store(true, Ordering::SeqCst)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!fired.load(Ordering::SeqCst), "the watch fired while the child lived");
    assert!(stream.try_recv_with_handles(&mut buf).unwrap().is_none());
    child.kill().unwrap();
    assert!(peer.wait_for_exit(Duration::from_secs(10)), "the killed child was not seen to exit");
    let start = Instant::now();
    while !fired.load(Ordering::SeqCst) {
        assert!(start.elapsed() < Duration::from_secs(10), "the watch never fired");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(stream.recv_with_handles(&mut buf).unwrap().0, 0, "the killed child's stream did not end");
    assert!(matches!(stream.send_with_handles(b"x", &[]), Err(Error::PeerGone(_))));
    child.wait().unwrap();
}

/// The Unix-shaped calls: a listener bound at a path, taken from without waiting, and a
/// single connection attempt that says `NotFound` where nobody listens.
#[test]
fn a_listener_at_a_path_is_found_by_the_path() {
    let dir = std::env::temp_dir().join(test_child::unique("lf-at"));
    let path = dir.join("chan.sock");
    assert_eq!(connect(&path).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    let listener = Listener::bind(&path).unwrap();
    assert!(listener.try_accept().unwrap().is_none(), "a client appeared from nowhere");
    assert!(matches!(Listener::bind(&path), Err(Error::InvalidState(_))), "a second listener at one path");
    let other = Listener::bind(&std::env::temp_dir().join(test_child::unique("lf-at")).join("chan.sock")).unwrap();
    let client = connect(&path).unwrap();
    let start = Instant::now();
    let server = loop {
        if let Some(stream) = listener.try_accept().unwrap() {
            break stream;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the connection was never accepted");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(other.try_accept().unwrap().is_none(), "a path in another directory took the connection");
    client.send_with_handles(b"hi", &[]).unwrap();
    let mut buf = [0u8; 4];
    let (n, _) = server.recv_with_handles(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hi");
}

/// A read timeout ends a read that gets nothing, as on a Unix socket (`WouldBlock`); once
/// cleared, reads wait again and get what comes.
#[test]
fn a_read_timeout_ends_an_empty_read_with_would_block() {
    let name = test_child::unique("lf-timeout");
    let listener = Listener::bind_name(&name).unwrap();
    let n = name.clone();
    let client = std::thread::spawn(move || connect_name(&n, Instant::now() + Duration::from_secs(30)).unwrap());
    let server = listener.accept(Some(Duration::from_secs(30))).unwrap();
    let client = client.join().unwrap();
    assert!(server.set_read_timeout(Some(Duration::ZERO)).is_err(), "a zero timeout means nothing");
    server.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 8];
    let start = Instant::now();
    match server.recv_with_handles(&mut buf) {
        Err(Error::Io { source, .. }) => assert_eq!(source.kind(), std::io::ErrorKind::WouldBlock),
        other => panic!("a read with nothing to get: {other:?}"),
    }
    assert!(start.elapsed() >= Duration::from_millis(90), "the read gave up before its timeout");
    server.set_read_timeout(None).unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        client.send_with_handles(b"late", &[]).unwrap();
        client
    });
    let (n, _) = server.recv_with_handles(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"late");
    drop(sender.join().unwrap());
}
