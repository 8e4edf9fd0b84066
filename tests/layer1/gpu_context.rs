//! GPU memory through the one API: `Context` opens the device, `Context::allocate` hands out
//! GPU buffers as `Buffer`s (or visible CPU fallbacks), `Buffer::export` / `Context::import`
//! carry them to a second real process, `write_at`/`read_at`/`Context::copy` move data, and
//! GPU-pinned CPU memory reports its registrations.
//!
//! Tests that need a Vulkan device skip (printing why) where there is none, and fail instead
//! when `LF_REQUIRE_VULKAN=1`. Two-process tests re-execute this binary (see gpu_memory.rs).

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;

use lava_flow::memory::gpu::DEVICE_ENV;
use lava_flow::memory::{
    Buffer, BufferOrigin, Context, ContextConfig, DeviceRegistration, DeviceSelector, ExportHandle, GpuPolicy,
    MemoryLocation,
};
use lava_flow::Error;

use super::gpu_memory::{
    assert_no_fd_leak, child_role, connect_to_parent, expect_child_success, pattern, recv_byte, require_vulkan,
    send_byte, spawn_child_in,
};

const GPU_LOCATIONS: [MemoryLocation; 2] = [MemoryLocation::GpuDeviceLocal, MemoryLocation::GpuHostVisible];

fn config(gpu: GpuPolicy) -> ContextConfig {
    let mut config = ContextConfig::default();
    config.gpu = gpu;
    config.gpu_arena_size = 4 << 20;
    config
}

/// A context with a Vulkan device, or `None` (after printing why) where there is none and
/// `LF_REQUIRE_VULKAN=1` is not set.
fn gpu_context(test: &str) -> Option<Context> {
    match Context::new(config(GpuPolicy::Required)) {
        Ok(context) => Some(context),
        Err(Error::Unsupported(why)) if !require_vulkan() => {
            eprintln!("SKIP {test}: no usable Vulkan device: {why} (set LF_REQUIRE_VULKAN=1 to fail instead)");
            None
        }
        Err(e) => panic!("{test}: Context::new with GpuPolicy::Required failed: {e}"),
    }
}

fn spawn(
    test: &str,
    role: &str,
    envs: &[(&str, &str)],
    with_socket: bool,
) -> (std::process::Child, Option<UnixStream>) {
    spawn_child_in("gpu_context", test, role, envs, with_socket)
}

fn read_all(buffer: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; buffer.len()];
    buffer.read_at(0, &mut out).unwrap();
    out
}

