//! What the channel layer's GPU route stands on: timeline semaphores (and whether the device
//! can share them), GPU copies that wait on them, views of part of a whole-arena GPU buffer,
//! whole-arena exports, re-export of imported GPU memory, and the quarter rule for GPU arenas.
//!
//! Tests that need a Vulkan device skip (printing why) where there is none, and fail instead
//! when `LF_REQUIRE_VULKAN=1`. Two-process tests re-execute this binary (see gpu_memory.rs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lava_flow::memory::gpu::*;
use lava_flow::memory::{Buffer, BufferOrigin, Context, ContextConfig, GpuPolicy, MemoryLocation};
use lava_flow::Error;

use super::gpu_memory::{assert_no_fd_leak, child_role, expect_child_success, pattern, require_vulkan, spawn_child_in};

fn open_device(test: &str) -> Option<VulkanDevice> {
    match VulkanDevice::open(&GpuConfig::default()) {
        Ok(device) => Some(device),
        Err(Error::Unsupported(why)) if !require_vulkan() => {
            eprintln!("SKIP {test}: no usable Vulkan device: {why} (set LF_REQUIRE_VULKAN=1 to fail instead)");
            None
        }
        Err(e) => panic!("{test}: opening the Vulkan device failed: {e}"),
    }
}

fn gpu_context(test: &str, gpu_arena_size: u64) -> Option<Context> {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Required;
    config.gpu_arena_size = gpu_arena_size;
    match Context::new(config) {
        Ok(context) => Some(context),
        Err(Error::Unsupported(why)) if !require_vulkan() => {
            eprintln!("SKIP {test}: no usable Vulkan device: {why} (set LF_REQUIRE_VULKAN=1 to fail instead)");
            None
        }
        Err(e) => panic!("{test}: Context::new with GpuPolicy::Required failed: {e}"),
    }
}

fn small_arenas() -> GpuAllocatorConfig {
    GpuAllocatorConfig { arena_size: 4 << 20, ..GpuAllocatorConfig::default() }
}

/// Signals `value` on `semaphore` from another thread after `delay`.
fn signal_later(semaphore: Arc<TimelineSemaphore>, value: u64, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        semaphore.signal(value).unwrap();
    })
}

// ---------------------------------------------------------------------------------------------
// Semaphores

#[test]
fn gpu_semaphore_probe_agrees_with_device_info() {
    let Some(device) = open_device("gpu_semaphore_probe_agrees_with_device_info") else { return };
    let info = device.info();
    let report = info.to_string();
    println!("{report}");
    assert!(report.contains("timeline semaphores:"), "{report}");
    let json = info.to_json();
    assert_eq!(json["timeline_semaphores"], info.timeline_semaphores);
    assert_eq!(json["semaphore_fd"]["exportable"], info.semaphore_fd.exportable);
    assert_eq!(json["semaphore_fd"]["importable"], info.semaphore_fd.importable);
    match probe_semaphore_sharing(&device) {
        Ok(()) => {
            println!("timeline semaphores are shared as opaque fds on {}", info.name);
            assert!(info.timeline_semaphores && info.semaphore_fd.exportable && info.semaphore_fd.importable);
            assert!(info.has_extension("VK_KHR_external_semaphore_fd"));
            // The round trip by hand: two imports of one export see the same counter.
            let exported = TimelineSemaphore::new_exportable(&device, 10).unwrap();
            assert!(exported.is_exportable());
            let first = TimelineSemaphore::import(&device, exported.export_fd().unwrap()).unwrap();
            let second = TimelineSemaphore::import(&device, exported.export_fd().unwrap()).unwrap();
            assert_eq!(first.value().unwrap(), 10);
            first.signal(11).unwrap();
            assert!(second.wait(11, Duration::from_secs(1)).unwrap());
            assert_eq!(exported.value().unwrap(), 11);
        }
        Err(reason) => {
            println!("probe: {reason}");
            assert!(reason.contains(&info.name), "the reason names the device: {reason}");
            assert!(
                !(info.timeline_semaphores && info.semaphore_fd.exportable && info.semaphore_fd.importable)
                    || reason.contains("failed")
                    || reason.contains("did not see"),
                "DeviceInfo says sharing works, so the probe must name a failed step: {reason}"
            );
            if !info.has_extension("VK_KHR_external_semaphore_fd") {
                assert!(reason.contains("VK_KHR_external_semaphore_fd is not offered"), "{reason}");
                assert_eq!(info.semaphore_fd, ExternalSemaphoreSupport::default());
            } else if !info.semaphore_fd.exportable {
                assert!(reason.contains("cannot be exported as opaque fds"), "{reason}");
            }
            if !info.semaphore_fd.exportable {
                let e = TimelineSemaphore::new_exportable(&device, 0).unwrap_err();
                assert!(matches!(e, Error::Unsupported(_)), "{e}");
            }
        }
    }
}

