//! GPU memory (Vulkan): device selection and report, allocation of each kind, host transfers,
//! GPU copies, export to and import in a second real process, the import cache, refusal of
//! foreign or tampered exports, fd hygiene, and GPU-pinned host memory.
//!
//! Tests that need a Vulkan device skip (printing why) where there is none, and fail instead
//! when `LF_REQUIRE_VULKAN=1`. `LF_VULKAN_DEVICE` picks the device (index or deviceUUID).
//! Two-process tests run themselves in a child in a role (the harness of
//! `tests/common/child.rs`); the child talks to the parent over a Unix socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Child;

use lava_flow::memory::gpu::*;
use lava_flow::Error;

// ---------------------------------------------------------------------------------------------
// Helpers

pub(crate) fn require_vulkan() -> bool {
    std::env::var("LF_REQUIRE_VULKAN").is_ok_and(|v| v == "1")
}

/// The device the tests use, or `None` (after printing why) when there is none and
/// `LF_REQUIRE_VULKAN=1` is not set.
pub(crate) fn open_device(test: &str) -> Option<VulkanDevice> {
    match VulkanDevice::open(&GpuConfig::default()) {
        Ok(device) => Some(device),
        Err(Error::Unsupported(why)) if !require_vulkan() => {
            eprintln!("SKIP {test}: no usable Vulkan device: {why} (set LF_REQUIRE_VULKAN=1 to fail instead)");
            None
        }
        Err(e) => panic!("{test}: opening the Vulkan device failed: {e}"),
    }
}

fn small_arenas() -> GpuAllocatorConfig {
    GpuAllocatorConfig { arena_size: 4 << 20, ..GpuAllocatorConfig::default() }
}

fn dedicated_arenas() -> GpuAllocatorConfig {
    GpuAllocatorConfig { dedicated_own_arenas: true, ..small_arenas() }
}

/// A recognisable byte pattern: word i of seed s.
pub(crate) fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len.div_ceil(4))
        .flat_map(|i| ((seed << 24) ^ (i as u32).wrapping_mul(2_654_435_761)).to_le_bytes())
        .take(len)
        .collect()
}

fn read_all(buffer: &GpuBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buffer.size() as usize];
    buffer.read(0, &mut out).unwrap();
    out
}