fn is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only queries the descriptor.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Moves an export's fd to a high, rarely used number, so that checking the number is closed
/// after a refused import is not fooled by another test thread reusing it (the kernel hands
/// out the lowest free numbers).
fn park_high(export: &mut ExportHandle) -> i32 {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    let floor = 700 + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 300;
    // SAFETY: F_DUPFD_CLOEXEC only duplicates the descriptor; the new fd is owned below.
    let high = unsafe { libc::fcntl(export.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    assert!(high >= 0, "F_DUPFD_CLOEXEC: {}", std::io::Error::last_os_error());
    // SAFETY: `high` is a fresh descriptor owned by nothing else; the old one closes on drop.
    export.fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(high) };
    high
}

#[test]
fn gpu_context_opens_and_reports_the_device() {
    let Some(context) = gpu_context("gpu_context_opens_and_reports_the_device") else { return };
    assert_eq!(context.gpu_unavailable_reason(), None);
    let info = context.device_info().expect("a device");
    println!("{info}");
    assert!(!info.name.is_empty() && !info.memory_heaps.is_empty());
    assert_ne!(info.device_uuid, [0; 16]);
    assert_ne!(info.driver_uuid, [0; 16]);
    // The same device again through the config, by index and by deviceUUID.
    for selector in [DeviceSelector::Index(info.index), DeviceSelector::Uuid(info.device_uuid)] {
        let mut by = config(GpuPolicy::Required);
        by.gpu_device = Some(selector.clone());
        let again = Context::new(by).unwrap();
        assert_eq!(again.device_info().unwrap().device_uuid, info.device_uuid, "{selector}");
    }
}

#[test]
fn gpu_context_bad_device_selection_refused() {
    const TEST: &str = "gpu_context_bad_device_selection_refused";
    if child_role(TEST).is_some() {
        // LF_VULKAN_DEVICE=99: refused under every policy that opens the GPU.
        for policy in [GpuPolicy::Auto, GpuPolicy::Required] {
            let e = Context::new(config(policy)).unwrap_err();
            assert!(matches!(e, Error::NotFound(ref m) if m.contains("index 99")), "{e}");
        }
        Context::new(config(GpuPolicy::Disabled)).unwrap();
        println!("child: {DEVICE_ENV}=99 refused");
        return;
    }
    let Some(context) = gpu_context(TEST) else { return };
    let count = context.device_info().unwrap().all_devices.len() as u32;
    for policy in [GpuPolicy::Auto, GpuPolicy::Required] {
        for selector in [DeviceSelector::Index(count + 98), DeviceSelector::Uuid([0xfe; 16])] {
            let mut bad = config(policy);
            bad.gpu_device = Some(selector.clone());
            let e = Context::new(bad).unwrap_err();
            println!("{policy:?} {selector}: {e}");
            assert!(matches!(e, Error::NotFound(ref m) if m.contains("0: ")), "lists the devices: {e}");
        }
    }
    let (child, _) = spawn(TEST, "env", &[(DEVICE_ENV, "99"), ("LF_REQUIRE_VULKAN", "1")], false);
    expect_child_success(child, "with LF_VULKAN_DEVICE=99");
}

#[test]
fn gpu_context_allocates_each_location_and_moves_data() {
    let Some(context) = gpu_context("gpu_context_allocates_each_location_and_moves_data") else { return };
    for location in GPU_LOCATIONS {
        let mut buffers = Vec::new();
        for (i, size) in [1usize, 4095, 65536, (5 << 20) + 1].into_iter().enumerate() {
            let buffer = context.allocate(size, location).unwrap();
            assert_eq!((buffer.len(), buffer.location(), buffer.fallback()), (size, location, None));
            assert_eq!(buffer.origin(), BufferOrigin::Allocated);
            let data = pattern(i as u32 + 1, size);
            buffer.write_at(0, &data).unwrap();
            assert!(read_all(&buffer) == data, "{location} {size} bytes");
            // Mappable memory has an address (and the registry knows it); other memory says why not.
            match buffer.host_ptr() {
                Ok(ptr) => assert_eq!(context.find(ptr.wrapping_add(size - 1)).unwrap().info.id, buffer.id()),
                Err(e) => {
                    assert!(matches!(e, Error::InvalidState(ref m) if m.contains("lf_buffer_write")), "{e}");
                    assert!(buffer.as_ptr().is_null());
                }
            }
            buffers.push(buffer);
        }
        // Small buffers share a pooled arena: one exported allocation, different offsets.
        let (a, b) = (buffers[0].export().unwrap(), buffers[1].export().unwrap());
        assert_eq!(a.descriptor.arena_id, b.descriptor.arena_id);
        assert_ne!(a.descriptor.offset, b.descriptor.offset);
        assert_eq!(buffers[3].export().unwrap().descriptor.offset, 0, "large buffers get their own");
        assert!(matches!(buffers[2].write_at(65532, b"hello"), Err(Error::InvalidArgument(_))));
        assert!(matches!(buffers[0].read_at(usize::MAX, &mut [0u8; 2]), Err(Error::InvalidArgument(_))));
    }
    assert!(matches!(context.allocate(0, MemoryLocation::GpuDeviceLocal), Err(Error::InvalidArgument(_))));
    let e = context.allocate(usize::MAX / 4, MemoryLocation::GpuDeviceLocal).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(ref m) if m.contains("heap")), "{e}");

    // Context::copy between every pair of kinds: GPU, CPU, GPU-pinned.
    let size = 1 << 20;
    let kinds = [
        MemoryLocation::GpuDeviceLocal,
        MemoryLocation::GpuHostVisible,
        MemoryLocation::CpuStandard,
        MemoryLocation::CpuGpuPinned,
    ];
    for (i, from) in kinds.into_iter().enumerate() {
        for (j, to) in kinds.into_iter().enumerate() {
            let src = context.allocate(size, from).unwrap();
            let dst = context.allocate(size, to).unwrap();
            let data = pattern((i * 4 + j) as u32, size);
            src.write_at(0, &data).unwrap();
            context.copy(&dst, 100, &src, 4096, 8192).unwrap();
            let mut out = vec![0u8; 8192];
            dst.read_at(100, &mut out).unwrap();
            assert!(out == data[4096..4096 + 8192], "copy {from} -> {to}");
        }
    }
    let one = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    let e = context.copy(&one, 0, &one, 100, 200).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("overlap")), "{e}");
    assert!(matches!(context.copy(&one, 4000, &one, 0, 200), Err(Error::InvalidArgument(_))));
}

