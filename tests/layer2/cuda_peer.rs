//! lava-flow's own GPU buffers to a CUDA consumer by the cuda_ipc route, between real
//! processes: on the GPU host, from a producer on GPU 0 (Vulkan only: it never uses CUDA) to a
//! consumer whose GPU is GPU 1, which copies every message into its own memory over the peer
//! path and checks every byte; on one GPU, to a consumer without vulkan_ipc; and, without CUDA
//! (CI), the route's negotiation and announcements on the test hooks' stand-in for the driver.
//! A child without what its part needs prints "skipped: ..." and the orchestrator skips too.

use std::ffi::c_void;
use std::time::Duration;

use lava_flow::channels::{ChannelConfig, Consumer, Producer, TransportKind};
use lava_flow::memory::{Buffer, Context, ContextConfig, DeviceSelector, GpuPolicy, MemoryLocation};
use lava_flow::Error;
use lava_flow_cuda::sys::*;
use lava_flow_cuda::Driver;

use crate::common::*;

const MESSAGES: u64 = 6;

/// Byte `i` of message `seq`.
fn pattern(seq: u64, i: usize) -> u8 {
    (i as u64).wrapping_mul(31).wrapping_add(seq.wrapping_mul(77)).wrapping_add((i >> 12) as u64) as u8
}

fn fill(buffer: &Buffer, len: usize, seq: u64) {
    let bytes: Vec<u8> = (0..len).map(|i| pattern(seq, i)).collect();
    buffer.write_at(0, &bytes).unwrap();
}

/// Over shared memory with cuda_ipc and no vulkan_ipc, or with both.
fn channel(vulkan_ipc: bool) -> ChannelConfig {
    let mut transports = vec![TransportKind::Shm, TransportKind::CudaIpc];
    if vulkan_ipc {
        transports.push(TransportKind::VulkanIpc);
    }
    ChannelConfig { transports: Some(transports), ..config(strategy("block")) }
}

/// A context on the Vulkan device whose UUID is `uuid` (hex), or without a GPU.
fn context_on(uuid: Option<&str>) -> Context {
    let mut config = ContextConfig::default();
    match uuid {
        Some(uuid) => {
            config.gpu = GpuPolicy::Required;
            config.gpu_device = Some(uuid.parse::<DeviceSelector>().unwrap());
        }
        None => config.gpu = GpuPolicy::Disabled,
    }
    Context::new(config).expect("a memory context")
}

/// The CUDA devices of this host, as UUIDs in hex, where there is a driver.
fn cuda_devices() -> Vec<String> {
    let Ok(driver) = lava_flow_cuda::driver() else { return Vec::new() };
    let count = driver.device_count().unwrap_or(0);
    (0..count)
        .map(|i| {
            let uuid = driver.device_uuid(driver.device(i).unwrap()).unwrap();
            uuid.iter().map(|b| format!("{b:02x}")).collect()
        })
        .collect()
}

/// The driver, with the primary context of the device whose UUID is `uuid` current on this
/// thread (as the CUDA runtime makes it), and that device's ordinal.
fn cuda_on(uuid: &str) -> (&'static Driver, i32) {
    let driver = lava_flow_cuda::driver().unwrap();
    let ordinal = cuda_devices().iter().position(|u| u == uuid).expect("the device is visible") as i32;
    let device = driver.device(ordinal).unwrap();
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and a device the driver gave; retained for the process's life.
    unsafe { driver.device_primary_ctx_retain(&mut context, device) }.unwrap();
    // SAFETY: the context just retained.
    unsafe { driver.ctx_set_current(context) }.unwrap();
    (driver, ordinal)
}

/// Copies `len` bytes at `src` (any device's memory this process reaches) into memory of the
/// current context's device, then to the host.
fn copy_here_and_read(driver: &Driver, src: CUdeviceptr, len: usize) -> Vec<u8> {
    let mut dst: CUdeviceptr = 0;
    // SAFETY: a valid out-pointer.
    unsafe { driver.mem_alloc(&mut dst, len) }.unwrap();
    // SAFETY: `len` bytes of live device memory at both (the message is held).
    unsafe { driver.memcpy_dtod(dst, src, len) }.unwrap();
    // SAFETY: no arguments.
    unsafe { driver.ctx_synchronize() }.unwrap();
    let mut out = vec![0u8; len];
    // SAFETY: `len` writable host bytes; the allocation just made.
    unsafe { driver.memcpy_dtoh(out.as_mut_ptr().cast::<c_void>(), dst, len) }.unwrap();
    // SAFETY: freed once; nothing uses it after.
    unsafe { driver.mem_free(dst) }.unwrap();
    out
}

