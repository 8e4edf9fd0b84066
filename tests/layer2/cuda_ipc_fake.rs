//! The CUDA IPC route between real processes without CUDA, on the test hooks' stand-in for the
//! driver (`LF_TEST_FAKE_CUDA_IPC=1`), which "opens" an allocation at an address derived from
//! its buffer id and touches no memory: the route's negotiation, what a hostile producer's
//! descriptors get, and the refusals that need no driver. The GPU host's tests, against the
//! driver, are in cuda_ipc.rs.

use std::time::Duration;

use lava_flow::channels::{Consumer, Producer};
use lava_flow::memory::Buffer;
use lava_flow::Error;

use crate::common::*;

const SLOTS: usize = 4096;
const SLOT: usize = 128;
const KIND_ROUTED_CUDA: u32 = 4 | 3 << 8;
const MESSAGES: u64 = 40;
const HOSTILE: [&str; 4] = ["slot", "generation", "range", "ready"];

/// Where the stand-in opens the allocation of buffer id `id`.
fn fake_address(id: u64) -> u64 {
    0x1000_0000_0000 + (id << 24)
}

/// A registration of CUDA memory described by hand (no memory at all: nothing may read it).
fn fake_cuda(id: u64) -> Buffer {
    use lava_flow::memory::{CudaMemoryKind, CudaPointer};
    let pointer = CudaPointer {
        kind: CudaMemoryKind::Legacy,
        base: 0x7000_0000_0000 + (id << 32),
        size: 1 << 20,
        buffer_id: id,
        device_ordinal: 0,
        context: 0,
    };
    ctx().register_cuda_for_tests(pointer).unwrap()
}

fn spawn_fake(test: &str, role: &str, dir: &std::path::Path, variant: &str) -> std::process::Child {
    let envs = [
        ("LF_RUNTIME_DIR", dir.display().to_string()),
        ("LF_TEST_FAKE_CUDA_IPC", "1".to_owned()),
        ("LF_TEST_ARG_variant", variant.to_owned()),
    ];
    crate::child::Spawn { test, role, envs: &envs, socket: false, capture_stderr: false }.start().0
}

fn fan_in_config() -> lava_flow::channels::ChannelConfig {
    lava_flow::channels::ChannelConfig {
        kind: lava_flow::channels::ChannelKind::FanIn,
        max_peers: 2,
        ..config(strategy("spin"))
    }
}

