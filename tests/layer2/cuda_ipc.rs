//! CUDA memory the application allocated, between real processes of one host, by reference
//! (the cuda_ipc route): per allocation kind, the consumer reads the producer's bytes through
//! its CUDA pointer and writes back, and the producer sees it; memory freed and re-allocated
//! at the same address gives the new bytes; kinds no other process can open are refused;
//! kill -9 of either end. Each child skips, saying "skipped: no CUDA driver", without libcuda
//! or a device (the orchestrator then skips too).

use std::ffi::c_void;
use std::time::Duration;

use lava_flow::channels::{Consumer, Producer};
use lava_flow::memory::Buffer;
use lava_flow::Error;
use lava_flow_cuda::sys::*;
use lava_flow_cuda::Driver;

use crate::child::kill9;
use crate::common::*;

const LEN: usize = 2 << 20;
const OFFSET: usize = 4096;
const SENT: usize = 64 << 10;

/// The CUDA driver with device 0's primary context current on this thread, or `None`
/// (printing why) where there is none.
fn cuda() -> Option<&'static Driver> {
    let driver = match lava_flow_cuda::driver() {
        Ok(driver) => driver,
        Err(e) => {
            println!("skipped: no CUDA driver ({e})");
            return None;
        }
    };
    if driver.device_count().unwrap_or(0) == 0 {
        println!("skipped: no CUDA driver (no device visible)");
        return None;
    }
    let device = driver.device(0).unwrap();
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the device the driver gave; the context stays retained for
    // the process's life.
    unsafe { driver.device_primary_ctx_retain(&mut context, device) }.unwrap();
    // SAFETY: the context just retained.
    unsafe { driver.ctx_set_current(context) }.unwrap();
    Some(driver)
}

/// Whether the orchestrator can run the test: a CUDA driver with a device here.
fn cuda_here() -> bool {
    lava_flow_cuda::driver().is_ok_and(|d| d.device_count().unwrap_or(0) > 0)
}

/// Memory of one allocation kind, freed on drop.
enum Allocation {
    Legacy(CUdeviceptr),
    Vmm { va: CUdeviceptr, size: usize, handle: CUmemGenericAllocationHandle },
    Managed(CUdeviceptr),
    Pool(CUdeviceptr),
}

impl Allocation {
    fn new(driver: &Driver, kind: &str, len: usize) -> Allocation {
        let mut ptr: CUdeviceptr = 0;
        match kind {
            "legacy" => {
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_alloc(&mut ptr, len) }.unwrap();
                Allocation::Legacy(ptr)
            }
            "managed" => {
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_alloc_managed(&mut ptr, len, CU_MEM_ATTACH_GLOBAL) }.unwrap();
                Allocation::Managed(ptr)
            }
            "pool" => {
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_alloc_async(&mut ptr, len, std::ptr::null_mut()) }.unwrap();
                // SAFETY: no arguments.
                unsafe { driver.ctx_synchronize() }.unwrap();
                Allocation::Pool(ptr)
            }
            "vmm" => {
                let prop = CUmemAllocationProp {
                    type_: CU_MEM_ALLOCATION_TYPE_PINNED,
                    requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
                    ..Default::default()
                };
                let mut granularity = 0;
                // SAFETY: valid out-pointer and properties.
                unsafe {
                    driver.mem_get_allocation_granularity(&mut granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
                }
                .unwrap();
                let size = len.div_ceil(granularity) * granularity;
                let mut handle = 0;
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_create(&mut handle, size, &prop, 0) }.unwrap();
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_address_reserve(&mut ptr, size, 0, 0, 0) }.unwrap();
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_map(ptr, size, 0, handle, 0) }.unwrap();
                let access = CUmemAccessDesc {
                    location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
                    flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                // SAFETY: valid out-pointers and properties; sizes and ranges the driver checks.
                unsafe { driver.mem_set_access(ptr, size, &access, 1) }.unwrap();
                Allocation::Vmm { va: ptr, size, handle }
            }
            other => panic!("unknown allocation kind {other}"),
        }
    }

    fn ptr(&self) -> CUdeviceptr {
        match *self {
            Allocation::Legacy(p) | Allocation::Managed(p) | Allocation::Pool(p) => p,
            Allocation::Vmm { va, .. } => va,
        }
    }

    fn free(self, driver: &Driver) {
        match self {
            // SAFETY: frees what `new` made, once; nothing uses it after.
            Allocation::Legacy(p) | Allocation::Managed(p) => unsafe { driver.mem_free(p) }.unwrap(),
            Allocation::Pool(p) => {
                // SAFETY: undoes what `new` did, once; nothing uses the memory after.
                unsafe { driver.mem_free_async(p, std::ptr::null_mut()) }.unwrap();
                // SAFETY: no arguments.
                unsafe { driver.ctx_synchronize() }.unwrap();
            }
            Allocation::Vmm { va, size, handle } => {
                // SAFETY: undoes what `new` did, once; nothing uses the memory after.
                unsafe { driver.mem_unmap(va, size) }.unwrap();
                // SAFETY: undoes what `new` did, once; nothing uses the memory after.
                unsafe { driver.mem_address_free(va, size) }.unwrap();
                // SAFETY: undoes what `new` did, once; nothing uses the memory after.
                unsafe { driver.mem_release(handle) }.unwrap();
            }
        }
    }
}

