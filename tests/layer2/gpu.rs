//! GPU buffers through a channel, between two real processes on one GPU (lavapipe in CI): by
//! reference through the Vulkan IPC route, in one order with CPU messages, each arena
//! imported once, completion, staging where the route cannot serve, kill -9 of either side,
//! hostile descriptors and leak cycles. The tests skip, saying why, without a Vulkan device,
//! and fail then under `LF_REQUIRE_VULKAN=1`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Message, Producer, TransportKind, WaitStrategy};
use lava_flow::memory::{Buffer, Context, ContextConfig, MemoryLocation};
use lava_flow::Error;

use crate::common::*;

/// This process's context with its GPU, or `None` (the test then skips) when there is none.
pub(crate) fn gpu_ctx() -> Option<Context> {
    let context = Context::new(ContextConfig::default()).expect("memory context");
    match context.gpu_unavailable_reason() {
        None => Some(context),
        Some(why) => {
            assert!(
                std::env::var("LF_REQUIRE_VULKAN").is_err(),
                "LF_REQUIRE_VULKAN is set but there is no Vulkan device: {why}"
            );
            eprintln!("skipped: no Vulkan device ({why})");
            None
        }
    }
}

pub(crate) fn gpu_config() -> ChannelConfig {
    config(WaitStrategy::SpinThenBlock { spin: Duration::from_micros(20) })
}

/// Writes message `seq` (sequence, checksum, payload) into `len` bytes at `offset` of `buffer`.
pub(crate) fn write_message(buffer: &Buffer, offset: usize, len: usize, seq: u64) {
    let mut bytes = vec![0u8; len];
    message_into(&mut bytes, seq);
    buffer.write_at(offset, &bytes).unwrap();
}

/// Reads a GPU message's bytes through its buffer and checks them.
pub(crate) fn check_gpu(context: &Context, m: &Message, seq: u64, copy_on_gpu: bool) {
    let buffer = m.buffer().expect("a GPU buffer");
    assert!(m.is_zero_copy());
    let mut bytes = vec![0u8; buffer.len()];
    if copy_on_gpu {
        // A GPU copy into a buffer of this process (which waits for the message's ready value
        // on the GPU), then read back.
        let own = context.allocate(buffer.len(), MemoryLocation::GpuDeviceLocal).unwrap();
        context.copy(&own, 0, buffer, 0, buffer.len()).unwrap();
        own.read_at(0, &mut bytes).unwrap();
    } else {
        buffer.read_at(0, &mut bytes).unwrap();
    }
    check(&bytes, seq);
}

/// What each message of the mixed stream is.
fn kind_of(seq: u64) -> &'static str {
    match seq % 5 {
        0 => "bytes",
        1 => "device-local",
        2 => "cpu-buffer",
        3 => "host-visible",
        _ => "large-own-arena",
    }
}