/// The route is negotiated between two real processes (the report names it), CUDA messages
/// and host messages of one producer keep their order, and a hostile producer's descriptor
/// (a slot never announced, another generation, bytes past the allocation, a ready value on a
/// channel that shares no ready semaphore) is `Corrupt`,
/// naming its slot, and detaches only it: the other producer goes on to its last message.
#[test]
fn hostile_cuda_descriptors_detach_only_their_producer() {
    const TEST: &str = "cuda_ipc_fake::hostile_cuda_descriptors_detach_only_their_producer";
    let name = || format!("cuda-hostile-{}", arg("variant"));
    match child_role().as_deref() {
        Some("hostile") => {
            let cuda = fake_cuda(1);
            let mut p = Producer::create(&ctx(), &name(), &here(), &here(), &fan_in_config()).unwrap();
            assert!(p.transport().reason.contains("CUDA memory: cuda_ipc"), "{}", p.transport().reason);
            assert_eq!(p.send_buffer(&cuda, 0, 64).unwrap(), 0);
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
            let (base, _) = region_of(&name());
            // "ready": a descriptor right in every field but a ready value, on a channel whose
            // producer shares no ready semaphore (no GPU route: neither end has Vulkan here).
            let (slot_id, generation, offset, ready): (u32, u32, u64, u64) = match arg("variant").as_str() {
                "slot" => (9, 1, 0, 0),
                "generation" => (0, 7, 0, 0),
                "ready" => (0, 1, 0, 5),
                _ => (0, 1, (1 << 20) - 8, 0),
            };
            use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
            let slot = SLOTS + SLOT;
            // SAFETY: the test owns the mapping and writes inside ring slot 1.
            unsafe {
                let at = |off: usize| &*(base.add(slot + off) as *const AtomicU64);
                let at32 = |off: usize| &*(base.add(slot + off) as *const AtomicU32);
                at32(16).store(slot_id, Ordering::Relaxed);
                at32(20).store(generation, Ordering::Relaxed);
                at(24).store(offset, Ordering::Relaxed);
                at(32).store(64, Ordering::Relaxed);
                at(40).store(ready, Ordering::Relaxed);
                at32(8).store(32, Ordering::Relaxed);
                at32(12).store(KIND_ROUTED_CUDA, Ordering::Relaxed);
                at(0).store(2, Ordering::SeqCst);
            }
            report("written", 1);
            // Kept open until the consumer has judged the message; then detached.
            let _ = p.wait_completed(1, Some(Duration::from_secs(5)));
        }
        Some("producer") => {
            let cuda = fake_cuda(2);
            let mut p = Producer::create(&ctx(), &name(), &here(), &here(), &fan_in_config()).unwrap();
            for seq in 0..MESSAGES {
                let sent = match seq % 2 {
                    0 => p.send_buffer(&cuda, seq as usize * 64, 64),
                    _ => p.send(&seq.to_le_bytes()),
                };
                assert_eq!(sent.unwrap(), seq);
            }
            p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), &name(), &here(), &here(), &fan_in_config()).unwrap();
            let (mut good, mut hostile_slot, mut corrupt) = (0u64, None, 0);
            loop {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Ok(m) => match m.cuda_ptr() {
                        Ok((address, 0)) if address == fake_address(1) => hostile_slot = Some(m.producer()),
                        Ok((address, 0)) => {
                            assert_eq!(m.sequence(), good, "the good producer's order");
                            assert_eq!(address, fake_address(2) + good * 64);
                            assert!(m.as_slice().is_empty() && m.len() == 64);
                            good += 1;
                        }
                        Ok(other) => panic!("{other:?}"),
                        Err(e) => {
                            assert!(
                                matches!(e, Error::InvalidState(ref why) if why.contains("not CUDA memory")),
                                "{e}"
                            );
                            assert_eq!((m.sequence(), &*m), (good, &good.to_le_bytes()[..]));
                            good += 1;
                        }
                    },
                    Err(Error::Corrupt(why)) => {
                        let slot = hostile_slot.expect("the hostile producer's good message came first");
                        assert!(why.contains(&format!("slot {slot}")) && why.contains("detached"), "{why}");
                        if arg("variant") == "ready" {
                            assert!(why.contains("shares no ready semaphore"), "{why}");
                        }
                        corrupt += 1;
                        println!("corrupt: {why}");
                        report("corrupt", slot);
                    }
                    Err(Error::PeerGone(_)) if good == MESSAGES => break,
                    Err(Error::PeerGone(_)) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(corrupt, 1, "one hostile message, reported once");
        }
        Some(_) => {}
        None => {
            for variant in HOSTILE {
                let dir = test_dir(&format!("cuda-hostile-{variant}"));
                let mut c = spawn_fake(TEST, "consumer", &dir, variant);
                let mut c_out = stdout_of(&mut c);
                let mut hostile = spawn_fake(TEST, "hostile", &dir, variant);
                let mut h_out = stdout_of(&mut hostile);
                expect_line(&mut h_out, "written");
                let producer = spawn_fake(TEST, "producer", &dir, variant);
                let slot = expect_line(&mut c_out, "corrupt");
                println!("{variant}: the hostile producer in slot {slot} was detached");
                wait_ok(producer, "producer");
                wait_ok(hostile, "hostile producer");
                wait_ok(c, "consumer");
                assert_dir_empty(&dir);
            }
        }
    }
}