#[test]
fn gpu_context_export_import_across_processes() {
    const TEST: &str = "gpu_context_export_import_across_processes";
    const SIZES: [usize; 3] = [65536, 1000, 3 << 20];
    let locations = [MemoryLocation::GpuDeviceLocal, MemoryLocation::GpuDeviceLocal, MemoryLocation::GpuHostVisible];
    if child_role(TEST).is_some() {
        let mut stream = connect_to_parent();
        let context = Context::new(config(GpuPolicy::Required)).unwrap();
        let mut imported = Vec::new();
        for (i, size) in SIZES.into_iter().enumerate() {
            let buffer = context.import(ExportHandle::recv(&stream).unwrap()).unwrap();
            assert_eq!((buffer.len(), buffer.location()), (size, locations[i]));
            assert!(matches!(buffer.origin(), BufferOrigin::Imported { .. }));
            assert!(read_all(&buffer) == pattern(i as u32 + 1, size), "child sees the parent's bytes in buffer {i}");
            buffer.write_at(0, &pattern(i as u32 + 101, size)).unwrap();
            imported.push(buffer);
        }
        assert_eq!(context.imported_arenas(), 2, "buffers 0 and 1 share an arena, imported once");
        // The same buffer again: the import cache answers, no new arena.
        let again = context.import(ExportHandle::recv(&stream).unwrap()).unwrap();
        assert_eq!(context.imported_arenas(), 2);
        assert_eq!(read_all(&again)[..16], pattern(101, 16)[..]);
        println!("child: imported {} buffers from {} arenas", imported.len() + 1, context.imported_arenas());
        send_byte(&mut stream, b'k');
        assert_eq!(recv_byte(&mut stream), b'q');
        return;
    }
    let Some(context) = gpu_context(TEST) else { return };
    let buffers: Vec<Buffer> =
        SIZES.iter().zip(locations).map(|(&size, location)| context.allocate(size, location).unwrap()).collect();
    let (child, stream) = spawn(TEST, "importer", &[("LF_REQUIRE_VULKAN", "1")], true);
    let mut stream = stream.unwrap();
    let device_uuid = context.device_info().unwrap().device_uuid;
    for (i, buffer) in buffers.iter().enumerate() {
        buffer.write_at(0, &pattern(i as u32 + 1, buffer.len())).unwrap();
        let export = buffer.export().unwrap();
        let d = &export.descriptor;
        assert_eq!((d.size as usize, d.location, d.device_uuid), (buffer.len(), buffer.location().code(), device_uuid));
        assert!(d.arena_size >= d.offset + d.size && d.handle_type == 1);
        export.send(&stream).unwrap();
    }
    buffers[0].export().unwrap().send(&stream).unwrap();
    assert_eq!(recv_byte(&mut stream), b'k', "child verified and wrote");
    for (i, buffer) in buffers.iter().enumerate() {
        assert!(
            read_all(buffer) == pattern(i as u32 + 101, buffer.len()),
            "parent sees the child's bytes in buffer {i}"
        );
    }
    send_byte(&mut stream, b'q');
    expect_child_success(child, "importer");
}

