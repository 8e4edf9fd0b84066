"""Channels between two Python processes: zero-copy receive, loans, buffer sends, lifetimes,
errors, asyncio."""
import asyncio
import gc
import select

import numpy as np
import pytest

import lava_flow as lf

PRODUCER = """
import numpy as np, lava_flow as lf
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, capacity=4)
n = int(ARGS[0])
for i in range(n):
    ch.send(np.full(1000, i, dtype=np.float32))
# A loan, written in place.
with ch.loan(64) as loan:
    np.frombuffer(loan, dtype=np.uint8)[:] = 42
    loan.publish()
# A buffer send by reference: the consumer reads this very buffer.
buf = ctx.alloc(1 << 16)
np.asarray(buf)[:] = 9
seq = ch.send_buffer(buf)
ch.wait_completed(seq, timeout=30)
ch.close()
"""


def test_two_processes(name, peer):
    ctx = lf.Context(gpu="disabled")
    n = 20
    p = peer(PRODUCER, name, n)
    ch = lf.consumer(ctx, name)
    assert ch.transport.startswith("shm") and ch.transport_reason
    for i in range(n):
        msg = ch.recv(timeout=30)
        assert msg.sequence == i and len(msg) == 4000
        a = np.frombuffer(msg, dtype=np.float32)
        # Zero copy: the array is the message's shared memory, read-only.
        assert a.ctypes.data == msg.address and not a.flags.writeable
        assert np.from_dlpack(msg).ctypes.data == msg.address
        assert (a == i).all()
        # The view keeps the message until it goes (the producer waits for the completions).
        msg.release()
        del a
    with ch.recv(timeout=30) as loaned:
        assert bytes(loaned) == b"\x2a" * 64
    msg = ch.recv(timeout=30)
    assert msg.zero_copy and msg.flags & lf.MessageFlags.ZERO_COPY
    assert (np.frombuffer(msg, np.uint8) == 9).all()
    msg.release()
    with pytest.raises(lf.PeerGoneError) as e:
        ch.recv(timeout=30)
    assert e.value.status == lf.Status.ERR_PEER_GONE
    p.wait()


ECHO_PRODUCER = """
import lava_flow as lf
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, capacity=2)
for i in range(int(ARGS[0])):
    ch.send(i.to_bytes(8, "little"), timeout=30)
"""


def test_view_outlives_release_and_gc_releases(name, peer):
    ctx = lf.Context(gpu="disabled")
    # capacity 2: the producer finishes only if every message is handed back, which here
    # happens through garbage collection alone for most of them.
    p = peer(ECHO_PRODUCER, name, 50)
    ch = lf.consumer(ctx, name)
    msg = ch.recv(timeout=30)
    view = np.frombuffer(msg, dtype=np.uint64)
    msg.release()
    assert msg.released and view[0] == 0  # the view keeps the message's memory
    with pytest.raises(lf.InvalidStateError):
        memoryview(msg)
    with pytest.raises(lf.InvalidStateError):
        msg.tobytes()
    del msg
    m = ch.recv(timeout=30)  # the next one arrives while the view holds message 0
    assert int.from_bytes(m.tobytes(), "little") == 1 and view[0] == 0
    del view, m  # message 0 goes back with its last view, message 1 by garbage collection
    for i in range(2, 50):
        m = ch.recv(timeout=30)
        assert int.from_bytes(m.tobytes(), "little") == i
        del m  # released by garbage collection
    gc.collect()
    p.wait()


def test_timeout_try_recv_and_fileno(name, peer):
    ctx = lf.Context(gpu="disabled")
    p = peer(ECHO_PRODUCER.replace("for i", "import time; time.sleep(0.5)\nfor i"), name, 1)
    ch = lf.consumer(ctx, name)
    assert ch.try_recv() is None
    with pytest.raises(lf.TimeoutError) as e:
        ch.recv(timeout=0.01)
    assert e.value.status == lf.Status.ERR_TIMEOUT
    r, _, _ = select.select([ch], [], [], 30)
    assert r == [ch]
    m = ch.try_recv()
    assert m is not None and m.tobytes() == bytes(8)
    m.release()
    p.wait()


