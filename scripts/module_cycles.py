#!/usr/bin/env python3
"""Finds import cycles between the modules of each Rust crate under crates/.

A crate's modules are its top-level modules: `src/foo.rs`, `src/foo/mod.rs` and every file
under `src/foo/` are module `foo`. Module A depends on module B when a file of A names
`crate::B` (in a `use`, grouped `use crate::{B, ..}`, or an inline path), or names a type
that `lib.rs`/`main.rs` re-exports from B (`pub use B::Name`). Comments are ignored. A
cycle is a strongly connected set of two or more modules.

    scripts/module_cycles.py                      # every crate; exit 1 if any has a cycle
    scripts/module_cycles.py --crate sluice-kv    # only that crate
    scripts/module_cycles.py --allow sluice-x     # its cycles warn only (repeatable)

Every crate must be acyclic (`make lint` runs this with no `--allow`); `--allow` is for
looking at a crate mid-restructure.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOTS = ("lib.rs", "main.rs")
# `crate::name` not preceded by an identifier character (so `sluice_crate::x` is not it).
PATH = re.compile(r"(?<![A-Za-z0-9_])crate::([A-Za-z_][A-Za-z0-9_]*)")
GROUP = re.compile(r"(?<![A-Za-z0-9_])crate::\{")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ROOT_REEXPORT = re.compile(rf"pub\s+use\s+({IDENT})::(\{{[^;]*\}}|{IDENT})\s*;")


def strip_comments(text: str) -> str:
    """The source without `//` line comments and `/* */` blocks (strings are left alone:
    a `crate::` in a string literal is rare enough not to matter)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_of(src: Path, file: Path) -> str | None:
    """The top-level module a file belongs to; None for the crate root."""
    rel = file.relative_to(src)
    if len(rel.parts) == 1:
        return None if rel.name in ROOTS else rel.stem
    return rel.parts[0]


def group_names(text: str, start: int) -> list[str]:
    """The first-level names of a `crate::{a, b::c, d::{e}}` group opening at `start`."""
    depth, name, names = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1:
            if ch == ",":
                names.append(name)
                name = ""
            else:
                name += ch
    names.append(name)
    out = []
    for n in names:
        head = n.strip().split("::", 1)[0].strip()
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", head or ""):
            out.append(head)
    return out


def reexports(src: Path) -> dict[str, str]:
    """Names the crate root re-exports, mapped to the module they come from."""
    out: dict[str, str] = {}
    for root in ROOTS:
        path = src / root
        if not path.exists():
            continue
        for m in ROOT_REEXPORT.finditer(strip_comments(path.read_text())):
            module, names = m.group(1), m.group(2)
            for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", names):
                if name not in ("self", "as"):
                    out.setdefault(name, module)
    return out


def graph(src: Path) -> dict[str, set[str]]:
    files = sorted(src.rglob("*.rs"))
    modules = {m for f in files if (m := module_of(src, f))}
    names = reexports(src)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for f in files:
        here = module_of(src, f)
        if here is None:
            continue
        text = strip_comments(f.read_text())
        targets = [m.group(1) for m in PATH.finditer(text)]
        for g in GROUP.finditer(text):
            targets += group_names(text, g.end() - 1)
        for t in targets:
            t = names.get(t, t)
            if t in modules and t != here:
                edges[here].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def describe(edges: dict[str, set[str]], comp: list[str]) -> str:
    inside = set(comp)
    arrows = [f"{a} -> {b}" for a in comp for b in sorted(edges[a] & inside)]
    return f"{', '.join(comp)} ({'; '.join(arrows)})"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--root", default=Path(__file__).resolve().parents[1], type=Path)
    ap.add_argument("--allow", action="append", default=[], help="a crate whose cycles only warn")
    ap.add_argument("--crate", action="append", default=[], help="check only this crate")
    args = ap.parse_args(argv)
    failed = False
    crates = sorted(p for p in (args.root / "crates").iterdir() if (p / "src").is_dir())
    for crate in crates:
        if args.crate and crate.name not in args.crate:
            continue
        edges = graph(crate / "src")
        found = cycles(edges)
        enforced = crate.name not in args.allow
        for comp in found:
            kind = "error" if enforced else "warning"
            print(f"{kind}: {crate.name}: module cycle: {describe(edges, comp)}")
        if found and enforced:
            failed = True
        elif not found and enforced:
            print(f"{crate.name}: {len(edges)} modules, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
