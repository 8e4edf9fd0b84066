//! GPU-to-GPU copies: the copy engine, the copy shader and CUDA, forced in turn, on sizes
//! from one byte to 256 MiB, at offsets congruent mod 16, mod 4 only and not at all, with the
//! bytes around the destination checked untouched; overlap refused; what `CopyMethod::Auto`
//! chooses; `LF_GPU_COPY` (a child process with the variable set), and a shader copy that
//! waits for a timeline semaphore. Where CUDA cannot take the buffers (no NVIDIA driver, as on
//! lavapipe), a copy by CUDA is refused with the reason; `LF_REQUIRE_CUDA=1` makes that a
//! failure.
//!
//! On lavapipe (a CPU device) `maxStorageBufferRange` is 128 MiB, so the 256 MiB shader copy
//! takes several dispatches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lava_flow::memory::gpu::*;
use lava_flow::Error;

use super::gpu_memory::{child_role, expect_child_success, open_device, pattern, spawn_child_in};

/// The sizes every method copies at every offset pair.
const SIZES: [u64; 7] = [1, 15, 16, 17, 4095, (1 << 20) + 3, 64 << 20];
/// (source offset, destination offset): congruent mod 16, mod 4 only, not at all.
const OFFSETS: [(u64, u64); 4] = [(0, 0), (5, 21), (3, 7), (1, 2)];
/// Bytes checked on each side of the destination range.
const MARGIN: u64 = 48;

/// The first index where `got` and `want` differ, for a readable failure.
fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter().zip(want).position(|(a, b)| a != b).or((got.len() != want.len()).then_some(got.len().min(want.len())))
}

/// What a copy made by `method` from `src_offset` to `dst_offset` (buffers at offset 0 of
/// their `VkBuffer`s; `dst_local`: the destination is DEVICE_LOCAL) reports as its method.
fn expected_method(method: CopyMethod, src_offset: u64, dst_offset: u64, len: u64, dst_local: bool) -> CopyMethod {
    if method == CopyMethod::Cuda {
        // Host memory is the engine's.
        return if dst_local { CopyMethod::Cuda } else { CopyMethod::Engine };
    }
    if method != CopyMethod::Shader {
        return CopyMethod::Engine;
    }
    let apart = src_offset.abs_diff(dst_offset);
    let element = [16, 4].into_iter().find(|e| apart % e == 0);
    match element {
        Some(e) if len >= (e - src_offset % e) % e + e => CopyMethod::Shader,
        _ => CopyMethod::Engine,
    }
}

/// Copies `len` bytes from `src` (holding `src_bytes`) at `src_offset` to `dst` at
/// `dst_offset` with `method`, after writing `dst_bytes` over the destination range and its
/// margins, and checks the range and the margins.
#[allow(clippy::too_many_arguments)]
fn check_copy(
    src: &GpuBuffer,
    src_bytes: &[u8],
    dst: &GpuBuffer,
    dst_bytes: &[u8],
    src_offset: u64,
    dst_offset: u64,
    len: u64,
    method: CopyMethod,
) {
    let lo = dst_offset.saturating_sub(MARGIN);
    let hi = (dst_offset + len + MARGIN).min(dst.size());
    dst.write(lo, &dst_bytes[lo as usize..hi as usize]).unwrap();
    let timing = copy_buffer_timed_with(src, src_offset, dst, dst_offset, len, method)
        .unwrap_or_else(|e| panic!("{method} copy of {len} bytes from {src_offset} to {dst_offset}: {e}"));
    if len >= 1 << 20 {
        println!("{method} copy of {len} bytes from {src_offset} to {dst_offset}: {timing:?}");
    }
    let what = format!("{method} copy of {len} bytes from {src_offset} to {dst_offset}");
    let dst_local = dst.memory_property_flags() & 1 != 0;
    assert_eq!(timing.method, expected_method(method, src_offset, dst_offset, len, dst_local), "{what}: made by");
    let mut out = vec![0u8; (hi - lo) as usize];
    dst.read(lo, &mut out).unwrap();
    let (before, rest) = out.split_at((dst_offset - lo) as usize);
    let (copied, after) = rest.split_at(len as usize);
    let s = src_offset as usize;
    let d = (dst_offset + len) as usize;
    assert_eq!(first_difference(before, &dst_bytes[lo as usize..dst_offset as usize]), None, "{what}: bytes before");
    assert_eq!(first_difference(copied, &src_bytes[s..s + len as usize]), None, "{what}: bytes copied");
    assert_eq!(first_difference(after, &dst_bytes[d..hi as usize]), None, "{what}: bytes after");
}