def test_asyncio(name, peer):
    ctx = lf.Context(gpu="disabled")
    p = peer(ECHO_PRODUCER.replace("for i", "import time; time.sleep(0.2)\nfor i"), name, 5)
    ch = lf.consumer(ctx, name)

    async def main():
        with pytest.raises(lf.TimeoutError):
            await ch.recv_async(timeout=0.01)
        got = []
        async for m in ch:
            got.append(int.from_bytes(m.tobytes(), "little"))
            m.release()
        return got

    assert asyncio.run(main()) == list(range(5))
    p.wait()


def test_closed_channel_and_bad_arguments(name):
    ctx = lf.Context(gpu="disabled")
    with pytest.raises(ValueError):
        lf.Channel(ctx, name, "middle")
    with pytest.raises(lf.LavaFlowError) as e:
        lf.Channel(ctx, "bad name!", "producer", rendezvous_timeout=0.1)
    assert e.value.status == lf.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(lf.TimeoutError):
        lf.consumer(ctx, name, rendezvous_timeout=0.05)


def test_full_channel_and_completion(name):
    # Both ends in this process (the consumer made on a thread: creation waits for the peer).
    import threading
    ctx = lf.Context(gpu="disabled")
    ends = {}
    t = threading.Thread(target=lambda: ends.setdefault("rx", lf.consumer(ctx, name)))
    t.start()
    tx = lf.producer(ctx, name, capacity=2)
    t.join()
    rx = ends["rx"]
    assert tx.try_send(b"a") == 0 and tx.try_send(b"b") == 1
    assert tx.try_send(b"c") is None
    with pytest.raises(lf.WouldBlockError):
        tx.send(b"c", timeout=0)
    with pytest.raises(lf.TimeoutError):
        tx.send(b"c", timeout=0.01)
    assert tx.completed == 0
    with pytest.raises(lf.TimeoutError):
        tx.wait_completed(0, timeout=0.01)
    m = rx.recv(timeout=5)
    m.release()
    tx.wait_completed(0, timeout=5)
    assert tx.completed == 1 and tx.try_send(b"c") == 2
    with rx.recv(timeout=5) as m:
        assert bytes(m) == b"b"
    # A loan given back unpublished leaves no message.
    loan = tx.loan(16, timeout=5)
    loan.cancel()
    with pytest.raises(lf.InvalidStateError):
        memoryview(loan)
    with rx.recv(timeout=5) as m:
        assert bytes(m) == b"c"
    assert rx.try_recv() is None
    tx.close()
    with pytest.raises(lf.InvalidStateError):
        tx.send(b"x")
    with pytest.raises(lf.PeerGoneError):
        rx.recv(timeout=5)


def test_loan_collected_while_another_thread_holds_the_channel(name):
    # A loan dropped unpublished while another thread waits in the channel cannot be given back
    # at once (a finalizer must not wait): the next call gives it back, and the next loan works.
    import threading
    import time
    ctx = lf.Context(gpu="disabled")
    ends = {}
    t = threading.Thread(target=lambda: ends.setdefault("rx", lf.consumer(ctx, name)))
    t.start()
    tx = lf.producer(ctx, name, capacity=2)
    t.join()
    rx = ends["rx"]
    assert tx.send(b"a", timeout=5) == 0
    loan = tx.loan(16, timeout=5)
    outcome = []

    def blocked_wait():
        try:
            tx.wait_completed(0, timeout=0.6)  # the consumer does not read: waits, holding the channel
            outcome.append("completed")
        except lf.TimeoutError:
            outcome.append("timeout")

    waiter = threading.Thread(target=blocked_wait)
    waiter.start()
    time.sleep(0.2)
    del loan  # collected while the waiter holds the channel
    gc.collect()
    waiter.join()
    assert outcome == ["timeout"]
    tx.completed  # any call on the producer gives the collected loan back first
    with rx.recv(timeout=5) as m:
        assert bytes(m) == b"a"
    with tx.loan(16, timeout=5) as loan:  # a new loan: the collected one was given back
        np.frombuffer(loan, dtype=np.uint8)[:] = 7
        loan.publish()
    with rx.recv(timeout=5) as m:
        assert bytes(m) == bytes([7] * 16)
    assert rx.try_recv() is None
