"""CUDA tensors the application allocated, sent by reference (`send_tensor`): PyTorch's default
caching allocator (cudaMalloc memory, legacy CUDA IPC handles), its expandable segments (CUDA
VMM memory, an fd per piece) and CuPy's memory pool (cudaMalloc memory), received as DLPack on
the consumer's GPU; stream-ordered sends, whose consumer's stream waits on the GPU. The GPU
tests need torch (or CuPy) with a CUDA device (skipped elsewhere); the refusals run everywhere."""
import os

import pytest

import lava_flow as lf

CONSUMER_UNTIL_GONE = """
import lava_flow as lf
ctx = lf.Context(gpu="disabled")
ch = lf.consumer(ctx, NAME)
try:
    ch.recv(timeout=30)
    print("unexpected message")
except lf.PeerGoneError:
    print("gone")
"""


class CudaArray:
    """An object that says it is a CUDA array (as torch and CuPy do), at an address no CUDA
    driver knows: what lava-flow must refuse with a reason."""

    def __init__(self, ptr, shape, strides=None):
        self.__cuda_array_interface__ = {
            "data": (ptr, False), "shape": shape, "typestr": "<f4", "strides": strides, "version": 3,
        }


def test_send_tensor_refuses_what_it_cannot_send(name, peer):
    p = peer(CONSUMER_UNTIL_GONE, name)
    ctx = lf.Context(gpu="disabled")
    with lf.producer(ctx, name) as ch:
        with pytest.raises(TypeError, match=r"send\(\)"):
            ch.send_tensor(b"host bytes")
        with pytest.raises(ValueError, match="not C-contiguous"):
            ch.send_tensor(CudaArray(0x1000, (4, 4), strides=(4, 16)))
        with pytest.raises(lf.LavaFlowError) as e:
            ch.send_tensor(CudaArray(0x1000, (16,)))
        assert "CUDA" in str(e.value), e.value
    assert "gone" in p.wait()


def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    # lava-flow opens CUDA memory only in a process that uses CUDA already.
    torch.cuda.init()
    return torch


PRODUCER = """
import os, lava_flow as lf, torch
torch.cuda.init()
n = 1 << 16
t = torch.arange(n, dtype=torch.int32, device="cuda")
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, rendezvous_timeout=60)
print("transport", ch.transport_reason)
seq = ch.send_tensor(t[16:])
ch.wait_completed(seq, timeout=60)
# The consumer added 1 to every element it saw, through its view of these very bytes.
expected = torch.arange(n, dtype=torch.int32, device="cuda")
expected[16:] += 1
assert torch.equal(t, expected), "the consumer's writes are not in the producer's tensor"
# A second tensor of the same allocation goes too (one registration of the allocation), after
# the work on a stream: these contexts open no GPU, so the channel shares no ready semaphore and
# send_tensor synchronises the stream on the host first.
seq = ch.send_tensor(t[:16], stream=torch.cuda.current_stream())
ch.wait_completed(seq, timeout=60)
print("ok", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"))
"""


@pytest.mark.parametrize("allocator", ["default", "expandable_segments:True"])
def test_a_torch_tensor_travels_by_reference(name, peer, allocator):
    torch = torch_cuda()
    env = dict(os.environ)
    if allocator != "default":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = allocator
    try:
        p = peer(PRODUCER, name)
    finally:
        os.environ.clear()
        os.environ.update(env)
    ctx = lf.Context(gpu="disabled")
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    n = 1 << 16
    with ch.recv(timeout=60) as m:
        assert m.is_cuda, (m.flags, ch.transport_reason)
        assert len(m) == (n - 16) * 4
        address, device = m.cuda_ptr
        assert address != 0 and device == 0
        view = torch.from_dlpack(m)
        assert view.is_cuda and view.dtype == torch.uint8 and view.numel() == (n - 16) * 4
        assert view.data_ptr() == address, "a view of the message's bytes, not a copy"
        ints = view.view(torch.int32)
        assert torch.equal(ints, torch.arange(16, n, dtype=torch.int32, device="cuda"))
        ints += 1
        torch.cuda.synchronize()
        del view, ints
    with ch.recv(timeout=60) as m:
        ints = torch.from_dlpack(m).view(torch.int32)
        assert torch.equal(ints, torch.arange(16, dtype=torch.int32, device="cuda"))
        del ints
    out = p.wait()
    assert "ok" in out, out
    assert "cuda_ipc" in out, out


# A producer whose tensor is written on a stream held back by a host function until the consumer
# says so: send_tensor(stream=) returns all the same (nothing waits on the host).
ORDERED_PRODUCER = """
import ctypes, os, time, lava_flow as lf, torch, faulthandler, sys
faulthandler.dump_traceback_later(25, exit=False)
torch.cuda.init()
cuda = ctypes.CDLL("libcuda.so.1")
device = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
uuid = (ctypes.c_ubyte * 16)()
assert cuda.cuDeviceGetUuid_v2(uuid, device) == 0
ctx = lf.Context(gpu="required", gpu_device=bytes(uuid))
n = 1 << 16
t = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
ch = lf.producer(ctx, NAME, rendezvous_timeout=60)
print("transport", ch.transport_reason.replace("\\n", " "), flush=True)
assert "stream-ordered sends" in ch.transport_reason, ch.transport_reason
gate = ARGS[0]
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def hold(_):
    # At most a minute: a failed test must not hang.
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.001)


hold_fn = HOST_FN(hold)
cuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, HOST_FN, ctypes.c_void_p]
s = torch.cuda.Stream()
assert cuda.cuLaunchHostFunc(s.cuda_stream, hold_fn, None) == 0
with torch.cuda.stream(s):
    t.fill_(0xC5)
seq = ch.send_tensor(t, stream=s)
assert not s.query(), "send_tensor waited for the held stream on the host"
print("sent", seq, flush=True)
ch.wait_completed(seq, timeout=60)
s.synchronize()
print("ok", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"))
"""