#[test]
fn gpu_timeline_semaphore_signal_wait_value() {
    let Some(device) = open_device("gpu_timeline_semaphore_signal_wait_value") else { return };
    if !device.info().timeline_semaphores {
        let e = TimelineSemaphore::new(&device, 0).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        eprintln!("SKIP: {} has no timeline semaphores", device.info().name);
        return;
    }
    let semaphore = Arc::new(TimelineSemaphore::new(&device, 5).unwrap());
    assert!(semaphore.device().same_device(&device));
    assert_eq!(semaphore.value().unwrap(), 5);
    assert!(semaphore.wait(5, Duration::ZERO).unwrap(), "a value reached is no wait");
    let start = Instant::now();
    assert!(!semaphore.wait(6, Duration::from_millis(20)).unwrap(), "false on timeout");
    assert!(start.elapsed() >= Duration::from_millis(15));
    let signaller = signal_later(Arc::clone(&semaphore), 7, Duration::from_millis(20));
    assert!(semaphore.wait(7, Duration::from_secs(5)).unwrap());
    signaller.join().unwrap();
    assert_eq!(semaphore.value().unwrap(), 7);
    semaphore.signal(9).unwrap();
    assert!(semaphore.wait(8, Duration::ZERO).unwrap());
    // Made for this process only: not exportable.
    assert!(!semaphore.is_exportable());
    assert!(semaphore.export_fd().is_err());
}

