#!/usr/bin/env python3
"""No import cycles between sibling modules: the layering check of the core crate (src/) and of
the C API (crates/c-api/src).

Rust lets the modules of one folder name each other freely; this check keeps each folder's
modules a layered graph, so that each can be read, tested and changed knowing only those below.

What counts as a reference: every path in code, outside comments and string literals, that
starts with `crate::`, `super::` or `self::`, whether in a `use` item (grouped imports such as
`use super::{a, b::c}` are expanded) or written inline (`super::device::vk_err(..)`,
`crate::logging::log_first!`). Items under `#[cfg(test)]` are left out: a test may drive the code
it tests through the layers above it. Intra-doc links are comments and are left out too.

What counts as an edge: a reference from a file's module A to a path that resolves to module T
(following the `pub use` re-exports of the modules on the way, so `crate::memory::Context`
resolves to `crate::memory::context`, where `Context` is defined; a module alias such as the
platform layer's `use linux as platform;` stands for every module it names under its cfgs, so
`crate::os::poller` resolves to `os::linux::poller` and `os::macos::poller` alike). Let P be the
longest common prefix of A and T. When A and T both go below P, through children `a` != `b` of P, that is the
edge `a -> b` between the siblings `a` and `b` of P (so `memory::gpu::arena` naming
`memory::export::process_token` is the edge `gpu -> export` inside `memory`). A module naming
its own submodules (T below A), or a module naming its ancestors' own items (T above A), is the
ordinary shape of a Rust module tree and no edge.

What counts as a cycle: sibling modules of one parent that reach each other through such edges,
directly or transitively (a strongly connected component of more than one module). Each cycle is
printed with the files and lines of its edges; the exit status is 1 if there is any.

`--edges MODULE` (e.g. `--edges lava_flow::memory`) prints the edges among MODULE's children
instead, one `a -> b` per line: the layering to document.

A second rule keeps the channel layer's interfaces neutral: the files of `INTERFACES` (the
transport traits, the channel core, the route table, the bindings' access) name no transport
implementation in their code (comments, strings and `#[cfg(test)]` items aside): no `shm`,
`mpi`, `vulkan_ipc`, `loopback` or `rendezvous`, and no type named after one (`ShmProducer`).
`channels::transports` is the one module that names them.
"""

from __future__ import annotations

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CRATES = [("lava-flow", "src"), ("lava-flow-c-api", "crates/c-api/src")]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
KEYWORDS_START = ("crate", "super", "self")

def strip(text: str) -> str:
    """The source with comments, string and char literals blanked (newlines kept, so lines
    still count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            m = re.match(r"'(\\(u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_cfg_test(code: str) -> str:
    """Blanks every item under `#[cfg(test)]` (the attribute through the end of its item)."""
    out = list(code)
    for m in re.finditer(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code):
        i = m.end()
        depth = 0
        while i < len(code):
            ch = code[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            elif ch == ";" and depth == 0:
                i += 1
                break
            i += 1
        for k in range(m.start(), i):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


def expand_use(tree: str) -> list[tuple[str, str | None]]:
    """`a::{b, c::{d, e}, self}` -> [("a::b", "b"), ("a::c::d", "d"), ("a::c::e", "e"),
    ("a", "a")]: each imported path with the name it is bound to (None for globs). Aliases
    (`e as f`) are parse_use_tree's."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s: str) -> list[str]:
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix: str, s: str) -> list[tuple[str, str | None]]:
        brace = s.find("{")
        if brace >= 0 and s.endswith("}"):
            head = s[:brace].rstrip(":")
            base = f"{prefix}::{head}" if prefix and head else (prefix or head)
            res = []
            for part in split_top(s[brace + 1 : -1]):
                res.extend(walk(base, part))
            return res
        path = s
        full = f"{prefix}::{path}" if prefix else path
        if full.endswith("::self"):
            full = full[: -len("::self")]
        if full.endswith("*"):
            return [(full[:-3] if full.endswith("::*") else full, None)]
        name = full.split("::")[-1]
        return [(full, name)]

    return walk("", tree)