pub(crate) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Runs `cycle` 1,000 times (after 10 to warm up: drivers open descriptors of their own on
/// first use, and keep them) and fails if the process holds more descriptors afterwards.
pub(crate) fn assert_no_fd_leak(cycle: impl Fn(usize)) {
    for i in 0..10 {
        cycle(i);
    }
    let before = open_fds();
    for i in 1..=1000 {
        cycle(i);
    }
    let after = open_fds();
    println!("child: open fds before {before}, after 1,000 cycles {after}");
    assert_eq!(before, after, "descriptors leaked");
}

/// `Some(role)` when this process is the child of `test`.
pub(crate) fn child_role(test: &str) -> Option<String> {
    crate::child::role_in(test)
}

/// Starts this test binary again, running only `test` in role `role`, with a socket to talk
/// over when `with_socket`.
fn spawn_child(test: &str, role: &str, envs: &[(&str, &str)], with_socket: bool) -> (Child, Option<UnixStream>) {
    spawn_child_in("gpu_memory", test, role, envs, with_socket)
}

/// [`spawn_child`] for a test of module `module`.
pub(crate) fn spawn_child_in(
    module: &str,
    test: &str,
    role: &str,
    envs: &[(&str, &str)],
    with_socket: bool,
) -> (Child, Option<UnixStream>) {
    let envs: Vec<(&str, String)> = envs.iter().map(|&(k, v)| (k, v.to_owned())).collect();
    let test = format!("{module}::{test}");
    crate::child::Spawn { test: &test, role, envs: &envs, socket: with_socket, capture_stderr: true }.start()
}

pub(crate) fn connect_to_parent() -> UnixStream {
    crate::child::parent_socket()
}

/// Waits for the child and fails the test, with its output, unless it succeeded.
pub(crate) fn expect_child_success(child: Child, what: &str) {
    let stdout = crate::child::expect_success(child, what);
    // Under VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation, API misuse in the child fails too.
    assert!(!stdout.contains("Validation Error"), "child {what} misused Vulkan:\n{stdout}");
    for line in stdout.lines().filter_map(|l| l.find("child:").map(|at| &l[at..])) {
        println!("{line}");
    }
}

pub(crate) fn send_byte(stream: &mut UnixStream, byte: u8) {
    stream.write_all(&[byte]).unwrap();
}

pub(crate) fn recv_byte(stream: &mut UnixStream) -> u8 {
    let mut b = [0u8; 1];
    stream.read_exact(&mut b).unwrap();
    b[0]
}

// ---------------------------------------------------------------------------------------------
// Device

#[test]
fn gpu_open_device_and_report() {
    let Some(device) = open_device("gpu_open_device_and_report") else { return };
    let info = device.info();
    println!("{info}");
    assert!(!info.name.is_empty());
    assert_ne!(info.device_uuid, [0; 16], "deviceUUID is reported");
    assert!(!info.memory_heaps.is_empty() && !info.memory_types.is_empty());
    assert!(info.has_extension("VK_KHR_external_memory_fd"));
    assert!(info.opaque_fd.exportable && info.opaque_fd.importable, "opaque fd export: {:?}", info.opaque_fd);
    assert!(info.all_devices.iter().any(|d| d.3 == info.device_uuid));
    let json = info.to_json();
    assert_eq!(json["device_uuid"], format_uuid(&info.device_uuid));

    // The same device again, by index and by UUID, whatever LF_VULKAN_DEVICE says.
    let by_index = VulkanDevice::open(&GpuConfig::with_device(DeviceSelector::Index(info.index))).unwrap();
    assert_eq!(by_index.device_uuid(), info.device_uuid);
    let uuid_text = format_uuid(&info.device_uuid);
    let by_uuid = VulkanDevice::open(&GpuConfig::with_device(uuid_text.parse().unwrap())).unwrap();
    assert_eq!(by_uuid.info().index, info.index);
    assert!(!by_uuid.same_device(&device));
}

#[test]
fn gpu_bad_device_selector_refused() {
    const TEST: &str = "gpu_bad_device_selector_refused";
    if let Some(role) = child_role(TEST) {
        // The parent set LF_VULKAN_DEVICE: 99 ("env") or a malformed value ("env-bad").
        let e = VulkanDevice::open(&GpuConfig::default()).unwrap_err();
        if role == "env" {
            assert!(matches!(e, Error::NotFound(ref m) if m.contains("index 99") && m.contains("0: ")), "{e}");
        } else {
            assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains(DEVICE_ENV)), "{e}");
        }
        let without_env = GpuConfig { device: None, use_env: false };
        VulkanDevice::open(&without_env).unwrap();
        println!("child: {DEVICE_ENV}={:?} refused: {e}", std::env::var(DEVICE_ENV).unwrap());
        return;
    }
    let Some(device) = open_device(TEST) else { return };
    let count = device.info().all_devices.len() as u32;
    let e = VulkanDevice::open(&GpuConfig::with_device(DeviceSelector::Index(count + 98))).unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::NotFound(ref m) if m.contains(&device.info().name)), "lists devices: {e}");
    let e = VulkanDevice::open(&GpuConfig::with_device(DeviceSelector::Uuid([0xff; 16]))).unwrap_err();
    assert!(matches!(e, Error::NotFound(ref m) if m.contains(&format_uuid(&device.device_uuid()))), "{e}");
    assert!(matches!("not-a-device".parse::<DeviceSelector>(), Err(Error::InvalidArgument(_))));

    let (child, _) = spawn_child(TEST, "env", &[(DEVICE_ENV, "99"), ("LF_REQUIRE_VULKAN", "1")], false);
    expect_child_success(child, "with LF_VULKAN_DEVICE=99");
    let (child, _) = spawn_child(TEST, "env-bad", &[(DEVICE_ENV, "gpu-zero"), ("LF_REQUIRE_VULKAN", "1")], false);
    expect_child_success(child, "with LF_VULKAN_DEVICE=gpu-zero");
}