def cuda_device_0_uuid():
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
    uuid = (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGetUuid_v2(uuid, device) == 0
    return bytes(uuid)


@pytest.mark.parametrize("allocator", ["default", "expandable_segments:True"])
def test_a_stream_ordered_tensor_is_waited_for_on_the_consumer_s_stream(name, peer, tmp_path, allocator):
    """Both contexts open CUDA device 0's GPU with Vulkan, so the channel shares a ready
    semaphore: the producer's send_tensor(stream=) signals it on its stream (held back, so the
    send is seen not to wait), the consumer's torch.from_dlpack under its own stream makes that
    stream wait on the GPU, and once the producer's stream goes on, the consumer's sum sees the
    producer's bytes."""
    torch = torch_cuda()
    try:
        ctx = lf.Context(gpu="required", gpu_device=cuda_device_0_uuid())
    except lf.LavaFlowError as e:
        pytest.skip(f"no Vulkan device on CUDA device 0: {e}")
    gate = tmp_path / "go"
    env = dict(os.environ)
    if allocator != "default":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = allocator
    try:
        p = peer(ORDERED_PRODUCER, name, gate)
    finally:
        os.environ.clear()
        os.environ.update(env)
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    n = 1 << 16
    s = torch.cuda.Stream()
    import faulthandler, sys, time as _tt
    faulthandler.dump_traceback_later(15, exit=False, file=sys.stdout)
    _t0 = _tt.monotonic()
    # PyTorch's allocator keeps the blocks of this stream's work below: none of it may need a
    # cudaMalloc while the stream waits, since a cudaMalloc may wait for the whole device, and
    # so for the producer's held stream, which only the gate below lets go.
    with torch.cuda.stream(s):
        int(torch.zeros(n, dtype=torch.int64, device="cuda").sum())
    with ch.recv(timeout=60) as m:
        assert m.is_cuda and m.ready_value > 0, (m.flags, m.ready_value, ch.transport_reason)
        print('recv at', _tt.monotonic()-_t0, flush=True)
        with torch.cuda.stream(s):
            cap = m.__dlpack__(stream=s.cuda_stream)
            print('dlpack at', _tt.monotonic()-_t0, flush=True)
            view = torch.from_dlpack(cap)
            print('view at', _tt.monotonic()-_t0, flush=True)
            v64 = view.to(torch.int64)
            print('to at', _tt.monotonic()-_t0, flush=True)
            total = v64.sum()
            print('sum at', _tt.monotonic()-_t0, flush=True)
        waited = not s.query()
        gate.touch()
        s.synchronize()
        total = int(total)
        del view
        print('consumer before release', lf._gpu_releases(), flush=True)
    print('consumer after release', lf._gpu_releases(), flush=True)
    import time as _t
    for _ in range(40):
        _t.sleep(0.5)
        try:
            ch.try_recv()
        except Exception as e:
            pass
        if p.proc.poll() is not None: break
    print('consumer after nudges', lf._gpu_releases(), p.proc.poll(), flush=True)
    out = p.wait()
    # The producer's output says what it sent, where its stream did not hold the consumer's.
    assert waited, ("the consumer's stream did not wait for the held producer stream", out)
    assert total == n * 0xC5
    assert "ok" in out and "stream-ordered" in out, out


# A CuPy array (CuPy's memory pool: cudaMalloc memory) sent by reference; the consumer views it
# with CuPy and writes through its view.
CUPY_PRODUCER = """
import lava_flow as lf, cupy
n = 1 << 16
a = cupy.arange(n, dtype=cupy.int32)
cupy.cuda.runtime.deviceSynchronize()
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, rendezvous_timeout=60)
print("transport", ch.transport_reason)
seq = ch.send_tensor(a[16:])
ch.wait_completed(seq, timeout=60)
expected = cupy.arange(n, dtype=cupy.int32)
expected[16:] *= 2
assert bool((a == expected).all()), "the consumer's writes are not in the producer's array"
print("ok")
"""


def test_a_cupy_array_travels_by_reference(name, peer):
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("CuPy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("CuPy finds no CUDA driver")
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # CUDA in use here too
    p = peer(CUPY_PRODUCER, name)
    ctx = lf.Context(gpu="disabled")
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    n = 1 << 16
    with ch.recv(timeout=60) as m:
        assert m.is_cuda, (m.flags, ch.transport_reason)
        address, _ = m.cuda_ptr
        view = cupy.from_dlpack(m)
        assert view.data.ptr == address, "a view of the message's bytes, not a copy"
        ints = view.view(cupy.int32)
        assert bool((ints == cupy.arange(16, n, dtype=cupy.int32)).all())
        ints *= 2
        cupy.cuda.runtime.deviceSynchronize()
        del view, ints
    out = p.wait()
    assert "ok" in out, out
    assert "cuda_ipc" in out, out
