"""Shared helpers: unique channel names, and peers run as separate processes."""
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

# lava-flow's channels put their sockets in the runtime directory.
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")


@pytest.fixture
def name():
    """A channel name no other test uses."""
    return "py-" + uuid.uuid4().hex[:16]


class Peer:
    """Another Python process running `code` (with `NAME` set to the channel name)."""

    def __init__(self, code, name, *args):
        src = "import sys\nNAME = sys.argv[1]\nARGS = sys.argv[2:]\n" + textwrap.dedent(code)
        self.proc = subprocess.Popen([sys.executable, "-c", src, name, *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait(self, timeout=60):
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"peer failed ({self.proc.returncode}):\n{out}\n{err}"
        return out


@pytest.fixture
def peer():
    """Starts peers; each must exit 0 (checked by the test through wait())."""
    peers = []

    def start(code, name, *args):
        p = Peer(code, name, *args)
        peers.append(p)
        return p

    yield start
    for p in peers:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