#[test]
fn gpu_buffers_and_cpu_messages_share_one_order() {
    const TEST: &str = "gpu::gpu_buffers_and_cpu_messages_share_one_order";
    const MESSAGES: u64 = 400;
    const LEN: usize = 64 << 10;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut p = Producer::create(&context, "gpu-order", &here(), &here(), &gpu_config()).unwrap();
            let names = p.transport().names();
            assert_eq!(names, "shm+vulkan_ipc", "{}", p.transport().reason);
            // Four regions per kind, each rewritten only once its previous message completed.
            let device_local = context.allocate(4 * LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            let host_visible = context.allocate(4 * LEN, MemoryLocation::GpuHostVisible).unwrap();
            // Over a quarter of the 64 MiB GPU arena: an arena of its own.
            let large = context.allocate(20 << 20, MemoryLocation::GpuDeviceLocal).unwrap();
            let cpu = context.allocate(4 * LEN, MemoryLocation::CpuStandard).unwrap();
            for seq in 0..MESSAGES {
                if let Some(previous) = seq.checked_sub(20) {
                    p.wait_completed(previous, Some(Duration::from_secs(30))).unwrap();
                }
                let region = ((seq / 5) % 4) as usize * LEN;
                let len = 16 + (seq as usize * 7919) % (LEN - 16);
                let sent = match kind_of(seq) {
                    "bytes" => {
                        let mut bytes = vec![0u8; len.min(4000)];
                        message_into(&mut bytes, seq);
                        p.send(&bytes)
                    }
                    kind => {
                        let buffer = match kind {
                            "device-local" => &device_local,
                            "host-visible" => &host_visible,
                            "large-own-arena" => &large,
                            _ => &cpu,
                        };
                        write_message(buffer, region, len, seq);
                        p.send_buffer(buffer, region, len)
                    }
                };
                assert_eq!(sent.unwrap(), seq);
            }
            p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(30))).unwrap();
            report("reason", &p.transport().reason);
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "gpu-order", &here(), &here(), &gpu_config()).unwrap();
            assert_eq!(c.transport().names(), "shm+vulkan_ipc");
            let imported_before = context.imported_arenas();
            for seq in 0..MESSAGES {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(m.sequence(), seq, "one order across every kind of message");
                match kind_of(seq) {
                    "bytes" => {
                        assert!(m.buffer().is_none());
                        check(&m, seq);
                    }
                    "cpu-buffer" => {
                        assert!(m.buffer().is_none() && m.is_zero_copy());
                        check(&m, seq);
                    }
                    _ => {
                        check_gpu(&context, &m, seq, seq % 3 == 0);
                        // The buffer can be handed on (to CUDA, say) while the message is held.
                        m.buffer().unwrap().export().unwrap();
                        assert_eq!(m.ready_value(), 0);
                    }
                }
            }
            // Three GPU arenas (the pooled DEVICE_LOCAL and HOST_VISIBLE ones and the large
            // buffer's own), each imported once however many messages pointed into it.
            assert_eq!(context.imported_arenas() - imported_before, 3, "each GPU arena is imported once");
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            // Both start orders.
            for first in ["consumer", "producer"] {
                let dir = test_dir(&format!("gpu-order-{first}"));
                let start = |role| spawn(TEST, role, &dir, &[]);
                let pause = || std::thread::sleep(Duration::from_millis(50));
                let (p, c) = if first == "producer" {
                    let p = start("producer");
                    pause();
                    (p, start("consumer"))
                } else {
                    let c = start("consumer");
                    pause();
                    (start("producer"), c)
                };
                wait_ok(p, "producer");
                wait_ok(c, "consumer");
                assert_dir_empty(&dir);
            }
        }
    }
}

#[test]
fn gpu_buffers_are_staged_where_the_route_cannot_serve() {
    const TEST: &str = "gpu::gpu_buffers_are_staged_where_the_route_cannot_serve";
    const LEN: usize = 100_000;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let case = arg("case");
            let mut config = gpu_config();
            if case == "shm-only" {
                config.transports = Some(vec![TransportKind::Shm]);
            }
            let mut p = Producer::create(&context, &format!("staged-{case}"), &here(), &here(), &config).unwrap();
            let reason = p.transport().reason.clone();
            assert_eq!(p.transport().names(), "shm", "{reason}");
            let why = if case == "shm-only" {
                "vulkan_ipc is not allowed"
            } else {
                "the consumer serves no GPU route (vulkan_ipc needs a Vulkan device"
            };
            assert!(reason.contains("GPU buffers: staged through shm") && reason.contains(why), "{reason}");
            let buffer = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&buffer, 0, LEN, 7);
            assert_eq!(p.send_buffer(&buffer, 0, LEN).unwrap(), 0);
            // The bytes were copied: the buffer may be rewritten at once.
            write_message(&buffer, 0, LEN, 8);
            assert!(matches!(p.send_buffer_after(&buffer, 0, LEN, 5, None), Err(Error::Unsupported(_))));
            assert!(matches!(p.ready_semaphore(), Err(Error::Unsupported(_))));
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
            drop(p);
            // Strict: the same channel refuses to stage (or, where semaphores cannot be shared,
            // to synchronise on the host), before or after meeting the consumer.
            let strict = ChannelConfig { strict_gpu: true, rendezvous_timeout: Some(Duration::from_secs(5)), ..config };
            let err = Producer::create(&context, &format!("strict-{case}"), &here(), &here(), &strict).unwrap_err();
            assert!(matches!(err, Error::Unsupported(ref m) if m.contains("strict_gpu")), "{err}");
        }
        Some("consumer") => {
            let case = arg("case");
            let context = if case == "no-gpu-consumer" {
                ctx()
            } else {
                let Some(context) = gpu_ctx() else { return };
                context
            };
            let mut config = gpu_config();
            if case == "shm-only" {
                config.transports = Some(vec![TransportKind::Shm]);
            }
            let mut c = Consumer::create(&context, &format!("staged-{case}"), &here(), &here(), &config).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(m.buffer().is_none() && !m.is_zero_copy(), "staged: host bytes");
            assert_eq!(m.len(), LEN);
            check(&m, 7);
            drop(m);
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
            drop(c);
            // The strict producer's attempt: it connects, reads the answer and leaves, unless it
            // refused before connecting.
            if case == "no-gpu-consumer" {
                let short = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(5)), ..config };
                if let Ok(mut c) = Consumer::create(&context, &format!("strict-{case}"), &here(), &here(), &short) {
                    assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
                }
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            for case in ["shm-only", "no-gpu-consumer"] {
                run_pair_with(TEST, &format!("gpu-staged-{case}"), &[("case", case.to_owned())]);
            }
        }
    }
}