#[test]
fn gpu_context_import_twice_hits_cache_and_uuid_mismatch_is_refused() {
    let test = "gpu_context_import_twice_hits_cache_and_uuid_mismatch_is_refused";
    let (Some(exporter), Some(importer)) = (gpu_context(test), gpu_context(test)) else { return };
    let buffer = exporter.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    buffer.write_at(0, b"cached").unwrap();
    let first = importer.import(buffer.export().unwrap()).unwrap();
    let second = importer.import(buffer.export().unwrap()).unwrap();
    assert_eq!(importer.imported_arenas(), 1, "two imports of one arena import it once");
    second.write_at(0, b"CACHED").unwrap();
    assert_eq!(read_all(&first)[..6], *b"CACHED");
    assert_eq!(read_all(&buffer)[..6], *b"CACHED");
    drop((first, second));
    assert_eq!(importer.imported_arenas(), 0, "the arena goes with its last buffer");

    let tampered = |tamper: &dyn Fn(&mut ExportHandle)| {
        let mut export = buffer.export().unwrap();
        tamper(&mut export);
        let fd = park_high(&mut export);
        let e = importer.import(export).unwrap_err();
        assert!(!is_open(fd), "the fd is closed on error: {e}");
        e
    };
    let e = tampered(&|h| h.descriptor.device_uuid[0] ^= 0xff);
    println!("{e}");
    assert!(
        matches!(e, Error::Unsupported(ref m) if m.contains("another GPU or driver") && m.contains("deviceUUID")),
        "{e}"
    );
    let e = tampered(&|h| h.descriptor.driver_uuid[15] ^= 1);
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("driverUUID")), "{e}");
    let e = tampered(&|h| h.descriptor.size = h.descriptor.arena_size + 1);
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("outside")), "{e}");
    let e = tampered(&|h| h.descriptor.numa_node = 0);
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = tampered(&|h| h.descriptor.handle_type = 0x40);
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("handle type")), "{e}");
    assert_eq!(importer.imported_arenas(), 0, "nothing stays imported after a refused import");

    // A context without a GPU cannot import GPU memory: a clear error, the fd closed.
    let cpu_only = Context::new(config(GpuPolicy::Disabled)).unwrap();
    let mut export = buffer.export().unwrap();
    let fd = park_high(&mut export);
    let e = cpu_only.import(export).unwrap_err();
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("no Vulkan device")), "{e}");
    assert!(!is_open(fd));
}

#[test]
fn gpu_context_fallback_is_visible_and_strict_is_an_error() {
    const TEST: &str = "gpu_context_fallback_is_visible_and_strict_is_an_error";
    // Vulkan disabled by the config: GPU requests get CPU memory that says so.
    let check_fallback = |context: &Context, why: &str| {
        for location in GPU_LOCATIONS {
            let buffer = context.allocate(5000, location).unwrap();
            assert_eq!(buffer.location(), MemoryLocation::CpuStandard);
            let reason = buffer.fallback().expect("the fallback is recorded");
            assert!(reason.contains(&location.to_string()) && reason.contains(why), "{reason}");
            buffer.write_at(10, b"fallback").unwrap();
            // It is ordinary CPU memory: exportable and importable as such.
            let twin = context.import(buffer.export().unwrap()).unwrap();
            assert_eq!(read_all(&twin)[10..18], *b"fallback");
        }
    };
    if let Some(role) = child_role(TEST) {
        // VK_ICD_FILENAMES / VK_DRIVER_FILES point at nothing: no driver.
        match role.as_str() {
            "auto" => {
                let context = Context::new(config(GpuPolicy::Auto)).unwrap();
                let why = context.gpu_unavailable_reason().expect("no device").to_owned();
                println!("child: no driver: {why}");
                assert!(context.device_info().is_none());
                check_fallback(&context, &why);
                let mut strict = config(GpuPolicy::Auto);
                strict.strict_gpu = true;
                let e = Context::new(strict).unwrap().allocate(64, MemoryLocation::GpuDeviceLocal).unwrap_err();
                assert!(matches!(e, Error::Unsupported(ref m) if m.contains(&why)), "{e}");
            }
            _ => {
                let e = Context::new(config(GpuPolicy::Required)).unwrap_err();
                println!("child: required: {e}");
                assert!(matches!(e, Error::Unsupported(_) | Error::Vulkan(_)), "{e}");
            }
        }
        return;
    }
    let disabled = Context::new(config(GpuPolicy::Disabled)).unwrap();
    assert!(disabled.gpu_unavailable_reason().unwrap().contains("disables the GPU"));
    check_fallback(&disabled, "disables the GPU");
    let mut strict = config(GpuPolicy::Disabled);
    strict.strict_gpu = true;
    let strict = Context::new(strict).unwrap();
    for location in GPU_LOCATIONS {
        let e = strict.allocate(64, location).unwrap_err();
        assert!(
            matches!(e, Error::Unsupported(ref m) if m.contains("strict_gpu") && m.contains("disables the GPU")),
            "{e}"
        );
    }
    let no_driver = [("VK_ICD_FILENAMES", "/nonexistent/lf-icd.json"), ("VK_DRIVER_FILES", "/nonexistent/lf-icd.json")];
    for role in ["auto", "required"] {
        let (child, _) = spawn(TEST, role, &no_driver, false);
        expect_child_success(child, &format!("{role} without a Vulkan driver"));
    }
}