// ---------------------------------------------------------------------------------------------
// Allocation and host transfers

#[test]
fn gpu_allocate_each_kind_write_read() {
    let Some(device) = open_device("gpu_allocate_each_kind_write_read") else { return };
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    for kind in GpuMemoryKind::ALL {
        let Some(type_index) = allocator.memory_type_index(kind) else {
            panic!("device {} has no {kind} memory type", device.info().name);
        };
        println!(
            "{kind}: memory type {type_index} {}",
            describe_memory_flags(device.info().memory_types[type_index as usize].property_flags)
        );
        let mut buffers = Vec::new();
        for (i, size) in [1usize, 4095, 65536, (3 << 20) + 7, (5 << 20) + 1].into_iter().enumerate() {
            let buffer = allocator.allocate(size as u64, kind).unwrap();
            assert_eq!((buffer.size(), buffer.kind()), (size as u64, kind));
            assert!(buffer.offset() + buffer.size() <= buffer.arena_size());
            let data = pattern(i as u32 + 1, size);
            buffer.write(0, &data).unwrap();
            assert_eq!(read_all(&buffer), data, "{kind} {size} bytes, direct or staged as the memory allows");
            // The staged path, which DEVICE_LOCAL memory takes on real GPUs, on every device.
            let data = pattern(i as u32 + 50, size);
            buffer.write_staged(0, &data).unwrap();
            let mut out = vec![0u8; size];
            buffer.read_staged(0, &mut out).unwrap();
            assert_eq!(out, data);
            assert_eq!(read_all(&buffer), data);
            buffers.push(buffer);
        }
        // Small buffers share a pooled arena; the one above the arena size has its own.
        assert_eq!(buffers[0].arena_id(), buffers[1].arena_id());
        assert_ne!(buffers[0].offset(), buffers[1].offset());
        assert_ne!(buffers[4].arena_id(), buffers[0].arena_id());
        assert_eq!(buffers[4].offset(), 0);
        // Partial writes and out-of-range access.
        buffers[2].write(100, b"hello").unwrap();
        let mut five = [0u8; 5];
        buffers[2].read(100, &mut five).unwrap();
        assert_eq!(&five, b"hello");
        assert!(matches!(buffers[2].write(65532, b"hello"), Err(Error::InvalidArgument(_))));
        assert!(matches!(buffers[0].read(u64::MAX, &mut five), Err(Error::InvalidArgument(_))));
        drop(buffers);
        assert!(allocator.arena_count(kind) >= 1);
    }
    assert!(matches!(allocator.allocate(0, GpuMemoryKind::DeviceLocal), Err(Error::InvalidArgument(_))));
    let pooled = GpuMemoryKind::ALL.map(|kind| allocator.pooled_bytes(kind));
    assert_eq!(pooled[0], allocator.arena_count(GpuMemoryKind::DeviceLocal) as u64 * allocator.config().arena_size);
    assert!(
        pooled[1] > 0
            && pooled[1] <= allocator.arena_count(GpuMemoryKind::HostVisible) as u64 * allocator.config().arena_size
    );
    assert_eq!(allocator.trim(), pooled[0] + pooled[1], "every idle arena is given back");
    assert_eq!(allocator.arena_count(GpuMemoryKind::DeviceLocal), 0);
}

/// HOST_VISIBLE memory is pinned and cleared by the driver when allocated, so its pooled
/// arenas start at a 32nd of the arena size and double: the first buffer is quick.
#[test]
fn gpu_host_visible_arenas_grow() {
    let Some(device) = open_device("gpu_host_visible_arenas_grow") else { return };
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    let arena = allocator.config().arena_size;
    let first = allocator.allocate(64 << 10, GpuMemoryKind::HostVisible).unwrap();
    assert_eq!(first.arena_size(), arena / 32);
    // Filling it makes the next arena twice as large; DEVICE_LOCAL arenas are whole.
    let fill: Vec<GpuBuffer> =
        (0..31).map(|_| allocator.allocate(64 << 10, GpuMemoryKind::HostVisible).unwrap()).collect();
    assert!(fill.iter().all(|b| b.arena_id() == first.arena_id()));
    let second = allocator.allocate(64 << 10, GpuMemoryKind::HostVisible).unwrap();
    assert_ne!(second.arena_id(), first.arena_id());
    assert_eq!(second.arena_size(), arena / 16);
    assert_eq!(allocator.pooled_bytes(GpuMemoryKind::HostVisible), arena / 32 + arena / 16);
    assert_eq!(allocator.allocate(64 << 10, GpuMemoryKind::DeviceLocal).unwrap().arena_size(), arena);
}