#[test]
fn gpu_copy_buffer_waiting_waits_for_the_signal() {
    let Some(device) = open_device("gpu_copy_buffer_waiting_waits_for_the_signal") else { return };
    if !device.info().timeline_semaphores {
        eprintln!("SKIP: {} has no timeline semaphores", device.info().name);
        return;
    }
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let len = 256 << 10;
    let src = allocator.allocate(len, GpuMemoryKind::DeviceLocal).unwrap();
    let dst = allocator.allocate(len, GpuMemoryKind::DeviceLocal).unwrap();
    let data = pattern(3, len as usize);
    src.write(0, &data).unwrap();
    dst.write(0, &vec![0u8; len as usize]).unwrap();
    let semaphore = Arc::new(TimelineSemaphore::new(&device, 0).unwrap());

    let signaller = {
        let semaphore = Arc::clone(&semaphore);
        // Where the destination is mappable, look at it before signalling: the copy must not
        // have run yet.
        let peek = dst.is_host_mappable().then(|| dst.map().unwrap().as_ptr() as usize);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: the mapping lives as long as `dst`, which outlives this thread (joined
            // below); the GPU does not write it before the signal.
            let before = peek.map(|p| unsafe { std::slice::from_raw_parts(p as *const u8, 64) }.to_vec());
            semaphore.signal(1).unwrap();
            before
        })
    };
    let start = Instant::now();
    copy_buffer_waiting(&src, 0, &dst, 0, len, &[(&semaphore, 1)]).unwrap();
    let took = start.elapsed();
    let before = signaller.join().unwrap();
    println!("copy_buffer_waiting returned after {took:?}");
    assert!(took >= Duration::from_millis(40), "the copy waited for the signal ({took:?})");
    if let Some(before) = before {
        assert!(before.iter().all(|&b| b == 0), "the copy ran before the signal");
    }
    let mut out = vec![0u8; len as usize];
    dst.read(0, &mut out).unwrap();
    assert!(out == data, "the copy happened");

    // A value already reached: no wait; and a semaphore of another device is refused.
    let start = Instant::now();
    copy_buffer_waiting(&dst, 0, &src, 0, 4096, &[(&semaphore, 1)]).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    let other = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let foreign = TimelineSemaphore::new(&other, 1).unwrap();
    let e = copy_buffer_waiting(&src, 0, &dst, 0, 4096, &[(&foreign, 1)]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // copy_buffer is a copy with no waits.
    copy_buffer(&src, 0, &dst, 0, 4096).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Views and whole-arena exports

#[test]
fn gpu_views_read_write_copy_export() {
    let Some(context) = gpu_context("gpu_views_read_write_copy_export", 4 << 20) else { return };
    let device = context.gpu_device().unwrap().clone();
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    // The producer's buffer and, as a consumer would hold it, its whole arena imported.
    let source = allocator.allocate(1 << 20, GpuMemoryKind::DeviceLocal).unwrap();
    let data = pattern(9, 1 << 20);
    source.write(0, &data).unwrap();
    let arena = source.export_arena().unwrap();
    assert_eq!((arena.desc.offset, arena.desc.size), (0, source.arena_size()));
    assert_eq!(arena.desc.arena_id(), source.arena_id());
    let whole = Arc::new(GpuImporter::new(&device).import(arena).unwrap());
    assert_eq!(whole.size(), source.arena_size());

    let timeline = device.info().timeline_semaphores;
    let semaphore = timeline.then(|| Arc::new(TimelineSemaphore::new(&device, 0).unwrap()));
    let wait = |value: u64| semaphore.as_ref().map(|s| (Arc::clone(s), value));
    let at = source.offset() + 1001; // an odd offset
    let origin = BufferOrigin::Imported { exporter_pid: std::process::id() };

    // Bounds.
    for (offset, len) in [(whole.size() - 10, 11), (whole.size(), 1), (0, 0), (u64::MAX, 1)] {
        let e = Buffer::gpu_view(Arc::clone(&whole), offset, len, None, origin).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{offset}+{len}: {e}");
    }

    let view = Buffer::gpu_view(Arc::clone(&whole), at, 777, wait(3), origin).unwrap();
    assert_eq!(view.len(), 777);
    assert_eq!(view.location(), MemoryLocation::GpuDeviceLocal);
    assert_eq!(view.origin(), origin);
    assert!(view.gpu_buffer().is_none(), "a view is no GPU buffer of its own");
    if whole.is_host_mappable() {
        assert_eq!(view.host_ptr().unwrap() as usize, whole.map().unwrap().as_ptr() as usize + at as usize);
        assert!(context.find(view.as_ptr()).is_none(), "views are in no registry");
    } else {
        assert!(view.host_ptr().is_err());
    }
    let e = view.shared_arena().unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");

    // Reading waits on the host for the semaphore.
    let mut out = vec![0u8; 777];
    let start = Instant::now();
    let signaller = semaphore.as_ref().map(|s| {
        assert_eq!(view.gpu_wait().map(|(_, v)| v), Some(3));
        signal_later(Arc::clone(s), 3, Duration::from_millis(50))
    });
    view.read_at(0, &mut out).unwrap();
    if let Some(signaller) = signaller {
        assert!(start.elapsed() >= Duration::from_millis(40), "read_at waited for the semaphore");
        signaller.join().unwrap();
    }
    assert!(out[..] == data[1001..1001 + 777], "the view reads the whole buffer at its offset");
    view.write_at(5, b"hello").unwrap();
    let mut five = [0u8; 5];
    source.read(1006, &mut five).unwrap();
    assert_eq!(&five, b"hello");
    assert!(view.write_at(775, b"abc").is_err(), "range checked");

    // Context::copy between a view and a GPU buffer: the GPU waits for the semaphore.
    let target = context.allocate(777, MemoryLocation::GpuDeviceLocal).unwrap();
    let later = Buffer::gpu_view(Arc::clone(&whole), at, 777, wait(4), origin).unwrap();
    let start = Instant::now();
    let signaller = semaphore.as_ref().map(|s| signal_later(Arc::clone(s), 4, Duration::from_millis(50)));
    context.copy(&target, 0, &later, 0, 777).unwrap();
    if let Some(signaller) = signaller {
        assert!(start.elapsed() >= Duration::from_millis(40), "the copy waited for the semaphore");
        signaller.join().unwrap();
    }
    let mut copied = vec![0u8; 777];
    target.read_at(0, &mut copied).unwrap();
    assert_eq!(&copied[5..10], b"hello");
    assert!(copied[10..] == data[1011..1001 + 777]);
    // And into a view, and through the host into CPU memory.
    target.write_at(0, b"back").unwrap();
    context.copy(&later, 100, &target, 0, 4).unwrap();
    source.read(1101, &mut five[..4]).unwrap();
    assert_eq!(&five[..4], b"back");
    let cpu = context.allocate(777, MemoryLocation::CpuStandard).unwrap();
    context.copy(&cpu, 0, &later, 0, 777).unwrap();
    let mut via_cpu = vec![0u8; 777];
    cpu.read_at(0, &mut via_cpu).unwrap();
    assert_eq!(&via_cpu[100..104], b"back");

    // Export: the whole buffer's arena (the producer's identity) with the view's place in it.
    let export = view.export().unwrap();
    assert_eq!((export.descriptor.offset, export.descriptor.size), (at, 777));
    assert_eq!(export.descriptor.arena_id, source.arena_id().counter);
    assert_eq!(export.descriptor.exporter_token, source.arena_id().token);
    assert_eq!(export.descriptor.arena_size, source.arena_size());
    let imported = context.import(export).unwrap();
    let mut again = vec![0u8; 777];
    imported.read_at(0, &mut again).unwrap();
    assert_eq!(again, via_cpu, "the export of a view imports as the same bytes");

    // A value never signalled: read_at gives up after 10 s, naming the value.
    if let Some(semaphore) = &semaphore {
        let stuck = Buffer::gpu_view(Arc::clone(&whole), at, 1, Some((Arc::clone(semaphore), 1000)), origin).unwrap();
        let start = Instant::now();
        let e = stuck.read_at(0, &mut [0u8; 1]).unwrap_err();
        assert!(matches!(e, Error::Timeout(ref m) if m.contains("1000")), "{e}");
        assert!(start.elapsed() >= Duration::from_secs(9));
    }
}

#[test]
fn gpu_dedicated_arena_views_and_exports() {
    let Some(device) = open_device("gpu_dedicated_arena_views_and_exports") else { return };
    let allocator =
        GpuAllocator::new(&device, GpuAllocatorConfig { dedicated_own_arenas: true, ..small_arenas() }).unwrap();
    let dedicated = allocator.allocate_unpooled(5000, GpuMemoryKind::DeviceLocal).unwrap();
    assert!(dedicated.is_dedicated());
    let data = pattern(4, 5000);
    dedicated.write(0, &data).unwrap();
    let arena = dedicated.export_arena().unwrap();
    assert_eq!((arena.desc.offset, arena.desc.size), (0, 5000), "a dedicated arena exports as its buffer");
    let other = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let whole = Arc::new(GpuImporter::new(&other).import(arena).unwrap());
    let view = Buffer::gpu_view(Arc::clone(&whole), 333, 100, None, BufferOrigin::Allocated).unwrap();
    let mut out = [0u8; 100];
    view.read_at(0, &mut out).unwrap();
    assert!(out[..] == data[333..433]);
    // Part of a dedicated allocation, imported on a third device: the same bytes.
    let third = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let handle = view.export().unwrap();
    assert_eq!((handle.descriptor.offset, handle.descriptor.size), (333, 100));
    drop(handle);
    let mut export = whole.export().unwrap();
    (export.desc.offset, export.desc.size) = (333, 100);
    let part = GpuImporter::new(&third).import(export).unwrap();
    assert_eq!(part.raw_buffer_offset(), 333);
    let mut again = [0u8; 100];
    part.read(0, &mut again).unwrap();
    assert_eq!(again, out);
}

// ---------------------------------------------------------------------------------------------
// Layer 1 rules

#[test]
fn gpu_buffers_above_a_quarter_of_the_arena_get_their_own() {
    let Some(context) = gpu_context("gpu_buffers_above_a_quarter_of_the_arena_get_their_own", 64 << 20) else {
        return;
    };
    let small = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    let quarter = context.allocate(16 << 20, MemoryLocation::GpuDeviceLocal).unwrap();
    let big = context.allocate(20 << 20, MemoryLocation::GpuDeviceLocal).unwrap();
    let (small, quarter, big) = (small.gpu_buffer().unwrap(), quarter.gpu_buffer().unwrap(), big.gpu_buffer().unwrap());
    assert_eq!(small.arena_size(), 64 << 20);
    assert_eq!(quarter.arena_id(), small.arena_id(), "a quarter of the arena is still pooled");
    assert_ne!(big.arena_id(), small.arena_id(), "20 MiB of a 64 MiB arena gets an arena of its own");
    assert!(big.arena_size() < 64 << 20 && big.arena_size() >= 20 << 20, "{}", big.arena_size());
    assert_eq!(big.offset(), 0);
}

#[test]
fn gpu_errors_name_no_rust_items() {
    let Some(context) = gpu_context("gpu_errors_name_no_rust_items", 4 << 20) else { return };
    let buffer = context.allocate(4096, MemoryLocation::GpuDeviceLocal).unwrap();
    let e = buffer.shared_arena().unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains("GPU route") && e.contains("lf_buffer_copy"), "{e}");
    for banned in ["Context::copy", "not built yet", "later issue"] {
        assert!(!e.contains(banned), "{e}");
    }
    // An import refused for its UUID prints the handle type by its Vulkan name.
    let mut export = buffer.export().unwrap();
    export.descriptor.device_uuid[0] ^= 0xff;
    let e = context.import(export).unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains("OPAQUE_FD") && !e.contains("Some(") && !e.contains("OpaqueFd"), "{e}");
}

