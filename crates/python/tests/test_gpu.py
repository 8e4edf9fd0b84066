"""GPU paths: Vulkan GPU buffers (lavapipe here, the real GPU on a GPU host), GPU buffers
sent between two Python processes, and DLPack into PyTorch and CuPy on CUDA hosts.

The CUDA tests run where torch or cupy with a CUDA device is installed (the H200 host):
    python -m pytest crates/python/tests/test_gpu.py -v
and skip elsewhere."""
import os
import time

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


@pytest.mark.parametrize("on_gpu", [False, True], ids=["release_after_events", "release_on_gpu"])
def test_gpu_buffer_between_processes(gpu_ctx, name, peer, on_gpu):
    p = peer(GPU_PRODUCER, name)
    # A consumer that asks to release on the GPU, of a producer without a released semaphore:
    # its messages are released as before.
    ch = lf.consumer(gpu_ctx, name, released_semaphore=on_gpu)
    if on_gpu:
        with pytest.raises(lf.LavaFlowError, match="has no released semaphore"):
            ch.released_semaphore()
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


# ---- GPU messages in CUDA: arenas imported once, releases ordered after the consumer's stream.
# These need a CUDA device and PyTorch (the GPU host); they skip elsewhere. Run them with
#   python3 -m pytest crates/python/tests/test_gpu.py -v -k cuda_

SENDS_ONE_ARENA = """
import numpy as np, lava_flow as lf
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME)
n = int(ARGS[0])
# Two buffers of one pooled arena, sent in turn: one import serves both.
bufs = [ctx.alloc(1 << 16, lf.Memory.GPU_DEVICE_LOCAL) for _ in range(2)]
for i in range(n):
    b = bufs[i % 2]
    b.write(np.full(1 << 16, i % 251, dtype=np.uint8))
    ch.wait_completed(ch.send_buffer(b), timeout=60)
print("sent", n)
"""


def eventually(check, timeout=10.0):
    """True once `check()` is (deferred releases and frees happen on lava-flow's own thread)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def cuda_uuid(torch, device=0):
    u = torch.cuda.get_device_properties(device).uuid
    raw = getattr(u, "bytes", None)
    return bytes(raw) if raw is not None else bytes.fromhex(str(u).removeprefix("GPU-").replace("-", ""))


def cuda_consumer_ctx(gpu_ctx):
    torch = cuda_framework("torch")
    if bytes(gpu_ctx.device_info()["device_uuid"]) != cuda_uuid(torch):
        pytest.skip("lava-flow's default Vulkan device is not CUDA device 0")
    return torch


def test_cuda_arena_imported_once_for_many_messages(gpu_ctx, name, peer):
    torch = cuda_consumer_ctx(gpu_ctx)
    n = 200
    p = peer(SENDS_ONE_ARENA, name, n)
    ch = lf.consumer(gpu_ctx, name)
    made, alive, _ = lf._cuda_imports()
    for i in range(n):
        with ch.recv(timeout=60) as m:
            assert m.is_gpu, ch.transport_reason
            t = torch.from_dlpack(m)
            assert t.is_cuda and t.numel() == 1 << 16
            assert int(t[0]) == i % 251 and int(t[-1]) == i % 251
            del t
    assert lf._cuda_imports()[0] == made + 1, "every message of the one arena after the first is a lookup"
    assert "sent" in p.wait()
    ch.close()
    del ch
    # The channel took its arena out of the cache; no tensor holds it, so it is destroyed.
    assert eventually(lambda: lf._cuda_imports()[1] == alive), lf._cuda_imports()


HOLDS_UNTIL_TOLD = """
import numpy as np, lava_flow as lf
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME)
b = ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
b.write(np.full(1 << 20, 9, dtype=np.uint8))
seq = ch.send_buffer(b)
ch.wait_completed(seq, timeout=60)
print("completed")
"""


def test_cuda_tensor_keeps_its_message_and_import_past_release_and_close(gpu_ctx, name, peer):
    torch = cuda_consumer_ctx(gpu_ctx)
    p = peer(HOLDS_UNTIL_TOLD, name)
    ch = lf.consumer(gpu_ctx, name)
    alive = lf._cuda_imports()[1]
    m = ch.recv(timeout=60)
    t = torch.from_dlpack(m)
    assert int(t.sum()) == 9 * (1 << 20)
    m.release()
    ch.close()
    del m, ch
    # The tensor is a view of the message: released in Python, its channel closed and no name
    # left for either, the message goes back only with the tensor, whose bytes stay mapped.
    time.sleep(0.5)
    assert p.proc.poll() is None, "the message went back under a live tensor"
    assert t.is_cuda and int(t.to(torch.int64).sum()) == 9 * (1 << 20)
    assert lf._cuda_imports()[1] == alive + 1, "the tensor keeps its arena's import"
    del t
    # No call on the channel is left to make: the release thread hands the message back, and
    # the channel, freed, takes its arena's import with it.
    assert "completed" in p.wait()
    assert eventually(lambda: lf._cuda_imports()[1] == alive), lf._cuda_imports()


ORDERED_PRODUCER = """
import numpy as np, lava_flow as lf
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME)
back = lf.consumer(ctx, NAME + "-back")
b = ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
b.write(np.full(1 << 20, 3, dtype=np.uint8))
seq = ch.send_buffer(b)
with back.recv(timeout=60) as note:
    assert bytes(note) == b"released"
