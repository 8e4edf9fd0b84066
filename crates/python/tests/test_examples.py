"""The Python examples run as a user runs them."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples-python"


@pytest.mark.parametrize("loaders", [None, 2])
def test_data_loader_example(loaders):
    # Loader processes feeding one trainer through one fan-in channel (4 of them by default).
    args = ["--batches", "200"] + ([] if loaders is None else ["--loaders", str(loaders)])
    out = subprocess.run([sys.executable, str(EXAMPLES / "data_loader.py"), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    n = loaders or 4
    assert f"trained on 200 batches from {n} loaders, in order" in out.stdout, out.stdout
    # Every loader's end was reported, each for the slot its batches came through.
    sent = re.findall(r"^loader (\d+) sent through slot (\d+), up to batch (\d+)$", out.stdout, re.M)
    assert sorted(int(loader) for loader, _, _ in sent) == list(range(n)), out.stdout
    assert all(int(last) % n == int(loader) and 200 - n <= int(last) < 200 for loader, _, last in sent)