/// Every size at every offset pair with `method`, and one copy of 256 MiB.
fn every_size_and_offset(test: &str, method: CopyMethod) {
    let Some(device) = open_device(test) else { return };
    if method == CopyMethod::Shader {
        if let Some(why) = shader_copy_unavailable(&device) {
            assert_ne!(device.info().device_type, DeviceType::Cpu, "lavapipe runs the copy shader: {why}");
            eprintln!("SKIP {test}: {} makes no shader copies: {why}", device.info().name);
            return;
        }
    }
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    if method == CopyMethod::Cuda {
        let (a, b) = (
            allocator.allocate(64, GpuMemoryKind::DeviceLocal).unwrap(),
            allocator.allocate(64, GpuMemoryKind::DeviceLocal).unwrap(),
        );
        if let Err(e) = copy_buffer_timed_with(&a, 0, &b, 0, 64, CopyMethod::Cuda) {
            assert!(matches!(e, Error::Unsupported(ref m) if m.contains("CUDA cannot take these buffers")), "{e}");
            assert!(std::env::var("LF_REQUIRE_CUDA").map_or(true, |v| v != "1"), "CUDA required but: {e}");
            eprintln!("SKIP {test}: copies by CUDA are refused here, as they should be: {e}");
            return;
        }
    }
    let size = (64 << 20) + 64;
    let src_bytes = pattern(3, size as usize);
    let dst_bytes = pattern(9, size as usize);
    let src = allocator.allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    src.write(0, &src_bytes).unwrap();
    // Device-local to device-local, and to host-visible memory for the small sizes.
    let dst = allocator.allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    let host_dst = allocator.allocate(1 << 21, GpuMemoryKind::HostVisible).unwrap();
    let start = Instant::now();
    for len in SIZES {
        for (src_offset, dst_offset) in OFFSETS {
            check_copy(&src, &src_bytes, &dst, &dst_bytes, src_offset, dst_offset, len, method);
            if len < 1 << 21 {
                check_copy(&src, &src_bytes, &host_dst, &dst_bytes, src_offset, dst_offset, len, method);
            }
        }
    }
    // A buffer's own offsets are relative to its arena: copies between two small buffers of
    // one arena.
    let a = allocator.allocate(8192, GpuMemoryKind::DeviceLocal).unwrap();
    let b = allocator.allocate(8192, GpuMemoryKind::DeviceLocal).unwrap();
    a.write(0, &src_bytes[..8192]).unwrap();
    check_copy(&a, &src_bytes[..8192], &b, &dst_bytes[..8192], 16, 48, 8000, method);
    check_copy(&a, &src_bytes[..8192], &b, &dst_bytes[..8192], 4, 8, 4000, method);
    drop((src, dst));

    let size = (256 << 20) + 64;
    let src_bytes = pattern(5, size as usize);
    let dst_bytes = pattern(7, size as usize);
    let src = allocator.allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    let dst = allocator.allocate(size, GpuMemoryKind::DeviceLocal).unwrap();
    src.write(0, &src_bytes).unwrap();
    check_copy(&src, &src_bytes, &dst, &dst_bytes, 16, 32 + 16, 256 << 20, method);
    println!("{method}: all copies checked in {:?}", start.elapsed());
}

#[test]
fn gpu_copy_engine_every_size_and_offset() {
    every_size_and_offset("gpu_copy_engine_every_size_and_offset", CopyMethod::Engine);
}

#[test]
fn gpu_copy_shader_every_size_and_offset() {
    every_size_and_offset("gpu_copy_shader_every_size_and_offset", CopyMethod::Shader);
}

#[test]
fn gpu_copy_cuda_every_size_and_offset() {
    every_size_and_offset("gpu_copy_cuda_every_size_and_offset", CopyMethod::Cuda);
}