#[test]
fn kill9_of_either_side_with_gpu_buffers_in_flight() {
    const TEST: &str = "gpu::kill9_of_either_side_with_gpu_buffers_in_flight";
    const LEN: usize = 1 << 20;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut p = Producer::create(&context, "gpu-kill", &here(), &here(), &gpu_config()).unwrap();
            let buffer = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&buffer, 0, LEN, 0);
            p.send_buffer(&buffer, 0, LEN).unwrap();
            report("sent", 1);
            if arg("victim") == "producer" {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            // The consumer holds message 0 and is killed: waiting for it ends in PeerGone.
            let started = monotonic_ns();
            let err = p.wait_completed(0, Some(Duration::from_secs(20))).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
            report("gone_after_ms", (monotonic_ns() - started) as f64 / 1e6);
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "gpu-kill", &here(), &here(), &gpu_config()).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            report("holding", 1);
            if arg("victim") == "consumer" {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            // The producer was killed: the held buffer stays readable (its import is this
            // process's), the next receive is PeerGone, and the import goes with the message.
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            check_gpu(&context, &m, 0, true);
            let started = monotonic_ns();
            assert!(matches!(c.recv_timeout(Duration::from_secs(20)), Err(Error::PeerGone(_))));
            report("gone_after_ms", (monotonic_ns() - started) as f64 / 1e6);
            let imported = context.imported_arenas();
            drop(m);
            assert_eq!(
                context.imported_arenas(),
                imported - 1,
                "the dead producer's arena is released with its last message"
            );
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            for victim in ["producer", "consumer"] {
                let dir = test_dir(&format!("gpu-kill-{victim}"));
                let scratch = scratch_dir();
                let flag = scratch.path().join(format!("gpu-kill-{victim}.flag")).display().to_string();
                let _ = std::fs::remove_file(&flag);
                let args = [("victim", victim.to_owned()), ("flag", flag.clone())];
                let mut c = spawn(TEST, "consumer", &dir, &args);
                let mut c_out = stdout_of(&mut c);
                let mut p = spawn(TEST, "producer", &dir, &args);
                let mut p_out = stdout_of(&mut p);
                expect_line(&mut p_out, "sent");
                expect_line(&mut c_out, "holding");
                let (mut victim_child, survivor, mut out) =
                    if victim == "producer" { (p, c, c_out) } else { (c, p, p_out) };
                kill9(&mut victim_child);
                std::fs::write(&flag, b"killed").unwrap();
                let ms: f64 = expect_line(&mut out, "gone_after_ms").parse().unwrap();
                println!("{victim} killed: seen after {ms:.1} ms");
                assert!(ms < 500.0, "peer death seen after {ms} ms");
                wait_ok(survivor, "survivor");
                let _ = std::fs::remove_file(&flag);
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

/// A consumer killed while it holds a 16 MiB GPU message: the producer frees the buffer and
/// trims, and what `trim` reports is what really went back to the driver (the context's count
/// of live GPU allocations), all of it, before the channel is freed. Two ways to learn of the
/// death: `told`, the producer's wait for the message ends in `PeerGone` first; `untold`, the
/// producer never touches the channel again, and the process's watcher alone lets go.
#[test]
fn a_dead_consumer_gives_its_gpu_message_back() {
    const TEST: &str = "gpu::a_dead_consumer_gives_its_gpu_message_back";
    const LEN: usize = 16 << 20;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let how = arg("how");
            let mut p =
                Producer::create(&context, &format!("gpu-dead-{how}"), &here(), &here(), &gpu_config()).unwrap();
            let buffer = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&buffer, 0, LEN, 0);
            p.send_buffer(&buffer, 0, LEN).unwrap();
            report("sent", 1);
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            if how == "told" {
                let err = p.wait_completed(0, Some(Duration::from_secs(20))).unwrap_err();
                assert!(matches!(err, Error::PeerGone(_)), "{err}");
            }
            let held = context.gpu_allocated_bytes();
            assert!(held >= LEN as u64, "the buffer's {LEN} bytes are counted: {held}");
            drop(buffer);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let before = context.gpu_allocated_bytes();
                let given_back = context.trim();
                let after = context.gpu_allocated_bytes();
                if how == "told" {
                    assert_eq!(given_back, before - after, "trim reports what went back to the driver");
                } else {
                    // The watcher may free more while trim runs, never less than trim says.
                    assert!(
                        given_back <= before - after,
                        "trim reported {given_back} bytes given back; {} went back",
                        before - after
                    );
                }
                if after == 0 {
                    break;
                }
                assert!(
                    how == "untold" && std::time::Instant::now() < deadline,
                    "{how}: {after} bytes of GPU memory are still allocated after the buffer was freed and \
                     the context trimmed, while the channel lives (what the dead consumer held)"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            drop(p);
            assert_eq!(context.gpu_allocated_bytes(), 0);
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c =
                Consumer::create(&context, &format!("gpu-dead-{}", arg("how")), &here(), &here(), &gpu_config())
                    .unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(m.len(), LEN);
            check_gpu(&context, &m, 0, false);
            report("holding", 1);
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            for how in ["told", "untold"] {
                let dir = test_dir(&format!("gpu-dead-{how}"));
                let scratch = scratch_dir();
                let flag = scratch.path().join("killed.flag").display().to_string();
                let args = [("how", how.to_owned()), ("flag", flag.clone())];
                let (mut c, mut c_out) = spawn_reporting(TEST, "consumer", &dir, &args);
                let (p, mut p_out) = spawn_reporting(TEST, "producer", &dir, &args);
                expect_line(&mut p_out, "sent");
                expect_line(&mut c_out, "holding");
                kill9(&mut c);
                std::fs::write(&flag, b"killed").unwrap();
                wait_ok(p, &format!("producer ({how})"));
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

// The layout from src/channels/transports/shm/ring.rs and the Vulkan IPC route's descriptor
// (src/channels/transports/vulkan_ipc/wire.rs), as a hostile producer would learn them.
const SLOTS: usize = 4096;
const SLOT: usize = 128;
const KIND_ROUTED_VULKAN: u32 = 4 | 2 << 8;

/// What the hostile producer writes as message 1, after a legitimate GPU message 0.
const HOSTILE: [&str; 5] = ["slot", "generation", "range", "ready-without-semaphore", "short-descriptor"];

#[test]
fn hostile_gpu_descriptors_are_corrupt() {
    const TEST: &str = "gpu::hostile_gpu_descriptors_are_corrupt";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
            for variant in HOSTILE {
                let mut p =
                    Producer::create(&context, &format!("gpu-hostile-{variant}"), &here(), &here(), &gpu_config())
                        .unwrap();
                if variant == "ready-without-semaphore" && p.ready_semaphore().is_ok() {
                    // On a driver that shares semaphores, a value going backwards instead.
                    p.send_buffer_after(&buffer, 0, 64, 10, None).unwrap();
                } else {
                    p.send_buffer(&buffer, 0, 64).unwrap();
                }
                p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
                let (base, _) = region_of(&format!("gpu-hostile-{variant}"));
                let slot = SLOTS + SLOT;
                let (slot_id, generation, offset, len, ready): (u32, u32, u64, u64, u64) = match variant {
                    "slot" => (9999, 1, 0, 64, 0),
                    "generation" => (0, 7, 0, 64, 0),
                    "range" => (0, 1, u64::MAX - 10, 64, 0),
                    _ => (0, 1, 0, 64, 5),
                };
                let desc_len: u32 = if variant == "short-descriptor" { 31 } else { 32 };
                // SAFETY: the test owns the mapping and writes inside slot 1.
                unsafe {
                    let at = |off: usize| &*(base.add(slot + off) as *const AtomicU64);
                    let at32 = |off: usize| &*(base.add(slot + off) as *const AtomicU32);
                    at32(16).store(slot_id, Ordering::Relaxed);
                    at32(20).store(generation, Ordering::Relaxed);
                    at(24).store(offset, Ordering::Relaxed);
                    at(32).store(len, Ordering::Relaxed);
                    at(40).store(ready, Ordering::Relaxed);
                    at32(8).store(desc_len, Ordering::Relaxed);
                    at32(12).store(KIND_ROUTED_VULKAN, Ordering::Relaxed);
                    at(0).store(2, Ordering::SeqCst);
                }
                report("written", variant);
                // Kept open until the consumer has judged the message.
                let _ = p.wait_completed(1, Some(Duration::from_secs(2)));
            }
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            for variant in HOSTILE {
                let mut c =
                    Consumer::create(&context, &format!("gpu-hostile-{variant}"), &here(), &here(), &gpu_config())
                        .unwrap();
                drop(c.recv_timeout(Duration::from_secs(30)).unwrap());
                let err = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
                assert!(matches!(err, Error::Corrupt(_)), "{variant}: {err}");
                println!("{variant}: {err}");
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            run_pair(TEST, "gpu-hostile");
        }
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn gpu_channel_cycles_leak_nothing() {
    const TEST: &str = "gpu::gpu_channel_cycles_leak_nothing";
    const CYCLES: u32 = 1000;
    const MESSAGES: u64 = 100_000;
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let buffers: Vec<Buffer> =
                (0..4).map(|_| context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap()).collect();
            let fds = open_fds();
            for i in 0..CYCLES {
                let mut p = Producer::create(&context, "gpu-cycle", &here(), &here(), &gpu_config()).unwrap();
                p.send_buffer(&buffers[i as usize % 4], 0, 64).unwrap();
                p.wait_completed(0, Some(Duration::from_secs(10))).unwrap();
                if i % 250 == 0 {
                    eprintln!("producer: cycle {i}");
                }
            }
            assert_eq!(open_fds(), fds, "fds leaked over {CYCLES} channels");
            let mut p = Producer::create(&context, "gpu-stream", &here(), &here(), &gpu_config()).unwrap();
            for seq in 0..MESSAGES {
                p.send_buffer(&buffers[seq as usize % 4], (seq as usize % 64) * 64, 64).unwrap();
                if seq % 25_000 == 0 {
                    eprintln!("producer: message {seq}");
                }
            }
            p.wait_completed(MESSAGES - 1, Some(Duration::from_secs(60))).unwrap();
            drop(p);
            assert_eq!(open_fds(), fds, "fds leaked over {MESSAGES} messages");
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let (fds, imports) = (open_fds(), context.imported_arenas());
            for _ in 0..CYCLES {
                let mut c = Consumer::create(&context, "gpu-cycle", &here(), &here(), &gpu_config()).unwrap();
                let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(m.len(), 64);
                assert!(m.buffer().is_some());
            }
            assert_eq!(open_fds(), fds, "fds leaked over {CYCLES} channels");
            assert_eq!(context.imported_arenas(), imports, "imports outlived their channels");
            let mut c = Consumer::create(&context, "gpu-stream", &here(), &here(), &gpu_config()).unwrap();
            for seq in 0..MESSAGES {
                let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(m.sequence(), seq);
            }
            assert_eq!(context.imported_arenas(), imports + 1, "one arena, imported once for {MESSAGES} messages");
            assert!(matches!(c.recv_timeout(Duration::from_secs(10)), Err(Error::PeerGone(_))));
            drop(c);
            assert_eq!(open_fds(), fds, "fds leaked over {MESSAGES} messages");
            assert_eq!(context.imported_arenas(), imports);
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            run_pair(TEST, "gpu-cycles");
        }
    }
}

/// The producer on GPU 0, the consumer on GPU 1 (device UUIDs differ): detected at connect,
/// reported, and GPU buffers staged through host memory; strict channels refuse. Skips on a
/// host with fewer than two Vulkan devices.
#[test]
fn a_consumer_on_another_gpu_gets_staged_buffers() {
    const TEST: &str = "gpu::a_consumer_on_another_gpu_gets_staged_buffers";
    const LEN: usize = 4 << 20;
    let on_device = |index: u32| {
        let mut config = ContextConfig::default();
        config.gpu = lava_flow::memory::GpuPolicy::Required;
        config.gpu_device = Some(lava_flow::memory::DeviceSelector::Index(index));
        Context::new(config).expect("a context on that device")
    };
    // Without cuda_ipc, which takes GPU buffers to a CUDA consumer on another GPU by reference.
    let gpu_config =
        || ChannelConfig { transports: Some(vec![TransportKind::Shm, TransportKind::VulkanIpc]), ..gpu_config() };
    match child_role().as_deref() {
        Some("producer") => {
            let context = on_device(0);
            let mut p = Producer::create(&context, "gpu-cross", &here(), &here(), &gpu_config()).unwrap();
            let reason = p.transport().reason.clone();
            assert!(reason.contains("staged") && reason.contains("another GPU"), "{reason}");
            let buffer = context.allocate(LEN, MemoryLocation::GpuDeviceLocal).unwrap();
            for seq in 0..8 {
                write_message(&buffer, 0, LEN, seq);
                p.send_buffer(&buffer, 0, LEN).unwrap();
            }
            p.wait_completed(7, Some(Duration::from_secs(30))).unwrap();
            println!("{reason}");
        }
        Some("consumer") => {
            let context = on_device(1);
            let mut c = Consumer::create(&context, "gpu-cross", &here(), &here(), &gpu_config()).unwrap();
            for seq in 0..8 {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert!(m.buffer().is_none(), "staged: host bytes");
                check(&m, seq);
            }
        }
        Some(_) => {}
        None => {
            let Some(context) = gpu_ctx() else { return };
            let devices = context.device_info().map_or(0, |d| d.all_devices.len());
            if devices < 2 {
                eprintln!("skipped: {devices} Vulkan device(s); this test needs two GPUs");
                return;
            }
            run_pair(TEST, "gpu-cross");
        }
    }
}

/// A send that finds the channel full keeps what the consumer must learn first (a new arena's
/// export) for the next send: nothing is lost, nothing is `Corrupt`.
#[test]
fn a_full_channel_loses_no_arena_announcement() {
    const TEST: &str = "gpu::a_full_channel_loses_no_arena_announcement";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let config = ChannelConfig { capacity: 2, ..gpu_config() };
            let mut p = Producer::create(&context, "gpu-full", &here(), &here(), &config).unwrap();
            let first = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
            // Over a quarter of the GPU arena: an arena of its own, not announced yet.
            let second = context.allocate(20 << 20, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&first, 0, 64, 0);
            write_message(&first, 64, 64, 1);
            write_message(&second, 0, 64, 2);
            p.send_buffer(&first, 0, 64).unwrap();
            p.send_buffer(&first, 64, 64).unwrap();
            for _ in 0..3 {
                let err = p.try_send_buffer(&second, 0, 64).unwrap_err();
                assert!(matches!(err, Error::WouldBlock(_)), "{err}");
            }
            report("full", 1);
            assert_eq!(p.send_buffer_timeout(&second, 0, 64, Duration::from_secs(30)).unwrap(), 2);
            p.wait_completed(2, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let config = ChannelConfig { capacity: 2, ..gpu_config() };
            let mut c = Consumer::create(&context, "gpu-full", &here(), &here(), &config).unwrap();
            let flag = arg("flag");
            while !std::path::Path::new(&flag).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            for seq in 0..3 {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(m.sequence(), seq);
                let mut bytes = vec![0u8; 64];
                m.buffer().expect("a GPU buffer").read_at(0, &mut bytes).unwrap();
                check(&bytes, seq);
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("gpu-full");
            let scratch = scratch_dir();
            let flag = scratch.path().join("gpu-full.flag").display().to_string();
            let _ = std::fs::remove_file(&flag);
            let args = [("flag", flag.clone())];
            let c = spawn(TEST, "consumer", &dir, &args);
            let mut p = spawn(TEST, "producer", &dir, &args);
            let mut p_out = stdout_of(&mut p);
            expect_line(&mut p_out, "full");
            std::fs::write(&flag, b"go").unwrap();
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            let _ = std::fs::remove_file(&flag);
            assert_dir_empty(&dir);
        }
    }
}

/// A consumer's report follows its current producer: one that sends GPU buffers by
/// reference, then (after it has gone) one that stages them.
#[test]
fn the_consumer_report_follows_a_new_producer() {
    const TEST: &str = "gpu::the_consumer_report_follows_a_new_producer";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut config = gpu_config();
            if arg("which") == "staging" {
                config.transports = Some(vec![TransportKind::Shm]);
            }
            let mut p = Producer::create(&context, "gpu-report", &here(), &here(), &config).unwrap();
            let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&buffer, 0, 64, 0);
            p.send_buffer(&buffer, 0, 64).unwrap();
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "gpu-report", &here(), &here(), &gpu_config()).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert!(m.buffer().is_some());
            assert_eq!(c.transport().names(), "shm+vulkan_ipc", "{}", c.transport().reason);
            drop(m);
            report("first", 1);
            let m = loop {
                match c.recv_timeout(Duration::from_secs(30)) {
                    Err(Error::PeerGone(_)) => std::thread::sleep(Duration::from_millis(2)),
                    other => break other.unwrap(),
                }
            };
            assert!(m.buffer().is_none(), "the second producer stages");
            check(&m, 0);
            let reason = &c.transport().reason;
            assert_eq!(c.transport().names(), "shm", "{reason}");
            assert!(reason.contains("staged") && reason.contains("offers no GPU route"), "{reason}");
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("gpu-report");
            let mut c = spawn(TEST, "consumer", &dir, &[]);
            let mut c_out = stdout_of(&mut c);
            let p1 = spawn(TEST, "producer", &dir, &[("which", "reference".to_owned())]);
            expect_line(&mut c_out, "first");
            wait_ok(p1, "first producer");
            let p2 = spawn(TEST, "producer", &dir, &[("which", "staging".to_owned())]);
            wait_ok(p2, "second producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// The released semaphore: the consumer signals it to `seq + 1` once it let go of GPU message
/// `seq` and every GPU message before it (CPU messages do not count), so that the producer's
/// GPU work can wait before rewriting a buffer. Where semaphores cannot be shared (lavapipe),
/// the producer is told why, and strict_gpu refuses the channel.
#[test]
fn the_released_semaphore_follows_the_consumer() {
    const TEST: &str = "gpu::the_released_semaphore_follows_the_consumer";
    let released_config = || ChannelConfig { released_semaphore: true, ..gpu_config() };
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut p = Producer::create(&context, "released", &here(), &here(), &released_config()).unwrap();
            let mut back = Consumer::create(&context, "released-back", &here(), &here(), &released_config()).unwrap();
            let semaphore = match p.released_semaphore() {
                Ok(fd) => {
                    Some(lava_flow::memory::gpu::TimelineSemaphore::import(context.gpu_device().unwrap(), fd).unwrap())
                }
                Err(Error::Unsupported(why)) => {
                    assert!(p.ready_semaphore().is_err(), "a ready semaphore but no released one: {why}");
                    assert!(why.contains("released semaphore"), "{why}");
                    None
                }
                Err(e) => panic!("{e}"),
            };
            let reason = p.transport().reason.clone();
            assert_eq!(semaphore.is_some(), reason.contains("signals a released semaphore"), "{reason}");
            let gpu = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
            write_message(&gpu, 0, 4096, 0);
            assert_eq!(p.send_buffer(&gpu, 0, 4096).unwrap(), 0);
            assert_eq!(p.send(b"a CPU message").unwrap(), 1);
            assert_eq!(p.send_buffer(&gpu, 0, 4096).unwrap(), 2);
            // The consumer let go of message 2 only: message 0 is still held.
            assert_eq!(&*back.recv_timeout(Duration::from_secs(30)).unwrap(), b"released 2");
            if let Some(s) = &semaphore {
                assert_eq!(s.value().unwrap(), 0, "signalled while GPU message 0 is held");
            }
            p.send(b"go on").unwrap();
            // Then of message 0: every GPU message up to 2 is let go.
            assert_eq!(&*back.recv_timeout(Duration::from_secs(30)).unwrap(), b"released 0");
            if let Some(s) = &semaphore {
                assert!(s.wait(3, Duration::from_secs(10)).unwrap(), "the released semaphore never reached 3");
                assert_eq!(s.value().unwrap(), 3);
            }
            p.wait_completed(3, Some(Duration::from_secs(30))).unwrap();
            if semaphore.is_none() {
                drop(p);
                let strict = ChannelConfig {
                    strict_gpu: true,
                    rendezvous_timeout: Some(Duration::from_secs(5)),
                    ..released_config()
                };
                let err = Producer::create(&context, "released-strict", &here(), &here(), &strict).unwrap_err();
                assert!(matches!(err, Error::Unsupported(ref m) if m.contains("strict_gpu")), "{err}");
            }
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let mut c = Consumer::create(&context, "released", &here(), &here(), &released_config()).unwrap();
            let mut back = Producer::create(&context, "released-back", &here(), &here(), &released_config()).unwrap();
            let held: Vec<Message> = (0..3).map(|_| c.recv_timeout(Duration::from_secs(30)).unwrap()).collect();
            assert!(held[0].buffer().is_some() && held[1].buffer().is_none() && held[2].buffer().is_some());
            let mut held = held.into_iter();
            let (m0, m1, m2) = (held.next().unwrap(), held.next().unwrap(), held.next().unwrap());
            drop(m2);
            back.send(b"released 2").unwrap();
            assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), b"go on");
            check_gpu(&context, &m0, 0, false);
            drop(m0);
            back.send(b"released 0").unwrap();
            drop(m1);
            back.wait_completed(1, Some(Duration::from_secs(30))).unwrap();
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
            let short = ChannelConfig { rendezvous_timeout: Some(Duration::from_secs(5)), ..released_config() };
            if let Ok(mut c) = Consumer::create(&context, "released-strict", &here(), &here(), &short) {
                assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_some() {
                run_pair(TEST, "gpu-released");
            }
        }
    }
}