/// Staged transfers go in pieces through a few staging buffers, several pieces in flight: a
/// transfer of many pieces at odd offsets arrives whole, and leaves the bytes around it alone.
#[test]
fn gpu_staging_larger_than_one_chunk() {
    let Some(device) = open_device("gpu_staging_larger_than_one_chunk") else { return };
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    let size = (64 << 20) + 4096 + 3; // many 4 MiB pieces, more than the staging slots
    let buffer = allocator.allocate(size as u64 + 64, GpuMemoryKind::DeviceLocal).unwrap();
    buffer.write_staged(0, &vec![0xEEu8; size + 64]).unwrap();
    let data = pattern(9, size);
    buffer.write_staged(31, &data).unwrap();
    let mut out = vec![0u8; size];
    buffer.read_staged(31, &mut out).unwrap();
    assert!(out == data, "staged round trip of {size} bytes at offset 31");
    let mut edges = [0u8; 64];
    buffer.read_staged(0, &mut edges[..31]).unwrap();
    buffer.read_staged(31 + size as u64, &mut edges[31..]).unwrap();
    assert!(edges.iter().all(|&b| b == 0xEE), "bytes around the transfer untouched");
    // A transfer of a piece and a bit, at an odd offset of both.
    let piece = (4 << 20) + 5;
    let data = pattern(10, piece);
    buffer.write_staged(1_000_003, &data).unwrap();
    let mut out = vec![0u8; piece];
    buffer.read(1_000_003, &mut out).unwrap();
    assert!(out == data, "a piece and a bit");
}

#[test]
fn gpu_map_host_visible() {
    let Some(device) = open_device("gpu_map_host_visible") else { return };
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let buffer = allocator.allocate(8192, GpuMemoryKind::HostVisible).unwrap();
    assert!(buffer.is_host_mappable());
    let map = buffer.map().unwrap();
    assert_eq!(map.len(), 8192);
    // SAFETY: nothing else touches the buffer while the slice lives.
    unsafe { map.as_mut_slice()[..4].copy_from_slice(b"abcd") };
    let mut out = [0u8; 4];
    buffer.read(0, &mut out).unwrap();
    assert_eq!(&out, b"abcd");
    buffer.write(4, b"efgh").unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { &map.as_slice()[..8] }, b"abcdefgh");

    let local = allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap();
    if local.is_host_mappable() {
        println!("DEVICE_LOCAL memory of {} is host-visible too (CPU driver or resizable BAR)", device.info().name);
        local.map().unwrap();
    } else {
        assert!(matches!(local.map(), Err(Error::InvalidState(_))));
    }
}

