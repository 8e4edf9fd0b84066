#!/usr/bin/env python3
"""Checks that every code block of README.md marked `<!-- PATH -->` on the line before it
equals the file PATH, so that the README's complete examples are the ones the tests build
and run. Exits 1, naming each block that differs."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = (root / "README.md").read_text()
blocks = re.findall(r"^<!-- (\S+) -->\n```\w*\n(.*?)^```$", readme, flags=re.M | re.S)
bad = [path for path, text in blocks if not (root / path).is_file() or (root / path).read_text() != text]
for path in bad:
    print(f"README.md: the copy of {path} differs from the file (or it is missing): paste the file again",
          file=sys.stderr)
if not blocks:
    print("README.md: no marked code blocks found", file=sys.stderr)
    sys.exit(1)
print(f"README.md: {len(blocks) - len(bad)} of {len(blocks)} marked code blocks equal their files")
sys.exit(1 if bad else 0)