/// `send` of bytes that lie in a GPU buffer's host mapping (HOST_VISIBLE memory) goes by
/// reference through the GPU route, as a buffer send of that range would; with
/// auto_zero_copy off, or on a channel that stages GPU buffers, the bytes are copied.
#[test]
fn sends_from_a_gpu_mapping_go_by_reference() {
    const TEST: &str = "gpu::sends_from_a_gpu_mapping_go_by_reference";
    const LEN: usize = 50_000;
    let config_of = |case: &str| {
        let mut config = gpu_config();
        config.auto_zero_copy = case != "copy";
        if case == "shm-only" {
            config.transports = Some(vec![TransportKind::Shm]);
        }
        config
    };
    match child_role().as_deref() {
        Some("producer") => {
            let Some(context) = gpu_ctx() else { return };
            let case = arg("case");
            let mut p =
                Producer::create(&context, &format!("mapped-{case}"), &here(), &here(), &config_of(&case)).unwrap();
            let buffer = context.allocate(3 * LEN, MemoryLocation::GpuHostVisible).unwrap();
            let ptr = buffer.host_ptr().expect("HOST_VISIBLE memory is mapped");
            // SAFETY: 3 * LEN bytes of the live mapping; nothing else uses them.
            let mapped = unsafe { std::slice::from_raw_parts_mut(ptr, 3 * LEN) };
            message_into(&mut mapped[LEN..2 * LEN], 0);
            assert_eq!(p.send(&mapped[LEN..2 * LEN]).unwrap(), 0);
            p.wait_completed(0, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let Some(context) = gpu_ctx() else { return };
            let case = arg("case");
            let mut c =
                Consumer::create(&context, &format!("mapped-{case}"), &here(), &here(), &config_of(&case)).unwrap();
            let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(m.len(), LEN);
            check(&m, 0);
            assert_eq!(
                m.buffer().is_some(),
                case == "auto",
                "{case}: by reference only where the GPU route serves and auto_zero_copy is on"
            );
            assert_eq!(m.is_zero_copy(), case == "auto");
            if case == "auto" {
                check_gpu(&context, &m, 0, true);
            }
        }
        Some(_) => {}
        None => {
            if gpu_ctx().is_none() {
                return;
            }
            for case in ["auto", "copy", "shm-only"] {
                run_pair_with(TEST, &format!("gpu-mapped-{case}"), &[("case", case.to_owned())]);
            }
        }
    }
}
