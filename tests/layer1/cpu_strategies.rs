//! Layer 1, CPU memory: every strategy, checked with the kernel; export to and import from a
//! real second process; leaks over many cycles; bad input.
//!
//! Tests that need a process of their own (another process to import into, a clean process to
//! count fds and mappings in, a lowered RLIMIT_MEMLOCK) run `cpu_strategies::child_role` in a
//! child (the harness of `tests/common/child.rs`) in a role.

#[cfg(unix)]
use std::io::{Read, Write};
#[cfg(unix)]
use std::os::unix::net::UnixStream;

#[cfg(unix)]
use crate::child::{expect_success, parent_socket, role_in, Spawn};

#[cfg(unix)]
use lava_flow::memory::{kernel_page_size_of, locked_bytes, node_of_address, HugepagePolicy};
use lava_flow::memory::{
    Buffer, BufferOrigin, Context, ContextConfig, ExportHandle, GpuPolicy, HugePageSize, MemoryLocation,
};
use lava_flow::{Error, ProcessLocation};

// The tests that cross processes, read /proc or /sys, or lower resource limits are Unix's
// (Linux's where they read /proc); on Windows (under Wine) the others run.
#[cfg(unix)]
const CHILD_TEST: &str = "cpu_strategies::child_role";

/// A CPU-only context: these tests are about CPU memory (gpu_context.rs covers the GPU), so
/// no Vulkan device is opened and GPU locations are refused rather than falling back.
fn context() -> Context {
    let mut config = ContextConfig::default();
    config.gpu = GpuPolicy::Disabled;
    config.strict_gpu = true;
    Context::new(config).unwrap()
}

