#!/usr/bin/env python3
"""Checks that the workspace's rust-version (Cargo.toml) is true for what its crates need to
build: no dependency of the core, the C library or the tools (normal and build dependencies,
every feature) declares a newer rust-version. (Clippy's incompatible_msrv lint, run by the test command, checks lava-flow's
own use of the standard library against it.) Exits non-zero, naming each offender."""
import json
import subprocess
import sys


def version(text):
    return tuple(int(p) for p in text.split("."))


def main():
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
        check=True, capture_output=True, text=True).stdout)
    members = meta["workspace_members"]
    packages = {p["id"]: p for p in meta["packages"]}
    versions = {packages[m].get("rust_version") for m in members}
    if None in versions or len(versions) != 1:
        sys.exit(f"every workspace member must take rust-version from the workspace (found {versions})")
    ours = versions.pop()
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    # Walk the dependencies the crates build with (the libraries and the tools): normal and
    # build edges only.
    seen, todo = set(members), list(members)
    while todo:
        node = nodes[todo.pop()]
        for dep in node["deps"]:
            if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    newer = sorted(
        (packages[d]["rust_version"], packages[d]["name"], packages[d]["version"])
        for d in seen
        if packages[d].get("rust_version") and version(packages[d]["rust_version"]) > version(ours))
    if newer:
        for rv, name, ver in newer:
            print(f"{name} {ver} needs Rust {rv}, but Cargo.toml says rust-version = \"{ours}\"", file=sys.stderr)
        sys.exit("raise rust-version in Cargo.toml (or pin older dependencies)")
    print(f"rust-version {ours}: every dependency of the crates builds with it ({len(seen) - len(members)} checked)")


main()