#[test]
fn gpu_copy_buffer_to_buffer() {
    let Some(device) = open_device("gpu_copy_buffer_to_buffer") else { return };
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let size = 1 << 20;
    let src = allocator.allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    let dst = allocator.allocate(size, GpuMemoryKind::HostVisible).unwrap();
    let own = allocator.allocate_unpooled(size, GpuMemoryKind::DeviceLocal).unwrap();
    let data = pattern(3, size as usize);
    src.write(0, &data).unwrap();
    copy_buffer(&src, 0, &dst, 0, size).unwrap();
    assert!(read_all(&dst) == data);
    let timing = copy_buffer_timed(&dst, 4096, &own, 0, 8192).unwrap();
    println!("8 KiB copy: {timing:?}");
    let mut out = vec![0u8; 8192];
    own.read(0, &mut out).unwrap();
    assert_eq!(out, data[4096..4096 + 8192]);

    // Refusals: out of range, zero length, overlap inside one buffer, another device.
    assert!(matches!(copy_buffer(&src, 1, &dst, 0, size), Err(Error::InvalidArgument(_))));
    assert!(matches!(copy_buffer(&src, 0, &dst, 0, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(copy_buffer(&src, 0, &src, 100, 200), Err(Error::InvalidArgument(_))));
    copy_buffer(&src, 0, &src, 1000, 1000).unwrap();
    let other = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let other_buffer =
        GpuAllocator::new(&other, small_arenas()).unwrap().allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    assert!(matches!(copy_buffer(&src, 0, &other_buffer, 0, 16), Err(Error::InvalidArgument(_))));
}

// ---------------------------------------------------------------------------------------------
// Export and import

#[test]
fn gpu_export_import_across_processes() {
    const TEST: &str = "gpu_export_import_across_processes";
    const SIZES: [u64; 5] = [65536, 65536 + 5, 1 << 20, 256 << 10, (128 << 10) + 1];
    if let Some(role) = child_role(TEST) {
        assert_eq!(role, "importer");
        let mut stream = connect_to_parent();
        let device = VulkanDevice::open(&GpuConfig::default()).unwrap();
        let importer = GpuImporter::new(&device);
        let mut imported = Vec::new();
        for (i, size) in SIZES.into_iter().enumerate() {
            let export = GpuExport::recv(&stream).unwrap();
            assert_eq!(export.desc.size, size);
            let buffer = importer.import(export).unwrap();
            assert!(buffer.is_imported());
            assert!(
                read_all(&buffer) == pattern(i as u32 + 1, size as usize),
                "child sees the parent's bytes in buffer {i}"
            );
            buffer.write(0, &pattern(i as u32 + 101, size as usize)).unwrap();
            imported.push(buffer);
        }
        // Buffers 0 and 1 came from one exported arena: imported once.
        assert_eq!(imported[0].raw_memory(), imported[1].raw_memory());
        assert_eq!(importer.cached_arenas(), 4);
        assert!(imported[4].is_dedicated() && !imported[0].is_dedicated());
        println!("child: imported 5 buffers from {} arenas on {}", importer.cached_arenas(), device.info().name);
        send_byte(&mut stream, b'k');
        assert_eq!(recv_byte(&mut stream), b'q');
        return;
    }
    let Some(device) = open_device(TEST) else { return };
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let buffers = [
        allocator.allocate(SIZES[0], GpuMemoryKind::DeviceLocal).unwrap(),
        allocator.allocate(SIZES[1], GpuMemoryKind::DeviceLocal).unwrap(),
        allocator.allocate(SIZES[2], GpuMemoryKind::HostVisible).unwrap(),
        allocator.allocate_unpooled(SIZES[3], GpuMemoryKind::DeviceLocal).unwrap(),
        GpuAllocator::new(&device, dedicated_arenas())
            .unwrap()
            .allocate_unpooled(SIZES[4], GpuMemoryKind::HostVisible)
            .unwrap(),
    ];
    assert!(buffers[4].is_dedicated());
    assert_eq!(buffers[0].arena_id(), buffers[1].arena_id(), "one arena, one fd, many buffers");
    let (child, stream) = spawn_child(TEST, "importer", &[], true);
    let mut stream = stream.unwrap();
    for (i, buffer) in buffers.iter().enumerate() {
        buffer.write(0, &pattern(i as u32 + 1, buffer.size() as usize)).unwrap();
        let export = buffer.export().unwrap();
        assert_eq!((export.desc.offset, export.desc.size), (buffer.offset(), buffer.size()));
        assert_eq!(export.desc.device_uuid, device.device_uuid());
        export.send(&stream).unwrap();
        // `export` drops here: its fd closes in this process; the child has its own copy.
    }
    assert_eq!(recv_byte(&mut stream), b'k', "child verified and wrote");
    for (i, buffer) in buffers.iter().enumerate() {
        assert!(
            read_all(buffer) == pattern(i as u32 + 101, buffer.size() as usize),
            "parent sees the child's bytes in buffer {i}"
        );
    }
    send_byte(&mut stream, b'q');
    expect_child_success(child, "importer");
}

#[test]
fn gpu_import_twice_hits_cache() {
    let Some(device) = open_device("gpu_import_twice_hits_cache") else { return };
    // A second device handle stands in for the other process's own device.
    let other = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let importer = GpuImporter::new(&other);
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let a = allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap();
    let b = allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap();
    a.write(0, b"from a").unwrap();
    b.write(0, b"from b").unwrap();
    let export_a = a.export().unwrap();
    let export_a_again = a.export().unwrap();
    let export_b = b.export().unwrap();
    assert_eq!(export_a.desc.arena_id(), export_b.desc.arena_id());
    let ia = importer.import(export_a).unwrap();
    let ia2 = importer.import(export_a_again).unwrap();
    let ib = importer.import(export_b).unwrap();
    assert_eq!(importer.cached_arenas(), 1, "three imports of one arena import it once");
    assert_eq!(ia.raw_memory(), ia2.raw_memory());
    assert_eq!(ia.raw_memory(), ib.raw_memory());
    let mut six = [0u8; 6];
    ib.read(0, &mut six).unwrap();
    assert_eq!(&six, b"from b");
    ia2.write(0, b"via a2").unwrap();
    a.read(0, &mut six).unwrap();
    assert_eq!(&six, b"via a2");
    drop((ia, ia2, ib));
    assert_eq!(importer.cached_arenas(), 0, "the arena goes with its last imported buffer");
    let again = importer.import(a.export().unwrap()).unwrap();
    assert_eq!(importer.cached_arenas(), 1);
    again.read(0, &mut six).unwrap();
    assert_eq!(&six, b"via a2");

    // Unpooled arenas, re-imported while alive.
    let big = allocator.allocate_unpooled(1 << 20, GpuMemoryKind::HostVisible).unwrap();
    big.write(1000, b"big").unwrap();
    let i1 = importer.import(big.export().unwrap()).unwrap();
    let i2 = importer.import(big.export().unwrap()).unwrap();
    assert_eq!(i1.raw_memory(), i2.raw_memory());
    assert_eq!(importer.cached_arenas(), 2);
    let mut three = [0u8; 3];
    i2.read(1000, &mut three).unwrap();
    assert_eq!(&three, b"big");

    // A dedicated arena: every import shares the one buffer the memory is dedicated to.
    let dedicated = GpuAllocator::new(&device, dedicated_arenas())
        .unwrap()
        .allocate_unpooled(5000, GpuMemoryKind::DeviceLocal)
        .unwrap();
    assert!(dedicated.is_dedicated());
    let export = dedicated.export().unwrap();
    assert_eq!(export.desc.flags & GPU_EXPORT_DEDICATED, GPU_EXPORT_DEDICATED);
    let d1 = importer.import(export).unwrap();
    let d2 = importer.import(dedicated.export().unwrap()).unwrap();
    assert!(d1.is_dedicated() && d1.raw_buffer() == d2.raw_buffer());
    d1.write(4990, b"0123456789").unwrap();
    let mut ten = [0u8; 10];
    dedicated.read(4990, &mut ten).unwrap();
    assert_eq!(&ten, b"0123456789");
    drop((d1, d2));

    // Imported memory is exported again (a copy of the fd it came with), under the original
    // exporter's arena identity.
    assert!(i1.is_exportable());
    let re = i1.export().unwrap();
    assert_eq!(re.desc.arena_id(), big.arena_id());
    assert_eq!((re.desc.offset, re.desc.size, re.desc.arena_size), (0, 1 << 20, big.arena_size()));
    drop(re);

    // Not exportable: plain (non-exportable) allocations.
    let plain = GpuAllocator::new(&device, GpuAllocatorConfig { exportable: false, ..small_arenas() }).unwrap();
    assert!(matches!(plain.allocate(64, GpuMemoryKind::DeviceLocal).unwrap().export(), Err(Error::InvalidState(_))));
}

#[test]
fn gpu_uuid_mismatch_refused() {
    let Some(device) = open_device("gpu_uuid_mismatch_refused") else { return };
    let importer = GpuImporter::new(&device);
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let buffer = allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap();

    let tampered = |tamper: &dyn Fn(&mut GpuExportDesc)| {
        let mut export = buffer.export().unwrap();
        tamper(&mut export.desc);
        importer.import(export).unwrap_err()
    };
    let e = tampered(&|d| d.device_uuid[0] ^= 0xff);
    println!("{e}");
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("deviceUUID")), "{e}");
    let e = tampered(&|d| d.driver_uuid[15] ^= 1);
    assert!(matches!(e, Error::Unsupported(ref m) if m.contains("driverUUID")), "{e}");
    let e = tampered(&|d| d.memory_type_index = 31);
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("memory type 31")), "{e}");
    let e = tampered(&|d| d.memory_property_flags ^= 0x8);
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = tampered(&|d| d.offset = d.arena_size);
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("outside")), "{e}");
    // An offset that is not a multiple of the buffer alignment (an export of part of a
    // buffer) is imported: bound below it, starting inside.
    buffer.write(0, b"abcdef").unwrap();
    let mut part = buffer.export().unwrap();
    part.desc.offset += 1;
    part.desc.size -= 1;
    let part = importer.import(part).unwrap();
    let mut five = [0u8; 5];
    part.read(0, &mut five).unwrap();
    assert_eq!(&five, b"bcdef");
    drop(part);
    let e = tampered(&|d| d.magic = 0);
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(importer.cached_arenas(), 0, "nothing stays imported after a refused import");
}

