#!/usr/bin/env python3
"""Checks the documentation: README.md, CHANGELOG.md and the pages of docs/.

- Every code block marked `<!-- PATH -->` on the line before it equals the file PATH, so that
  the complete examples the documentation shows are the ones the tests build and run. The
  README must have such blocks (its examples per language).
- Every relative link (`[text](target)`) resolves to a file or folder of the repository.

Exits 1, naming each block that differs and each link that leads nowhere."""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pages = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]
failed = False
checked = 0
readme_blocks = 0
links = 0
for page in pages:
    name = page.relative_to(root)
    if not page.is_file():
        print(f"{name} is missing: the README links to it", file=sys.stderr)
        failed = True
        continue
    text = page.read_text()
    blocks = re.findall(r"^<!-- (\S+) -->\n```\w*\n(.*?)^```$", text, flags=re.M | re.S)
    for path, block in blocks:
        if not (root / path).is_file() or (root / path).read_text() != block:
            print(f"{name}: the copy of {path} differs from the file (or it is missing): paste the file again",
                  file=sys.stderr)
            failed = True
    checked += len(blocks)
    if page.name == "README.md" and page.parent == root:
        readme_blocks = len(blocks)
    # Links outside code: fenced blocks and inline code spans hold no links.
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the same page
        links += 1
        resolved = (page.parent / target.split("#", 1)[0]).resolve()
        if not resolved.exists():
            print(f"{name}: the link to {target} leads nowhere: fix the path (relative to {name})",
                  file=sys.stderr)
            failed = True
if readme_blocks == 0:
    print("README.md: no marked code blocks found: its examples must be marked with <!-- PATH -->",
          file=sys.stderr)
    failed = True
print(f"{len(pages)} documentation pages: {checked} marked code blocks and {links} relative links checked"
      + ("" if not failed else ", some failed (above)"))
sys.exit(1 if failed else 0)
