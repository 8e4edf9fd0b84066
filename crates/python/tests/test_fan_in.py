"""Fan-in channels between Python processes: several producers, one consumer, each producer's
messages in order and named by its slot, each producer's end reported on its own (a clean close
or kill -9), a full fan-in refused, bad options refused with the library's message."""
import time

import numpy as np
import pytest

import lava_flow as lf

# ARGS: its id, how many messages, a file whose existence lets it close (or "-": close at once).
PRODUCER = """
import os, time
import numpy as np, lava_flow as lf
ident, count, hold = int(ARGS[0]), int(ARGS[1]), ARGS[2]
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, kind="fan_in", max_peers=int(ARGS[3]), capacity=4, rendezvous_timeout=60)
# A fan-in producer's one peer: its consumer, whose pid it is not told.
(consumer,) = ch.peers()
assert consumer.slot == 0 and consumer.state == "alive" and consumer.pid == 0, consumer
for i in range(count):
    ch.send(np.array([ident, i], dtype=np.uint64), timeout=60)
print("sent", flush=True)
deadline = time.monotonic() + 60
while hold != "-" and not os.path.exists(hold) and time.monotonic() < deadline:
    time.sleep(0.01)
ch.close()
"""


def fan_in_consumer(ctx, name, max_peers, **config):
    return lf.consumer(ctx, name, kind="fan_in", max_peers=max_peers, rendezvous_timeout=60, **config)


def payload(msg):
    ident, i = np.frombuffer(msg, dtype=np.uint64)
    return int(ident), int(i)