#[test]
fn gpu_reexport_of_imported_arenas_leaks_no_fd() {
    const TEST: &str = "gpu_reexport_of_imported_arenas_leaks_no_fd";
    if child_role(TEST).is_none() {
        // Alone in a process of its own: other tests' descriptors would blur the count.
        if open_device(TEST).is_none() {
            return;
        }
        let (child, _) = spawn_child_in("gpu_sharing", TEST, "cycles", &[("LF_REQUIRE_VULKAN", "1")], false);
        expect_child_success(child, "1,000 import/re-export cycles");
        return;
    }
    let exporter = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let middle = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let last = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let allocator = GpuAllocator::new(&exporter, small_arenas()).unwrap();
    let dedicated =
        GpuAllocator::new(&exporter, GpuAllocatorConfig { dedicated_own_arenas: true, ..small_arenas() }).unwrap();
    let cycle = |i: usize| {
        let word = (i as u32).to_le_bytes();
        for buffer in [
            allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap(),
            dedicated.allocate_unpooled(8192, GpuMemoryKind::HostVisible).unwrap(),
        ] {
            buffer.write(16, &word).unwrap();
            // Imported on one device, exported again, imported on another: the same memory.
            let imported = GpuImporter::new(&middle).import(buffer.export().unwrap()).unwrap();
            assert!(imported.is_exportable());
            let again = imported.export().unwrap();
            assert_eq!(again.desc.arena_id(), buffer.arena_id(), "the original identity");
            let whole = imported.export_arena().unwrap();
            let reimported = GpuImporter::new(&last).import(again).unwrap();
            let mut seen = [0u8; 4];
            reimported.read(16, &mut seen).unwrap();
            assert_eq!(seen, word);
            // A view of the whole imported arena, exported: yet another fd, closed on drop.
            let whole = Arc::new(GpuImporter::new(&last).import(whole).unwrap());
            let view = Buffer::gpu_view(whole, buffer.offset() + 16, 4, None, BufferOrigin::Allocated).unwrap();
            let handle = view.export().unwrap();
            view.read_at(0, &mut seen).unwrap();
            assert_eq!(seen, word);
            drop((handle, view, reimported, imported, buffer));
        }
    };
    assert_no_fd_leak(cycle);
    assert_eq!(GpuImporter::new(&middle).cached_arenas(), 0);
    assert_eq!(GpuImporter::new(&last).cached_arenas(), 0);
}
