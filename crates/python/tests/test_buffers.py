"""Buffers: allocation, zero-copy views by address, lifetimes, errors, export to another process."""
import ctypes
import gc
import socket
from pathlib import Path

import numpy as np
import pytest

import lava_flow as lf


@pytest.fixture(scope="module")
def ctx():
    return lf.Context(gpu="disabled")


def test_library_is_the_packaged_one():
    assert lf.library_path().endswith(lf._native.SONAME)
    assert lf.version() == lf.__version__


def test_numpy_view_is_the_buffer_memory(ctx):
    b = ctx.alloc(1 << 16)
    assert b.location == lf.Memory.CPU_STANDARD and b.origin == lf.Origin.ALLOCATED
    a = np.asarray(b)
    assert a.ctypes.data == b.address and a.nbytes == b.size and a.flags.writeable
    a[:] = np.arange(a.size, dtype=np.uint8)
    assert b.read(8, offset=1) == bytes(range(1, 9))
    b.write(b"\xff\xfe", offset=10)
    assert a[10] == 0xFF and a[11] == 0xFE
    d = np.from_dlpack(b)
    assert d.ctypes.data == b.address
    mv = memoryview(b)
    assert ctypes.addressof(ctypes.c_char.from_buffer(mv)) == b.address


def test_view_outlives_free(ctx):
    b = ctx.alloc(4096)
    a = np.asarray(b)
    a[:] = 7
    b.free()
    assert b.freed
    # The memory stays while the view lives; new views and calls are refused.
    assert int(a.sum()) == 7 * 4096
    with pytest.raises(lf.InvalidStateError) as e:
        memoryview(b)
    assert e.value.status == lf.Status.ERR_INVALID_STATE
    with pytest.raises(lf.InvalidStateError):
        b.read(1)
    del a
    gc.collect()
    with pytest.raises(lf.InvalidStateError):
        b.export()


def test_errors_carry_status_and_message(ctx):
    with pytest.raises(lf.LavaFlowError) as e:
        ctx.alloc(0)
    assert e.value.status == lf.Status.ERR_INVALID_ARGUMENT
    assert e.value.status_name == "LF_ERR_INVALID_ARGUMENT"
    assert "size" in e.value.message and str(e.value) == e.value.message
    with pytest.raises(lf.LavaFlowError) as e:
        ctx.alloc(16, 99)
    assert e.value.status == lf.Status.ERR_INVALID_ARGUMENT
    b = ctx.alloc(16)
    with pytest.raises(ValueError):
        b.write(b"x" * 17)
    with pytest.raises(ValueError):
        lf.Context(gpu="sometimes")


def test_memory_kinds(ctx):
    for kind in (lf.Memory.CPU_STANDARD, lf.Memory.CPU_NUMA, lf.Memory.CPU_GPU_PINNED):
        b = ctx.alloc(1 << 20, kind)
        assert b.size == 1 << 20
        np.asarray(b)[:] = 3
        assert b.read(4) == b"\x03" * 4
    # Huge pages: what the host gives (best effort falls back with a reason).
    b = ctx.alloc(2 << 20, lf.Memory.CPU_HUGEPAGE_2MB, hugepage="best_effort")
    assert b.location in (lf.Memory.CPU_HUGEPAGE_2MB, lf.Memory.CPU_STANDARD)
    if b.location == lf.Memory.CPU_STANDARD:
        assert b.fallback_reason
    # A GPU kind of a context without a GPU: CPU memory that says why.
    g = ctx.alloc(4096, lf.Memory.GPU_DEVICE_LOCAL)
    assert g.location == lf.Memory.CPU_STANDARD and "gpu" in g.fallback_reason.lower()


def test_register_and_copy(ctx):
    user = bytearray(b"registered memory")
    r = ctx.register(user)
    assert r.origin == lf.Origin.REGISTERED and r.address == ctypes.addressof((ctypes.c_char * 1).from_buffer(user))
    dst = ctx.alloc(len(user))
    ctx.copy(dst, r)
    assert dst.read() == bytes(user)
    r.free()
    user.extend(b"!")  # the registration no longer holds the bytearray's buffer


def test_locations(tmp_path):
    here = lf.Location.detect()
    assert here.hostname and here.host_id
    other = lf.Location("another-host-xyz", node_id=1)
    assert here.scope(here) == "local" and here.scope(other) == "remote"
    assert other.node_id == 1 and other.device_id is None
    cfg = tmp_path / "p.json"
    cfg.write_text('{"processes": [{"name": "loader", "hostname": "h1", "node_id": 0}]}')
    assert lf.Location.from_config(cfg, "loader").hostname == "h1"
    with pytest.raises(lf.LavaFlowError) as e:
        lf.Location.from_config(cfg, "trainer")
    assert e.value.status == lf.Status.ERR_NOT_FOUND


EXPORT_PEER = """
import socket, lava_flow as lf
s = socket.socket(fileno=int(ARGS[0]))
ctx = lf.Context(gpu="disabled")
b = ctx.import_export(lf.Export.recv(s))
assert b.origin == lf.Origin.IMPORTED
data = bytes(memoryview(b))
memoryview(b)[:5] = b"hello"
s.send(data[:16])
s.recv(1)
"""


def test_export_import_between_processes(ctx, name, peer):
    import subprocess
    import sys
    a, bsock = socket.socketpair()
    buf = ctx.alloc(4096)
    np.asarray(buf)[:] = np.arange(4096, dtype=np.uint8)
    e = buf.export()
    assert e.size == 4096 and e.fd >= 0
    src = "import sys\nARGS = sys.argv[1:]\n" + EXPORT_PEER
    p = subprocess.Popen([sys.executable, "-c", src, str(bsock.fileno())], pass_fds=[bsock.fileno()])
    e.send(a)
    e.close()
    assert a.recv(16) == bytes(range(16))
    # The peer wrote into the same memory.
    assert buf.read(5) == b"hello"
    a.send(b"x")
    assert p.wait(timeout=60) == 0


class FakeComm:
    """Stands for an mpi4py communicator: lava_flow takes its Fortran handle (py2f)."""

    def __init__(self):
        self.asked = False

    def py2f(self):
        self.asked = True
        return 0


def test_mpi_without_the_mpi_feature():
    if "LAVA_FLOW_FEATURE_MPI 1" in (Path(lf.get_include()) / "lava_flow_features.h").read_text():
        pytest.skip("this library has MPI: test_mpi.py runs it under mpirun")
    comm = FakeComm()
    with pytest.raises(lf.LavaFlowError) as e:
        lf.Mpi(comm, "rank0")
    assert comm.asked and e.value.status == lf.Status.ERR_UNSUPPORTED
