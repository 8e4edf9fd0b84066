"""lava-flow memory for PyTorch (`lava_flow.torch.mem_pool`): tensors made under the pool are
lava-flow GPU buffers, sent by reference as ordinary GPU messages, given back when PyTorch
frees them.

The refusals (no torch, an old torch, no CUDA, no pool for the device, a free of memory the
pool did not allocate) run everywhere. The GPU tests need PyTorch 2.8 or newer with a CUDA
device that lava-flow opens with Vulkan (the GPU host), and skip elsewhere:
    python3 -m pytest crates/python/tests/test_torch_pool.py -v
"""
import ctypes
import os
import re
import sys
import types

import pytest

import lava_flow as lf

# ---- Everywhere: the hooks PyTorch calls, and the errors that say what is missing.


def hooks():
    """The allocator hooks, as PyTorch's CUDAPluggableAllocator finds them (by name, in the
    extension module's own shared library)."""
    so = ctypes.CDLL(lf._native.__file__)
    alloc = getattr(so, lf._native._TORCH_ALLOC)
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = getattr(so, lf._native._TORCH_FREE)
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free


def test_the_hooks_refuse_a_device_no_pool_serves_and_say_why(capfd):
    alloc, free = hooks()
    before = lf.torch._stats()
    lf._native._torch_pool_last_error(clear=True)
    # No pool in this process serves device 63: NULL (PyTorch's out-of-memory), and the reason.
    assert alloc(1 << 20, 63, None) is None
    why = lf.torch.last_error()
    assert why and "CUDA device 63" in why and "lava_flow.torch.mem_pool(63)" in why, why
    assert re.search(r"lava-flow\[\d+\] WARN lava_flow::torch: .*CUDA device 63", capfd.readouterr().err)
    for size in (0, -1):
        assert alloc(size, 0, None) is None
        assert f"{size} bytes" in lf.torch.last_error()
    # A free of an address the pool never gave out changes nothing, and says so.
    free(0x7000_0000_1000, 4096, 0, None)
    assert "0x700000001000" in lf.torch.last_error() and "did not allocate" in lf.torch.last_error()
    assert lf.torch._stats() == before
    assert lf._native._torch_pool_last_error(clear=True) is not None
    assert lf.torch.last_error() is None


def test_the_hooks_log_at_lava_flows_level(capfd):
    alloc, _ = hooks()
    lf.set_log_level(lf.LogLevel.OFF)
    try:
        assert alloc(1 << 20, 63, None) is None
        assert "lava_flow::torch" not in capfd.readouterr().err
        assert "CUDA device 63" in lf.torch.last_error(), "kept, though not logged"
    finally:
        lf.set_log_level(lf.LogLevel.WARN)
    assert alloc(1 << 20, 62, None) is None
    assert "CUDA device 62" in capfd.readouterr().err


def test_buffer_of_other_memory_is_none():
    class Tensor:
        def data_ptr(self):
            return 0x7000_0000_2000

    assert lf.torch.buffer_of(Tensor()) is None


def fake_torch(version, cuda_available=True, mem_pool=True):
    torch = types.ModuleType("torch")
    torch.__version__ = version
    memory = types.SimpleNamespace()
    torch.cuda = types.SimpleNamespace(is_available=lambda: cuda_available, memory=memory)
    if mem_pool:
        torch.cuda.MemPool = object
        memory.CUDAPluggableAllocator = object
    return torch


def test_mem_pool_without_torch_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ImportError, match=r"needs PyTorch \(2\.8 or newer, with CUDA\): pip install torch"):
        lf.torch.mem_pool(0)


@pytest.mark.parametrize("version,mem_pool", [("2.4.1+cu121", False), ("2.7.1", True), ("", True)])
def test_mem_pool_names_the_torch_it_needs(monkeypatch, version, mem_pool):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(version, mem_pool=mem_pool))
    with pytest.raises(RuntimeError, match=r"needs PyTorch 2\.8 or newer") as e:
        lf.torch.mem_pool(0)
    assert (version or "of unknown version") in str(e.value) and "pip install -U torch" in str(e.value)


