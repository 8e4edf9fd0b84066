//! CUDA memory the application allocated, registered with a context.
//!
//! Everywhere (CI has no CUDA): an address that is no memory is refused, and the message says
//! that no CUDA driver was found to recognise it (or that `LF_DISABLE_CUDA=1` kept it away),
//! in a fresh process (`registration_without_cuda_*`).
//!
//! On a host with the NVIDIA driver (skipped elsewhere, printing "skipped: no CUDA driver"):
//! memory allocated through lava-flow's binding of the driver API with `cuMemAlloc` (legacy),
//! `cuMemCreate` with POSIX fd handles (VMM), `cuMemAllocManaged`, `cuMemAllocAsync` (the
//! default pool) and `cuMemAllocHost` is registered and checked: kind, base, size, origin and
//! location; a second pointer of the same allocation gives the same registration; memory
//! freed and re-allocated at the same address is a new registration (`*_same_address_*`).

use std::ffi::c_void;

use lava_flow::memory::{BufferOrigin, Context, ContextConfig, CudaMemoryKind, GpuPolicy, MemoryLocation};
use lava_flow::Error;
use lava_flow_cuda::sys::*;
use lava_flow_cuda::Driver;

use crate::child::{expect_success, role_in, Spawn};

fn context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    Context::new(config).unwrap()
}

/// An address in the first page, which is never mapped.
const NO_MEMORY: *mut u8 = 0x200 as *mut u8;

const CHILD_TEST: &str = "cuda_memory::registration_without_cuda_child";

/// In a child: registers an address that is no memory and prints the message.
#[test]
fn registration_without_cuda_child() {
    let Some(role) = role_in(CHILD_TEST) else { return };
    assert!(!lava_flow_cuda::is_loaded(), "a fresh test process has not loaded CUDA");
    // SAFETY: the registration must fail; nothing is ever read through it.
    let err = unsafe { context().register(NO_MEMORY, 64) }.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("not entirely mapped memory"), "{text}");
    assert!(text.contains("no CUDA driver was"), "{text}");
    match role.as_str() {
        "disabled" => assert!(text.contains("LF_DISABLE_CUDA=1") && text.contains("unset it"), "{text}"),
        _ => assert!(
            text.contains("libcuda.so.1 is not loaded") && text.contains("register mapped host memory"),
            "{text}"
        ),
    }
    assert!(!lava_flow_cuda::is_loaded(), "a failed registration must not load CUDA");
    println!("message: {text}");
}

#[test]
fn registration_without_cuda_names_the_missing_driver() {
    let (child, _) = Spawn { test: CHILD_TEST, role: "plain", envs: &[], socket: false, capture_stderr: true }.start();
    let out = expect_success(child, "registering without CUDA");
    assert!(out.contains("message: "), "{out}");
}

#[test]
fn registration_without_cuda_names_lf_disable_cuda() {
    let envs = [("LF_DISABLE_CUDA", "1".to_owned())];
    let (child, _) =
        Spawn { test: CHILD_TEST, role: "disabled", envs: &envs, socket: false, capture_stderr: true }.start();
    expect_success(child, "registering under LF_DISABLE_CUDA=1");
}

/// The driver with device 0's primary context current on this thread, or `None` (skipped)
/// without a CUDA driver or device.
fn cuda() -> Option<&'static Driver> {
    let driver = match lava_flow_cuda::driver() {
        Ok(driver) => driver,
        Err(e) => {
            println!("skipped: no CUDA driver ({e})");
            return None;
        }
    };
    if driver.device_count().unwrap_or(0) == 0 {
        println!("skipped: no CUDA driver (no CUDA device)");
        return None;
    }
    let device = driver.device(0).unwrap();
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the retain is kept for the test process's life.
    unsafe { driver.device_primary_ctx_retain(&mut context, device) }.unwrap();
    // SAFETY: a live, retained context.
    unsafe { driver.ctx_set_current(context) }.unwrap();
    Some(driver)
}

fn mem_alloc(driver: &Driver, size: usize) -> u64 {
    let mut ptr = 0;
    // SAFETY: valid out-pointer; the context is current.
    unsafe { driver.mem_alloc(&mut ptr, size) }.unwrap();
    ptr
}

fn mem_free(driver: &Driver, ptr: u64) {
    // SAFETY: a live cuMemAlloc allocation of this test, freed once.
    unsafe { driver.mem_free(ptr) }.unwrap();
}

/// Registers `[ptr, ptr + len)` (device memory: never read by lava-flow).
fn register(context: &Context, ptr: u64, len: usize) -> lava_flow::Result<lava_flow::memory::Buffer> {
    // SAFETY: the memory outlives every registration of these tests, which end before it is freed
    // (the stale-registration tests keep only buffers whose memory is gone on purpose, and
    // never touch their bytes).
    unsafe { context.register(ptr as *mut u8, len) }
}