fn check(bytes: &[u8], seq: u64) {
    if let Some(i) = (0..bytes.len()).find(|&i| bytes[i] != pattern(seq, i)) {
        panic!("message {seq}: byte {i} is {:#x}, not {:#x}", bytes[i], pattern(seq, i));
    }
}

/// The producer's part: `MESSAGES` messages of `len` bytes of one GPU buffer, each complete
/// before the buffer is rewritten.
fn produce(context: &Context, name: &str, config: &ChannelConfig, len: usize) {
    let mut p = Producer::create(context, name, &here(), &here(), config).unwrap();
    let reason = p.transport().reason.clone();
    report("transport", reason.replace('\n', " "));
    assert!(reason.contains("GPU buffers: cuda_ipc, by reference on"), "{reason}");
    let buffer = context.allocate(len, MemoryLocation::GpuDeviceLocal).unwrap();
    for seq in 0..MESSAGES {
        fill(&buffer, len, seq);
        let sent = p.send_buffer(&buffer, 0, len).unwrap();
        p.wait_completed(sent, Some(Duration::from_secs(60))).unwrap();
    }
}

/// The consumer's part: every message a CUDA pointer on the producer's GPU (`device`, this
/// process's ordinal), copied to this process's current device and checked byte for byte.
fn consume(driver: &Driver, context: &Context, name: &str, config: &ChannelConfig, len: usize, device: i32) {
    let mut c = Consumer::create(context, name, &here(), &here(), config).unwrap();
    let reason = c.transport().reason.clone();
    report("consumer_transport", reason.replace('\n', " "));
    assert!(reason.contains("GPU buffers: cuda_ipc, by reference on GPU"), "{reason}");
    for seq in 0..MESSAGES {
        let m = c.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!(m.len(), len);
        assert!(m.as_slice().is_empty(), "device memory has no host bytes");
        let (ptr, on) = m.cuda_ptr().expect("a CUDA message");
        assert_eq!(on, device, "the producer's GPU, by this process's ordinal");
        check(&copy_here_and_read(driver, ptr, len), seq);
    }
    assert!(matches!(c.recv_timeout(Duration::from_secs(60)), Err(Error::PeerGone(_))));
}

/// A GPU buffer from a producer on GPU 0 to a consumer whose Vulkan device and CUDA context
/// are GPU 1: by reference (the reports say so, with peer access), each message copied GPU
/// to GPU into the consumer's memory and checked byte for byte. Needs two GPUs with a peer
/// path.
#[test]
fn a_gpu_buffer_reaches_a_consumer_on_another_gpu_by_reference() {
    const TEST: &str = "cuda_peer::a_gpu_buffer_reaches_a_consumer_on_another_gpu_by_reference";
    const LEN: usize = 16 << 20;
    match child_role().as_deref() {
        Some("producer") => {
            // Vulkan only: the producer needs no CUDA for its GPU buffers.
            let context = context_on(Some(&arg("gpu0")));
            produce(&context, "cuda-peer", &channel(true), LEN);
            report("producer_loaded_cuda", lava_flow_cuda::is_loaded());
        }
        Some("consumer") => {
            let (driver, _) = cuda_on(&arg("gpu1"));
            let context = context_on(Some(&arg("gpu1")));
            let gpu0 = cuda_devices().iter().position(|u| *u == arg("gpu0")).unwrap() as i32;
            consume(driver, &context, "cuda-peer", &channel(true), LEN, gpu0);
        }
        _ => {
            let devices = cuda_devices();
            if devices.len() < 2 {
                println!("skipped: {} CUDA device(s); this test needs two GPUs", devices.len());
                return;
            }
            let driver = lava_flow_cuda::driver().unwrap();
            let mut can = 0;
            // SAFETY: a valid out-pointer; devices the driver gave.
            unsafe { driver.device_can_access_peer(&mut can, driver.device(1).unwrap(), driver.device(0).unwrap()) }
                .unwrap();
            if can == 0 {
                println!("skipped: GPU 1 has no peer path to GPU 0");
                return;
            }
            let args = [("gpu0", devices[0].clone()), ("gpu1", devices[1].clone())];
            run_pair_with(TEST, "cuda-peer", &args);
        }
    }
}