#[test]
fn gpu_no_fd_leak_over_1000_cycles() {
    const TEST: &str = "gpu_no_fd_leak_over_1000_cycles";
    if child_role(TEST).is_none() {
        // Alone in a process of its own: other tests' descriptors would blur the count.
        if open_device(TEST).is_none() {
            return;
        }
        let (child, _) = spawn_child(TEST, "cycles", &[("LF_REQUIRE_VULKAN", "1")], false);
        expect_child_success(child, "1,000 export/import cycles");
        return;
    }
    let device = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let other = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let importer = GpuImporter::new(&other);
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let dedicated = GpuAllocator::new(&device, dedicated_arenas()).unwrap();
    let cycle = |i: u32| {
        let pooled = allocator.allocate(4096, GpuMemoryKind::DeviceLocal).unwrap();
        let own = if i % 2 == 0 { &allocator } else { &dedicated }
            .allocate_unpooled(8192, GpuMemoryKind::HostVisible)
            .unwrap();
        pooled.write(0, &i.to_le_bytes()).unwrap();
        let mut misaligned = pooled.export().unwrap();
        misaligned.desc.offset += 1;
        misaligned.desc.size -= 1;
        // Imported (Vulkan takes the fd, the arena keeps a copy to export again), then freed.
        drop(importer.import(misaligned).unwrap());
        let first = importer.import(pooled.export().unwrap()).unwrap();
        let mut contradicting = pooled.export().unwrap();
        contradicting.desc.flags ^= GPU_EXPORT_DEDICATED;
        // A cache hit that contradicts the cached arena: refused, fd closed.
        assert!(matches!(importer.import(contradicting), Err(Error::InvalidArgument(_))));
        // Re-export of the imported arena, imported on the first device: the same memory.
        let back = GpuImporter::new(&device).import(first.export().unwrap()).unwrap();
        let mut word = [0u8; 4];
        back.read(0, &mut word).unwrap();
        assert_eq!(u32::from_le_bytes(word), i);
        drop(back);
        let cached = importer.import(pooled.export().unwrap()).unwrap(); // cache hit: fd closed
        cached.read(0, &mut word).unwrap();
        assert_eq!(u32::from_le_bytes(word), i);
        let mut bad = own.export().unwrap();
        bad.desc.driver_uuid[0] ^= 1;
        assert!(importer.import(bad).is_err()); // refused before Vulkan: fd closed
        let mut bad = own.export().unwrap();
        bad.desc.offset += 1;
        assert!(importer.import(bad).is_err()); // outside the arena: refused, fd closed
        let own_imported = importer.import(own.export().unwrap()).unwrap();
        own_imported.write(0, b"x").unwrap();
        drop((first, cached, own_imported, own, pooled));
    };
    assert_no_fd_leak(|i| cycle(i as u32));
    assert_eq!(importer.cached_arenas(), 0);
}