#[test]
fn legacy_memory_is_registered_whole_and_once() {
    let Some(driver) = cuda() else { return };
    let context = context();
    let size = 4 << 20;
    let ptr = mem_alloc(driver, size);
    let tensor = register(&context, ptr + 4096, 4096).unwrap();
    let cuda = tensor.cuda().expect("recognised as CUDA memory");
    assert_eq!(cuda.kind, CudaMemoryKind::Legacy, "{cuda:?}");
    assert_eq!(cuda.base, ptr, "the whole allocation, from its first byte: {cuda:?}");
    assert!(cuda.size >= size, "{cuda:?}");
    assert_ne!(cuda.buffer_id, 0, "{cuda:?}");
    assert_eq!(cuda.device_ordinal, 0);
    assert_eq!(tensor.origin(), BufferOrigin::Cuda { kind: CudaMemoryKind::Legacy });
    assert_eq!(tensor.location(), MemoryLocation::CudaDevice { ordinal: 0 });
    assert_eq!(tensor.len(), cuda.size);
    assert!(tensor.as_ptr().is_null(), "no host address");
    let found = context.find((ptr + 100) as *const u8).expect("any address of the allocation is found");
    assert_eq!((found.info.id, found.offset), (tensor.id(), 100));

    // A second tensor of the allocation: the same registration.
    let second = register(&context, ptr + size as u64 - 64, 64).unwrap();
    assert_eq!(second.id(), tensor.id());
    assert_eq!(second.cuda(), Some(cuda));

    // The host neither reads nor writes it, and channels cannot send it yet.
    let err = tensor.read_at(0, &mut [0u8; 16]).unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)) && err.to_string().contains("cudaMemcpy"), "{err}");
    assert!(matches!(tensor.export().unwrap_err(), Error::Unsupported(_)));
    let err = register(&context, ptr + size as u64 - 64, 128).unwrap_err();
    assert!(err.to_string().contains("runs past the end of the CUDA allocation"), "{err}");

    // The registration ends with its last buffer.
    context.deregister(tensor).unwrap();
    assert_eq!(context.find(ptr as *const u8).map(|f| f.info.id), Some(second.id()));
    drop(second);
    assert!(context.find(ptr as *const u8).is_none());
    mem_free(driver, ptr);
}

#[test]
fn legacy_memory_re_allocated_at_the_same_address_is_a_new_registration() {
    let Some(driver) = cuda() else { return };
    let context = context();
    let size = 2 << 20;
    let ptr = mem_alloc(driver, size);
    let old = register(&context, ptr, 64).unwrap();
    let old_cuda = old.cuda().unwrap();
    mem_free(driver, ptr);
    // cuMemAlloc after cuMemFree usually gives the same address back; allocations that land
    // elsewhere are held so that the next try cannot land there again.
    let mut elsewhere = Vec::new();
    let again = loop {
        let next = mem_alloc(driver, size);
        if next == ptr {
            break Some(next);
        }
        elsewhere.push(next);
        if elsewhere.len() == 64 {
            break None;
        }
    };
    for other in elsewhere {
        mem_free(driver, other);
    }
    let Some(again) = again else {
        println!("skipped: cuMemAlloc never gave {ptr:#x} back (the VMM test forces the same address)");
        return;
    };
    let new = register(&context, again, 64).unwrap();
    let new_cuda = new.cuda().unwrap();
    assert_eq!(new_cuda.base, old_cuda.base);
    assert_ne!(new_cuda.buffer_id, old_cuda.buffer_id, "CUDA gives re-created memory a new buffer id");
    assert_ne!(new.id(), old.id(), "never served from the stale registration");
    assert_eq!(context.find(again as *const u8).unwrap().info.id, new.id());
    drop(old);
    assert_eq!(context.find(again as *const u8).unwrap().info.id, new.id(), "the stale one's end leaves the new one");
    drop(new);
    mem_free(driver, again);
}

/// A VMM piece of `size` bytes with POSIX fd handles on device 0.
fn vmm_create(driver: &Driver, size: usize) -> CUmemGenericAllocationHandle {
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        ..Default::default()
    };
    let mut handle = 0;
    // SAFETY: valid out-pointer and properties.
    unsafe { driver.mem_create(&mut handle, size, &prop, 0) }.unwrap();
    handle
}

fn vmm_granularity(driver: &Driver) -> usize {
    let prop = CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        ..Default::default()
    };
    let mut granularity = 0;
    // SAFETY: valid out-pointer and properties.
    unsafe { driver.mem_get_allocation_granularity(&mut granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) }
        .unwrap();
    granularity
}