def test_mem_pool_without_cuda_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch("2.9.0", cuda_available=False))
    with pytest.raises(RuntimeError, match=r"sees no CUDA device"):
        lf.torch.mem_pool(0)
    with pytest.raises(RuntimeError, match=r"sees no CUDA device"):
        lf.torch.device_uuid(0)


NO_CUDA = """
import lava_flow as lf
ctx = lf.Context(gpu="disabled")
for call in (lambda: lf._native._torch_pool_bind(ctx, 0), lambda: lf._native._cuda_device_uuid(0)):
    try:
        call()
        print("unexpected success")
    except lf.LavaFlowError as e:
        assert e.status == lf.Status.ERR_UNSUPPORTED, e
        assert "CUDA" in e.message and "not available" in e.message, e.message
print("refused")
"""


def test_binding_a_pool_without_cuda_is_unsupported(name, peer, monkeypatch):
    # Without a CUDA driver (LF_DISABLE_CUDA=1 hides it) there is no device to serve.
    monkeypatch.setenv("LF_DISABLE_CUDA", "1")
    p = peer(NO_CUDA, name)
    assert p.wait().strip() == "refused"


# ---- The GPU host: PyTorch 2.8+ with CUDA, and lava-flow's Vulkan device on that GPU.


def torch_pool_ready():
    """Skips unless PyTorch (new enough, with CUDA) and lava-flow's Vulkan share CUDA device 0."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if not found or (int(found[1]), int(found[2])) < lf.torch.MIN_TORCH:
        pytest.skip(f"lava_flow.torch needs PyTorch 2.8 or newer; this is {torch.__version__}")
    ctx = lf.Context(gpu_device=lf.torch.device_uuid(0))
    if ctx.gpu_unavailable_reason:
        pytest.skip(f"lava-flow opens no Vulkan device on CUDA device 0: {ctx.gpu_unavailable_reason}")
    return torch


def run(peer, name, code, *args, env=None):
    """Runs `code` in a fresh process (each binds its own devices and counts its own buffers)
    and returns its output."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        p = peer(code, name, *args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return p.wait(timeout=120)


SETUP = """
import gc, lava_flow as lf, torch
import lava_flow.torch
ctx = lf.Context(gpu="required", gpu_device=lf.torch.device_uuid(0))
pool = lf.torch.mem_pool(0, context=ctx)
"""

IS_LAVA_FLOW_MEMORY = SETUP + """
assert lf.torch.context(0) is ctx
with torch.cuda.use_mem_pool(pool):
    t = torch.arange(1 << 20, dtype=torch.int32, device="cuda:0")
    u = (t * 2)[1:]
elsewhere = torch.arange(16, device="cuda:0")
buf, offset = lf.torch.buffer_of(t)
assert buf.location == lf.Memory.GPU_DEVICE_LOCAL and buf.is_gpu, buf
assert buf.origin == lf.Origin.ALLOCATED
assert buf.cuda_address + offset == t.data_ptr(), "the buffer's bytes are the tensor's"
assert buf.size >= offset + t.nbytes
assert t.data_ptr() % 512 == 0, "aligned as cudaMalloc's memory"
# What torch wrote, lava-flow reads (its own Vulkan read of the buffer).
torch.cuda.synchronize()
assert buf.read(t.nbytes, offset) == t.cpu().numpy().tobytes()
# What lava-flow writes, torch reads.
buf.write((7).to_bytes(4, "little") * 4, offset)
assert t[:4].tolist() == [7, 7, 7, 7] and t[4].item() == 4
# A view inside a segment is found too, at its own offset.
vbuf, voffset = lf.torch.buffer_of(u)
assert vbuf.cuda_address + voffset == u.data_ptr()
assert lf.torch.buffer_of(elsewhere) is None, "the default allocator's memory is not lava-flow's"
# DLPack of the Buffer goes through the pool's own import of the arena.
whole = torch.from_dlpack(buf)
assert whole.data_ptr() == buf.cuda_address
s = lf.torch._stats()
assert s["buffers"] >= 1 and s["arenas"] >= 1 and s["allocs"] >= s["buffers"], s
print("ok", s)
"""


def test_pool_tensors_are_lava_flow_memory(name, peer):
    torch_pool_ready()
    out = run(peer, name, IS_LAVA_FLOW_MEMORY)
    assert out.startswith("ok"), out