# The consumer released while its stream still sleeps before reading: not complete yet.
print("early", ch.completed > seq)
ch.wait_completed(seq, timeout=60)
# Rewriting now must not change what the consumer's stream read.
b.write(np.full(1 << 20, 200, dtype=np.uint8))
print("completed")
"""


@pytest.mark.parametrize("opted", [False, True], ids=["default", "opted_in_without_released_semaphore"])
def test_cuda_release_orders_after_the_consumer_stream(gpu_ctx, name, peer, opted):
    torch = cuda_consumer_ctx(gpu_ctx)
    p = peer(ORDERED_PRODUCER, name)
    # Opted in to releases on the GPU, but the producer has no released semaphore: the release
    # goes after the stream's events all the same.
    ch = lf.consumer(gpu_ctx, name, released_semaphore=opted)
    on_gpu_before = lf._gpu_releases()[2]
    back = lf.producer(gpu_ctx, name + "-back")
    stream = torch.cuda.Stream()
    m = ch.recv(timeout=60)
    t = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream))
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time before the read
        total = t.to(torch.int64).sum()
    del t
    started = time.monotonic()
    m.release()
    released_in = time.monotonic() - started
    assert not stream.query(), "the stream's work is still running"
    assert released_in < 0.2, f"release blocked the host for {released_in:.3f} s"
    back.send(b"released")
    # No further call on the channel: the release thread hands the message back.
    out = p.wait(timeout=60)
    assert "early False" in out and "completed" in out, out
    assert int(total) == 3 * (1 << 20), "the producer rewrote the buffer under the consumer's stream"
    assert lf._gpu_releases()[2] == on_gpu_before, "released on the GPU without a released semaphore"
    ch.close()
    back.close()


STREAM_PRODUCER = """
import lava_flow as lf, torch
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME)
b = ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
t = torch.from_dlpack(b)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    t.fill_(1)
# The first send on a stream imports the channel's semaphore into CUDA, which may wait for the
# device: done here, before the fill that must not be waited for.
ch.wait_completed(ch.send_buffer(b, stream=s), timeout=60)
with torch.cuda.stream(s):
    torch.cuda._sleep(2_000_000_000)  # the fill lands well after the send
    t.fill_(7)
seq = ch.send_buffer(b, stream=s)
print("queued", s.query())
ch.wait_completed(seq, timeout=60)
del t  # before the interpreter shuts down
"""


def test_cuda_send_buffer_on_a_stream(gpu_ctx, name, peer):
    torch = cuda_consumer_ctx(gpu_ctx)
    p = peer(STREAM_PRODUCER, name)
    ch = lf.consumer(gpu_ctx, name)
    stream = torch.cuda.Stream()
    with ch.recv(timeout=60) as m:
        t = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream))
        with torch.cuda.stream(stream):
            first = t.to(torch.int64).sum()
        stream.synchronize()
        del t
    assert int(first) == 1 << 20
    with ch.recv(timeout=60) as m:
        assert m.ready_value > 0
        t = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream))
        with torch.cuda.stream(stream):
            total = t.to(torch.int64).sum()
        stream.synchronize()
        del t
    assert int(total) == 7 * (1 << 20), "the consumer's stream read before the producer's fill"
    assert "queued False" in p.wait()


# ---- Releases on the GPU: the consumer releases at once, the producer's released semaphore is
# signalled on the consumer's stream, and the producer's wait_completed waits for it.

RELEASED_ON_GPU_PRODUCER = """
import time, numpy as np, lava_flow as lf, torch
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME, released_semaphore=True)
b = ctx.alloc(1 << 20, lf.Memory.GPU_DEVICE_LOCAL)
t = torch.from_dlpack(b)
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    t.fill_(3)
seq = ch.send_buffer(b, stream=s)
# On the host the consumer released at once (its stream still sleeps before it reads); s waits
# on the GPU for its signal before the rewrite.
ch.wait_completed(seq, timeout=60, stream=s)
print("gpu-wait", not s.query())
with torch.cuda.stream(s):
    t.fill_(200)