#[test]
fn gpu_context_pinned_memory_reports_its_registrations() {
    let Some(context) = gpu_context("gpu_context_pinned_memory_reports_its_registrations") else { return };
    let info = context.device_info().unwrap();
    let pinned = context.allocate(100_000, MemoryLocation::CpuGpuPinned).unwrap();
    println!("registrations {:?}, missing: {:?}", pinned.registrations(), pinned.registration_failures());
    // Each API either holds the memory or says why not (a driver may refuse shared memory).
    let missing = |api: &str| pinned.registration_failures().iter().any(|f| f.starts_with(api));
    let vulkan = pinned.registrations().contains(&DeviceRegistration::Vulkan { device_uuid: info.device_uuid });
    assert!(vulkan != missing("Vulkan: "), "{:?}", pinned.registration_failures());
    if !info.has_extension("VK_EXT_external_memory_host") {
        assert!(!vulkan);
    } else if std::env::var("LF_REQUIRE_VULKAN").is_ok_and(|v| v == "1") {
        assert!(vulkan, "VK_EXT_external_memory_host is offered: {:?}", pinned.registration_failures());
    }
    let cuda = pinned.registrations().iter().any(|r| matches!(r, DeviceRegistration::Cuda { .. }));
    assert!(cuda != missing("CUDA: "), "{:?}", pinned.registration_failures());
    if !lava_flow::memory::gpu::cuda_available() {
        assert!(!cuda);
    } else if std::env::var("LF_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
        assert!(cuda, "CUDA is present: {:?}", pinned.registration_failures());
    }
    assert_eq!(
        pinned.registrations().len() + pinned.registration_failures().len(),
        2,
        "each API registered or explained"
    );
    // Pinned memory moves to and from the GPU (directly on the GPU where Vulkan imported it).
    let gpu = context.allocate(100_000, MemoryLocation::GpuDeviceLocal).unwrap();
    let data = pattern(77, 100_000);
    pinned.write_at(0, &data).unwrap();
    context.copy(&gpu, 0, &pinned, 0, data.len()).unwrap();
    context.copy(&pinned, 0, &gpu, 0, 0).unwrap();
    assert!(read_all(&gpu) == data);
    assert!(context.allocate(64, MemoryLocation::CpuStandard).unwrap().registrations().is_empty());

    let cpu_only = Context::new(config(GpuPolicy::Disabled)).unwrap();
    let unregistered = cpu_only.allocate(4096, MemoryLocation::CpuGpuPinned).unwrap();
    assert!(unregistered.registrations().is_empty());
    assert!(unregistered.registration_failures()[0].contains("disables the GPU"));
}