fn set(driver: &Driver, ptr: CUdeviceptr, value: u8, len: usize) {
    // SAFETY: `len` bytes of live device memory at `ptr` (the callers' allocations and
    // received messages).
    unsafe { driver.memset_d8(ptr, value, len) }.unwrap();
    // SAFETY: no arguments.
    unsafe { driver.ctx_synchronize() }.unwrap();
}

fn read(driver: &Driver, ptr: CUdeviceptr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `len` writable host bytes; `len` bytes of live device memory at `ptr`.
    unsafe { driver.memcpy_dtoh(out.as_mut_ptr().cast::<c_void>(), ptr, len) }.unwrap();
    out
}

/// Registers `len` bytes of CUDA memory at `ptr`: the buffer of its whole allocation, and
/// where `ptr` lies in it.
fn register(ptr: CUdeviceptr, len: usize) -> (Buffer, usize) {
    // SAFETY: CUDA device memory of this process, alive until the test frees it.
    let buffer = unsafe { ctx().register(ptr as usize as *mut u8, len) }.unwrap();
    let base = buffer.cuda().expect("CUDA memory").base;
    (buffer, (ptr - base) as usize)
}

fn consumer(name: &str) -> Consumer {
    Consumer::create(&ctx(), name, &here(), &here(), &config(strategy("block"))).unwrap()
}

fn producer(name: &str) -> Producer {
    let p = Producer::create(&ctx(), name, &here(), &here(), &config(strategy("block"))).unwrap();
    report("transport", p.transport().reason.replace('\n', " "));
    p
}

/// Per kind that goes by reference: the consumer reads the producer's bytes through its CUDA
/// pointer and overwrites them; the producer, once the message completed, reads what the
/// consumer wrote.
#[test]
fn cuda_memory_travels_by_reference_and_writes_come_back() {
    const TEST: &str = "cuda_ipc::cuda_memory_travels_by_reference_and_writes_come_back";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let allocation = Allocation::new(driver, &arg("kind"), LEN);
            set(driver, allocation.ptr(), 0xa5, LEN);
            let (buffer, at) = register(allocation.ptr(), LEN);
            let mut p = producer(&format!("cuda-{}", arg("kind")));
            assert!(p.transport().reason.contains("cuda_ipc"), "{}", p.transport().reason);
            let seq = p.send_buffer(&buffer, at + OFFSET, SENT).unwrap();
            p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
            let back = read(driver, allocation.ptr() + OFFSET as u64, SENT);
            assert!(back.iter().all(|&b| b == 0x5a), "the consumer's writes are in the producer's memory");
            let before = read(driver, allocation.ptr() + OFFSET as u64 - 1, 1);
            assert_eq!(before, [0xa5], "the consumer wrote only the message's bytes");
            drop(p);
            drop(buffer);
            allocation.free(driver);
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let mut c = consumer(&format!("cuda-{}", arg("kind")));
            let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(message.len(), SENT);
            assert!(message.as_slice().is_empty(), "CUDA memory has no host bytes");
            assert!(message.buffer().is_none());
            let (ptr, device) = message.cuda_ptr().unwrap();
            assert_eq!(device, 0);
            assert!(read(driver, ptr, SENT).iter().all(|&b| b == 0xa5), "the producer's bytes");
            set(driver, ptr, 0x5a, SENT);
            drop(message);
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            for kind in ["legacy", "vmm"] {
                run_pair_with(TEST, &format!("cuda-{kind}"), &[("kind", kind.to_owned())]);
            }
        }
    }
}

/// Memory freed and re-allocated (at the same address, as the allocator usually gives it)
/// reaches the consumer with its new bytes, never through the import of the old.
#[test]
fn a_reallocation_at_the_same_address_gives_the_new_bytes() {
    const TEST: &str = "cuda_ipc::a_reallocation_at_the_same_address_gives_the_new_bytes";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let mut p = producer("cuda-realloc");
            let mut bases = Vec::new();
            for round in 0..3u8 {
                let allocation = Allocation::new(driver, &arg("kind"), LEN);
                set(driver, allocation.ptr(), 0x10 + round, LEN);
                let (buffer, at) = register(allocation.ptr(), LEN);
                bases.push(buffer.cuda().unwrap().base);
                let seq = p.send_buffer(&buffer, at, SENT).unwrap();
                p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
                drop(buffer);
                allocation.free(driver);
            }
            report("same_base", bases.windows(2).all(|w| w[0] == w[1]));
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let mut c = consumer("cuda-realloc");
            for round in 0..3u8 {
                let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
                let (ptr, _) = message.cuda_ptr().unwrap();
                let bytes = read(driver, ptr, SENT);
                assert!(bytes.iter().all(|&b| b == 0x10 + round), "round {round}: got {:#x}", bytes[0]);
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            for kind in ["legacy", "vmm"] {
                run_pair_with(TEST, &format!("cuda-realloc-{kind}"), &[("kind", kind.to_owned())]);
            }
        }
    }
}