#[cfg(unix)]
fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Free huge pages of `page`'s size (none on Windows, which gives large pages only to a
/// privileged account; under Wine /sys would be Linux's).
fn free_huge_pages(page: HugePageSize) -> u64 {
    if cfg!(windows) {
        return 0;
    }
    let kb = page.bytes() / 1024;
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB/free_hugepages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn pattern(seed: usize, at: usize) -> u8 {
    (at.wrapping_mul(31) ^ seed.wrapping_mul(7)) as u8
}

fn fill(buffer: &Buffer, seed: usize) {
    let bytes: Vec<u8> = (0..buffer.len()).map(|at| pattern(seed, at)).collect();
    buffer.write_at(0, &bytes).unwrap();
}

fn check(buffer: &Buffer, seed: usize) -> bool {
    let mut bytes = vec![0u8; buffer.len()];
    buffer.read_at(0, &mut bytes).unwrap();
    bytes.iter().enumerate().all(|(at, &b)| b == pattern(seed, at))
}

/// The locations every machine can give (hugepages only when some are free).
fn available_locations() -> Vec<MemoryLocation> {
    let mut locations =
        vec![MemoryLocation::CpuStandard, MemoryLocation::CpuNuma { node: None }, MemoryLocation::CpuGpuPinned];
    if free_huge_pages(HugePageSize::Size2M) >= 4 {
        locations.push(MemoryLocation::CpuHugepage { page: HugePageSize::Size2M });
    }
    locations
}

#[cfg(unix)]
/// Runs this binary's `child_role` test in a new process with `role`, with a socket to it
/// when `with_socket`.
fn run_child(role: &str, with_socket: bool, envs: &[(&str, String)]) -> (std::process::Child, Option<UnixStream>) {
    Spawn { test: CHILD_TEST, role, envs, socket: with_socket, capture_stderr: true }.start()
}

#[cfg(unix)]
/// The entry point of child processes; does nothing in a normal test run.
#[test]
fn child_role() {
    let Some(role) = role_in(CHILD_TEST) else { return };
    match role.as_str() {
        "importer" => importer_role(parent_socket()),
        "leak-check" => leak_check_role(),
        "memlock-limit" => memlock_limit_role(),
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn each_strategy_allocates_writes_and_reads() {
    let context = context();
    for location in available_locations() {
        for size in [1, 100, 4096, 100_000, 3 << 20] {
            let buffer = context.allocate(size, location).unwrap_or_else(|e| panic!("{location} {size}: {e}"));
            assert_eq!(buffer.len(), size);
            assert_eq!(buffer.origin(), BufferOrigin::Allocated);
            fill(&buffer, size);
            assert!(check(&buffer, size), "{location} {size}");
            match location {
                MemoryLocation::CpuNuma { node: None } => {
                    assert!(matches!(buffer.location(), MemoryLocation::CpuNuma { node: Some(_) }))
                }
                _ => assert_eq!(buffer.location(), location),
            }
        }
    }
}

#[cfg(unix)]
#[test]
fn numa_placement_is_what_the_kernel_reports() {
    let context = context();
    for &node in context.numa_nodes() {
        let buffer = context.allocate(1 << 20, MemoryLocation::CpuNuma { node: Some(node) }).unwrap();
        assert_eq!(buffer.location(), MemoryLocation::CpuNuma { node: Some(node) });
        fill(&buffer, 1);
        for at in (0..buffer.len()).step_by(page()) {
            assert_eq!(node_of_address(buffer.as_ptr().wrapping_add(at)).unwrap(), node, "page at {at}");
        }
    }
    let missing = context.numa_nodes().iter().max().unwrap() + 1;
    let err = context.allocate(64, MemoryLocation::CpuNuma { node: Some(missing) }).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("NUMA node {missing} does not exist")), "{text}");
    assert!(text.contains(&format!("nodes with memory are {}", context.numa_nodes()[0])), "{text}");
}

#[cfg(unix)]
#[test]
fn hugepages_are_really_huge_or_refused_saying_how_to_reserve() {
    let context = context();
    let huge = HugePageSize::Size2M;
    if free_huge_pages(huge) >= 2 {
        let buffer = context.allocate(5000, MemoryLocation::CpuHugepage { page: huge }).unwrap();
        assert_eq!(buffer.page_size(), huge.bytes());
        fill(&buffer, 3);
        assert_eq!(kernel_page_size_of(buffer.as_ptr()).unwrap(), huge.bytes());
    } else {
        eprintln!("no free 2 MiB huge pages: backing not checked (echo 64 > /proc/sys/vm/nr_hugepages)");
    }
    // 1 GiB pages are hardly ever reserved: the strict refusal says how to reserve them, and
    // best-effort falls back visibly.
    let giant = MemoryLocation::CpuHugepage { page: HugePageSize::Size1G };
    if free_huge_pages(HugePageSize::Size1G) == 0 {
        let err = context.allocate(4096, giant).unwrap_err();
        match &err {
            Error::OutOfMemory(text) => {
                assert!(text.contains("nr_hugepages") && text.contains("best-effort"), "{text}")
            }
            Error::Unsupported(text) => assert!(text.contains("1 GiB"), "{text}"),
            other => panic!("unexpected {other}"),
        }
        let fallback = context.allocate_with(4096, giant, HugepagePolicy::BestEffort).unwrap();
        assert_eq!(fallback.location(), MemoryLocation::CpuStandard);
        assert_eq!(fallback.page_size(), page());
        let reason = fallback.fallback().expect("a best-effort fallback says why");
        assert!(reason.contains("1 GiB huge pages") && reason.contains("best-effort"), "{reason}");
        fill(&fallback, 4);
        assert!(check(&fallback, 4));
    }
}

#[cfg(unix)]
#[test]
fn pinned_memory_is_locked() {
    let context = context();
    let before = locked_bytes().unwrap();
    let buffer = context.allocate(1000, MemoryLocation::CpuGpuPinned).unwrap();
    let after = locked_bytes().unwrap();
    assert!(after >= before + 1000, "VmLck {before} -> {after}");
    assert!(buffer.registrations().is_empty(), "the GPU is disabled");
    assert!(buffer.registration_failures()[0].contains("disables the GPU"), "{:?}", buffer.registration_failures());
    fill(&buffer, 5);
    assert!(check(&buffer, 5));
}

#[cfg(unix)]
#[test]
fn a_small_memlock_limit_gives_a_clear_error() {
    expect_success(run_child("memlock-limit", false, &[]).0, "memlock-limit");
}

#[cfg(unix)]
fn memlock_limit_role() {
    // Root ignores RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it for this thread first.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_IPC_LOCK: u32 = 14;
    let mut header = Header { version: 0x2008_0522, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: header and a two-element data array are what capget/capset v3 expect.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()), 0);
        data[0].effective &= !(1 << CAP_IPC_LOCK);
        data[0].permitted &= !(1 << CAP_IPC_LOCK);
        assert_eq!(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()), 0);
        let limit = libc::rlimit { rlim_cur: 64 << 10, rlim_max: 64 << 10 };
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit), 0);
    }
    let err = context().allocate(100, MemoryLocation::CpuGpuPinned).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::PermissionDenied(_)), "{text}");
    assert!(text.contains("RLIMIT_MEMLOCK is 65536 bytes") && text.contains("ulimit -l"), "{text}");
}