/// A stream-ordered send of CUDA memory on a channel that shares no ready semaphore with its
/// consumer (no GPU route between them sharing one: here neither end has a Vulkan device that
/// exports semaphores) is refused, naming why and the way out, and sends nothing; the same
/// memory sent without a ready value arrives with ready value 0. The report says how CUDA
/// memory is synchronised.
#[test]
fn a_ready_value_without_a_shared_semaphore_is_refused_naming_the_way_out() {
    const TEST: &str = "cuda_ipc_fake::a_ready_value_without_a_shared_semaphore_is_refused_naming_the_way_out";
    match child_role().as_deref() {
        Some("producer") => {
            let cuda = fake_cuda(4);
            let mut p = Producer::create(&ctx(), "cuda-ready", &here(), &here(), &config(strategy("spin"))).unwrap();
            let reason = p.transport().reason.clone();
            assert!(reason.contains("CUDA memory: cuda_ipc"), "{reason}");
            assert!(reason.contains("host-side synchronisation (CUDA memory is complete when sent)"), "{reason}");
            let err = p.send_buffer_after(&cuda, 0, 64, 1, None).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::Unsupported(_)), "{err}");
            assert!(text.contains("shares no ready semaphore"), "{err}");
            assert!(text.contains("cudaStreamSynchronize") && text.contains("without a ready value"), "{err}");
            println!("refused: {err}");
            assert_eq!(p.send_buffer(&cuda, 64, 64).unwrap(), 0, "nothing went before");
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "cuda-ready", &here(), &here(), &config(strategy("spin"))).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!((m.sequence(), m.ready_value()), (0, 0));
            assert_eq!(m.cuda_ptr().unwrap(), (fake_address(4) + 64, 0));
            assert!(c.ready_semaphore().is_err(), "no semaphore to wait on");
            drop(m);
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            let dir = test_dir("cuda-ready");
            let c = spawn_fake(TEST, "consumer", &dir, "ready");
            let p = spawn_fake(TEST, "producer", &dir, "ready");
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// A consumer that cannot open CUDA memory (here: no CUDA driver; on a GPU host, not the
/// stand-in's device) declines the route at the rendezvous: the producer's report says so, and
/// its send of CUDA memory is refused naming why, copying nothing.
#[test]
fn a_consumer_that_cannot_open_cuda_memory_has_the_send_refused_naming_why() {
    const TEST: &str = "cuda_ipc_fake::a_consumer_that_cannot_open_cuda_memory_has_the_send_refused_naming_why";
    match child_role().as_deref() {
        Some("producer") => {
            let cuda = fake_cuda(3);
            let mut p = Producer::create(&ctx(), "cuda-declined", &here(), &here(), &config(strategy("spin"))).unwrap();
            let reason = p.transport().reason.clone();
            let err = p.send_buffer(&cuda, 0, 64).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::Unsupported(_)), "{err}");
            assert!(text.contains("copies none") || text.contains("cannot see"), "{err}");
            if text.contains("copies none") {
                // The consumer's own words on why, through the producer's report.
                assert!(reason.contains("CUDA memory: refused at send"), "{reason}");
                assert!(text.contains("the consumer cannot open CUDA memory: "), "{err}");
            }
            println!("refused: {err}");
            p.send(b"done").unwrap();
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "cuda-declined", &here(), &here(), &config(strategy("spin"))).unwrap();
            assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), b"done", "nothing else came");
        }
        Some(_) => {}
        None => {
            let dir = test_dir("cuda-declined");
            // The producer runs on the stand-in (it offers the route); the consumer does not.
            let c = spawn(TEST, "consumer", &dir, &[]);
            let p = spawn_fake(TEST, "producer", &dir, "declined");
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// Where the stand-in imports the pool allocation of buffer id `id`.
fn fake_pool_address(id: u64) -> u64 {
    0x3000_0000_0000 + (id << 24)
}

/// A registration of memory of a CUDA memory pool described by hand (the stand-in names its
/// pool by the 4 GiB region of `base`).
fn fake_pool_memory(id: u64, base: u64) -> Buffer {
    use lava_flow::memory::{CudaMemoryKind, CudaPointer};
    let pointer =
        CudaPointer { kind: CudaMemoryKind::Pool, base, size: 1 << 20, buffer_id: id, device_ordinal: 0, context: 0 };
    ctx().register_cuda_for_tests(pointer).unwrap()
}

/// Memory of a CUDA memory pool between real processes on the stand-in: the pool's fd crosses
/// with SCM_RIGHTS once, each allocation's export data once; messages into two allocations of
/// one pool and one re-allocated at the same base (a new buffer id) each reach the consumer at
/// their own import's address, in order; the report names the pool route.
#[test]
fn pool_memory_goes_by_reference_and_a_reallocation_is_imported_anew() {
    const TEST: &str = "cuda_ipc_fake::pool_memory_goes_by_reference_and_a_reallocation_is_imported_anew";
    const BASE: u64 = 0x7200_0000_0000;
    match child_role().as_deref() {
        Some("producer") => {
            let mut p = Producer::create(&ctx(), "cuda-pool", &here(), &here(), &config(strategy("spin"))).unwrap();
            let reason = p.transport().reason.clone();
            assert!(reason.contains("memory of a CUDA memory pool that exports fds as its pool's fd"), "{reason}");
            let first = fake_pool_memory(11, BASE);
            let second = fake_pool_memory(12, BASE + (1 << 20));
            assert_eq!(p.send_buffer(&first, 64, 64).unwrap(), 0);
            assert_eq!(p.send_buffer(&second, 0, 128).unwrap(), 1);
            assert_eq!(p.send_buffer(&first, 4096, 64).unwrap(), 2);
            p.wait_completed(2, Some(Duration::from_secs(30))).unwrap();
            // Freed and re-allocated at the same base: a new buffer id.
            drop(first);
            let again = fake_pool_memory(13, BASE);
            assert_eq!(p.send_buffer(&again, 64, 64).unwrap(), 3);
            p.wait_completed(3, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "cuda-pool", &here(), &here(), &config(strategy("spin"))).unwrap();
            for (id, offset, len) in [(11, 64, 64), (12, 0, 128), (11, 4096, 64), (13, 64, 64)] {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                let reason = c.transport().reason.clone();
                assert!(reason.contains("memory of a CUDA memory pool imported from its pool"), "{reason}");
                assert_eq!(m.cuda_ptr().unwrap(), (fake_pool_address(id) + offset, 0), "buffer id {id}");
                assert_eq!(m.len(), len);
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            let dir = test_dir("cuda-pool");
            let c = spawn_fake(TEST, "consumer", &dir, "pool");
            let p = spawn_fake(TEST, "producer", &dir, "pool");
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}