/// `write_at`/`read_at` of GPU memory from and into GPU-pinned memory of the context: the GPU
/// copies straight between them (where Vulkan imported the pinned memory), at any offset of
/// a pooled or an own arena, and the bytes arrive whole.
#[test]
fn gpu_context_host_transfers_from_and_into_pinned_memory() {
    let Some(context) = gpu_context("gpu_context_host_transfers_from_and_into_pinned_memory") else { return };
    let _first = context.allocate(64 << 10, MemoryLocation::CpuGpuPinned).unwrap();
    let pooled = context.allocate(512 << 10, MemoryLocation::CpuGpuPinned).unwrap();
    let own = context.allocate((4 << 20) + 8192, MemoryLocation::CpuGpuPinned).unwrap();
    let gpu = context.allocate(5 << 20, MemoryLocation::GpuDeviceLocal).unwrap();
    for (pinned, len) in [(&pooled, 300_000usize), (&own, (3 << 20) + 5)] {
        println!("registrations {:?}, missing {:?}", pinned.registrations(), pinned.registration_failures());
        let data = pattern(len as u32, len);
        pinned.write_at(1001, &data).unwrap();
        let base = pinned.host_ptr().unwrap();
        // SAFETY: the ranges lie inside the live pinned buffer, which nothing else touches.
        let (from, into) = unsafe {
            (std::slice::from_raw_parts(base.add(1001), len), std::slice::from_raw_parts_mut(base.add(3), len))
        };
        gpu.write_at(77, from).unwrap();
        let mut check = vec![0u8; len];
        gpu.read_at(77, &mut check).unwrap();
        assert!(check == data, "pinned -> GPU, {len} bytes");
        into.fill(0);
        gpu.read_at(77, into).unwrap();
        assert!(into == &data[..], "GPU -> pinned, {len} bytes");
    }
}

#[test]
fn gpu_context_no_fd_leak_over_1000_cycles() {
    const TEST: &str = "gpu_context_no_fd_leak_over_1000_cycles";
    if child_role(TEST).is_none() {
        // Alone in a process of its own: other tests' descriptors would blur the count.
        if gpu_context(TEST).is_some() {
            let (child, _) = spawn(TEST, "cycles", &[("LF_REQUIRE_VULKAN", "1")], false);
            expect_child_success(child, "1,000 export/import cycles through Context");
        }
        return;
    }
    let exporter = Context::new(config(GpuPolicy::Required)).unwrap();
    let importer = Context::new(config(GpuPolicy::Required)).unwrap();
    let cycle = |i: usize| {
        let location = GPU_LOCATIONS[i % 2];
        let size = if i % 10 == 0 { 5 << 20 } else { 64 + i % 4000 };
        let buffer = exporter.allocate(size, location).unwrap();
        buffer.write_at(0, &(i as u32).to_le_bytes()).unwrap();
        let imported = importer.import(buffer.export().unwrap()).unwrap();
        let cached = importer.import(buffer.export().unwrap()).unwrap(); // cache hit: fd closed
        let mut word = [0u8; 4];
        cached.read_at(0, &mut word).unwrap();
        assert_eq!(u32::from_le_bytes(word) as usize, i);
        let mut bad = buffer.export().unwrap();
        bad.descriptor.device_uuid[3] ^= 1;
        assert!(importer.import(bad).is_err()); // refused before Vulkan: fd closed
        drop((imported, cached, buffer));
    };
    assert_no_fd_leak(cycle);
    assert_eq!(importer.imported_arenas(), 0);
}

/// Contexts opened and closed in several threads at once (a test harness does this, so do
/// servers): no crash, every one works. The Vulkan loader's driver list does not survive a
/// create racing a destroy on every driver; lava-flow serialises them.
#[test]
fn gpu_contexts_open_and_close_in_several_threads_at_once() {
    const TEST: &str = "gpu_contexts_open_and_close_in_several_threads_at_once";
    let Some(first) = gpu_context(TEST) else { return };
    drop(first);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            s.spawn(move || {
                for i in 0..15u8 {
                    let context = gpu_context(TEST).expect("a GPU context");
                    let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
                    buffer.write_at(0, &[t, i]).unwrap();
                    let mut back = [0u8; 2];
                    buffer.read_at(0, &mut back).unwrap();
                    assert_eq!(back, [t, i]);
                }
            });
        }
    });
}