ONE_IMPORT_PER_ARENA = SETUP + """
made, alive, _ = lf._cuda_imports()
with torch.cuda.use_mem_pool(pool):
    # Small tensors: PyTorch asks for a 2 MiB segment per two of them, all in one 64 MiB arena.
    ts = [torch.full((1 << 20,), i, dtype=torch.uint8, device="cuda:0") for i in range(8)]
s = lf.torch._stats()
assert s["allocs"] >= 2 and s["buffers"] == s["allocs"], s
assert s["arenas"] == 1, s
assert lf._cuda_imports()[0] == made + 1, ("one CUDA import for every buffer of the arena", lf._cuda_imports())
assert [int(t[0]) for t in ts] == list(range(8))
print("ok", s)
"""


def test_an_arena_is_imported_into_cuda_once(name, peer):
    torch_pool_ready()
    out = run(peer, name, ONE_IMPORT_PER_ARENA)
    assert out.startswith("ok"), out


GIVES_BACK = SETUP + """
with torch.cuda.use_mem_pool(pool):
    small = [torch.ones(1 << 18, device="cuda:0") for _ in range(4)]
    large = torch.ones(48 << 20, dtype=torch.uint8, device="cuda:0")  # an arena of its own
s = lf.torch._stats()
assert s["buffers"] >= 2 and s["bytes"] >= 48 << 20, s
_, alive, _ = lf._cuda_imports()
del small, large
# PyTorch keeps freed blocks cached in the pool; the pool's end gives its segments back.
del pool
gc.collect()
torch.cuda.empty_cache()
after = lf.torch._stats()
assert after["buffers"] == 0 and after["bytes"] == 0 and after["arenas"] == 0, after
assert after["frees"] == after["allocs"] == s["allocs"], after
assert lf._cuda_imports()[1] == alive - s["arenas"], ("the arenas' imports are unmapped", lf._cuda_imports())
print("ok", after, ctx.trim())
"""


def test_freeing_tensors_gives_the_memory_back(name, peer):
    torch_pool_ready()
    out = run(peer, name, GIVES_BACK)
    assert out.startswith("ok"), out


PRODUCER = SETUP + """
n = 1 << 20
with torch.cuda.use_mem_pool(pool):
    t = torch.arange(n, dtype=torch.int32, device="cuda:0")
ch = lf.producer(ctx, NAME, rendezvous_timeout=60)
print("transport", ch.transport, "|", ch.transport_reason)
seq = ch.send_tensor(t[16:])
ch.wait_completed(seq, timeout=60)
# The consumer added 1 to what it saw, through its view of these very bytes.
expected = torch.arange(n, dtype=torch.int32, device="cuda:0")
expected[16:] += 1
assert torch.equal(t, expected), "the consumer's writes are not in the producer's tensor"
# Written on a side stream and sent stream-ordered on it: the consumer's stream waits on the GPU.
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    torch.cuda._sleep(50_000_000)
    t[:16] = -5
seq = ch.send_tensor(t[:16], stream=side)
ch.wait_completed(seq, timeout=60)
print("ok")
"""


def test_a_pool_tensor_arrives_by_reference_as_a_gpu_message(name, peer):
    torch = torch_pool_ready()
    p = peer(PRODUCER, name)
    ctx = lf.Context()
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    n = 1 << 20
    with ch.recv(timeout=60) as m:
        # lava-flow's own GPU buffer (send_buffer's route), not foreign CUDA memory.
        assert m.is_gpu and not m.is_cuda, (m.flags, ch.transport_reason)
        assert len(m) == (n - 16) * 4
        view = torch.from_dlpack(m)
        ints = view.view(torch.int32)
        assert torch.equal(ints, torch.arange(16, n, dtype=torch.int32, device="cuda:0"))
        # The message's lava-flow buffer, read by lava-flow itself (Vulkan), holds the same.
        buf = m.buffer
        assert buf.is_gpu and buf.origin == lf.Origin.IMPORTED
        assert buf.read(64) == b"".join(i.to_bytes(4, "little") for i in range(16, 32))
        del buf
        ints += 1
        torch.cuda.synchronize()
        del view, ints
    with ch.recv(timeout=60) as m:
        assert m.is_gpu and not m.is_cuda
        stream = torch.cuda.Stream()
        ints = torch.from_dlpack(m.__dlpack__(stream=stream.cuda_stream)).view(torch.int32)
        with torch.cuda.stream(stream):
            values = ints.tolist()
        assert values == [-5] * 16, "the consumer's stream waited for the producer's side stream"
        del ints
    out = p.wait(timeout=120)
    assert "ok" in out and "vulkan_ipc" in out, out


