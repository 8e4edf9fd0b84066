"""MPI: two ranks under mpirun that lava-flow sees on two hosts (LF_HOST_ID) join through a
communicator's Fortran handle, as mpi4py's `comm.py2f()` gives it, find each other by name and
exchange numpy arrays through a channel that takes the MPI transport."""
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


def test_mpi_two_ranks_on_two_hosts(tmp_path):
    if "LAVA_FLOW_FEATURE_MPI 1" not in (Path(lf.get_include()) / "lava_flow_features.h").read_text():
        pytest.skip("this library was built without MPI (LAVA_FLOW_FEATURES=mpi builds it with)")
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    cmd = ["mpirun", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
    for i, host in enumerate("ab"):
        cmd += ([":"] if i else []) + ["-np", "1", "-x", f"LF_HOST_ID={host}", "-x", "PYTHONPATH",
                                        sys.executable, str(script)]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0: ok" in out.stdout and "rank 1: ok" in out.stdout, out.stdout + out.stderr
