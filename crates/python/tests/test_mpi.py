"""MPI: ranks under mpirun that lava-flow sees on two hosts (LF_HOST_ID) join through a
communicator's Fortran handle, as mpi4py's `comm.py2f()` gives it. Two ranks find each other by
name and exchange numpy arrays through a channel that takes the MPI transport; four ranks make a
fan-in whose producers come over shared memory (same host) and MPI (the other host)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lava_flow as lf

RANK = """
import os, sys
import numpy as np
import lava_flow as lf

class World:
    # What mpi4py's MPI.COMM_WORLD gives lava_flow: py2f(), the Fortran handle (0 in Open MPI).
    def py2f(self):
        return 0

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
mpi = lf.Mpi(World(), f"rank{rank}")
assert (mpi.size, mpi.rank) == (2, rank), (mpi.size, mpi.rank)
peer = mpi.rank_of(f"rank{1 - rank}")
assert peer == 1 - rank and mpi.process_name(peer) == f"rank{peer}"
here, there = lf.Location.detect(), mpi.location(peer)
assert here.scope(there) == "remote", here.scope(there)
ctx = lf.Context(gpu="disabled")
ch = lf.Channel(ctx, "py-mpi", "producer" if rank == 0 else "consumer",
                my_location=here, peer_location=there, rendezvous_timeout=60)
assert ch.transport == "mpi", ch.transport
if rank == 0:
    for i in range(20):
        ch.send(np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64))
    ch.wait_completed(19, timeout=60)
else:
    for i in range(20):
        with ch.recv(timeout=60) as m:
            assert np.array_equal(np.frombuffer(m, dtype=np.int64), np.arange(i * 1000, (i + 1) * 1000))