seq = ch.send_buffer(b, stream=s)
# No stream: this call waits on the host for the consumer's GPU work too, so that a write from
# the host (Vulkan, unordered with CUDA) comes after its read.
ch.wait_completed(seq, timeout=60)
b.write(np.full(1 << 20, 9, dtype=np.uint8))
del t  # before the interpreter shuts down
print("completed")
"""


def test_cuda_release_on_gpu_orders_the_producers_rewrite(gpu_ctx, name, peer):
    torch = cuda_consumer_ctx(gpu_ctx)
    p = peer(RELEASED_ON_GPU_PRODUCER, name)
    ch = lf.consumer(gpu_ctx, name, released_semaphore=True)
    stream = torch.cuda.Stream()
    immediate, deferred, on_gpu = lf._gpu_releases()
    totals = []
    for _ in range(2):
        m = ch.recv(timeout=60)
        assert m.is_gpu and m.ready_value > 0, ch.transport_reason
        # The consumer's own fd of its producer's released semaphore (what it signals).
        fd = ch.released_semaphore()
        assert fd >= 0
        os.close(fd)
        t = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream))
        with torch.cuda.stream(stream):
            torch.cuda._sleep(1_000_000_000)  # GPU time before the read
            totals.append(t.to(torch.int64).sum())
        del t
        started = time.monotonic()
        m.release()
        released_in = time.monotonic() - started
        assert not stream.query(), "the stream's work is still running"
        assert released_in < 0.2, f"release blocked the host for {released_in:.3f} s"
    stream.synchronize()
    out = p.wait(timeout=60)
    assert "gpu-wait True" in out and "completed" in out, out
    assert [int(x) for x in totals] == [3 << 20, 200 << 20], "the producer rewrote the buffer under the read"
    assert lf._gpu_releases() == (immediate, deferred, on_gpu + 2), "both released on the GPU, none deferred"
    ch.close()


MANY_ON_GPU_PRODUCER = """
import lava_flow as lf, torch
ctx = lf.Context(gpu="required")
ch = lf.producer(ctx, NAME, released_semaphore=True)
n = int(ARGS[0])
bufs = [ctx.alloc(1 << 16, lf.Memory.GPU_DEVICE_LOCAL) for _ in range(2)]
views = [torch.from_dlpack(b) for b in bufs]
s = torch.cuda.Stream()
last = [None, None]
for i in range(n):
    k = i % 2
    if last[k] is not None:
        ch.wait_completed(last[k], timeout=60, stream=s)
    with torch.cuda.stream(s):
        views[k].fill_(i % 251)
    last[k] = ch.send_buffer(bufs[k], stream=s)
ch.wait_completed(last[(n - 1) % 2], timeout=60)
del views  # before the interpreter shuts down
print("sent", n)
"""


def test_cuda_release_on_gpu_many_messages_across_streams(gpu_ctx, name, peer):
    torch = cuda_consumer_ctx(gpu_ctx)
    n = 200
    p = peer(MANY_ON_GPU_PRODUCER, name, n)
    ch = lf.consumer(gpu_ctx, name, released_semaphore=True)
    # Views on two streams in turn, some messages without any view, some garbage-collected:
    # every one is released on the GPU, each value after the work before it.
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    seen = []
    on_gpu = lf._gpu_releases()[2]
    for i in range(n):
        m = ch.recv(timeout=60)
        if i % 5 == 4:
            del m  # no view at all: released as it is collected
            continue
        s = streams[(i // 3) % 2]
        t = torch.from_dlpack(m.__dlpack__(stream=s.cuda_stream))
        with torch.cuda.stream(s):
            seen.append((i, t[0].clone(), t[-1].clone()))
        del t
        m.release()
    torch.cuda.synchronize()
    assert "sent" in p.wait(timeout=60)
    wrong = [(i, int(a), int(b)) for i, a, b in seen if int(a) != i % 251 or int(b) != i % 251]
    assert not wrong, f"read another round's bytes: {wrong[:5]}"
    assert lf._gpu_releases()[2] - on_gpu == n, "every GPU message was released on the GPU"
    ch.close()