/// On one GPU, where vulkan_ipc is not allowed: a consumer with no Vulkan device, and one
/// whose Vulkan device is the producer's, get CUDA pointers to the producer's buffer.
#[test]
fn a_gpu_buffer_goes_as_cuda_memory_where_vulkan_ipc_is_not_allowed() {
    const TEST: &str = "cuda_peer::a_gpu_buffer_goes_as_cuda_memory_where_vulkan_ipc_is_not_allowed";
    const LEN: usize = 1 << 20;
    let name = || format!("cuda-one-gpu-{}", arg("consumer_gpu"));
    match child_role().as_deref() {
        Some("producer") => produce(&context_on(Some(&arg("gpu0"))), &name(), &channel(false), LEN),
        Some("consumer") => {
            let (driver, ordinal) = cuda_on(&arg("gpu0"));
            let vulkan = (arg("consumer_gpu") == "vulkan").then(|| arg("gpu0"));
            let context = context_on(vulkan.as_deref());
            consume(driver, &context, &name(), &channel(false), LEN, ordinal);
        }
        _ => {
            let devices = cuda_devices();
            if devices.is_empty() {
                println!("skipped: no CUDA driver");
                return;
            }
            for consumer_gpu in ["none", "vulkan"] {
                let args = [("gpu0", devices[0].clone()), ("consumer_gpu", consumer_gpu.to_owned())];
                run_pair_with(TEST, &format!("cuda-one-gpu-{consumer_gpu}"), &args);
            }
        }
    }
}

/// Without CUDA, on the test hooks' stand-in for the driver: a producer with a Vulkan device
/// and a consumer without one meet over shared memory with cuda_ipc and no vulkan_ipc; both
/// reports name cuda_ipc for GPU buffers, each arena reaches the consumer once (the stand-in
/// "opens" it where its counter says), and a message's CUDA address lies at its offset in its
/// arena, in order with host messages.
#[test]
fn gpu_buffers_to_a_cuda_consumer_are_negotiated_and_announced_between_processes() {
    const TEST: &str = "cuda_peer::gpu_buffers_to_a_cuda_consumer_are_negotiated_and_announced_between_processes";
    const OFFSETS: [usize; 3] = [0, 4096, 8192];
    match child_role().as_deref() {
        Some("producer") => {
            let context = Context::new(ContextConfig::default()).unwrap();
            let mut p = Producer::create(&context, "cuda-fake-arena", &here(), &here(), &channel(false)).unwrap();
            let reason = p.transport().reason.clone();
            assert!(reason.contains("GPU buffers: cuda_ipc, by reference on"), "{reason}");
            let buffer = context.allocate(64 << 10, MemoryLocation::GpuDeviceLocal).unwrap();
            for offset in OFFSETS {
                p.send_buffer(&buffer, offset, 256).unwrap();
                p.send(b"host").unwrap();
            }
            p.wait_completed(2 * OFFSETS.len() as u64 - 1, Some(Duration::from_secs(30))).unwrap();
        }
        Some("consumer") => {
            let mut c = Consumer::create(&ctx(), "cuda-fake-arena", &here(), &here(), &channel(false)).unwrap();
            let reason = c.transport().reason.clone();
            assert!(reason.contains("GPU buffers: cuda_ipc, by reference on GPU 0"), "{reason}");
            let mut first = None;
            for offset in OFFSETS {
                let m = c.recv_timeout(Duration::from_secs(30)).unwrap();
                let (address, device) = m.cuda_ptr().expect("a CUDA message");
                assert_eq!((m.len(), device), (256, 0));
                let base = *first.get_or_insert(address - offset as u64);
                assert_eq!(address, base + offset as u64, "the same arena's import, at the message's offset");
                assert!(base >= 0x2000_0000_0000, "where the stand-in opens arenas: {base:#x}");
                drop(m);
                assert_eq!(&*c.recv_timeout(Duration::from_secs(30)).unwrap(), b"host");
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        _ => {
            if crate::gpu::gpu_ctx().is_none() {
                return;
            }
            let dir = test_dir("cuda-fake-arena");
            let spawn = |role| {
                let envs = [("LF_RUNTIME_DIR", dir.display().to_string()), ("LF_TEST_FAKE_CUDA_IPC", "1".to_owned())];
                crate::child::Spawn { test: TEST, role, envs: &envs, socket: false, capture_stderr: false }.start().0
            };
            let c = spawn("consumer");
            let p = spawn("producer");
            wait_ok(p, "producer");
            wait_ok(c, "consumer");
            assert_dir_empty(&dir);
        }
    }
}
