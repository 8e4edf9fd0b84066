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


def test_torch_pool_example():
    # PyTorch tensors in lava-flow memory, to a consumer process and back: the GPU host only.
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import lava_flow as lf
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if not found or (int(found[1]), int(found[2])) < lf.torch.MIN_TORCH:
        pytest.skip(f"lava_flow.torch needs PyTorch 2.8 or newer; this is {torch.__version__}")
    out = subprocess.run([sys.executable, str(EXAMPLES / "torch_pool.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^batch 0 is 4194304 bytes at offset \d+ of <lava_flow.Buffer \d+ bytes, GPU_DEVICE_LOCAL>$",
                     out.stdout, re.M), out.stdout
    for i in range(3):
        assert f"batch {i}: GPU message True, sum {i << 20}" in out.stdout, out.stdout
    assert "after the consumer: [0.0, 2.0, 4.0]" in out.stdout, out.stdout
