"""A/B of two Sluice builds on the loader benchmark's readers, in one run.

A refactor must not make a loader slower, and the disk of this machine kind varies between runs
by more than the effects we look for. So both builds run here side by side: for every round and
every reader, the baseline and the current build each load the same checkpoint once, in an
order that alternates between rounds, from a dropped (cold) or filled (warm) page cache, with
the VM's free page reporting off. The consumer is `bench_load.py`'s worker (every destination
tensor allocated and touched before the clock starts).

The baseline is a directory holding another build's `sluice` package and its extension, put
first on `PYTHONPATH` for its workers; make one from an older commit with

    git worktree add /tmp/base <commit> && cd /tmp/base && maturin build --release
    python -m zipfile -e target/wheels/sluice-*.whl /tmp/sluice-base

Usage: python benches/ab_load.py --baseline /tmp/sluice-base [--runs 5] [--readers ...]
Prints medians per reader, cache state and build, and the ratio current / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import page_cache
import synth_checkpoint
from bench_load import parse_result

HERE = Path(__file__).resolve().parent
DEFAULT_READERS = "sluice-buffered,sluice-direct,sluice-stream"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="directory with the baseline's sluice/")
    p.add_argument("--data", default="bench-data/ckpt-4g")
    p.add_argument("--size-gib", type=float, default=4)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--readers", default=DEFAULT_READERS)
    p.add_argument("--kinds", default="cold,warm", help="cold, warm or both")
    p.add_argument("--json", help="also write every run here")
    return p.parse_args()


def run_worker(reader: str, index: Path, baseline: Path | None) -> float:
    """GB/s of one load by `reader`, with the baseline's package first when given."""
    env = dict(os.environ)
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(baseline), str(HERE)]))
    cmd = [sys.executable, str(HERE / "bench_load.py"), "--worker", reader, "--index", str(index)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    result = parse_result(out.stdout)
    if out.returncode != 0 or result is None:
        raise SystemExit(f"{reader} ({baseline or 'current'}) failed:\n{out.stderr[-2000:]}")
    return result["bytes"] / result["seconds"] / 1e9


def sluice_origin(baseline: Path | None) -> str:
    """Where `import sluice` resolves for a build, to show the A/B is real."""
    env = dict(os.environ)
    if baseline is not None:
        env["PYTHONPATH"] = str(baseline)
    code = "import sluice._sluice as m; print(m.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def main() -> None:
    args = parse_args()
    baseline = Path(args.baseline).resolve()
    index = synth_checkpoint.generate(args.data, int(args.size_gib * 2**30), 4, 0)
    files = sorted({s.path for s in synth_checkpoint.read_layout(index)})
    builds: list[tuple[str, Path | None]] = [("baseline", baseline), ("current", None)]
    for name, where in builds:
        print(f"{name}: {sluice_origin(where)}")
    if not page_cache.can_drop():
        raise SystemExit("ab_load needs root to drop the page cache")
    readers = args.readers.split(",")
    runs: list[dict[str, object]] = []
    prime = 2 * sum(f.stat().st_size for f in files)
    with page_cache.free_page_reporting_off(False, prime) as note:
        print(note)
        for round_no in range(args.runs):
            order = builds if round_no % 2 == 0 else builds[::-1]
            for kind in args.kinds.split(","):
                for reader in readers:
                    for build, where in order:
                        page_cache.drop()
                        if kind == "warm":
                            page_cache.warm(files)
                        gbps = run_worker(reader, index, where)
                        runs.append(
                            {
                                "round": round_no,
                                "kind": kind,
                                "reader": reader,
                                "build": build,
                                "gbps": gbps,
                            }
                        )
                        print(
                            f"[{round_no + 1}/{args.runs}] {kind:4} {reader:16} {build:8} "
                            f"{gbps:6.3f} GB/s",
                            flush=True,
                        )
    print("\n| reader | cache | baseline GB/s | current GB/s | current / baseline | runs |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in args.kinds.split(","):
        for reader in readers:
            med = {}
            for build, _ in builds:
                xs = [
                    r["gbps"]
                    for r in runs
                    if (r["kind"], r["reader"], r["build"]) == (kind, reader, build)
                ]
                med[build] = statistics.median(xs)
            print(
                f"| {reader} | {kind} | {med['baseline']:.2f} | {med['current']:.2f} | "
                f"{med['current'] / med['baseline']:.2f} | {args.runs} |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