def wait_until(check, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def test_four_producers_in_order_with_their_slots_and_ends(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    count, hold = 300, tmp_path / "close"
    procs = [peer(PRODUCER, name, ident, count, hold, 6) for ident in range(4)]
    ch = fan_in_consumer(ctx, name, 6)
    assert ch.kind == lf.ChannelKind.FAN_IN
    got = {}  # producer id -> [(slot, sequence, index)]
    for _ in range(4 * count):
        with ch.recv(timeout=60) as msg:
            ident, i = payload(msg)
            got.setdefault(ident, []).append((msg.producer, msg.sequence, i))
    assert sorted(got) == [0, 1, 2, 3]
    slot_of = {}
    for ident, seen in got.items():
        slots = {s for s, _, _ in seen}
        assert len(slots) == 1, f"producer {ident} came through slots {slots}"
        slot_of[ident] = slots.pop()
        # Each producer's messages in its order, each once; sequence numbers count per producer.
        assert [i for _, _, i in seen] == list(range(count))
        assert [q for _, q, _ in seen] == list(range(count))
    assert len(set(slot_of.values())) == 4 and all(0 <= s < 6 for s in slot_of.values())
    assert ch.try_recv() is None

    peers = ch.peers()
    assert [p.slot for p in peers] == list(range(6))
    by_slot = {p.slot: p for p in peers}
    for ident, slot in slot_of.items():
        p = by_slot[slot]
        assert p.state == "alive" and p.pid == procs[ident].proc.pid
        assert p.rank is None and p.host and p.route == "shm"
    for slot in set(range(6)) - set(slot_of.values()):
        p = by_slot[slot]
        assert p.state == "free" and p.pid == 0 and p.route is None and p.host == ""

    # The producers close one by one: each end is reported with its slot, the others go on.
    hold.touch()
    ended = []
    for _ in range(4):
        with pytest.raises(lf.PeerGoneError) as e:
            ch.recv(timeout=60)
        assert e.value.status == lf.Status.ERR_PEER_GONE and f"slot {e.value.producer}" in e.value.message
        ended.append(e.value.producer)
        # Its slot is free once its end was reported.
        assert ch.peers()[e.value.producer].state == "free"
    assert sorted(ended) == sorted(slot_of.values())
    for p in procs:
        p.wait()

    # The consumer goes on: a producer that comes later takes a free slot, numbered from 0 again.
    late = peer(PRODUCER, name, 9, 3, "-", 6)
    seen = []
    for _ in range(3):
        with ch.recv(timeout=60) as msg:
            seen.append((payload(msg), msg.sequence))
            slot = msg.producer
    assert seen == [((9, 0), 0), ((9, 1), 1), ((9, 2), 2)]
    with pytest.raises(lf.PeerGoneError) as e:
        ch.recv(timeout=60)
    assert e.value.producer == slot
    late.wait()
    ch.close()


def test_gone_state_before_its_end_is_read(name, peer):
    # A producer that closed with messages still unread is "gone" until they and its end are read.
    ctx = lf.Context(gpu="disabled")
    p = peer(PRODUCER, name, 0, 3, "-", 2)
    ch = fan_in_consumer(ctx, name, 2)
    p.wait()
    wait_until(lambda: [q.state for q in ch.peers()].count("gone") == 1, "the producer's end shown in peers()")
    (gone,) = [q for q in ch.peers() if q.state == "gone"]
    assert gone.pid == p.proc.pid
    for i in range(3):
        with ch.recv(timeout=30) as msg:
            assert payload(msg) == (0, i) and msg.producer == gone.slot
    with pytest.raises(lf.PeerGoneError) as e:
        ch.recv(timeout=30)
    assert e.value.producer == gone.slot
    assert [q.state for q in ch.peers()] == ["free", "free"]
    assert ch.try_recv() is None  # nothing attached: no message, no error


# ARGS: its id, how many messages, a file to wait for before sending.
LATE = """
import os, time
import numpy as np, lava_flow as lf
ident, count, start = int(ARGS[0]), int(ARGS[1]), ARGS[2]
ch = lf.producer(lf.Context(gpu="disabled"), NAME, kind="fan_in", max_peers=2, rendezvous_timeout=60)
deadline = time.monotonic() + 60
while not os.path.exists(start) and time.monotonic() < deadline:
    time.sleep(0.01)
for i in range(count):
    ch.send(np.array([ident, i], dtype=np.uint64), timeout=60)
ch.close()
"""


def test_iteration_goes_on_past_one_producers_end(name, peer, tmp_path):
    # `for msg in ch` on a fan-in: one producer's end passes while another is attached; the
    # iteration stops when the last attached producer's end is read.
    import threading
    ctx = lf.Context(gpu="disabled")
    first, start = tmp_path / "first", tmp_path / "start"
    early = peer(LATE, name, 0, 3, first)
    late = peer(LATE, name, 1, 3, start)
    ch = fan_in_consumer(ctx, name, 2)
    # A receive takes up producers that attached; neither sends yet.
    wait_until(lambda: ch.try_recv() is None and all(p.state == "alive" for p in ch.peers()),
               "both producers attached", timeout=60)
    first.touch()

    def start_late():
        early.proc.wait()
        time.sleep(0.5)  # the first one's end read (the consumer waits in recv) before the others
        start.touch()

    threading.Thread(target=start_late, daemon=True).start()
    got = []
    for msg in ch:
        got.append(payload(msg))
        msg.release()
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    early.wait()
    late.wait()
    assert all(p.state == "free" for p in ch.peers())


# ARGS: its id. Sends until it is killed.
ENDLESS = """
import numpy as np, lava_flow as lf
ident = int(ARGS[0])
ctx = lf.Context(gpu="disabled")
ch = lf.producer(ctx, NAME, kind="fan_in", max_peers=4, capacity=4, rendezvous_timeout=60)
i = 0
while True:
    ch.send(np.array([ident, i], dtype=np.uint64))
    i += 1
"""


def test_kill_one_producer_of_four(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    count = 2000
    others = [peer(PRODUCER, name, ident, count, "-", 4) for ident in range(3)]
    victim = peer(ENDLESS, name, 3)
    ch = fan_in_consumer(ctx, name, 4)
    got = {ident: [] for ident in range(4)}
    slot_of = {}
    ends = []
    killed = False
    while len(ends) < 4:
        try:
            msg = ch.recv(timeout=60)
        except lf.PeerGoneError as e:
            ends.append(e.producer)
            continue
        ident, i = payload(msg)
        assert slot_of.setdefault(ident, msg.producer) == msg.producer
        got[ident].append(i)
        msg.release()
        if ident == 3 and len(got[3]) == 50 and not killed:
            victim.proc.kill()  # SIGKILL, mid-stream: its ring is full, it may be in a send
            victim.proc.wait()
            killed = True
    assert killed
    # The others finished; every one of their messages came, in order.
    for ident in range(3):
        assert got[ident] == list(range(count))
    for p in others:
        p.wait()
    # The killed one's messages up to its death came in order, and its end named its slot.
    assert got[3] == list(range(len(got[3]))) and len(got[3]) >= 50
    # (A producer that finished early frees its slot, which a later one may take.)
    assert sorted(ends) == sorted(slot_of.values())
    assert all(p.state == "free" for p in ch.peers())


# A producer of a full fan-in: prints the refusal.
REFUSED = """
import lava_flow as lf
try:
    lf.producer(lf.Context(gpu="disabled"), NAME, kind="fan_in", max_peers=2, rendezvous_timeout=60)
except lf.InvalidStateError as e:
    print(e.message)
else:
    raise SystemExit("a third producer attached to a fan-in of max_peers=2")
"""


def test_full_fan_in_is_refused(name, peer, tmp_path):
    ctx = lf.Context(gpu="disabled")
    hold = tmp_path / "close"
    first = [peer(PRODUCER, name, ident, 1, hold, 2) for ident in range(2)]
    ch = fan_in_consumer(ctx, name, 2)
    for _ in range(2):
        ch.recv(timeout=60).release()
    assert [p.state for p in ch.peers()] == ["alive", "alive"]
    # The consumer answers a producer's hello while it waits in a receive.
    third = peer(REFUSED, name)
    deadline = time.monotonic() + 60
    while third.proc.poll() is None:
        assert time.monotonic() < deadline, "the third producer got no answer"
        with pytest.raises(lf.TimeoutError):
            ch.recv(timeout=0.05)
    refusal = third.wait()
    assert "is full" in refusal and "max_peers = 2" in refusal, refusal
    # The two attached are untouched, and each end is reported.
    assert [p.state for p in ch.peers()] == ["alive", "alive"]
    hold.touch()
    ends = set()
    for _ in range(2):
        with pytest.raises(lf.PeerGoneError) as gone:
            ch.recv(timeout=60)
        ends.add(gone.value.producer)
    assert ends == {0, 1}
    for p in first:
        p.wait()


@pytest.mark.parametrize("config, status, words", [
    (dict(kind="fan_in", max_peers=0), lf.Status.ERR_INVALID_ARGUMENT, "max_peers 0 must be from 1 to 64"),
    (dict(kind="fan_in", max_peers=65), lf.Status.ERR_INVALID_ARGUMENT, "max_peers 65 must be from 1 to 64"),
    (dict(kind="fan_in", slow_consumer_timeout=1.0), lf.Status.ERR_INVALID_ARGUMENT,
     "slow_consumer_timeout is a fan-out setting"),
    (dict(kind="pair", slow_consumer_timeout=1.0), lf.Status.ERR_INVALID_ARGUMENT,
     "slow_consumer_timeout is a fan-out setting"),
    (dict(kind="fan-in"), lf.Status.ERR_INVALID_ARGUMENT, '"fan_in"'),
    (dict(kind=7), lf.Status.ERR_INVALID_ARGUMENT, "kind"),
])
@pytest.mark.parametrize("role", ["producer", "consumer"])
def test_bad_options_are_refused_with_the_library_message(name, role, config, status, words):
    ctx = lf.Context(gpu="disabled")
    start = time.monotonic()
    with pytest.raises(lf.LavaFlowError) as e:
        lf.Channel(ctx, name, role, rendezvous_timeout=5, **config)
    assert e.value.status == status and words in e.value.message, e.value.message
    assert time.monotonic() - start < 4, "refused only after waiting for a peer"


def test_pair_channel_fields(name, peer):
    # A pair's messages come from slot 0, its one producer is its one peer, and its end names
    # no slot.
    ctx = lf.Context(gpu="disabled")
    p = peer("""
import lava_flow as lf
ch = lf.producer(lf.Context(gpu="disabled"), NAME, rendezvous_timeout=60)
ch.send(b"x")
ch.wait_completed(0, timeout=60)
""", name)
    ch = lf.consumer(ctx, name, rendezvous_timeout=60)
    assert ch.kind == lf.ChannelKind.PAIR
    with ch.recv(timeout=60) as msg:
        assert msg.producer == 0
        (only,) = ch.peers()
        assert only.slot == 0 and only.pid == p.proc.pid and only.route == "shm"
    with pytest.raises(lf.PeerGoneError) as e:
        ch.recv(timeout=60)
    assert e.value.producer is None
    p.wait()
    assert repr(only).startswith("<lava_flow.Peer slot 0 ")