#[cfg(unix)]
#[test]
fn export_in_one_process_import_in_another_writes_seen_both_ways() {
    let context = context();
    let locations = available_locations();
    let buffers: Vec<Buffer> = locations
        .iter()
        .enumerate()
        .flat_map(|(i, &location)| {
            [100, 64 << 10, 3 << 20].map(|size| {
                let buffer = context.allocate(size, location).unwrap();
                fill(&buffer, i * 10 + size);
                buffer
            })
        })
        .collect();
    let (child, parent) = run_child("importer", true, &[]);
    let mut parent = parent.expect("a socket");
    parent.write_all(&(buffers.len() as u32).to_ne_bytes()).unwrap();
    for (n, buffer) in buffers.iter().enumerate() {
        let seed = (n / 3) * 10 + buffer.len();
        parent.write_all(&(seed as u64).to_ne_bytes()).unwrap();
        buffer.export().unwrap().send(&parent).unwrap();
        let mut ack = [0u8; 1];
        parent.read_exact(&mut ack).unwrap();
        assert_eq!(ack[0], 1, "the child saw buffer {n} ({})", buffer.location());
        assert!(check(buffer, seed + 1), "the child's writes are seen here ({})", buffer.location());
    }
    let stdout = expect_success(child, "importer");
    assert!(stdout.contains(&format!("imported {} buffers", buffers.len())), "{stdout}");
}

#[cfg(unix)]
fn importer_role(mut socket: UnixStream) {
    let context = context();
    let parent = std::os::unix::process::parent_id();
    let mut count = [0u8; 4];
    socket.read_exact(&mut count).unwrap();
    let count = u32::from_ne_bytes(count);
    let mut kept = Vec::new();
    for _ in 0..count {
        let mut seed = [0u8; 8];
        socket.read_exact(&mut seed).unwrap();
        let seed = u64::from_ne_bytes(seed) as usize;
        let handle = ExportHandle::recv(&socket).unwrap();
        let location =
            MemoryLocation::from_code(handle.descriptor.location, u32::try_from(handle.descriptor.numa_node).ok())
                .unwrap();
        let buffer = context.import(handle).unwrap();
        assert_eq!(buffer.origin(), BufferOrigin::Imported { exporter_pid: parent });
        assert_eq!(buffer.location(), location);
        let seen = check(&buffer, seed);
        fill(&buffer, seed + 1);
        socket.write_all(&[u8::from(seen)]).unwrap();
        kept.push(buffer);
    }
    println!("imported {} buffers", kept.len());
}

#[cfg(unix)]
#[test]
fn ten_thousand_cycles_leak_no_fds_and_no_mappings() {
    let stdout = expect_success(run_child("leak-check", false, &[]).0, "leak-check");
    assert!(stdout.contains("no leaks"), "{stdout}");
}

#[cfg(unix)]
fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[cfg(unix)]
fn mapped() -> (usize, usize) {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().next().unwrap().parse().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap().lines().count();
    (pages, maps)
}

#[cfg(unix)]
fn leak_check_role() {
    let context = context();
    let cycle = |i: usize| {
        let size = if i % 10 == 0 { 1 << 20 } else { 64 + i % 4000 };
        let buffer = context.allocate(size, MemoryLocation::CpuStandard).unwrap();
        buffer.write_at(size - 1, &[i as u8]).unwrap();
        let imported = context.import(buffer.export().unwrap()).unwrap();
        let mut byte = [0u8; 1];
        imported.read_at(size - 1, &mut byte).unwrap();
        assert_eq!(byte[0], i as u8);
        assert_eq!(context.find(imported.as_ptr()).unwrap().info.id, imported.id());
        // Refused imports must not leak either.
        let mut damaged = buffer.export().unwrap();
        DAMAGE[i % DAMAGE.len()].1(&mut damaged);
        assert!(context.import(damaged).is_err());
        drop(imported);
        drop(buffer);
    };
    for i in 0..100 {
        cycle(i);
    }
    let (fds, (pages, maps)) = (fd_count(), mapped());
    for i in 0..10_000 {
        cycle(i);
    }
    let (fds_after, (pages_after, maps_after)) = (fd_count(), mapped());
    assert_eq!(fds_after, fds, "open fds");
    assert_eq!(maps_after, maps, "mappings");
    assert_eq!(pages_after, pages, "mapped pages (statm size)");
    println!("no leaks: {fds} fds, {maps} mappings, {pages} pages before and after");
}

/// Ways to damage an export handle, and what the refusal says.
type Damage = fn(&mut ExportHandle);

