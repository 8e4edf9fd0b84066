"""GPU buffers by reference on fan-in and fan-out channels between Python processes on one GPU
(lavapipe in CI): three producers' GPU buffers each read through its own producer's memory by
one consumer, and one producer's GPU buffer shared by three consumers, complete only after the
last release. The tests skip without a Vulkan device, and fail then under LF_REQUIRE_VULKAN=1."""
import os
import time

import numpy as np
import pytest

import lava_flow as lf


@pytest.fixture(scope="module")
def gpu_ctx():
    ctx = lf.Context()
    why = ctx.gpu_unavailable_reason
    if why:
        assert os.environ.get("LF_REQUIRE_VULKAN") != "1", f"LF_REQUIRE_VULKAN=1, but no Vulkan device: {why}"
        pytest.skip(f"no Vulkan device: {why}")
    return ctx


def wait_until(check, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


# Message `seq` of producer `ident`: the id, the sequence number, then bytes derived from both.
# Even messages are GPU buffers (DEVICE_LOCAL and HOST_VISIBLE in turn), odd ones copies.
MESSAGE = """
import numpy as np
def length_of(seq):
    return 256 + (seq * 131) % 3800 if seq % 2 == 0 else 64
def message(ident, seq):
    body = (np.arange(length_of(seq), dtype=np.uint64) * 7 + ident * 101 + seq * 31).astype(np.uint8)
    body[:16] = np.array([ident, seq], dtype=np.uint64).view(np.uint8)
    return body.tobytes()
"""
_defs = {}
exec(MESSAGE, _defs)  # the same definitions here as in the peers
length_of, message = _defs["length_of"], _defs["message"]

# ARGS: its id, how many messages, a file to wait for before sending (every producer attached).
GPU_PRODUCER = MESSAGE + """
import os, time
import lava_flow as lf
ident, count, go = int(ARGS[0]), int(ARGS[1]), ARGS[2]
ctx = lf.Context()
ch = lf.producer(ctx, NAME, kind="fan_in", max_peers=3, rendezvous_timeout=60)
assert ch.transport == "shm+vulkan_ipc", (ch.transport, ch.transport_reason)
# Every producer allocates the same buffers in the same order: a message resolved through
# another producer's imports would name memory that exists, with another producer's bytes.
kinds = [lf.Memory.GPU_DEVICE_LOCAL, lf.Memory.GPU_HOST_VISIBLE]
buffers = [ctx.alloc(4096, kinds[(seq // 2) % 2]) for seq in range(0, count, 2)]
print("attached", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
for seq in range(count):
    data = message(ident, seq)
    if seq % 2 == 0:
        buf = buffers[seq // 2]
        buf.write(data)
        sent = ch.send_buffer(buf, 0, len(data), timeout=60)
    else:
        sent = ch.send(data, timeout=60)
    assert sent == seq, (sent, seq)
# Its buffers stay alive until the consumer released every message.
ch.wait_completed(count - 1, timeout=60)
ch.close()
"""


def read_gpu(ctx, msg):
    """A GPU message's bytes, copied to host memory by the GPU, and read through the buffer."""
    buf = msg.buffer
    assert buf.is_gpu and buf.origin == lf.Origin.IMPORTED, (buf.location, buf.origin)
    host = ctx.alloc(len(msg), lf.Memory.CPU_GPU_PINNED)
    ctx.copy(host, buf, len(msg))
    copied = bytes(memoryview(host))
    assert buf.read(len(msg)) == copied
    host.free()
    return copied


def test_gpu_fan_in_three_producers_by_reference(gpu_ctx, name, peer, tmp_path):
    count, go = 12, tmp_path / "go"
    procs = [peer(GPU_PRODUCER, name, ident, count, go) for ident in range(3)]
    ch = lf.consumer(gpu_ctx, name, kind="fan_in", max_peers=3, rendezvous_timeout=60)
    # (+cuda_ipc where an earlier test loaded CUDA into this process: it then takes CUDA memory.)
    assert ch.transport.startswith("shm+vulkan_ipc"), (ch.transport, ch.transport_reason)
    for p in procs:
        assert p.proc.stdout.readline() == "attached\n"
    # Every producer attached before any sends: a receive takes them up.
    wait_until(lambda: ch.try_recv() is None and all(p.state == "alive" for p in ch.peers()),
               "three producers attached")
    reason = ch.transport_reason
    assert "vulkan_ipc, by reference" in reason and "slots 0, 1, 2" in reason, reason
    pid_of_slot = {p.slot: p.pid for p in ch.peers()}
    assert sorted(pid_of_slot.values()) == sorted(p.proc.pid for p in procs)
    assert all(p.route == "shm" and p.rank is None for p in ch.peers()), ch.peers()
    go.touch()

    next_seq, slot_of, held = {}, {}, []
    for _ in range(3 * count):
        msg = ch.recv(timeout=60)
        seq = msg.sequence
        assert msg.is_gpu == (seq % 2 == 0), (seq, msg.flags, ch.transport_reason)
        if msg.is_gpu:
            # By reference: the producer's GPU memory, imported, not staged through the ring.
            assert msg.zero_copy, ch.transport_reason
            data = read_gpu(gpu_ctx, msg)
        else:
            data = bytes(msg)
        ident, sent_seq = np.frombuffer(data[:16], dtype=np.uint64)
        ident = int(ident)
        assert (int(sent_seq), len(data)) == (seq, length_of(seq)), (ident, seq)
        assert data == message(ident, seq), f"producer {ident}'s message {seq}: its bytes"
        # Each producer's messages in its order, under one slot: its own.
        assert seq == next_seq.get(ident, 0), f"producer {ident}: message {seq} out of order"
        next_seq[ident] = seq + 1
        assert slot_of.setdefault(ident, msg.producer) == msg.producer, f"producer {ident} under two slots"
        assert pid_of_slot[msg.producer] == procs[ident].proc.pid
        if seq == 0:
            held.append(msg)  # held across the others' messages, released out of order below
        else:
            msg.release()
    assert sorted(next_seq.items()) == [(i, count) for i in range(3)]
    # Each producer has a ready semaphore of its own: the channel-wide one is refused, naming
    # the call that answers per producer. It gives an fd where the driver shares semaphores,
    # and says why not where it does not (lavapipe synchronises on the host).
    with pytest.raises(lf.InvalidStateError) as e:
        ch.ready_semaphore()
    assert "producer_ready_semaphore" in e.value.message, e.value.message
    for slot in slot_of.values():
        try:
            os.close(ch.producer_ready_semaphore(slot))
        except lf.LavaFlowError as e:
            assert e.status == lf.Status.ERR_UNSUPPORTED, e.message
    with pytest.raises(lf.InvalidStateError):
        ch.producer_ready_semaphore(3)  # no such slot: max_peers is 3
    # The first GPU message of each producer still reads its producer's bytes.
    for msg in reversed(held):
        ident = int(np.frombuffer(read_gpu(gpu_ctx, msg)[:8], dtype=np.uint64)[0])
        assert read_gpu(gpu_ctx, msg) == message(ident, 0)
        msg.release()
    ended = []
    for _ in range(3):
        with pytest.raises(lf.PeerGoneError) as e:
            ch.recv(timeout=60)
        assert f"slot {e.value.producer}" in e.value.message
        ended.append(e.value.producer)
    assert sorted(ended) == sorted(slot_of.values()) == [0, 1, 2]
    for p in procs:
        p.wait()
    ch.close()


# ARGS: its index, a directory for flags. Receives two GPU messages, reads them, reads the first
# again once the producer rewrote its memory, then holds both until `release-<index>` exists.
GPU_CONSUMER = """
import os, pathlib, time
import numpy as np, lava_flow as lf
index, flags = int(ARGS[0]), pathlib.Path(ARGS[1])

def wait_for(path):
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)

def pattern(seed, n):
    return ((np.arange(n, dtype=np.uint64) * 13 + seed) % 251).astype(np.uint8).tobytes()

ctx = lf.Context()
ch = lf.consumer(ctx, NAME, kind="fan_out", max_peers=3, rendezvous_timeout=60)
assert ch.transport == "shm+vulkan_ipc", (ch.transport, ch.transport_reason)
held = [ch.recv(timeout=60) for _ in range(2)]
for seq, msg in enumerate(held):
    assert msg.sequence == seq and msg.producer == 0
    assert msg.is_gpu and msg.zero_copy, (msg.flags, ch.transport_reason)
    buf = msg.buffer
    assert buf.is_gpu and buf.origin == lf.Origin.IMPORTED and buf.size >= len(msg) == 1 << 16
    host = ctx.alloc(len(msg), lf.Memory.CPU_GPU_PINNED)
    ctx.copy(host, buf, len(msg))
    assert bytes(memoryview(host)) == pattern(seq, len(msg)), f"message {seq}: its bytes"
    host.free()
    del buf  # a view of the message's buffer would keep it from its release below
(flags / f"read-{index}").touch()
# The producer rewrites the first buffer while every consumer holds it: each sees the new bytes,
# one memory for all, not a copy each.
wait_for(flags / "rewritten")
assert held[0].buffer.read(len(held[0])) == pattern(99, 1 << 16), "the rewrite is not seen: a copy"
wait_for(flags / f"release-{index}")
for msg in reversed(held):
    msg.release()
(flags / f"released-{index}").touch()
try:
    ch.recv(timeout=60)
    raise SystemExit("a message after the producer's last")
except lf.PeerGoneError:
    pass
print("ok", flush=True)
"""


def pattern(seed, n):
    return ((np.arange(n, dtype=np.uint64) * 13 + seed) % 251).astype(np.uint8).tobytes()


def wait_for_flag(consumer, flag, what, timeout=60):
    """Waits for a consumer's flag; fails at once, with its output, if the consumer ended first."""
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if consumer.proc.poll() is not None:
            out, err = consumer.proc.communicate()
            pytest.fail(f"{what}: the consumer ended first ({consumer.proc.returncode}):\n{out}\n{err}")
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def test_gpu_fan_out_three_consumers_share_one_memory(gpu_ctx, name, peer, tmp_path):
    size = 1 << 16
    consumers = [peer(GPU_CONSUMER, name, index, tmp_path) for index in range(3)]
    ch = lf.producer(gpu_ctx, name, kind="fan_out", max_peers=3, rendezvous_timeout=60)
    wait_until(lambda: sum(p.state == "alive" for p in ch.peers()) == 3, "three consumers attached")
    assert sorted(p.pid for p in ch.peers()) == sorted(c.proc.pid for c in consumers)
    device_local = gpu_ctx.alloc(size, lf.Memory.GPU_DEVICE_LOCAL)
    host_visible = gpu_ctx.alloc(size, lf.Memory.GPU_HOST_VISIBLE)
    device_local.write(pattern(0, size))
    host_visible.write(pattern(1, size))
    assert ch.send_buffer(device_local, timeout=60) == 0
    last = ch.send_buffer(host_visible, timeout=60)
    assert last == 1
    assert ch.transport.startswith("shm+vulkan_ipc"), (ch.transport, ch.transport_reason)
    assert "vulkan_ipc, by reference" in ch.transport_reason, ch.transport_reason
    for index in range(3):
        wait_for_flag(consumers[index], tmp_path / f"read-{index}", f"consumer {index}'s read")
    device_local.write(pattern(99, size))
    (tmp_path / "rewritten").touch()
    # Released by one consumer after another: not complete while any of them holds it.
    for index in range(3):
        assert ch.completed == 0, f"complete while consumers {index}..2 hold the messages"
        with pytest.raises(lf.TimeoutError):
            ch.wait_completed(last, timeout=0.1)
        (tmp_path / f"release-{index}").touch()
        wait_for_flag(consumers[index], tmp_path / f"released-{index}", f"consumer {index}'s release")
    ch.wait_completed(last, timeout=60)
    assert ch.completed == 2
    ch.close()
    for c in consumers:
        assert c.wait() == "ok\n"
    device_local.free()
    host_visible.free()
