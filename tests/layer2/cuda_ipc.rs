//! CUDA memory the application allocated, between real processes of one host, by reference
//! (the cuda_ipc route): per allocation kind, the consumer reads the producer's bytes through
//! its CUDA pointer and writes back, and the producer sees it; memory freed and re-allocated
//! at the same address gives the new bytes; kinds no other process can open are refused;
//! stream-ordered sends, whose consumer's stream waits on the GPU; kill -9 of either end.
//! (The route without CUDA, on the test hooks' stand-in: cuda_ipc_fake.rs.) Each child skips, saying "skipped: no CUDA driver", without libcuda
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
    Vmm {
        va: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    },
    Managed(CUdeviceptr),
    Pool(CUdeviceptr),
    /// Memory of [`ipc_pool`].
    IpcPool(CUdeviceptr),
}

/// This process's CUDA memory pool on device 0 that exports POSIX fds, made at the first call
/// (kept for the process's life, so that memory freed and allocated again from it likely
/// lies at the same address).
fn ipc_pool(driver: &Driver) -> CUmemoryPool {
    static POOL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *POOL.get_or_init(|| {
        let props = CUmemPoolProps {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
            ..Default::default()
        };
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and properties.
        unsafe { driver.mem_pool_create(&mut pool, &props) }.unwrap();
        pool as usize
    }) as CUmemoryPool
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
            "ipcpool" => {
                // SAFETY: valid out-pointer; a pool of this process; the legacy default stream.
                unsafe { driver.mem_alloc_from_pool_async(&mut ptr, len, ipc_pool(driver), std::ptr::null_mut()) }
                    .unwrap();
                // SAFETY: no arguments.
                unsafe { driver.ctx_synchronize() }.unwrap();
                Allocation::IpcPool(ptr)
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
            Allocation::Legacy(p) | Allocation::Managed(p) | Allocation::Pool(p) | Allocation::IpcPool(p) => p,
            Allocation::Vmm { va, .. } => va,
        }
    }

    fn free(self, driver: &Driver) {
        match self {
            // SAFETY: frees what `new` made, once; nothing uses it after.
            Allocation::Legacy(p) | Allocation::Managed(p) => unsafe { driver.mem_free(p) }.unwrap(),
            Allocation::Pool(p) | Allocation::IpcPool(p) => {
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
            for kind in ["legacy", "vmm", "ipcpool"] {
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
            for kind in ["legacy", "vmm", "ipcpool"] {
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
            for kind in ["legacy", "vmm", "ipcpool"] {
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

/// A Vulkan context on CUDA device 0's GPU (the channel's ready semaphore is its), or `None`
/// (printing why) where there is none.
#[cfg(feature = "vulkan")]
fn vulkan_on_cuda_device_0(driver: &Driver) -> Option<lava_flow::memory::Context> {
    use lava_flow::memory::{Context, ContextConfig, DeviceSelector};
    let uuid = driver.device_uuid(driver.device(0).unwrap()).unwrap();
    let mut config = ContextConfig::default();
    config.gpu_device = Some(DeviceSelector::Uuid(uuid));
    let context = match Context::new(config) {
        Ok(context) => context,
        Err(e) => {
            println!("skipped: no Vulkan device on CUDA device 0 ({e})");
            return None;
        }
    };
    match context.gpu_device().map(|d| d.info().device_uuid) {
        Some(found) if found == uuid => Some(context),
        _ => {
            println!("skipped: no Vulkan device on CUDA device 0 ({:?})", context.gpu_unavailable_reason());
            None
        }
    }
}

#[cfg(feature = "vulkan")]
/// The channel's ready semaphore (`fd`) imported into CUDA (the driver takes the fd).
fn import_semaphore(driver: &Driver, fd: std::os::fd::OwnedFd) -> CUexternalSemaphore {
    use std::os::fd::IntoRawFd;
    let desc = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
        type_: CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD,
        handle: [fd.into_raw_fd() as u32 as u64, 0],
        flags: 0,
        reserved: [0; 16],
    };
    let mut semaphore: CUexternalSemaphore = std::ptr::null_mut();
    // SAFETY: a valid descriptor of an fd this process owns; out-pointer valid.
    unsafe { driver.import_external_semaphore(&mut semaphore, &desc) }.unwrap();
    semaphore
}

#[cfg(feature = "vulkan")]
fn new_stream(driver: &Driver) -> CUstream {
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the current context is device 0's.
    unsafe { driver.stream_create(&mut stream, 0) }.unwrap();
    stream
}

#[cfg(feature = "vulkan")]
/// Whether `stream` still has work to do.
fn busy(driver: &Driver, stream: CUstream) -> bool {
    // SAFETY: a stream of this process.
    match unsafe { driver.stream_query(stream) } {
        Ok(()) => false,
        Err(e) if e.code() == Some(CUDA_ERROR_NOT_READY) => true,
        Err(e) => panic!("{e}"),
    }
}

#[cfg(feature = "vulkan")]
/// A stream's host function: holds the stream back until the file its argument names exists
/// (for at most a minute, so that a failed test does not hang).
unsafe extern "C" fn hold_until_file(gate: *mut c_void) {
    // SAFETY: the path the producer leaked for this one call.
    let gate = unsafe { Box::from_raw(gate.cast::<std::path::PathBuf>()) };
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !gate.exists() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Stream-ordered sends of CUDA memory: the producer queues its writes (cuMemsetD8Async) and
/// the signal of the channel's ready semaphore on a stream and sends with that value without
/// synchronising; the consumer's stream waits for the value on the GPU before reading. The
/// second message's producer stream is held back (a host function waiting for the
/// orchestrator's word): the send returns all the same, the consumer's read stays pending, and
/// once the producer's stream goes on, the consumer reads the new bytes. Skipped without CUDA,
/// or without a Vulkan device on CUDA device 0.
#[cfg(feature = "vulkan")]
#[test]
fn stream_ordered_cuda_memory_is_waited_for_on_the_consumer_s_stream() {
    const TEST: &str = "cuda_ipc::stream_ordered_cuda_memory_is_waited_for_on_the_consumer_s_stream";
    let name = || format!("cuda-stream-{}", arg("kind"));
    let block = || config(strategy("block"));
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let Some(context) = vulkan_on_cuda_device_0(driver) else { return };
            let allocation = Allocation::new(driver, &arg("kind"), LEN);
            set(driver, allocation.ptr(), 0, LEN);
            // SAFETY: CUDA device memory of this process, alive until the test frees it.
            let buffer = unsafe { context.register(allocation.ptr() as usize as *mut u8, LEN) }.unwrap();
            let at = (allocation.ptr() - buffer.cuda().expect("CUDA memory").base) as usize;
            let mut p = Producer::create(&context, &name(), &here(), &here(), &block()).unwrap();
            let reason = p.transport().reason.clone();
            assert!(reason.contains("stream-ordered sends"), "{reason}");
            let semaphore = import_semaphore(driver, p.ready_semaphore().unwrap());
            let stream = new_stream(driver);
            let signal = |value: u64| {
                let params = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS { fence_value: value, ..Default::default() };
                // SAFETY: a live semaphore and stream, valid parameters.
                unsafe { driver.signal_external_semaphores_async(&semaphore, &params, 1, stream) }.unwrap();
            };
            let first = allocation.ptr() + OFFSET as u64;
            // SAFETY: SENT bytes of the live allocation at each address, on a stream of this context.
            unsafe { driver.memset_d8_async(first, 0xa1, SENT, stream) }.unwrap();
            signal(1);
            p.send_buffer_after(&buffer, at + OFFSET, SENT, 1, None).unwrap();

            let gate = Box::into_raw(Box::new(std::path::PathBuf::from(arg("gate"))));
            // SAFETY: the host function takes the path back, once.
            unsafe { driver.launch_host_func(stream, Some(hold_until_file), gate.cast()) }.unwrap();
            // SAFETY: as above.
            unsafe { driver.memset_d8_async(first + SENT as u64, 0xc5, SENT, stream) }.unwrap();
            signal(2);
            let seq = p.send_buffer_after(&buffer, at + OFFSET + SENT, SENT, 2, None).unwrap();
            assert!(busy(driver, stream), "the send returned while the stream is held: nothing waited on the host");
            report("sent", seq);
            p.wait_completed(seq, Some(Duration::from_secs(60))).unwrap();
            // SAFETY: this process's stream and semaphore, not used after.
            unsafe {
                driver.stream_synchronize(stream).unwrap();
                driver.stream_destroy(stream).unwrap();
                driver.destroy_external_semaphore(semaphore).unwrap();
            }
            drop(p);
            drop(buffer);
            allocation.free(driver);
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let Some(context) = vulkan_on_cuda_device_0(driver) else { return };
            let mut c = Consumer::create(&context, &name(), &here(), &here(), &block()).unwrap();
            let semaphore = import_semaphore(driver, c.ready_semaphore().unwrap());
            let stream = new_stream(driver);
            // Pinned: a copy into pageable memory would wait on the host.
            let mut host: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            unsafe { driver.mem_alloc_host(&mut host, SENT) }.unwrap();
            for (value, byte) in [(1u64, 0xa1u8), (2, 0xc5)] {
                let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
                assert_eq!(message.ready_value(), value);
                let (ptr, _) = message.cuda_ptr().unwrap();
                let params = CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS { fence_value: value, ..Default::default() };
                // SAFETY: a live semaphore and stream; SENT pinned bytes at `host`, SENT bytes of
                // the held message at `ptr`.
                unsafe {
                    std::ptr::write_bytes(host.cast::<u8>(), 0, SENT);
                    driver.wait_external_semaphores_async(&semaphore, &params, 1, stream).unwrap();
                    driver.memcpy_dtoh_async(host, ptr, SENT, stream).unwrap();
                }
                if value == 2 {
                    assert!(busy(driver, stream), "the read waits on the GPU for the held producer stream");
                    report("waiting", 1);
                }
                // SAFETY: a stream of this process.
                unsafe { driver.stream_synchronize(stream) }.unwrap();
                // SAFETY: SENT pinned bytes, written by the finished copy.
                let got = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), SENT) };
                assert!(got.iter().all(|&b| b == byte), "message {value}: {:#x}, not {byte:#x}", got[0]);
                drop(message);
            }
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
            // SAFETY: this process's resources, not used after.
            unsafe {
                driver.mem_free_host(host).unwrap();
                driver.stream_destroy(stream).unwrap();
                driver.destroy_external_semaphore(semaphore).unwrap();
            }
        }
        _ => {
            let Some(driver) = cuda_here().then(cuda).flatten() else {
                println!("skipped: no CUDA driver");
                return;
            };
            if vulkan_on_cuda_device_0(driver).is_none() {
                return;
            }
            for kind in ["legacy", "vmm"] {
                let dir = test_dir(&format!("cuda-stream-{kind}"));
                let scratch = scratch_dir();
                let gate = scratch.path().join("go");
                let args = [("kind", kind.to_owned()), ("gate", gate.display().to_string())];
                let (consumer, mut consumer_out) = spawn_reporting(TEST, "consumer", &dir, &args);
                let (producer, mut producer_out) = spawn_reporting(TEST, "producer", &dir, &args);
                expect_line(&mut producer_out, "sent");
                expect_line(&mut consumer_out, "waiting");
                std::fs::write(&gate, b"go").unwrap();
                wait_ok(producer, "producer");
                wait_ok(consumer, "consumer");
                assert_dir_empty(&dir);
            }
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

/// The byte a span test writes at offset `i` of its range.
fn span_byte(i: usize) -> u8 {
    (i % 251) as u8 ^ 0x3c
}

/// A message across CUDA VMM pieces mapped back to back in one reservation (as PyTorch's
/// expandable segments grow): three granularity-sized pieces with POSIX fd handles, a pattern
/// written across them, and a region from inside the first to inside the third sent; the
/// consumer maps the span into one range and reads every byte through its one pointer.
#[test]
fn a_message_across_vmm_pieces_reads_every_byte() {
    const TEST: &str = "cuda_ipc::a_message_across_vmm_pieces_reads_every_byte";
    match child_role().as_deref() {
        Some("producer") => {
            let Some(driver) = cuda() else { return };
            let prop = CUmemAllocationProp {
                type_: CU_MEM_ALLOCATION_TYPE_PINNED,
                requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
                ..Default::default()
            };
            let mut piece = 0;
            // SAFETY: valid out-pointer and properties.
            unsafe { driver.mem_get_allocation_granularity(&mut piece, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) }
                .unwrap();
            let total = 3 * piece;
            let mut va: CUdeviceptr = 0;
            // SAFETY: valid out-pointer; the driver picks the range.
            unsafe { driver.mem_address_reserve(&mut va, total, 0, 0, 0) }.unwrap();
            let access = CUmemAccessDesc {
                location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            let mut handles = Vec::new();
            for i in 0..3 {
                let mut handle = 0;
                // SAFETY: valid out-pointer and properties; a granularity-sized piece.
                unsafe { driver.mem_create(&mut handle, piece, &prop, 0) }.unwrap();
                let at = va + (i * piece) as u64;
                // SAFETY: a piece-sized part of the reservation above, not mapped yet.
                unsafe { driver.mem_map(at, piece, 0, handle, 0) }.unwrap();
                // SAFETY: the piece just mapped; a valid descriptor.
                unsafe { driver.mem_set_access(at, piece, &access, 1) }.unwrap();
                handles.push(handle);
            }
            let pattern: Vec<u8> = (0..total).map(span_byte).collect();
            // SAFETY: `total` host bytes to `total` bytes of device memory mapped above.
            unsafe { driver.memcpy_htod(va, pattern.as_ptr().cast::<c_void>(), total) }.unwrap();
            // From inside the first piece to inside the third.
            let (start, len) = (piece - 4096, piece + 8192);
            let (buffer, at) = register(va + start as u64, len);
            let span = buffer.cuda().unwrap();
            assert_eq!((span.base, span.size), (va, total), "the span of the three pieces: {span:?}");
            let mut p = producer("cuda-span");
            let seq = p.send_buffer(&buffer, at, len).unwrap();
            p.wait_completed(seq, Some(Duration::from_secs(30))).unwrap();
            drop(p);
            drop(buffer);
            for (i, handle) in handles.into_iter().enumerate() {
                // SAFETY: undoes the mapping above, once; nothing uses the memory after.
                unsafe { driver.mem_unmap(va + (i * piece) as u64, piece) }.unwrap();
                // SAFETY: as above.
                unsafe { driver.mem_release(handle) }.unwrap();
            }
            // SAFETY: nothing is mapped in the reservation any more.
            unsafe { driver.mem_address_free(va, total) }.unwrap();
        }
        Some("consumer") => {
            let Some(driver) = cuda() else { return };
            let mut c = consumer("cuda-span");
            let message = c.recv_timeout(Duration::from_secs(30)).unwrap();
            let (ptr, device) = message.cuda_ptr().unwrap();
            assert_eq!(device, 0);
            let bytes = read(driver, ptr, message.len());
            // The region starts 4096 bytes before the end of the first piece.
            let piece = (message.len() - 8192) as u64;
            let start = (piece - 4096) as usize;
            for (i, &b) in bytes.iter().enumerate() {
                assert_eq!(b, span_byte(start + i), "byte {i} of {} (offset {} in the span)", bytes.len(), start + i);
            }
            assert!(message.buffer().is_none(), "a span has no Vulkan view");
            drop(message);
            assert!(matches!(c.recv_timeout(Duration::from_secs(30)), Err(Error::PeerGone(_))));
        }
        _ => {
            if !cuda_here() {
                println!("skipped: no CUDA driver");
                return;
            }
            run_pair(TEST, "cuda-span");
        }
    }
}