#[test]
fn gpu_copy_overlap_refused() {
    let Some(device) = open_device("gpu_copy_overlap_refused") else { return };
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    let buffer = allocator.allocate(4 << 20, GpuMemoryKind::DeviceLocal).unwrap();
    for method in [CopyMethod::Auto, CopyMethod::Engine, CopyMethod::Shader, CopyMethod::Cuda] {
        for (from, to, len) in [(0, 100, 200), (100, 0, 200), (0, 1 << 20, (2 << 20) + 16), (16, 16, 1 << 20)] {
            let e = copy_buffer_timed_with(&buffer, from, &buffer, to, len, method).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("overlap")), "{method}: {e}");
        }
        let e = copy_buffer_timed_with(&buffer, 0, &buffer, 0, 0, method).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let e = copy_buffer_timed_with(&buffer, (2 << 20) + 1, &buffer, 0, 2 << 20, method).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("overruns")), "{e}");
    }
    // Ranges of one buffer close together but apart are copied: the source 3 bytes after the
    // destination (the shader binds the source from below where it starts, where the engine
    // writes the destination's last byte), and adjacent halves.
    let bytes = pattern(4, 4096);
    for method in [CopyMethod::Engine, CopyMethod::Shader] {
        buffer.write(0, &bytes).unwrap();
        copy_buffer_timed_with(&buffer, 1036, &buffer, 0, 1033, method).unwrap();
        let mut out = vec![0u8; 4096];
        buffer.read(0, &mut out).unwrap();
        assert_eq!(first_difference(&out[..1033], &bytes[1036..2069]), None, "{method}: copied");
        assert_eq!(first_difference(&out[1033..], &bytes[1033..]), None, "{method}: the rest unchanged");
    }
    copy_buffer_timed_with(&buffer, 0, &buffer, 2 << 20, 2 << 20, CopyMethod::Shader).unwrap();
}

#[test]
fn gpu_copy_auto_choice() {
    let Some(device) = open_device("gpu_copy_auto_choice") else { return };
    let forced: Option<CopyMethod> = std::env::var(GPU_COPY_ENV).ok().and_then(|v| v.parse().ok());
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    let len = SHADER_COPY_MIN.max(1 << 20) + 64;
    let src = allocator.allocate(len, GpuMemoryKind::DeviceLocal).unwrap();
    let dst = allocator.allocate(len, GpuMemoryKind::DeviceLocal).unwrap();
    let host = allocator.allocate(len, GpuMemoryKind::HostVisible).unwrap();
    let big = chosen_copy_method(&src, 0, &dst, 0, len);
    let small = chosen_copy_method(&src, 0, &dst, 0, 4096);
    println!("{}: auto copies 4 KiB by {small}, {len} bytes by {big}", device.info().name);
    let shader = shader_copy_unavailable(&device).is_none();
    // Where the process uses CUDA on the device (another test here may have made it so), Auto
    // copies between DEVICE_LOCAL buffers go through CUDA instead, for the rest of the
    // process: `got` is `want`, or CUDA's and CUDA is in use.
    let vulkan_or_cuda = |got: CopyMethod, want: CopyMethod, what: &str| {
        assert!(got == want || got == CopyMethod::Cuda && copies_by_cuda(&device), "{what}: {got}, expected {want}");
    };
    match forced {
        Some(CopyMethod::Engine) => assert_eq!((small, big), (CopyMethod::Engine, CopyMethod::Engine)),
        Some(CopyMethod::Shader) => assert_eq!((small, big), (CopyMethod::Shader, CopyMethod::Shader)),
        _ if device.info().device_type == DeviceType::Cpu => {
            // lavapipe's copy engine is a memcpy: the shader would only add work.
            assert_eq!((small, big), (CopyMethod::Engine, CopyMethod::Engine));
        }
        _ => {
            let want = if shader { CopyMethod::Shader } else { CopyMethod::Engine };
            vulkan_or_cuda(small, CopyMethod::Engine, "4 KiB");
            vulkan_or_cuda(chosen_copy_method(&src, 0, &dst, 0, SHADER_COPY_MIN - 1), CopyMethod::Engine, "below");
            vulkan_or_cuda(chosen_copy_method(&src, 0, &dst, 0, SHADER_COPY_MIN), want, "at the shader's minimum");
            vulkan_or_cuda(big, want, "large");
            // Offsets congruent mod 4 only: still the shader, with words.
            vulkan_or_cuda(chosen_copy_method(&src, 4, &dst, 8, SHADER_COPY_MIN), want, "mod 4");
            // Host memory (not DEVICE_LOCAL, bit 1) is the engine's, even where CUDA is used.
            if host.memory_property_flags() & 1 == 0 {
                assert_eq!(chosen_copy_method(&src, 0, &host, 0, len), CopyMethod::Engine);
            }
        }
    }
    // Offsets not congruent mod 4 are the engine's, whatever the Vulkan method.
    vulkan_or_cuda(chosen_copy_method(&src, 1, &dst, 2, len - 64), CopyMethod::Engine, "unaligned");
    // What copies report matches the choice.
    for (from, to, n) in [(0, 0, len), (0, 0, 64), (3, 7, len - 64)] {
        let timing = copy_buffer_timed(&src, from, &dst, to, n).unwrap();
        let chosen = chosen_copy_method(&src, from, &dst, to, n);
        // (CUDA may have come into use between the two.)
        assert!(timing.method == chosen || chosen == CopyMethod::Cuda, "{n} bytes from {from} to {to}: {timing:?}");
    }
}