/// Maps `handle` (`size` bytes) at `va` and lets device 0 read and write it.
fn vmm_map(driver: &Driver, va: u64, size: usize, handle: CUmemGenericAllocationHandle) {
    let access = CUmemAccessDesc {
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `va` is reserved by this test, `size` bytes free of mappings; the handle is live.
    unsafe {
        driver.mem_map(va, size, 0, handle, 0).unwrap();
        driver.mem_set_access(va, size, &access, 1).unwrap();
    }
}

fn vmm_unmap(driver: &Driver, va: u64, size: usize, handle: CUmemGenericAllocationHandle) {
    // SAFETY: mapped by vmm_map; no work uses it; the handle is released once.
    unsafe {
        driver.mem_unmap(va, size).unwrap();
        driver.mem_release(handle).unwrap();
    }
}

#[test]
fn vmm_pieces_are_registered_one_by_one_and_re_created_pieces_anew() {
    let Some(driver) = cuda() else { return };
    let supported = driver.device_attribute(0, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
    if supported.unwrap_or(0) == 0 {
        println!("skipped: device 0 has no VMM memory with POSIX fd handles");
        return;
    }
    let context = context();
    let piece = vmm_granularity(driver);
    // One reservation of two pieces, as PyTorch's expandable segments grow.
    let mut va = 0;
    // SAFETY: valid out-pointer.
    unsafe { driver.mem_address_reserve(&mut va, 2 * piece, 0, 0, 0) }.unwrap();
    let (first, second) = (vmm_create(driver, piece), vmm_create(driver, piece));
    vmm_map(driver, va, piece, first);
    vmm_map(driver, va + piece as u64, piece, second);

    // The driver reports the whole contiguously mapped span as the range of a pointer in
    // either piece, but each piece has a buffer id of its own: a registration is per piece,
    // found within the span by its id.
    let a = register(&context, va + 64, 64).unwrap();
    let a_cuda = a.cuda().unwrap();
    println!("the first piece: {a_cuda:?} (piece size {piece})");
    assert_eq!(a_cuda.kind, CudaMemoryKind::Vmm, "{a_cuda:?}");
    assert_eq!((a_cuda.base, a_cuda.size), (va, piece), "the first piece alone: {a_cuda:?}");
    assert_eq!(a.origin(), BufferOrigin::Cuda { kind: CudaMemoryKind::Vmm });
    let b = register(&context, va + piece as u64 + 64, 64).unwrap();
    let b_cuda = b.cuda().unwrap();
    println!("the second piece: {b_cuda:?}");
    assert_eq!((b_cuda.base, b_cuda.size), (va + piece as u64, piece), "the second piece alone: {b_cuda:?}");
    assert_ne!(a_cuda.buffer_id, b_cuda.buffer_id);
    assert_ne!(a.id(), b.id(), "a registration per piece");
    assert_eq!(register(&context, va, 8).unwrap().id(), a.id(), "the same piece, the same registration");
    assert_eq!(register(&context, va + 2 * piece as u64 - 8, 8).unwrap().id(), b.id());
    assert_eq!(context.find((va + piece as u64 + 8) as *const u8).unwrap().info.id, b.id());
    // A range across the two pieces: the span of both, with an id of its own.
    let across = register(&context, va + piece as u64 - 8, 16).unwrap();
    let span = across.cuda().unwrap();
    assert_eq!((span.kind, span.base, span.size), (CudaMemoryKind::Vmm, va, 2 * piece), "{span:?}");
    assert!(![a_cuda.buffer_id, b_cuda.buffer_id].contains(&span.buffer_id), "{span:?}");

    // The first piece re-created at the same address (which this test controls): a new
    // registration, never the stale one.
    vmm_unmap(driver, va, piece, first);
    let renewed = vmm_create(driver, piece);
    vmm_map(driver, va, piece, renewed);
    let c = register(&context, va + 64, 64).unwrap();
    let c_cuda = c.cuda().unwrap();
    assert_eq!((c_cuda.base, c_cuda.kind), (va, CudaMemoryKind::Vmm));
    assert_ne!(c_cuda.buffer_id, a_cuda.buffer_id, "CUDA gives re-created memory a new buffer id");
    assert_ne!(c.id(), a.id(), "never served from the stale registration");
    assert_eq!(context.find((va + 8) as *const u8).unwrap().info.id, c.id());
    // The span again, over the re-created first piece: a new span id, a new registration.
    let across_again = register(&context, va + piece as u64 - 8, 16).unwrap();
    let span_again = across_again.cuda().unwrap();
    assert_eq!((span_again.base, span_again.size), (va, 2 * piece));
    assert_ne!(span_again.buffer_id, span.buffer_id, "a re-created piece makes the span new");
    assert_ne!(across_again.id(), across.id());
    drop((a, b, c, across, across_again));
    assert!(context.find(va as *const u8).is_none());
    vmm_unmap(driver, va, piece, renewed);
    vmm_unmap(driver, va + piece as u64, piece, second);
    // SAFETY: nothing is mapped in the reservation any more.
    unsafe { driver.mem_address_free(va, 2 * piece) }.unwrap();
}

#[test]
fn managed_pool_and_pinned_host_memory_are_told_apart() {
    let Some(driver) = cuda() else { return };
    let context = context();
    let size = 1 << 20;

    let mut managed = 0;
    // SAFETY: valid out-pointer; the context is current.
    unsafe { driver.mem_alloc_managed(&mut managed, size, CU_MEM_ATTACH_GLOBAL) }.unwrap();
    let buffer = register(&context, managed, 64).unwrap();
    assert_eq!(buffer.cuda().map(|c| c.kind), Some(CudaMemoryKind::Managed));
    assert_eq!(buffer.origin(), BufferOrigin::Cuda { kind: CudaMemoryKind::Managed });
    drop(buffer);
    mem_free(driver, managed);

    // The device's default memory pool exports no handle: other memory.
    let mut pooled = 0;
    // SAFETY: valid out-pointer; the legacy default stream (NULL) of the current context.
    match unsafe { driver.mem_alloc_async(&mut pooled, size, std::ptr::null_mut()) } {
        Ok(()) => {
            // SAFETY: the NULL stream of the current context.
            unsafe { driver.stream_synchronize(std::ptr::null_mut()) }.unwrap();
            let buffer = register(&context, pooled, 64).unwrap();
            assert_eq!(buffer.cuda().map(|c| c.kind), Some(CudaMemoryKind::Other), "{:?}", buffer.cuda());
            drop(buffer);
            // SAFETY: allocated above, freed once; synchronised before the test ends.
            unsafe { driver.mem_free_async(pooled, std::ptr::null_mut()) }.unwrap();
            // SAFETY: as above.
            unsafe { driver.stream_synchronize(std::ptr::null_mut()) }.unwrap();
        }
        Err(e) => println!("no memory pools here ({e}): the pool case is not checked"),
    }

    // A pool made to export POSIX fds: pool memory, registered whole (the allocation).
    let props = CUmemPoolProps {
        alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
        handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: CUmemLocation { type_: CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        ..Default::default()
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid out-pointer and properties.
    match unsafe { driver.mem_pool_create(&mut pool, &props) } {
        Ok(()) => {
            let mut pooled = 0;
            // SAFETY: valid out-pointer; the pool just made; the legacy default stream.
            unsafe { driver.mem_alloc_from_pool_async(&mut pooled, size, pool, std::ptr::null_mut()) }.unwrap();
            // SAFETY: the NULL stream of the current context.
            unsafe { driver.stream_synchronize(std::ptr::null_mut()) }.unwrap();
            let buffer = register(&context, pooled + 64, 64).unwrap();
            let cuda = buffer.cuda().unwrap();
            assert_eq!((cuda.kind, cuda.base), (CudaMemoryKind::Pool, pooled), "{cuda:?}");
            assert!(cuda.size >= size, "the whole allocation: {cuda:?}");
            drop(buffer);
            // SAFETY: allocated above, freed once; synchronised before the pool goes.
            unsafe { driver.mem_free_async(pooled, std::ptr::null_mut()) }.unwrap();
            // SAFETY: as above.
            unsafe { driver.stream_synchronize(std::ptr::null_mut()) }.unwrap();
            // SAFETY: the pool made above, with no allocation left.
            unsafe { driver.mem_pool_destroy(pool) }.unwrap();
        }
        Err(e) => println!("no IPC memory pools here ({e}): the IPC pool case is not checked"),
    }

    // Pinned host memory is host memory: registered as such, readable and writable.
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { driver.mem_alloc_host(&mut host, size) }.unwrap();
    // SAFETY: `size` bytes of host memory that outlive the buffer.
    let buffer = unsafe { context.register(host.cast(), size) }.unwrap();
    assert!(buffer.cuda().is_none());
    assert_eq!(buffer.origin(), BufferOrigin::Registered);
    assert_eq!(buffer.location(), MemoryLocation::CpuStandard);
    buffer.write_at(0, b"pinned").unwrap();
    drop(buffer);
    // SAFETY: allocated above, freed once, no longer registered.
    unsafe { driver.mem_free_host(host) }.unwrap();
}