def parse_use_tree(tree: str) -> list[tuple[str, str | None]]:
    """Like expand_use, with `as` aliases handled (spaces are significant for them)."""
    aliases = {}

    def repl(m: re.Match) -> str:
        key = f"__alias{len(aliases)}__"
        aliases[key] = m.group(2)
        return m.group(1) + key

    tree = re.sub(rf"((?:{IDENT}::)*{IDENT})\s+as\s+({IDENT})", lambda m: repl(m), tree)
    res = []
    for path, name in expand_use(tree):
        m = re.search(r"__alias(\d+)__$", path)
        if m:
            key = m.group(0)
            path = path[: -len(key)]
            name = aliases[key]
        res.append((path, name))
    return res


class Crate:
    def __init__(self, name: str, src: str):
        self.name = name
        self.src = src
        self.files: dict[tuple[str, ...], str] = {}  # module path -> file
        self.children: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self.code: dict[tuple[str, ...], str] = {}
        for dirpath, _, names in os.walk(os.path.join(ROOT, src)):
            for fname in names:
                if not fname.endswith(".rs"):
                    continue
                full = os.path.join(dirpath, fname)
                rel = os.path.relpath(full, os.path.join(ROOT, src))
                parts = rel[:-3].split(os.sep)
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                module = tuple(parts)
                self.files[module] = os.path.relpath(full, ROOT)
                for k in range(len(module)):
                    self.children[module[:k]].add(module[k])
        for module, file in self.files.items():
            with open(os.path.join(ROOT, file), encoding="utf-8") as f:
                self.code[module] = blank_cfg_test(strip(f.read()))
        # Module aliases (`use linux as platform;`), each cfg'd alternative kept: a name may
        # stand for several modules, one per platform.
        self.aliases: dict[tuple[str, ...], dict[str, list[tuple[str, ...]]]] = defaultdict(lambda: defaultdict(list))
        for module, code in self.code.items():
            for m in re.finditer(r"(?<![\w:])use\s+([^;{}]+?)\s+as\s+(" + IDENT + r")\s*;", code):
                for target in self.absolutes(module, m.group(1).replace(" ", "").split("::")):
                    if target in self.files and target not in self.aliases[module][m.group(2)]:
                        self.aliases[module][m.group(2)].append(target)
        self.reexports: dict[tuple[str, ...], dict[str, list[tuple[str, ...]]]] = defaultdict(lambda: defaultdict(list))
        for module, code in self.code.items():
            for m in re.finditer(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]+);", code):
                for path, name in parse_use_tree(m.group(1)):
                    if name is None:
                        continue
                    for target in self.absolutes(module, path.split("::")):
                        if target not in self.reexports[module][name]:
                            self.reexports[module][name].append(target)

    def absolute(self, module: tuple[str, ...], parts: list[str]) -> tuple[str, ...] | None:
        """The absolute path of `parts` written in `module`, or None when it leaves the crate
        (std, other crates)."""
        if not parts or not parts[0]:
            return None
        head = parts[0]
        if head == "crate":
            return tuple(parts[1:])
        if head in ("super", "self"):
            base = list(module)
            i = 0
            while i < len(parts) and parts[i] in ("super", "self"):
                if parts[i] == "super":
                    if not base:
                        return None
                    base.pop()
                i += 1
            return tuple(base) + tuple(parts[i:])
        if head in self.children.get(module, ()):
            return module + tuple(parts)
        return None

    def absolutes(self, module: tuple[str, ...], parts: list[str]) -> list[tuple[str, ...]]:
        """As `absolute`, with the module aliases of `module` (or of the module a `crate::`,
        `super::` or `self::` path reaches) expanded: every module the path can name."""
        if parts and parts[0] in getattr(self, "aliases", {}).get(module, {}):
            return [target + tuple(parts[1:]) for target in self.aliases[module][parts[0]]]
        base = self.absolute(module, parts)
        if base is None:
            return []
        for k in range(len(base)):
            names = getattr(self, "aliases", {}).get(base[:k], {})
            if base[k] in names and base[k] not in self.children.get(base[:k], ()):
                return [target + base[k + 1 :] for target in names[base[k]]]
        return [base]

    def resolve(self, path: tuple[str, ...], depth: int = 0) -> list[tuple[str, ...]]:
        """The modules that define what `path` names (one per platform where it differs),
        following re-exports."""
        module: tuple[str, ...] = ()
        for i, part in enumerate(path):
            if part in self.children.get(module, ()):
                module = module + (part,)
                continue
            targets = [t for t in self.reexports.get(module, {}).get(part, []) if t != module + (part,)]
            if targets and depth < 16:
                found: list[tuple[str, ...]] = []
                for target in targets:
                    for resolved in self.resolve(target + tuple(path[i + 1 :]), depth + 1):
                        if resolved not in found:
                            found.append(resolved)
                return found
            break
        return [module]

    def references(self):
        """(module, line, text, target module) for every crate-relative path in code."""
        pattern = re.compile(
            rf"\b(?:pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);|\b((?:crate|super|self)(?:\s*::\s*(?:{IDENT}|\{{[^;]*?\}}))+)"
        )
        for module, code in self.code.items():
            for m in pattern.finditer(code):
                line = code.count("\n", 0, m.start()) + 1
                tree = m.group(1) if m.group(1) is not None else m.group(2)
                for path, _ in parse_use_tree(tree):
                    parts = path.split("::")
                    if parts[0] not in KEYWORDS_START and m.group(1) is None:
                        continue
                    for target in self.absolutes(module, parts):
                        for resolved in self.resolve(target):
                            yield module, line, resolved