#[test]
fn gpu_copy_env_value_checked() {
    const TEST: &str = "gpu_copy_env_value_checked";
    if child_role(TEST).is_some() {
        let e = VulkanDevice::open(&GpuConfig::default()).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(ref m) if m.contains(GPU_COPY_ENV) && m.contains("auto, engine, shader and cuda")),
            "{e}"
        );
        println!("child: {GPU_COPY_ENV}={:?} refused: {e}", std::env::var(GPU_COPY_ENV).unwrap());
        return;
    }
    if open_device(TEST).is_none() {
        return;
    }
    assert_eq!("Shader".parse::<CopyMethod>().unwrap(), CopyMethod::Shader);
    assert_eq!(" engine ".parse::<CopyMethod>().unwrap(), CopyMethod::Engine);
    assert_eq!("CUDA".parse::<CopyMethod>().unwrap(), CopyMethod::Cuda);
    assert!(matches!("fast".parse::<CopyMethod>(), Err(Error::InvalidArgument(_))));
    let (child, _) =
        spawn_child_in("gpu_copy", TEST, "bad", &[(GPU_COPY_ENV, "fastest"), ("LF_REQUIRE_VULKAN", "1")], false);
    expect_child_success(child, "with LF_GPU_COPY=fastest");
}

/// With `LF_GPU_COPY=shader` (in a child process), `copy_buffer_waiting` copies with the
/// shader, and only once the semaphore is signalled.
#[test]
fn gpu_copy_waiting_through_the_shader() {
    const TEST: &str = "gpu_copy_waiting_through_the_shader";
    if child_role(TEST).is_none() {
        let Some(device) = open_device(TEST) else { return };
        if !device.info().timeline_semaphores {
            eprintln!("SKIP {TEST}: {} has no timeline semaphores", device.info().name);
            return;
        }
        if let Some(why) = shader_copy_unavailable(&device) {
            eprintln!("SKIP {TEST}: {} makes no shader copies: {why}", device.info().name);
            return;
        }
        let (child, _) = spawn_child_in("gpu_copy", TEST, "shader", &[(GPU_COPY_ENV, "shader")], false);
        expect_child_success(child, "with LF_GPU_COPY=shader");
        return;
    }
    let device = VulkanDevice::open(&GpuConfig::default()).unwrap();
    let allocator = GpuAllocator::new(&device, GpuAllocatorConfig::default()).unwrap();
    let len = (1 << 20) + 3;
    let src = allocator.allocate(len + 64, GpuMemoryKind::DeviceLocal).unwrap();
    let dst = allocator.allocate(len + 64, GpuMemoryKind::DeviceLocal).unwrap();
    let method = chosen_copy_method(&src, 0, &dst, 0, 64);
    assert_eq!(method, CopyMethod::Shader, "{GPU_COPY_ENV}=shader forces the shader");
    let data = pattern(3, len as usize + 64);
    src.write(0, &data).unwrap();
    dst.write(0, &vec![0u8; len as usize + 64]).unwrap();
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
            let before = peek.map(|p| unsafe { std::slice::from_raw_parts((p + 32) as *const u8, 4096) }.to_vec());
            semaphore.signal(1).unwrap();
            before
        })
    };
    let start = Instant::now();
    copy_buffer_waiting(&src, 16, &dst, 32, len, &[(&semaphore, 1)]).unwrap();
    let took = start.elapsed();
    let before = signaller.join().unwrap();
    println!("child: copy_buffer_waiting through the shader returned after {took:?}");
    assert!(took >= Duration::from_millis(40), "the copy waited for the signal ({took:?})");
    if let Some(before) = before {
        assert!(before.iter().all(|&b| b == 0), "the copy ran before the signal");
    }
    let mut out = vec![0u8; len as usize + 64];
    dst.read(0, &mut out).unwrap();
    assert!(out[..32].iter().all(|&b| b == 0) && out[32 + len as usize..].iter().all(|&b| b == 0));
    assert_eq!(first_difference(&out[32..32 + len as usize], &data[16..16 + len as usize]), None);
    // A copy timed while the variable is set is made by the shader.
    assert_eq!(copy_buffer_timed(&src, 0, &dst, 0, len).unwrap().method, CopyMethod::Shader);
}
