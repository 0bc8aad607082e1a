"""`make bench-sim`: replay throughput of Sluice's simulator against libCacheSim's C replay.

One synthetic trace (default 10 M requests, Zipf 1.0 over 1 M objects, lognormal sizes with a
64 KiB median), written once as oracleGeneral. For each policy (LRU, ARC, S3-FIFO, SIEVE, Belady)
and each round (interleaved, 3 by default), both simulators replay the whole trace on one core at
the same byte capacity (10% of the working set):

- libCacheSim: ``TraceReader`` + ``cache.process_trace`` (its C loop reads the file as it goes),
  with ``hashpower`` sized to the object count as its docs advise;
- Sluice: ``sluice.sim.run(..., threads=1)``, timed end to end (reading and parsing the file,
  the working-set pass, the replay), and its replay loop alone as reported in the row.

The ratios use Sluice's end-to-end time, the stricter comparison. Miss ratios of both are
printed as a cross-check. Results: ``--out``/bench-sim.{md,json}.

    make bench-sim
    .venv/bin/python benches/bench_sim.py --requests 1000000 --runs 1 --out /tmp/bs
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests"))
from sim_traces import object_sizes, write_oracle, zipf_ids

POLICIES = {"lru": "LRU", "arc": "ARC", "s3fifo": "S3FIFO", "sieve": "Sieve", "belady": "Belady"}
TARGET_RATIO = 1.0
TARGET_LRU_MREQ = 10.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000_000)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--fraction", type=float, default=0.1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--data", default="bench-data/sim")
    p.add_argument("--out", default="docs")
    return p.parse_args()


def ensure_trace(args: argparse.Namespace) -> Path:
    path = Path(args.data) / f"zipf{args.alpha}-{args.requests}-{args.objects}.oracleGeneral"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"generating {path}", flush=True)
        rng = np.random.default_rng(0)
        ids = zipf_ids(args.requests, args.objects, args.alpha, rng)
        write_oracle(path, ids, object_sizes(ids, rng, unit=False))
    return path


def run_sluice(path: Path, policy: str, fraction: float) -> dict[str, Any]:
    from sluice import sim

    started = time.perf_counter()
    (row,) = sim.run(path, [policy], [fraction], threads=1)
    wall = time.perf_counter() - started
    return {
        "seconds": wall,
        "replay_seconds": row["stats"]["seconds"],
        "miss_ratio": 1 - row["hit_ratio"],
        "byte_miss_ratio": 1 - row["byte_hit_ratio"],
        "capacity": row["capacity"],
        "requests": row["stats"]["requests"],
        "objects": row["working_set_objects"],
    }


def run_libcachesim(path: Path, policy: str, capacity: int, hashpower: int) -> dict[str, Any]:
    import libcachesim as lcs

    started = time.perf_counter()
    reader = lcs.TraceReader(trace=str(path), trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
    cache = getattr(lcs, POLICIES[policy])(capacity, hashpower=hashpower)
    miss_ratio, byte_miss_ratio = cache.process_trace(reader)
    return {
        "seconds": time.perf_counter() - started,
        "miss_ratio": miss_ratio,
        "byte_miss_ratio": byte_miss_ratio,
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "sluice": version("sluice"),
        "libcachesim": version("libcachesim"),
        "numpy": np.__version__,
    }


def main() -> int:
    args = parse_args()
    path = ensure_trace(args)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    probe = run_sluice(path, "fifo", args.fraction)
    capacity, requests = probe["capacity"], probe["requests"]
    hashpower = math.ceil(math.log2(max(probe["objects"], 2))) + 1
    print(f"trace {path}: {requests} requests, {probe['objects']} objects; capacity {capacity} B")
    runs: list[dict[str, Any]] = []
    for round_no in range(args.runs):
        for policy in policies:
            for sim_name in ("libcachesim", "sluice"):
                if sim_name == "sluice":
                    r = run_sluice(path, policy, args.fraction)
                else:
                    r = run_libcachesim(path, policy, capacity, hashpower)
                r.update(simulator=sim_name, policy=policy, round=round_no)
                r["mreq_per_s"] = requests / r["seconds"] / 1e6
                runs.append(r)
                print(
                    f"[{round_no + 1}/{args.runs}] {policy:<7} {sim_name:<12}"
                    f" {r['mreq_per_s']:7.2f} Mreq/s  miss {r['miss_ratio']:.4f}",
                    flush=True,
                )
    write_report(args, path, requests, probe["objects"], capacity, hashpower, policies, runs)
    return 0


def median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def write_report(
    args: argparse.Namespace,
    path: Path,
    requests: int,
    objects: int,
    capacity: int,
    hashpower: int,
    policies: list[str],
    runs: list[dict[str, Any]],
) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lines = [
        f"### Simulator throughput ({now[:10]})",
        "",
        f"Date: {now}. Machine: {platform.machine()}, {platform.release()}, 1 core per replay.",
        f"Trace: {requests:,} requests, {objects:,} objects, Zipf {args.alpha}, lognormal sizes;"
        f" capacity {capacity:,} B ({args.fraction:g} of the working set); libCacheSim hashpower"
        f" {hashpower}.",
        f"Versions: {', '.join(f'{k} {v}' for k, v in versions().items())}.",
        f"Command: `python benches/bench_sim.py --requests {args.requests} --objects"
        f" {args.objects} --runs {args.runs}`. Medians of {args.runs} interleaved runs.",
        "",
        "| policy | libCacheSim Mreq/s | Sluice end-to-end Mreq/s | Sluice replay-only Mreq/s"
        " | ratio (end-to-end) | miss ratio libCacheSim | miss ratio Sluice |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    checks = []
    for policy in policies:
        theirs = [r for r in runs if r["policy"] == policy and r["simulator"] == "libcachesim"]
        ours = [r for r in runs if r["policy"] == policy and r["simulator"] == "sluice"]
        lcs_rate, our_rate = median(theirs, "mreq_per_s"), median(ours, "mreq_per_s")
        replay_rate = requests / median(ours, "replay_seconds") / 1e6
        ratio = our_rate / lcs_rate
        lines.append(
            f"| {policy} | {lcs_rate:.2f} | {our_rate:.2f} | {replay_rate:.2f} | {ratio:.2f}x"
            f" | {theirs[0]['miss_ratio']:.4f} | {ours[0]['miss_ratio']:.4f} |"
        )
        checks.append(
            (
                f"{policy}: Sluice ≥ {TARGET_RATIO}x libCacheSim",
                f"{ratio:.2f}x",
                ratio >= TARGET_RATIO,
            )
        )
        if policy == "lru":
            checks.append(
                (
                    f"lru: ≥ {TARGET_LRU_MREQ} Mreq/s per core",
                    f"{our_rate:.2f}",
                    our_rate >= TARGET_LRU_MREQ,
                )
            )
    lines += ["", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'PASS' if ok else 'MISS'} |" for t, m, ok in checks]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-sim.md").write_text("\n".join(lines) + "\n")
    (out / "bench-sim.json").write_text(json.dumps({"runs": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
