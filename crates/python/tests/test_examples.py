"""The Python examples run as a user runs them."""
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples-python"


def test_data_loader_example():
    out = subprocess.run([sys.executable, str(EXAMPLES / "data_loader.py"), "--batches", "200"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trained on 200 batches" in out.stdout
