"""GPU paths: Vulkan GPU buffers (lavapipe here, the real GPU on a GPU host), GPU buffers
sent between two Python processes, and DLPack into PyTorch and CuPy on CUDA hosts.

The CUDA tests run where torch or cupy with a CUDA device is installed (the H200 host):
    python -m pytest crates/python/tests/test_gpu.py -v
and skip elsewhere."""
import numpy as np
import pytest

import lava_flow as lf


@pytest.fixture(scope="module")
def gpu_ctx():
    ctx = lf.Context()
    if ctx.gpu_unavailable_reason:
        pytest.skip(f"no Vulkan device: {ctx.gpu_unavailable_reason}")
    return ctx


def test_gpu_buffer(gpu_ctx):
    info = gpu_ctx.device_info()
    assert info["name"] and len(info["device_uuid"]) == 16
    b = gpu_ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
    assert b.is_gpu and b.location == lf.Memory.GPU_DEVICE_LOCAL
    data = np.arange(1 << 20, dtype=np.uint8).tobytes()
    b.write(data)
    assert b.read() == data
    host = gpu_ctx.alloc(1 << 20, lf.Memory.CPU_GPU_PINNED)
    gpu_ctx.copy(host, b)
    assert bytes(memoryview(host)) == data
    # DLPack: CUDA where the driver is (below), else the host mapping lavapipe gives.
    dev = b.__dlpack_device__()
    if dev[0] == 1:
        assert np.from_dlpack(b).ctypes.data == b.address
    e = b.export()
    assert e.location == lf.Memory.GPU_DEVICE_LOCAL and e.device_uuid == info["device_uuid"]
    e.close()


GPU_PRODUCER = """
import numpy as np, lava_flow as lf
ctx = lf.Context()
ch = lf.producer(ctx, NAME)
b = ctx.alloc(1 << 16, lf.Memory.GPU_DEVICE_LOCAL)
b.write(np.full(1 << 16, 0x77, dtype=np.uint8))
seq = ch.send_buffer(b)
ch.wait_completed(seq, timeout=60)
print(ch.transport)
"""


def test_gpu_buffer_between_processes(gpu_ctx, name, peer):
    p = peer(GPU_PRODUCER, name)
    ch = lf.consumer(gpu_ctx, name)
    with ch.recv(timeout=60) as m:
        if m.is_gpu:
            # By reference through Vulkan IPC: the producer's GPU memory, lent while held.
            buf = m.buffer
            assert buf.is_gpu and buf.size == 1 << 16
            assert buf.read() == b"\x77" * (1 << 16)
            del buf
            if m.__dlpack_device__()[0] == 1:  # no CUDA: the host mapping (lavapipe)
                assert (np.from_dlpack(m) == 0x77).all()
        else:
            # Staged through host memory (the transport report says why).
            assert bytes(m) == b"\x77" * (1 << 16), ch.transport_reason
    assert "shm" in p.wait()


def cuda_framework(name):
    mod = pytest.importorskip(name)
    if name == "torch" and not mod.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    if name == "cupy":
        try:
            mod.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001 (cupy raises its own runtime errors)
            pytest.skip(f"cupy has no CUDA device: {e}")
    return mod


def test_gpu_buffer_dlpack_torch(gpu_ctx):
    torch = cuda_framework("torch")
    b = gpu_ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
    b.write(np.arange(1 << 20, dtype=np.uint8))
    dev = b.__dlpack_device__()
    assert dev[0] == 2  # kDLCUDA
    t = torch.from_dlpack(b)
    assert t.is_cuda and t.numel() == 1 << 20
    assert t.data_ptr() == b.cuda_address
    assert (t[:256].cpu() == torch.arange(256, dtype=torch.uint8)).all()


def test_gpu_buffer_dlpack_cupy(gpu_ctx):
    cp = cuda_framework("cupy")
    b = gpu_ctx.alloc(1 << 16, lf.Memory.GPU_DEVICE_LOCAL)
    b.write(b"\x05" * (1 << 16))
    a = cp.from_dlpack(b)
    assert a.data.ptr == b.cuda_address and int(a.sum()) == 5 * (1 << 16)


def test_gpu_message_dlpack_torch(gpu_ctx, name, peer):
    torch = cuda_framework("torch")
    p = peer(GPU_PRODUCER, name)
    ch = lf.consumer(gpu_ctx, name)
    with ch.recv(timeout=60) as m:
        assert m.is_gpu, ch.transport_reason
        stream = torch.cuda.Stream()
        # The stream waits on the channel's ready semaphore before reading.
        t = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream))
        with torch.cuda.stream(stream):
            total = int(t.sum())
        assert total == 0x77 * (1 << 16)
        del t
    p.wait()
