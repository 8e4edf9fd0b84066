//! Pair channels between two real Windows processes (run under Wine on Linux): copies in
//! order, a loan, a buffer sent by reference, the producer's death seen by the consumer, and
//! a second consumer refused. Each test runs its other end in a child process (this test
//! binary again, `os::test_child`).

use std::time::{Duration, Instant};

use crate::channels::{ChannelConfig, Consumer, Producer};
use crate::error::Error;
use crate::memory::{Context, ContextConfig, MemoryLocation};
use crate::os::test_child;
use crate::types::ProcessLocation;

const CHANNEL_ENV: &str = "LF_TEST_CHANNEL";
const COPIES: u32 = 200;

fn ctx() -> Context {
    static CONTEXT: std::sync::OnceLock<Context> = std::sync::OnceLock::new();
    CONTEXT.get_or_init(|| Context::new(ContextConfig::default()).expect("memory context")).clone()
}

fn here() -> ProcessLocation {
    ProcessLocation::from_hostname().unwrap()
}

fn config() -> ChannelConfig {
    ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(60)), ..Default::default() }
}

fn channel() -> String {
    std::env::var(CHANNEL_ENV).expect("the channel's name from the parent")
}

/// Message `i`'s bytes: its length and contents both depend on `i`.
fn copy_of(i: u32) -> Vec<u8> {
    (0..(1 + i as usize * 37) % 3000 + 1).map(|at| (at as u32 ^ i.wrapping_mul(31)) as u8).collect()
}

fn buffer_bytes() -> Vec<u8> {
    (0..4000u32).map(|at| (at * 7 + 3) as u8).collect()
}

#[test]
fn copies_a_loan_and_a_buffer_arrive_in_order_from_another_process() {
    let test = test_child::test_path(module_path!(), "copies_a_loan_and_a_buffer_arrive_in_order_from_another_process");
    if let Some(role) = test_child::role() {
        assert_eq!(role, "producer");
        let mut p = Producer::create(&ctx(), &channel(), &here(), &here(), &config()).unwrap();
        for i in 0..COPIES {
            assert_eq!(p.send(&copy_of(i)).unwrap(), u64::from(i));
        }
        let mut loan = p.loan(5000, None).unwrap();
        loan.as_mut_slice().fill(0x5a);
        assert_eq!(loan.publish().unwrap(), u64::from(COPIES));
        let buffer = ctx().allocate(1 << 16, MemoryLocation::CpuStandard).unwrap();
        buffer.write_at(100, &buffer_bytes()).unwrap();
        let last = p.send_buffer(&buffer, 100, 4000).unwrap();
        assert_eq!(last, u64::from(COPIES) + 1);
        p.wait_completed(last, Some(Duration::from_secs(60))).unwrap();
        return;
    }
    let name = test_child::unique("lf-win-pair");
    // The consumer's create waits for the producer: the child starts first.
    let mut child = test_child::spawn(&test, "producer", &[(CHANNEL_ENV, name.clone())]);
    let mut c = Consumer::create(&ctx(), &name, &here(), &here(), &config()).unwrap();
    for i in 0..COPIES {
        let m = c.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(m.sequence(), u64::from(i));
        assert!(&*m == copy_of(i).as_slice(), "message {i} arrived changed");
    }
    let loan = c.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(loan.len(), 5000);
    assert!(loan.iter().all(|&b| b == 0x5a), "the loan's bytes arrived changed");
    drop(loan);
    let by_reference = c.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(by_reference.sequence(), u64::from(COPIES) + 1);
    assert!(&*by_reference == buffer_bytes().as_slice(), "the buffer's bytes arrived changed");
    drop(by_reference);
    assert!(child.wait().unwrap().success(), "the producer failed (its output is above)");
    match c.recv_timeout(Duration::from_secs(30)) {
        Err(Error::PeerGone(_)) => {}
        other => panic!("expected PeerGone once the producer had closed, got {other:?}"),
    }
}

#[test]
fn the_consumer_sees_a_killed_producer_gone() {
    let test = test_child::test_path(module_path!(), "the_consumer_sees_a_killed_producer_gone");
    if test_child::role().is_some() {
        let mut p = Producer::create(&ctx(), &channel(), &here(), &here(), &config()).unwrap();
        p.send(b"alive").unwrap();
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let name = test_child::unique("lf-win-death");
    let mut child = test_child::spawn(&test, "producer", &[(CHANNEL_ENV, name.clone())]);
    let mut c = Consumer::create(&ctx(), &name, &here(), &here(), &config()).unwrap();
    assert_eq!(&*c.recv_timeout(Duration::from_secs(60)).unwrap(), b"alive");
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    match c.recv_timeout(Duration::from_secs(30)) {
        Err(Error::PeerGone(_)) => {}
        other => panic!("expected PeerGone after the producer was killed, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the producer's death was noticed only after {:?}",
        start.elapsed()
    );
}

#[test]
fn a_second_consumer_is_refused() {
    let test = test_child::test_path(module_path!(), "a_second_consumer_is_refused");
    match test_child::role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), &channel(), &here(), &here(), &config()).unwrap();
            p.send(b"taken").unwrap();
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        Some(_) => {
            let err = Consumer::create(&ctx(), &channel(), &here(), &here(), &config()).unwrap_err();
            assert!(matches!(err, Error::InvalidState(ref m) if m.contains("already has a live consumer")), "{err}");
            return;
        }
        None => {}
    }
    let name = test_child::unique("lf-win-taken");
    let mut producer = test_child::spawn(&test, "producer", &[(CHANNEL_ENV, name.clone())]);
    let mut c = Consumer::create(&ctx(), &name, &here(), &here(), &config()).unwrap();
    assert_eq!(&*c.recv_timeout(Duration::from_secs(60)).unwrap(), b"taken");
    let mut second = test_child::spawn(&test, "second-consumer", &[(CHANNEL_ENV, name.clone())]);
    let refused = second.wait().unwrap().success();
    producer.kill().unwrap();
    producer.wait().unwrap();
    assert!(refused, "the second consumer was not refused as it should be (output above)");
}