/// Managed memory and memory of the default pool (cuMemAllocAsync) are refused at send,
/// naming the allocator and the way out; nothing reaches the consumer.
#[test]
fn managed_and_default_pool_memory_are_refused_naming_the_way_out() {
    const TEST: &str = "cuda_ipc::managed_and_default_pool_memory_are_refused_naming_the_way_out";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let mut p = producer("cuda-refused");
            for (kind, words) in [("managed", "cudaMallocManaged"), ("pool", "expandable_segments:True")] {
                let allocation = Allocation::new(driver, kind, LEN);
                let (buffer, at) = register(allocation.ptr(), LEN);
                let err = p.send_buffer(&buffer, at, SENT).unwrap_err();
                assert!(matches!(&err, Error::Unsupported(m) if m.contains(words)), "{kind}: {err}");
                drop(buffer);
                allocation.free(driver);
            }
        }
        Some("consumer") => {
            if cuda().is_none() {
                return;
            }
            let mut c = consumer("cuda-refused");
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            run_pair(TEST, "cuda-refused");
        }
    }
}

/// kill -9 of the producer while the consumer holds a message of VMM memory: the consumer
/// lives on, the message stays readable until released, and the producer's end is reported.
#[test]
fn the_producer_killed_while_the_consumer_holds_vmm_memory() {
    const TEST: &str = "cuda_ipc::the_producer_killed_while_the_consumer_holds_vmm_memory";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let allocation = Allocation::new(driver, "vmm", LEN);
            set(driver, allocation.ptr(), 0x77, LEN);
            let (buffer, at) = register(allocation.ptr(), LEN);
            let mut p = producer("cuda-pkill");
            p.send_buffer(&buffer, at, SENT).unwrap();
            report("sent", 1);
            std::thread::sleep(Duration::from_secs(120));
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let mut c = consumer("cuda-pkill");
            let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
            let (ptr, _) = message.cuda_ptr().unwrap();
            report("held", 1);
            let err = c.recv_timeout(Duration::from_secs(30)).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
            assert!(read(driver, ptr, SENT).iter().all(|&b| b == 0x77), "readable after the producer died");
            drop(message);
            report("done", 1);
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            let dir = test_dir("cuda-pkill");
            let (consumer, mut consumer_out) = spawn_reporting(TEST, "consumer", &dir, &[]);
            let (mut producer, mut producer_out) = spawn_reporting(TEST, "producer", &dir, &[]);
            expect_line(&mut producer_out, "sent");
            expect_line(&mut consumer_out, "held");
            kill9(&mut producer);
            expect_line(&mut consumer_out, "done");
            wait_ok(consumer, "consumer");
            assert_dir_empty(&dir);
        }
    }
}

/// kill -9 of the consumer while the producer waits for the completion of CUDA memory it sent:
/// the producer gets PeerGone.
#[test]
fn the_consumer_killed_while_the_producer_waits_for_completion() {
    const TEST: &str = "cuda_ipc::the_consumer_killed_while_the_producer_waits_for_completion";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let allocation = Allocation::new(driver, &arg("kind"), LEN);
            let (buffer, at) = register(allocation.ptr(), LEN);
            let mut p = producer(&format!("cuda-ckill-{}", arg("kind")));
            let seq = p.send_buffer(&buffer, at, SENT).unwrap();
            let err = p.wait_completed(seq, Some(Duration::from_secs(60))).unwrap_err();
            assert!(matches!(err, Error::PeerGone(_)), "{err}");
            drop(p);
            drop(buffer);
            allocation.free(driver);
            report("done", 1);
        }
        Some("consumer") => {
            if cuda().is_none() {
                return;
            }
            let mut c = consumer(&format!("cuda-ckill-{}", arg("kind")));
            let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
            message.cuda_ptr().unwrap();
            report("held", 1);
            std::thread::sleep(Duration::from_secs(120));
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            for kind in ["legacy", "vmm"] {
                let dir = test_dir(&format!("cuda-ckill-{kind}"));
                let args = [("kind", kind.to_owned())];
                let (mut consumer, mut consumer_out) = spawn_reporting(TEST, "consumer", &dir, &args);
                let (producer, mut producer_out) = spawn_reporting(TEST, "producer", &dir, &args);
                expect_line(&mut consumer_out, "held");
                kill9(&mut consumer);
                expect_line(&mut producer_out, "done");
                wait_ok(producer, "producer");
                assert_dir_empty(&dir);
            }
        }
    }
}