HELD_PRODUCER = SETUP + """
import sys
n = 1 << 20
with torch.cuda.use_mem_pool(pool):
    t = torch.full((n,), 0x5A, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
buf, offset = lf.torch.buffer_of(t)
ch = lf.producer(ctx, NAME, rendezvous_timeout=60)
seq = ch.send_buffer(buf, offset, n)
# PyTorch frees the memory while the message is in flight: the pool's buffer goes, lava-flow's
# hold keeps the arena's memory for the consumer.
del t, buf
del pool
gc.collect()
torch.cuda.empty_cache()
s = lf.torch._stats()
assert s["buffers"] == 0 and s["frees"] == s["allocs"], s
ctx.trim()
print("freed", flush=True)
ch.wait_completed(seq, timeout=60)
print("ok")
"""


def test_a_sent_buffer_outlives_its_free_by_pytorch(name, peer):
    torch_pool_ready()
    p = peer(HELD_PRODUCER, name)
    ctx = lf.Context()
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    line = p.proc.stdout.readline()
    assert line.strip() == "freed", line + p.proc.stderr.read()
    with ch.recv(timeout=60) as m:
        assert m.is_gpu and len(m) == 1 << 20
        assert m.buffer.read() == b"\x5a" * (1 << 20)
    assert "ok" in p.wait(timeout=120)


WRONG_DEVICE = SETUP + """
import ctypes
# Another Context on the same device is refused: the hooks know the device, not the pool.
other = lf.Context(gpu="required", gpu_device=lf.torch.device_uuid(0))
try:
    lf.torch.mem_pool(0, context=other)
    print("unexpected: a second Context for device 0")
except lf.InvalidStateError as e:
    assert "another Context" in e.message, e.message
assert lf.torch.mem_pool(0, context=ctx) is not None, "the same Context again is fine"
assert lf.torch.mem_pool(0) is not None, "no context: the one serving the device"
# A Context without a GPU cannot serve one.
try:
    lf._native._torch_pool_bind(lf.Context(gpu="disabled"), 0)
    print("unexpected: a Context without a GPU")
except lf.LavaFlowError as e:
    assert e.status == lf.Status.ERR_UNSUPPORTED and "has no GPU" in e.message, e.message
# PyTorch asking for a device no pool serves gets NULL (out of memory), and the reason.
alloc = getattr(ctypes.CDLL(lf._native.__file__), lf._native._TORCH_ALLOC)
alloc.restype = ctypes.c_void_p
alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
count = torch.cuda.device_count()
assert alloc(1 << 20, count, None) is None
assert f"CUDA device {count}" in lf.torch.last_error() and "serve CUDA device(s) 0 only" in lf.torch.last_error()
if count > 1:
    # The pool of device 0 used on device 1: PyTorch routes the allocation to it.
    try:
        with torch.cuda.use_mem_pool(pool, device=1):
            torch.empty(1 << 20, device="cuda:1")
        print("unexpected: memory on device 1")
    except torch.OutOfMemoryError:
        assert "CUDA device 1" in lf.torch.last_error(), lf.torch.last_error()
    # A Context of device 0 cannot serve device 1.
    try:
        lf.torch.mem_pool(1, context=ctx)
        print("unexpected: device 0's Context for device 1")
    except lf.LavaFlowError as e:
        assert e.status == lf.Status.ERR_INVALID_ARGUMENT and "is not CUDA device 1" in e.message, e.message
assert lf.torch._stats()["buffers"] == 0
print("ok", count)
"""


def test_a_device_the_pool_does_not_serve_is_refused(name, peer):
    torch_pool_ready()
    out = run(peer, name, WRONG_DEVICE)
    assert out.startswith("ok") and "unexpected" not in out, out