// ---------------------------------------------------------------------------------------------
// GPU-pinned host memory

#[test]
fn gpu_host_import_of_page_aligned_mmap() {
    let Some(device) = open_device("gpu_host_import_of_page_aligned_mmap") else { return };
    let Some(align) = device.info().min_imported_host_pointer_alignment else {
        let e = unsafe { import_host_memory(&device, std::ptr::null_mut(), 4096) }.unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)));
        eprintln!("SKIP: {} lacks VK_EXT_external_memory_host", device.info().name);
        return;
    };
    let len = (1usize << 20).next_multiple_of(align as usize);
    let host = Anonymous::new(len).unwrap();
    // SAFETY: the mapping outlives the import (dropped at the end of the test, after it).
    let pinned = unsafe { import_host_memory(&device, host.as_ptr(), len) }.unwrap();
    assert_eq!(pinned.len(), len as u64);
    let data = pattern(7, len);
    // SAFETY: the mapping is len bytes and no GPU work runs now.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host.as_ptr(), len) };
    let allocator = GpuAllocator::new(&device, small_arenas()).unwrap();
    let gpu = allocator.allocate(len as u64, GpuMemoryKind::DeviceLocal).unwrap();
    copy_buffer(pinned.buffer(), 0, &gpu, 0, len as u64).unwrap();
    assert!(read_all(&gpu) == data, "the GPU read the pinned host memory");
    gpu.write(0, &pattern(8, len)).unwrap();
    copy_buffer(&gpu, 0, pinned.buffer(), 0, len as u64).unwrap();
    // SAFETY: the copy has finished; the mapping is len bytes.
    let seen = unsafe { std::slice::from_raw_parts(host.as_ptr(), len) };
    assert!(seen == pattern(8, len).as_slice(), "the GPU wrote the pinned host memory");

    // SAFETY (both): the refused calls import nothing.
    let misaligned = unsafe { import_host_memory(&device, host.as_ptr().add(1), 4096) };
    assert!(matches!(misaligned, Err(Error::InvalidArgument(_))));
    let empty = unsafe { import_host_memory(&device, host.as_ptr(), 0) };
    assert!(matches!(empty, Err(Error::InvalidArgument(_))));
    drop(pinned);
}