ch.close()
del mpi
print(f"rank {rank}: ok")
"""


def mpirun(tmp_path, code, hosts, *args):
    """Runs `code` as one rank per entry of `hosts` (its LF_HOST_ID) under mpirun; returns the
    ranks' output. Skips where the library lacks MPI or there is no mpirun."""
    if "LAVA_FLOW_FEATURE_MPI 1" not in (Path(lf.get_include()) / "lava_flow_features.h").read_text():
        pytest.skip("this library was built without MPI (LAVA_FLOW_FEATURES=mpi builds it with)")
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    script = tmp_path / "rank.py"
    script.write_text(code)
    passed = ["PYTHONPATH"] + [v for v in ("LF_RUNTIME_DIR", "XDG_RUNTIME_DIR", "LAVA_FLOW_LIBRARY")
                               if v in os.environ]
    cmd = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
    for i, host in enumerate(hosts):
        cmd += ([":"] if i else []) + ["-np", "1", "-x", f"LF_HOST_ID={host}"]
        cmd += [arg for v in passed for arg in ("-x", v)] + [sys.executable, str(script), *map(str, args)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_mpi_two_ranks_on_two_hosts(tmp_path):
    out = mpirun(tmp_path, RANK, "ab")
    assert "rank 0: ok" in out and "rank 1: ok" in out, out


# ARGS: the channel's name, a directory for flags. Rank 0 (host a) is the consumer of a fan-in;
# rank 1 (host a) a producer over shared memory; ranks 2 and 3 (host b) producers over MPI.
# Rank 3 closes early, once the consumer had messages of all three; the others wait halfway until
# its end was reported, then go on.
FAN_IN_RANK = """
import os, pathlib, sys, time
import numpy as np
import lava_flow as lf

class World:
    def py2f(self):
        return 0

NAME, FLAGS = sys.argv[1], pathlib.Path(sys.argv[2])
COUNT, EARLY = 3000, 500
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
mpi = lf.Mpi(World(), f"rank{rank}")
assert (mpi.size, mpi.rank) == (4, rank), (mpi.size, mpi.rank)
mine = mpi.location(rank)

def length_of(seq):
    # Mostly small, some past a ring slot's inline bytes, one past an MPI chunk.
    return (1 << 20) + 4321 if seq == 1234 else 20000 if seq % 100 == 99 else 16 + (seq * 7) % 300

def message(r, seq):
    body = ((np.arange(length_of(seq), dtype=np.uint64) + r * 31 + seq) % 251).astype(np.uint8)
    body[:16] = np.array([r, seq], dtype=np.uint64).view(np.uint8)
    return body

def wait_for(flag, what):
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert time.monotonic() < deadline, f"{what} did not come"
        time.sleep(0.01)

ctx = lf.Context(gpu="disabled")
config = dict(kind="fan_in", max_peers=4, capacity=64, rendezvous_timeout=60)
if rank == 0:
    # The first producer is expected on this host; the others come over either carrier.
    ch = lf.Channel(ctx, NAME, "consumer", my_location=mine, peer_location=mpi.location(1), **config)
    assert "takes producers over shm and mpi" in ch.transport_reason, ch.transport_reason
    rank_of_slot, next_seq, ended, after_early_end, all_seen = {}, {}, [], 0, False
    while len(ended) < 3:
        try:
            msg = ch.recv(timeout=60)
        except lf.PeerGoneError as e:
            slot = e.producer
            assert f"slot {slot}" in e.message, e.message
            r = rank_of_slot.pop(slot)
            assert next_seq[r] == (EARLY if r == 3 else COUNT), f"rank {r}'s end before its last message"
            assert r != 3 or not ended, "rank 3 ends first"
            ended.append(r)
            assert ch.peers()[slot].state == "free"
            if r == 3:
                (FLAGS / "early-gone").touch()
            continue
        with msg:
            # A copy: a view would hold the message (and its producer's wait for it) past the block.
            data = np.frombuffer(msg, dtype=np.uint8).copy()
            r, seq = (int(v) for v in data[:16].view(np.uint64))
            assert (seq, msg.sequence, len(data)) == (next_seq.get(r, 0), seq, length_of(seq)), (r, seq)
            assert np.array_equal(data, message(r, seq)), f"rank {r}'s message {seq}: its bytes"
        next_seq[r] = seq + 1
        if 3 in ended:
            after_early_end += 1
        if msg.producer not in rank_of_slot:
            rank_of_slot[msg.producer] = r
            peer = ch.peers()[msg.producer]
            assert peer.state == "alive", peer
            if r == 1:
                assert (peer.route, peer.rank, peer.host) == ("shm", None, mine.hostname), peer
                assert peer.pid != 0, peer
            else:
                assert (peer.route, peer.rank, peer.pid) == ("mpi", r, 0), peer
                assert peer.host == mpi.location(r).hostname, peer
        assert rank_of_slot[msg.producer] == r, f"slot {msg.producer} carries two ranks' messages"
        if not all_seen and len(rank_of_slot) == 3:
            all_seen = True
            peers = ch.peers()
            assert sorted(p.route or "" for p in peers) == ["", "mpi", "mpi", "shm"], peers
            assert [p.state for p in peers].count("free") == 1, peers
            (FLAGS / "all-seen").touch()
    assert all_seen and ended[0] == 3 and sorted(ended) == [1, 2, 3], ended
    assert after_early_end >= COUNT, "the other producers go on after one ended"
    assert all(p.state == "free" for p in ch.peers()), ch.peers()
else:
    ch = lf.Channel(ctx, NAME, "producer", my_location=mine, peer_location=mpi.location(0), **config)
    assert ch.transport == ("shm" if rank == 1 else "mpi"), (ch.transport, ch.transport_reason)
    for seq in range(EARLY if rank == 3 else COUNT):
        if seq == COUNT // 2:
            wait_for(FLAGS / "early-gone", "rank 3's end")
        assert ch.send(message(rank, seq), timeout=60) == seq
    if rank == 3:
        wait_for(FLAGS / "all-seen", "messages of all three producers")
    ch.wait_completed(seq, timeout=60)
ch.close()
del mpi
print(f"rank {rank}: ok", flush=True)
"""


def test_mpi_fan_in_over_shm_and_mpi(tmp_path, name):
    out = mpirun(tmp_path, FAN_IN_RANK, "aabb", name, tmp_path)
    assert all(f"rank {r}: ok" in out for r in range(4)), out