/// A GPU arena larger than any memory heap of the device would make every GPU allocation
/// fail: the context refuses it at creation, naming the field and the heap.
#[test]
fn gpu_arenas_beyond_the_largest_heap_are_refused() {
    let Some(context) = gpu_context("gpu_arenas_beyond_the_largest_heap_are_refused") else { return };
    let largest = context.device_info().unwrap().memory_heaps.iter().map(|h| h.size).max().unwrap();
    drop(context);
    let mut too_large = config(GpuPolicy::Auto);
    too_large.gpu_arena_size = largest + 1;
    let err = Context::new(too_large).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(ref m) if m.contains(&format!("gpu_arena_size {}", largest + 1)) && m.contains("largest memory heap")),
        "{err}"
    );
    let mut absurd = config(GpuPolicy::Disabled);
    absurd.gpu_arena_size = 1 << 63;
    assert!(matches!(Context::new(absurd), Err(Error::InvalidArgument(ref m)) if m.contains("gpu_arena_size")));
}

#[test]
fn gpu_context_gives_freed_memory_back() {
    const TEST: &str = "gpu_context_gives_freed_memory_back";
    let Some(context) = gpu_context(TEST) else { return };
    let arena = config(GpuPolicy::Required).gpu_arena_size;
    assert_eq!(context.gpu_pooled_arenas(), 0, "no arena before the first buffer");
    // Buffers of an eighth of the arena: pooled, several arenas of each kind.
    let size = (arena / 8) as usize;
    for location in GPU_LOCATIONS {
        let buffers: Vec<Buffer> = (0..24).map(|_| context.allocate(size, location).unwrap()).collect();
        let arenas = context.gpu_pooled_arenas();
        assert!(arenas >= 3, "24 buffers of an eighth of an arena fill {arenas} arenas");
        drop(buffers);
        // Every arena emptied but one spare went back at once, to the driver.
        assert_eq!(context.gpu_pooled_arenas(), 1, "{location}: the one empty spare is kept");
        let spare_bytes = context.gpu_pooled_bytes();
        assert_eq!(context.gpu_allocated_bytes(), spare_bytes, "{location}: only the spare is left allocated");
        // A buffer over a quarter of the arena lives in an arena of its own, not in the pool.
        let large = context.allocate(arena as usize / 2, location).unwrap();
        assert_eq!(context.gpu_pooled_arenas(), 1);
        assert!(context.gpu_allocated_bytes() >= spare_bytes + arena / 2, "{location}: the large buffer's own arena");
        drop(large);
        assert_eq!(context.gpu_allocated_bytes(), spare_bytes, "{location}: an arena of its own goes when freed");
        // The spare goes too when asked; a buffer still held keeps its arena.
        let held = context.allocate(size, location).unwrap();
        assert_eq!(context.trim(), 0, "the arena holding a buffer is not given back");
        drop(held);
        let spare = context.gpu_pooled_bytes();
        if location == MemoryLocation::GpuDeviceLocal {
            assert_eq!(spare, arena, "DEVICE_LOCAL arenas are allocated whole");
        } else {
            assert!(spare > 0 && spare <= arena, "HOST_VISIBLE arenas grow up to the arena size: {spare}");
        }
        assert_eq!(context.trim(), spare, "{location}: the spare's bytes given back");
        assert_eq!(context.gpu_pooled_arenas(), 0);
        assert_eq!(context.gpu_allocated_bytes(), 0, "{location}: the bytes trim reported went back to the driver");
        assert_eq!(context.trim(), 0, "nothing left to give back");
        // Allocation after a trim makes a new arena.
        let again = context.allocate(size, location).unwrap();
        assert_eq!(context.gpu_pooled_arenas(), 1);
        drop(again);
        context.trim();
    }
}