INTERFACES = [
    "src/channels/mod.rs",
    "src/channels/transport.rs",
    "src/channels/producer.rs",
    "src/channels/consumer.rs",
    "src/channels/routes.rs",
    "src/channels/raw.rs",
]
IMPLEMENTATION = re.compile(r"\b(shm|mpi|vulkan_ipc|loopback|rendezvous)\b|\b(Shm|Mpi|VulkanIpc|Loopback)[A-Za-z0-9_]*")


def implementations_named() -> int:
    """Prints each place where an interface file names an implementation; returns how many."""
    found = 0
    for file in INTERFACES:
        with open(os.path.join(ROOT, file), encoding="utf-8") as f:
            code = blank_cfg_test(strip(f.read()))
        for m in IMPLEMENTATION.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            print(f"{file}:{line}: names the implementation {m.group(0)!r}: {read_line(file, line)}")
            found += 1
    return found


def main() -> int:
    show = None
    if len(sys.argv) == 3 and sys.argv[1] == "--edges":
        show = sys.argv[2]
    elif len(sys.argv) != 1:
        print("usage: check-layers.py [--edges CRATE::MODULE]", file=sys.stderr)
        return 2
    found = 0
    for crate_name, src in CRATES:
        crate = Crate(crate_name, src)
        # (parent, a, b) -> [(file, line)]
        edges: dict[tuple[tuple[str, ...], str, str], list[tuple[str, int]]] = defaultdict(list)
        for module, line, target in crate.references():
            common = 0
            while common < min(len(module), len(target)) and module[common] == target[common]:
                common += 1
            if common < len(module) and common < len(target):
                key = (module[:common], module[common], target[common])
                where = (crate.files[module], line)
                if where not in edges[key]:
                    edges[key].append(where)
        graphs: dict[tuple[str, ...], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for parent, a, b in edges:
            graphs[parent][a].add(b)
        for parent in sorted(graphs):
            where = "::".join((crate_name.replace("-", "_"),) + parent)
            if show is not None:
                if where == show:
                    for a in sorted(graphs[parent]):
                        print(f"{a} -> {', '.join(sorted(graphs[parent][a]))}")
                continue
            for scc in strongly_connected(graphs[parent]):
                if len(scc) < 2:
                    continue
                found += 1
                print(f"cycle among the modules of {where}: {', '.join(sorted(scc))}")
                for a in sorted(scc):
                    for b in sorted(graphs[parent][a] & scc):
                        for file, line in edges[(parent, a, b)]:
                            text = read_line(file, line)
                            print(f"  {a} -> {b}  {file}:{line}: {text}")
                print()
    if show is not None:
        return 0
    named = implementations_named()
    if named:
        print(
            f"{named} place(s) where a channel interface names a transport implementation: move the choice "
            "into channels::transports (see scripts/check-layers.py)",
            file=sys.stderr,
        )
        return 1
    if found:
        print(
            f"{found} import cycle(s) between sibling modules: move what both sides need below them "
            "(see scripts/check-layers.py for the rules)",
            file=sys.stderr,
        )
        return 1
    print("no import cycles between sibling modules; the channel interfaces name no transport")
    return 0


def read_line(file: str, line: int) -> str:
    with open(os.path.join(ROOT, file), encoding="utf-8") as f:
        for i, text in enumerate(f, 1):
            if i == line:
                return text.strip()
    return ""


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[set[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    scc.add(top)
                    if top == node:
                        break
                result.append(scc)
    return result


if __name__ == "__main__":
    sys.exit(main())
