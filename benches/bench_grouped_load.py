#!/usr/bin/env python3
"""Grouped model loading (issue 30): ranks of a gloo group on this machine load one checkpoint
with ``sluice.load_into(..., group=WORLD)`` (each byte read once between them, the rest sent
point to point) against every rank loading it alone (``load_into`` without a group), page
cache dropped before each run.

    sudo make bench-grouped
    sudo .venv/bin/python benches/bench_grouped_load.py [--gib 4] [--worlds 2,4] [--rounds 3]

Per run: bytes the ranks read from storage (``/proc/PID/io`` read_bytes, summed), time to
loaded (from a barrier to the last rank done), and peak RSS above each rank's RSS before the
load. A single rank loading alone is the yardstick for time. Runs interleave (alone, grouped,
per world, per round); medians and ranges are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import page_cache

HERE = Path(__file__).resolve().parent


def rank_main(rank: int, world: int, init: str, path: str, mode: str, out: str) -> None:
    import resource

    import sluice
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    meta = sluice.inspect(path)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    dest = {m["name"]: torch.empty(m["shape"], dtype=dtypes[m["dtype"]]) for m in meta}
    for t in dest.values():
        t.view(torch.uint8).fill_(1)  # touch the pages: RSS counts the model before the load
    rss0 = proc_field("/proc/self/status", "VmRSS:")
    io0 = proc_field("/proc/self/io", "read_bytes:")
    dist.barrier()
    t0 = time.time()
    if mode == "grouped":
        sluice.load_into(path, dest, group=dist.group.WORLD)
    else:
        sluice.load_into(path, dest)
    t1 = time.time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = sluice.last_load_stats() or {}
    with open(out, "w") as f:
        json.dump(
            {
                "start": t0,
                "end": t1,
                "storage_read_bytes": proc_field("/proc/self/io", "read_bytes:") - io0,
                "extra_peak_rss_bytes": max(0, peak - rss0) * 1024,
                "stats": stats,
            },
            f,
        )
    dist.barrier()
    dist.destroy_process_group()


def proc_field(path: str, key: str) -> int:
    """The number after ``key`` in a /proc file (``VmRSS:`` in kB, ``read_bytes:``)."""
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def make_checkpoint(path: Path, gib: float) -> int:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(30)
    tensors = {}
    total = 0
    i = 0
    while total < gib * (1 << 30):
        rows = 4096 if i % 3 else 14336
        t = torch.randn(rows, 4096, generator=g, dtype=torch.float32).to(torch.bfloat16)
        tensors[f"layers.{i}.w"] = t
        total += t.numel() * 2
        i += 1
    save_file(tensors, path)
    return path.stat().st_size


def run(world: int, mode: str, path: Path, work: Path) -> dict:
    init = tempfile.mktemp(dir=work)
    outs = [work / f"{mode}-{world}-{r}.json" for r in range(world)]
    page_cache.drop()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(r),
                str(world),
                init,
                str(path),
                mode,
                str(outs[r]),
            ]
        )
        for r in range(world)
    ]
    codes = [p.wait(timeout=1800) for p in procs]
    if codes != [0] * world:
        raise SystemExit(f"{mode} world {world}: exit codes {codes}")
    res = [json.loads(o.read_text()) for o in outs]
    return {
        "seconds": max(r["end"] for r in res) - min(r["start"] for r in res),
        "storage_read_bytes": sum(r["storage_read_bytes"] for r in res),
        "extra_peak_rss_bytes": max(r["extra_peak_rss_bytes"] for r in res),
        "ranks": res,
    }


def summary(runs: list[dict], size: int) -> dict:
    secs = [r["seconds"] for r in runs]
    reads = [r["storage_read_bytes"] / size for r in runs]
    return {
        "median_s": round(statistics.median(secs), 3),
        "range_s": [round(min(secs), 3), round(max(secs), 3)],
        "read_x_checkpoint": round(statistics.median(reads), 4),
        "extra_peak_rss_gib": round(max(r["extra_peak_rss_bytes"] for r in runs) / 2**30, 3),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        rank_main(int(a[0]), int(a[1]), a[2], a[3], a[4], a[5])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--out", default="target/bench-grouped-load.json")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    if not page_cache.can_drop():
        raise SystemExit("run as root: every run starts from a dropped page cache")
    with tempfile.TemporaryDirectory(prefix="bench-grouped-", dir=args.dir) as d:
        work = Path(d)
        path = work / "model.safetensors"
        size = make_checkpoint(path, args.gib)
        print(f"checkpoint: {size / 2**30:.2f} GiB at {path}", flush=True)
        runs: dict[str, list[dict]] = {}
        for rnd in range(args.rounds):
            order = [(1, "alone")] + [(w, m) for w in worlds for m in ("alone", "grouped")]
            for world, mode in order:
                key = f"{mode}-{world}"
                r = run(world, mode, path, work)
                runs.setdefault(key, []).append(r)
                print(f"round {rnd} {key}: {r['seconds']:.2f} s, "
                      f"read {r['storage_read_bytes'] / size:.3f}x", flush=True)  # fmt: skip
        table = {k: summary(v, size) for k, v in runs.items()}
        one = table["alone-1"]["median_s"]
        for row in table.values():
            row["time_x_single_rank_alone"] = round(row["median_s"] / one, 3)
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "checkpoint_bytes": size,
            "rounds": args.rounds,
            "table": table,
            "runs": runs,
        }
        Path(args.out).write_text(json.dumps(result, indent=1))
        for k, row in table.items():
            print(k, json.dumps(row))


if __name__ == "__main__":
    main()