// Without CUDA: the route between real processes on the test hooks' stand-in for the driver
// (LF_TEST_FAKE_CUDA_IPC=1), which "opens" an allocation at an address derived from its buffer
// id and touches no memory.

/// The layout from src/channels/transports/shm/ring.rs and the CUDA IPC route's descriptor
/// (src/channels/transports/cuda_ipc/wire.rs), as a hostile producer would learn them.
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
    const TEST: &str = "cuda_ipc::hostile_cuda_descriptors_detach_only_their_producer";
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
    const TEST: &str = "cuda_ipc::a_ready_value_without_a_shared_semaphore_is_refused_naming_the_way_out";
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
    const TEST: &str = "cuda_ipc::a_consumer_that_cannot_open_cuda_memory_has_the_send_refused_naming_why";
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

/// VMM memory reaches a consumer with a Vulkan device on the same GPU as an lf_buffer too: the
/// piece's fd imported into Vulkan when the message's buffer is first asked for, reading the
/// producer's bytes (skipped without CUDA, or where the consumer's Vulkan device is another GPU).
#[cfg(feature = "vulkan")]
#[test]
fn vmm_memory_is_lent_as_a_vulkan_buffer() {
    const TEST: &str = "cuda_ipc::vmm_memory_is_lent_as_a_vulkan_buffer";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let allocation = Allocation::new(driver, "vmm", LEN);
            set(driver, allocation.ptr(), 0x3c, LEN);
            set(driver, allocation.ptr() + OFFSET as u64, 0xc3, SENT);
            let (buffer, at) = register(allocation.ptr(), LEN);
            let mut p = producer("cuda-vulkan");
            let seq = p.send_buffer(&buffer, at + OFFSET, SENT).unwrap();
            p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
            drop(p);
            drop(buffer);
            allocation.free(driver);
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let Some(context) = crate::gpu::gpu_ctx() else { return };
            let cuda_uuid = driver.device_uuid(driver.device(0).unwrap()).unwrap();
            let vulkan_uuid = context.gpu_device().unwrap().info().device_uuid;
            let mut c =
                Consumer::create(&context, "cuda-vulkan", &here(), &here(), &config(strategy("block"))).unwrap();
            let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
            if vulkan_uuid != cuda_uuid {
                println!("skipped: the Vulkan device is not CUDA device 0");
                assert!(message.buffer().is_none());
                return;
            }
            let lent = message.buffer().expect("VMM memory of this GPU is lent as a Vulkan buffer");
            assert_eq!(lent.len(), SENT);
            let mut bytes = vec![0u8; SENT];
            lent.read_at(0, &mut bytes).unwrap();
            assert!(bytes.iter().all(|&b| b == 0xc3), "the producer's bytes through Vulkan");
            // The same memory through CUDA.
            let (ptr, _) = message.cuda_ptr().unwrap();
            assert!(read(driver, ptr, SENT).iter().all(|&b| b == 0xc3));
            report("read", 1);
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            run_pair(TEST, "cuda-vulkan");
        }
    }
}

/// Both ends threads of one process, over shared memory: the consumer's CUDA pointer is the
/// producer's own (a CUDA IPC handle does not open in the process that made it).
#[test]
fn both_ends_in_one_process_share_the_pointer() {
    const TEST: &str = "cuda_ipc::both_ends_in_one_process_share_the_pointer";
    match child_role().as_deref() {
        Some("both") => {
            let Some(driver) = cuda() else { return };
            let allocation = Allocation::new(driver, "legacy", LEN);
            set(driver, allocation.ptr(), 0x42, LEN);
            let (buffer, at) = register(allocation.ptr(), LEN);
            let consumer = std::thread::spawn(|| {
                let mut c = consumer("cuda-one-process");
                let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
                let found = message.cuda_ptr().unwrap();
                drop(message);
                found
            });
            let mut p = producer("cuda-one-process");
            let seq = p.send_buffer(&buffer, at + OFFSET, SENT).unwrap();
            p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
            let (ptr, device) = consumer.join().unwrap();
            assert_eq!((ptr, device), (allocation.ptr() + OFFSET as u64, 0), "the producer's own address");
            drop(p);
            drop(buffer);
            allocation.free(driver);
        }
        Some(_) => {}
        None => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            let dir = test_dir("cuda-one-process");
            wait_ok(spawn(TEST, "both", &dir, &[]), "both ends");
            assert_dir_empty(&dir);
        }
    }
}
