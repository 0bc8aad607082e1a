#!/usr/bin/env python3
"""Checks docs/DEVELOPMENT.md's crate tree against `cargo metadata`.

DEVELOPMENT.md keeps the workspace's dependency edges in a fenced block that follows the
marker ``<!-- check_crate_tree: edges -->``, one line per crate::

    sluice-load -> sluice-engine, sluice-formats, sluice-remote
    sluice-formats -> (none)

and a table whose first column names every crate (`` `sluice-load` ``). This script reads the
normal dependencies between workspace crates from
``cargo metadata --format-version 1 --no-deps`` (dev-dependencies are left out: they never
reach a build users run; build-dependencies count as normal), and fails, naming each one, on
an edge the document lacks or one it has that Cargo does not, and on a workspace crate missing
from the edge list or the table.

It also checks two rules of the tree's shape (docs/design/structure.md):
- fault-injecting doubles live behind each crate's ``testing`` feature, which only
  dev-dependencies enable: a normal dependency that turns it on would ship them in the wheel and
  the binary;
- no file under ``crates/*/src`` holds more than ``--max-lines`` lines (800) before its
  ``#[cfg(test)]`` tests: a larger one is split into a module folder.

Standard library only; run by ``make lint``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

MARKER = "<!-- check_crate_tree: edges -->"
NONE = "(none)"
TABLE_ROW = re.compile(r"^\|\s*`(sluice-[a-z0-9-]+)`\s*\|")

Edges = dict[str, set[str]]


def cargo_metadata(cargo: str, manifest_dir: Path) -> dict:
    out = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=manifest_dir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def testing_in_builds(meta: dict) -> list[str]:
    """Normal or build dependencies that enable a crate's ``testing`` feature."""
    found = []
    for p in meta["packages"]:
        for d in p["dependencies"]:
            if d.get("kind") != "dev" and "testing" in d.get("features", []):
                found.append(
                    f"{p['name']} -> {d['name']} enables 'testing' outside dev-dependencies"
                )
    return found


def long_files(root: Path, max_lines: int) -> list[str]:
    """Source files over ``max_lines`` lines before their ``#[cfg(test)]`` tests."""
    found = []
    for f in sorted(root.glob("crates/*/src/**/*.rs")):
        lines = f.read_text(encoding="utf-8").splitlines()
        body = next((i for i, line in enumerate(lines) if line.startswith("#[cfg(test)]")), None)
        n = len(lines) if body is None else body
        if n > max_lines:
            found.append(f"{f.relative_to(root)}: {n} lines before its tests (at most {max_lines})")
    return found


def cargo_edges(meta: dict) -> Edges:
    """Each workspace crate -> the workspace crates it depends on (normal and build kinds)."""
    members = set(meta["workspace_members"])
    packages = [p for p in meta["packages"] if p["id"] in members]
    names = {p["name"] for p in packages}
    return {
        p["name"]: {
            d["name"] for d in p["dependencies"] if d["name"] in names and d.get("kind") != "dev"
        }
        for p in packages
    }


def documented_edges(text: str, doc: Path) -> Edges:
    """The edge block after MARKER: `crate -> dep, dep` or `crate -> (none)` per line."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == MARKER)
    except StopIteration:
        raise SystemExit(f"{doc}: no line {MARKER!r} before the edge block") from None
    fence = start + 1
    if fence >= len(lines) or not lines[fence].startswith("```"):
        raise SystemExit(f"{doc}:{fence + 1}: a fenced block must follow {MARKER!r}")
    edges: Edges = {}
    for number, line in enumerate(lines[fence + 1 :], start=fence + 2):
        if line.startswith("```"):
            return edges
        if not line.strip():
            continue
        crate, arrow, deps = line.partition("->")
        crate = crate.strip()
        if not arrow or not crate:
            raise SystemExit(f"{doc}:{number}: expected 'crate -> deps', got {line!r}")
        if crate in edges:
            raise SystemExit(f"{doc}:{number}: {crate} is listed twice")
        deps = deps.strip()
        edges[crate] = set() if deps == NONE else {d.strip() for d in deps.split(",")}
        if "" in edges[crate]:
            raise SystemExit(f"{doc}:{number}: an empty name in {line!r}")
    raise SystemExit(f"{doc}: the edge block after {MARKER!r} is not closed")


def table_crates(text: str) -> set[str]:
    """Crates named in the first column of a Markdown table row."""
    return {m.group(1) for line in text.splitlines() if (m := TABLE_ROW.match(line))}


def problems(actual: Edges, documented: Edges, tabled: set[str]) -> list[str]:
    """Every difference between Cargo's graph and the document, one line each."""
    found = []
    for crate in sorted(actual.keys() - documented.keys()):
        found.append(f"crate {crate} is missing from the edge list")
    for crate in sorted(documented.keys() - actual.keys()):
        found.append(f"crate {crate} is in the edge list but not in the workspace")
    for crate in sorted(actual.keys() & documented.keys()):
        for dep in sorted(actual[crate] - documented[crate]):
            found.append(f"missing edge: {crate} -> {dep} (Cargo.toml has it)")
        for dep in sorted(documented[crate] - actual[crate]):
            found.append(f"extra edge: {crate} -> {dep} (no such normal dependency)")
    for crate in sorted(actual.keys() - tabled):
        found.append(f"crate {crate} is missing from the crate table")
    for crate in sorted(tabled - actual.keys()):
        found.append(f"crate {crate} is in the crate table but not in the workspace")
    return found


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=root / "docs" / "DEVELOPMENT.md")
    parser.add_argument("--workspace", type=Path, default=root)
    parser.add_argument("--cargo", default=os.environ.get("CARGO", "cargo"))
    parser.add_argument("--max-lines", type=int, default=800)
    args = parser.parse_args(argv)
    text = args.doc.read_text(encoding="utf-8")
    meta = cargo_metadata(args.cargo, args.workspace)
    shape = testing_in_builds(meta) + long_files(args.workspace, args.max_lines)
    if shape:
        print("the tree breaks its shape rules (docs/design/structure.md):", file=sys.stderr)
        for line in shape:
            print(f"  {line}", file=sys.stderr)
        return 1
    actual = cargo_edges(meta)
    found = problems(actual, documented_edges(text, args.doc), table_crates(text))
    if found:
        print(f"{args.doc}: the crate tree disagrees with cargo metadata:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        print(
            "Update the edge list and the crate table to match the Cargo.toml files.",
            file=sys.stderr,
        )
        return 1
    edges = sum(len(deps) for deps in actual.values())
    print(f"crate tree: {len(actual)} crates and {edges} edges match cargo metadata")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
