"""Fan-out channels between Python processes: one producer (this process), several consumers,
each consumer getting every message in order, a buffer by reference shared by all and complete
after the last release, a late consumer starting with the next message, a consumer killed with
kill -9 or detached for slowness while the producer goes on, a full fan-out refused, and
Channel.peers() on the producer listing its consumers."""
import threading
import time

import numpy as np
import pytest

import lava_flow as lf

# ARGS: its id, how many numbered messages, and a directory for flags: with "hold" as ARGS[3],
# it then receives a buffer by reference and holds it until the flag `release-<id>` exists,
# touching `released-<id>` once it let go. Ends at the producer's end.
CONSUMER = """
import os, pathlib, time
import numpy as np, lava_flow as lf
ident, count, flags = int(ARGS[0]), int(ARGS[1]), pathlib.Path(ARGS[2])
hold = len(ARGS) > 3 and ARGS[3] == "hold"
ch = lf.consumer(lf.Context(gpu="disabled"), NAME, kind="fan_out", max_peers=4, rendezvous_timeout=60)
assert ch.kind == lf.ChannelKind.FAN_OUT
(producer,) = ch.peers()
assert producer.state == "alive" and producer.pid == os.getppid() and producer.route == "shm", producer
for i in range(count):
    with ch.recv(timeout=60) as msg:
        assert msg.sequence == i and int(np.frombuffer(msg, dtype=np.uint64)[0]) == i, (msg.sequence, i)
        assert msg.producer == 0 and not msg.zero_copy
if hold:
    msg = ch.recv(timeout=60)
    assert msg.sequence == count and msg.zero_copy and len(msg) == 1 << 20
    assert (np.frombuffer(msg, dtype=np.uint8) == np.arange(1 << 20, dtype=np.uint64).astype(np.uint8)).all()
    deadline = time.monotonic() + 60
    while not (flags / f"release-{ident}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    msg.release()
    (flags / f"released-{ident}").touch()
try:
    ch.recv(timeout=60)
    raise SystemExit("a message after the producer's last")
except lf.PeerGoneError as e:
    assert e.producer is None  # one producer: no slot to name
print("ok", flush=True)
"""


def fan_out_producer(ctx, name, max_peers, **config):
    # A small pool (buffers go by reference, outside it): each consumer maps the pool in whole
    # while the producer waits for its answer, which must come within 2 s on a loaded machine.
    return lf.producer(ctx, name, kind="fan_out", max_peers=max_peers, pool_size=1 << 20, rendezvous_timeout=60,
                       **config)