const DAMAGE: [(&str, Damage); 6] = [
    ("not a lava-flow export handle", |h| h.descriptor.magic ^= 1),
    ("version", |h| h.descriptor.version = 9),
    ("outside its", |h| h.descriptor.offset = h.descriptor.arena_size),
    ("multiple of 64", |h| h.descriptor.offset += 1),
    ("-byte pages", |h| h.descriptor.location = MemoryLocation::CpuHugepage { page: HugePageSize::Size2M }.code()),
    ("the handle says", |h| h.descriptor.arena_size += 4096),
];

#[test]
fn bad_input_is_an_error_with_a_message() {
    let context = context();
    let err = context.allocate(0, MemoryLocation::CpuStandard).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("size 0"), "{err}");
    for size in [usize::MAX, 1 << 62] {
        let err = context.allocate(size, MemoryLocation::CpuStandard).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    }
    let err = context.allocate(64, MemoryLocation::GpuDeviceLocal).unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(ref m) if m.contains("no Vulkan device") && m.contains("strict_gpu")),
        "{err}"
    );
    assert!(Context::new({
        let mut c = ContextConfig::default();
        c.arena_size = 12345;
        c
    })
    .is_err());

    // Registration: NULL, empty, unmapped, overlapping.
    let mut memory = vec![0u8; 8192];
    // SAFETY (all registrations below): `memory` outlives the buffers; the bad ones fail.
    unsafe {
        assert!(context.register(std::ptr::null_mut(), 10).is_err());
        assert!(context.register(memory.as_mut_ptr(), 0).is_err());
        assert!(context.register(8usize as *mut u8, 4096).is_err());
        let registered = context.register(memory.as_mut_ptr(), 8192).unwrap();
        assert!(context.register(memory.as_mut_ptr().add(100), 10).is_err());
        assert_eq!(context.find(memory.as_ptr().add(8191)).unwrap().info.id, registered.id());
        assert!(matches!(registered.export(), Err(Error::Unsupported(_))));
        context.deregister(registered).unwrap();
    }
    assert!(context.find(memory.as_ptr()).is_none());

    // Imports: every damaged handle is refused (and its fd closed: see the leak check).
    let buffer = context.allocate(64, MemoryLocation::CpuStandard).unwrap();
    for (text, damage) in DAMAGE {
        let mut handle = buffer.export().unwrap();
        damage(&mut handle);
        let err = context.import(handle).unwrap_err();
        assert!(err.to_string().contains(text), "{text}: {err}");
    }
    let null_file = std::fs::File::open(if cfg!(windows) { "NUL" } else { "/dev/null" }).unwrap();
    let mut handle = buffer.export().unwrap();
    handle.fd = null_file.into();
    assert!(context.import(handle).unwrap_err().to_string().contains("not a memory file"));
    drop(buffer);

    // A message on the socket that is not an export handle.
    #[cfg(unix)]
    {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"hello").unwrap();
        assert!(matches!(ExportHandle::recv(&b), Err(Error::Corrupt(_))));
        drop(a);
        assert!(matches!(ExportHandle::recv(&b), Err(Error::PeerGone(_))));
    }
}

#[test]
fn the_registry_finds_every_buffer_by_any_address() {
    let context = context();
    let buffers: Vec<Buffer> =
        (1..200).map(|i| context.allocate(i * 37, MemoryLocation::CpuStandard).unwrap()).collect();
    for buffer in &buffers {
        for offset in [0, buffer.len() / 2, buffer.len() - 1] {
            let found = context.find(buffer.as_ptr().wrapping_add(offset)).unwrap();
            assert_eq!((found.info.id, found.offset), (buffer.id(), offset));
        }
    }
    let gone = buffers[10].as_ptr();
    drop(buffers);
    assert!(context.find(gone).is_none());
}

#[test]
fn allocate_auto_follows_the_peers_scope() {
    let context = context();
    let me = ProcessLocation::from_hostname().unwrap();
    let twin = ProcessLocation::new(&me.hostname, None, None).unwrap();
    let far = ProcessLocation::new("surely-another-host.invalid", None, None).unwrap();
    let local = context.allocate_auto(1000, &me, &twin).unwrap();
    if context.numa_nodes().len() == 1 {
        assert_eq!(local.location(), MemoryLocation::CpuStandard);
    }
    let remote = context.allocate_auto(1000, &me, &far).unwrap();
    assert!(
        matches!(remote.location(), MemoryLocation::CpuHugepage { .. } | MemoryLocation::CpuStandard),
        "{remote:?}"
    );
    // Both are shareable.
    drop(context.import(local.export().unwrap()).unwrap());
    drop(context.import(remote.export().unwrap()).unwrap());
}
