"""A/B of `sluice kv bench` between two builds of the CLI, runs interleaved.

Each configuration runs base, new, new, base, ... (`--runs` per side, each into a fresh
store) and prints one JSON row per configuration: every summary figure as [median, min,
max] per side. The hit ratios must be equal unless the change touches a policy.

    python benches/ab_kv.py --base /tmp/sluice-base --new target/release/sluice \\
        --trace t12k.jsonl --runs 5 --configs lru:5:0,lru:20:0,s3fifo:5:0,lru:5:64MiB

A configuration is POLICY:PCT:DRAM: the SSD tier holds PCT% of the trace's distinct blocks,
DRAM as `--dram` takes it. The trace comes from `sluice sim gen-kv`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

FIGURES = ("hit_ratio", "load_gbps", "store_gbps", "load_p50_ms", "load_p99_ms")


def distinct_blocks(trace: Path) -> int:
    with trace.open() as f:
        return len({h for line in f for h in json.loads(line)["hash_ids"]})


def one_run(
    binary: str, trace: Path, block_kib: int, blocks: int, policy: str, dram: str, out: Path
) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        binary, "kv", "bench", "--trace", str(trace), "--block-bytes", f"{block_kib}KiB",
        "--ssd", f"{blocks * block_kib}KiB", "--dram", dram, "--policy", policy,
        "--no-plots", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return json.loads((out / "bench.json").read_text())["summary"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", required=True, help="the base build's sluice binary")
    ap.add_argument("--new", required=True, help="the new build's sluice binary")
    ap.add_argument("--trace", required=True, type=Path)
    ap.add_argument("--runs", type=int, default=5, help="runs per side and configuration")
    ap.add_argument("--block-kib", type=int, default=64)
    ap.add_argument("--configs", default="lru:5:0,lru:20:0,s3fifo:5:0,lru:5:64MiB")
    ap.add_argument("--out", type=Path, help="write the rows here as JSON too")
    args = ap.parse_args()
    distinct = distinct_blocks(args.trace)
    bins = {"base": args.base, "new": args.new}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ab_kv-", dir="/var/tmp") as work:
        for config in args.configs.split(","):
            policy, pct, dram = config.split(":")
            blocks = distinct * int(pct) // 100
            res: dict[str, list[dict]] = {"base": [], "new": []}
            for r in range(args.runs):
                for side in ("base", "new") if r % 2 == 0 else ("new", "base"):
                    out = Path(work) / side
                    res[side].append(
                        one_run(bins[side], args.trace, args.block_kib, blocks, policy, dram, out)
                    )
            row: dict = {"policy": policy, "pct": int(pct), "dram": dram, "blocks": blocks}
            for key in FIGURES:
                for side in ("base", "new"):
                    vals = [s[key] for s in res[side]]
                    row[f"{side}_{key}"] = [statistics.median(vals), min(vals), max(vals)]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps({"trace": str(args.trace), "runs": args.runs, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