def wait_until(check, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def alive(ch):
    return [p for p in ch.peers() if p.state == "alive"]


def number(i):
    return np.array([i], dtype=np.uint64)


def test_four_consumers_get_every_message_and_share_a_buffer(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    count = 2000
    consumers = [peer(CONSUMER, name, ident, count, tmp_path, "hold") for ident in range(4)]
    ch = fan_out_producer(ctx, name, 6)
    assert ch.kind == lf.ChannelKind.FAN_OUT
    # Creating waited for the first consumer; each other one is taken up at the next send.
    wait_until(lambda: len(alive(ch)) == 4, "four consumers attached", timeout=60)
    peers = ch.peers()
    assert [p.slot for p in peers] == list(range(6))
    assert sorted(p.pid for p in alive(ch)) == sorted(c.proc.pid for c in consumers)
    for p in alive(ch):
        assert p.rank is None and p.host and p.route == "shm"
    for p in peers[4:]:
        assert p.state == "free" and p.pid == 0 and p.route is None and p.host == ""

    for i in range(count):
        assert ch.send(number(i), timeout=60) == i
    weights = ctx.alloc(1 << 20)
    weights.write(np.arange(1 << 20, dtype=np.uint64).astype(np.uint8))
    seq = ch.send_buffer(weights, timeout=60)
    assert seq == count
    # One memory for all four: not complete while any of them holds it.
    for ident in range(4):
        assert ch.completed <= seq
        with pytest.raises(lf.TimeoutError):
            ch.wait_completed(seq, timeout=0.1)
        (tmp_path / f"release-{ident}").touch()
        wait_until(lambda: (tmp_path / f"released-{ident}").exists(), f"consumer {ident}'s release", timeout=60)
    ch.wait_completed(seq, timeout=60)
    assert ch.completed == seq + 1
    ch.close()
    for c in consumers:
        assert c.wait() == "ok\n"
    weights.free()


# ARGS: how many messages it expects, the value of the first. Prints its sequence numbers.
LATE = """
import numpy as np, lava_flow as lf
count, first = int(ARGS[0]), int(ARGS[1])
ch = lf.consumer(lf.Context(gpu="disabled"), NAME, kind="fan_out", rendezvous_timeout=60)
got = []
for _ in range(count):
    with ch.recv(timeout=60) as msg:
        got.append((int(np.frombuffer(msg, dtype=np.uint64)[0]), msg.sequence))
assert [v for v, _ in got] == list(range(first, first + count)), got
print(" ".join(str(s) for _, s in got), flush=True)
try:
    ch.recv(timeout=60)
except lf.PeerGoneError:
    pass
"""


def test_a_late_consumer_starts_with_the_next_message(name, peer):
    ctx = lf.Context(gpu="disabled")
    early = peer(LATE, name, 20, 0)
    ch = fan_out_producer(ctx, name, 2)
    for i in range(10):
        ch.send(number(i), timeout=60)
    ch.wait_completed(9, timeout=60)
    late = peer(LATE, name, 10, 10)
    wait_until(lambda: len(alive(ch)) == 2, "the late consumer attached", timeout=60)
    # Taken up at this send: the late one's first message, its sequence number 0.
    for i in range(10, 20):
        assert ch.send(number(i), timeout=60) == i
    ch.wait_completed(19, timeout=60)
    ch.close()
    assert early.wait().split() == [str(s) for s in range(20)]
    assert late.wait().split() == [str(s) for s in range(10)]


# Attaches, then never receives: killed while the producer waits for its room.
VICTIM = """
import time, lava_flow as lf
ch = lf.consumer(lf.Context(gpu="disabled"), NAME, kind="fan_out", rendezvous_timeout=60)
print("attached", flush=True)
time.sleep(600)
"""


def test_kill_one_consumer_of_four_while_the_producer_waits_for_it(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    count = 200
    victim = peer(VICTIM, name)
    ch = fan_out_producer(ctx, name, 4, capacity=4)
    others = [peer(CONSUMER, name, ident, count, tmp_path) for ident in range(3)]
    wait_until(lambda: len(alive(ch)) == 4, "four consumers attached", timeout=60)
    for i in range(4):
        ch.send(number(i), timeout=60)
    # The victim's ring is full: the next send waits for its room until it is killed.
    assert ch.try_send(number(4)) is None
    killer = threading.Timer(0.5, victim.proc.kill)  # SIGKILL
    killer.start()
    for i in range(4, count):
        ch.send(number(i), timeout=30)
    killer.join()
    assert victim.proc.wait(timeout=60) == -9
    ch.wait_completed(count - 1, timeout=60)
    live = alive(ch)
    assert len(live) == 3 and victim.proc.pid not in [p.pid for p in live]
    ch.close()
    for c in others:
        assert c.wait() == "ok\n"  # every message, in order


# Attaches, receives nothing until the flag ARGS[0] exists, then reads what it had.
SLOW = """
import os, time
import numpy as np, lava_flow as lf
ch = lf.consumer(lf.Context(gpu="disabled"), NAME, kind="fan_out", rendezvous_timeout=60)
print("attached", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(ARGS[0]) and time.monotonic() < deadline:
    time.sleep(0.01)
got = []
try:
    while True:
        with ch.recv(timeout=60) as msg:
            got.append((int(np.frombuffer(msg, dtype=np.uint64)[0]), msg.sequence))
except lf.PeerGoneError as e:
    print(e.message)
assert got == [(i, i) for i in range(len(got))] and len(got) <= 4, got
"""


def test_a_slow_consumer_is_detached_and_the_producer_goes_on(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    go = tmp_path / "go"
    slow = peer(SLOW, name, go)
    # A bound a loaded 2-core machine does not reach for a consumer that keeps reading.
    ch = fan_out_producer(ctx, name, 2, capacity=4, slow_consumer_timeout=2.0)
    fast = peer(CONSUMER, name, 0, 50, tmp_path)
    wait_until(lambda: len(alive(ch)) == 2, "both consumers attached", timeout=60)
    for i in range(50):
        ch.send(number(i), timeout=30)
    ch.wait_completed(49, timeout=60)
    (only,) = alive(ch)
    assert only.pid == fast.proc.pid
    go.touch()
    said = slow.wait()
    assert "detached" in said and "slow_consumer_timeout" in said, said
    ch.close()
    assert fast.wait() == "ok\n"


# A consumer of a full fan-out: prints the refusal.
REFUSED = """
import lava_flow as lf
try:
    lf.consumer(lf.Context(gpu="disabled"), NAME, kind="fan_out", rendezvous_timeout=60)
except lf.InvalidStateError as e:
    print(e.message)
else:
    raise SystemExit("a third consumer attached to a fan-out of max_peers=2")
"""


def test_full_fan_out_is_refused(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    first = peer(CONSUMER, name, 0, 0, tmp_path)
    ch = fan_out_producer(ctx, name, 2)
    second = peer(CONSUMER, name, 1, 0, tmp_path)
    wait_until(lambda: len(alive(ch)) == 2, "both consumers attached", timeout=60)
    # The producer's thread answers while the producer does nothing.
    refusal = peer(REFUSED, name).wait()
    assert "is full" in refusal and "max_peers = 2" in refusal, refusal
    assert [p.state for p in ch.peers()] == ["alive", "alive"]
    ch.close()
    assert first.wait() == "ok\n" and second.wait() == "ok\n"