#[test]
fn gpu_cuda_host_register() {
    let host = Anonymous::new(1 << 20).unwrap();
    let uuid = VulkanDevice::open(&GpuConfig::default()).ok().map(|d| d.device_uuid());
    // SAFETY: the mapping outlives the registration.
    match unsafe { cuda_host_register(host.as_ptr(), host.len(), uuid) } {
        Ok(registration) => {
            println!(
                "cuMemHostRegister OK on CUDA device {} (driver {:?})",
                registration.cuda_device(),
                cuda_driver_version()
            );
            assert_eq!(registration.len(), 1 << 20);
            // SAFETY: as above. A second registration of the same range is refused.
            let again = unsafe { cuda_host_register(host.as_ptr(), host.len(), uuid) };
            assert!(matches!(again, Err(Error::InvalidState(_))), "{again:?}");
        }
        Err(Error::Unsupported(why)) => {
            assert!(!cuda_available());
            assert!(std::env::var("LF_REQUIRE_CUDA").map_or(true, |v| v != "1"), "CUDA required but: {why}");
            eprintln!("SKIP cuMemHostRegister: {why}");
        }
        Err(e) => panic!("cuMemHostRegister: {e}"),
    }
}

/// Fresh, private, page-aligned memory of this process (mmap), unmapped on drop.
struct Anonymous {
    ptr: *mut u8,
    len: usize,
}

impl Anonymous {
    fn new(len: usize) -> std::io::Result<Self> {
        // SAFETY: a new private anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Anonymous { ptr: ptr.cast(), len })
    }

    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Anonymous {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
