//! GPU buffers on a fan-out between real processes on one GPU (lavapipe in CI): one memory sent
//! by reference to every consumer through the Vulkan IPC route, complete after the last
//! release; a late consumer gets the arenas it never saw; a consumer killed while it holds a
//! GPU message neither stops the producer nor keeps its memory. The tests skip, saying why,
//! without a Vulkan device, and fail then under `LF_REQUIRE_VULKAN=1`.

use std::path::Path;
use std::time::{Duration, Instant};

use lava_flow::channels::{ChannelConfig, ChannelKind, Consumer, PeerState, Producer};
use lava_flow::memory::MemoryLocation;
use lava_flow::Error;

use crate::common::*;
use crate::gpu::{check_gpu, gpu_config, gpu_ctx, write_message};

fn fan_out_gpu(max_peers: u32) -> ChannelConfig {
    ChannelConfig { kind: ChannelKind::FanOut, max_peers, ..gpu_config() }
}

fn flag(name: &str) -> String {
    Path::new(&arg("scratch")).join(name).display().to_string()
}

fn wait_for_file(path: &str) {
    let start = Instant::now();
    while !Path::new(path).exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "{path} never appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `count` consumers are attached (met ones included: the next send takes them up).
fn wait_alive(p: &Producer, count: usize) {
    let start = Instant::now();
    while p.peers().iter().filter(|c| c.state == PeerState::Alive).count() < count {
        assert!(start.elapsed() < Duration::from_secs(30), "{:?}", p.peers());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A GPU buffer (DEVICE_LOCAL and HOST_VISIBLE) fanned out to four consumer processes goes by
/// reference through vulkan_ipc: every consumer reads the bytes, each imports each arena once,
/// and the message is complete only after the fourth release. A fifth consumer that attaches
/// later gets a message into an arena the others imported already, and its arena with it.
#[test]
fn a_gpu_buffer_goes_to_four_consumers_by_reference() {
    const TEST: &str = "fan_out_gpu::a_gpu_buffer_goes_to_four_consumers_by_reference";
    const LEN: usize = 256 << 10;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut p = Producer::create(&context, "fanout-gpu", &here(), &here(), &fan_out_gpu(5)).unwrap();
            wait_alive(&p, 4);
            let device_local = context.allocate(2 * LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            let host_visible = context.allocate(LEN, MemoryLocation::GpuHostVisible).unwrap();
            write_message(&device_local, 0, LEN, 0);
            write_message(&host_visible, 0, LEN, 1);
            assert_eq!(p.send_buffer(&device_local, 0, LEN).unwrap(), 0);
            let last = p.send_buffer(&host_visible, 0, LEN).unwrap();
            assert_eq!(last, 1);
            let info = p.transport();
            assert_eq!(info.names(), "shm+vulkan_ipc", "{}", info.reason);
            assert!(info.reason.contains("vulkan_ipc, by reference"), "{}", info.reason);
            assert_eq!(p.peers().iter().filter(|c| c.state == PeerState::Alive).count(), 4);
            // Released by one consumer after another: not complete while any holds it.
            for k in 0..4 {
                assert_eq!(p.completed().unwrap(), 0, "complete while consumers {k}..3 hold the messages");
                let err = p.wait_completed(last, Some(Duration::from_millis(100))).unwrap_err();
                assert!(matches!(err, Error::Timeout(_)), "{err}");
                std::fs::write(flag(&format!("release-{k}")), b"").unwrap();
                wait_for_file(&flag(&format!("released-{k}")));
            }
            p.wait_completed(last, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(p.completed().unwrap(), 2);
            // A late consumer; then a message into the DEVICE_LOCAL arena that it never saw.
            report("early_done", 1);
            wait_alive(&p, 5);
            write_message(&device_local, LEN, LEN, 2);
            assert_eq!(p.send_buffer(&device_local, LEN, LEN).unwrap(), 2);
            let mut bytes = vec![0u8; 3000];
            message_into(&mut bytes, 3);
            let last = p.send(&bytes).unwrap();
            p.wait_completed(last, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(p.peers().iter().filter(|c| c.state == PeerState::Alive).count(), 5);
        }
        Some(role @ ("consumer" | "late")) => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "fanout-gpu", &here(), &here(), &fan_out_gpu(5)).unwrap();
            assert_eq!(c.transport().names(), "shm+vulkan_ipc", "{}", c.transport().reason);
            let imported_before = context.imported_arenas();
            let recv = |c: &mut Consumer| c.recv_timeout(Duration::from_secs(30)).unwrap();
            let first = if role == "consumer" {
                let index = arg("index");
                let held = [recv(&mut c), recv(&mut c)];
                for (seq, m) in held.iter().enumerate() {
                    assert_eq!(m.sequence(), seq as u64);
                    assert_eq!(m.len(), LEN);
                    // By reference: a buffer over the producer's GPU memory, read on the GPU or
                    // through its mapping.
                    check_gpu(&context, m, seq as u64, seq == 0);
                }
                wait_for_file(&flag(&format!("release-{index}")));
                drop(held);
                std::fs::write(flag(&format!("released-{index}")), b"").unwrap();
                2
            } else {
                0
            };
            let m = recv(&mut c);
            assert_eq!(m.sequence(), first, "a late consumer counts from 0");
            check_gpu(&context, &m, 2, false);
            drop(m);
            check(&recv(&mut c), 3);
            // The early ones imported the DEVICE_LOCAL and HOST_VISIBLE arenas once each; the
            // late one the DEVICE_LOCAL arena, announced to it with its first message there.
            let imported = context.imported_arenas() - imported_before;
            assert_eq!(imported, if role == "consumer" { 2 } else { 1 }, "each arena is imported once");
            let err = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("fanout-gpu");
            let scratch = scratch_dir();
            let scratch_arg = ("scratch", scratch.path().display().to_string());
            let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, std::slice::from_ref(&scratch_arg));
            let consumers: Vec<_> = (0..4)
                .map(|k| spawn(TEST, "consumer", &dir, &[scratch_arg.clone(), ("index", k.to_string())]))
                .collect();
            expect_line(&mut p_out, "early_done");
            let late = spawn(TEST, "late", &dir, std::slice::from_ref(&scratch_arg));
            wait_ok(p, "producer");
            for c in consumers {
                wait_ok(c, "consumer");
            }
            wait_ok(late, "late consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// kill -9 of one of four consumers while it holds a GPU message sent by reference: the
/// producer's wait for the message ends once the others released it, the producer goes on,
/// and the memory goes back to the driver while the channel lives (the dead consumer's hold
/// with its end; the others' once the buffer is freed and their next GPU message is packed).
#[test]
fn a_killed_consumer_gives_its_gpu_message_back() {
    const TEST: &str = "fan_out_gpu::a_killed_consumer_gives_its_gpu_message_back";
    // Over a quarter of the 64 MiB GPU arena: each buffer has an arena of its own.
    const LEN: usize = 20 << 20;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut p = Producer::create(&context, "fanout-gpu-kill", &here(), &here(), &fan_out_gpu(4)).unwrap();
            wait_alive(&p, 4);
            let first = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            let one_arena = context.gpu_allocated_bytes();
            assert!(one_arena >= LEN as u64, "{one_arena}");
            write_message(&first, 0, LEN, 0);
            let seq = p.send_buffer(&first, 0, LEN).unwrap();
            report("sent", seq);
            wait_for_file(&flag("killed"));
            // The three others released it; the dead one is dropped.
            p.wait_completed(seq, Some(Duration::from_secs(20))).unwrap();
            assert_eq!(p.peers().iter().filter(|c| c.state == PeerState::Alive).count(), 3, "{:?}", p.peers());
            for n in 1..=10u64 {
                p.send(&n.to_le_bytes()).unwrap();
            }
            let second = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            assert_eq!(context.gpu_allocated_bytes(), 2 * one_arena, "each buffer in an arena of its own");
            drop(first);
            write_message(&second, 0, LEN, 11);
            let last = p.send_buffer(&second, 0, LEN).unwrap();
            p.wait_completed(last, Some(Duration::from_secs(30))).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                context.trim();
                let now = context.gpu_allocated_bytes();
                if now <= one_arena {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{now} bytes of GPU memory are allocated while the channel lives, after the first buffer was \
                     freed: the dead consumer's hold on it (or the others') was kept"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Some(role @ ("keeper" | "victim")) => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "fanout-gpu-kill", &here(), &here(), &fan_out_gpu(4)).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            check_gpu(&context, &m, 0, false);
            if role == "victim" {
                report("holding", 1);
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            drop(m);
            report("released", 1);
            for n in 1..=10u64 {
                assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), &n.to_le_bytes());
            }
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            check_gpu(&context, &m, 11, false);
            drop(m);
            let err = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("fanout-gpu-kill");
            let scratch = scratch_dir();
            let args = [("scratch", scratch.path().display().to_string())];
            let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &args);
            let (mut victim, mut v_out) = spawn_reporting(TEST, "victim", &dir, &args);
            let mut keepers: Vec<_> = (0..3).map(|_| spawn_reporting(TEST, "keeper", &dir, &args)).collect();
            expect_line(&mut p_out, "sent");
            expect_line(&mut v_out, "holding");
            for (_, out) in keepers.iter_mut() {
                expect_line(out, "released");
            }
            kill9(&mut victim);
            std::fs::write(scratch.path().join("killed"), b"").unwrap();
            wait_ok(p, "producer");
            for (c, _) in keepers {
                wait_ok(c, "keeper");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
