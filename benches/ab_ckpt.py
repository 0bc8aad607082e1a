"""A/B of two Sluice builds on `sluice.ckpt`'s save and load paths, in one run.

A restructure must not make a save or load slower, and this machine's disk varies between runs
by more than the effects we look for. So both builds run side by side: in every round, each
scenario runs once per build, in an order that alternates between rounds, each in a fresh
process with a fresh store. Scenarios:
- ``save``: a 1 GiB state of 16 fp32 tensors, ``sluice.ckpt.save``: seconds until staged and
  until durable;
- ``incremental``: the same state with 5% of its bytes changed, saved into the same store;
- ``load``: the first checkpoint loaded into existing tensors with the page cache dropped (the
  store's files evicted with POSIX_FADV_DONTNEED);
- ``small``: 55,000 tensors of 16 floats (a state of many small tensors), until durable, with
  ``torch.save`` of the same state for reference;
- ``grouped``: two ranks on gloo, 256 MiB each (half replicated, half sharded), rank 0's
  seconds until durable;
- ``replica``: the same with ``replicate=True``: rank 0's seconds until ``save`` returns,
  until staged (when training may go on) and until durable.

The baseline is a directory holding another build's ``sluice`` package and its extension, put
first on ``PYTHONPATH`` for its workers (see benches/ab_load.py for how to make one).

Usage: python benches/ab_ckpt.py --baseline /tmp/sluice-base [--runs 5] [--json out.json]
Prints, per scenario and build, the median and range, and the ratio current / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCENARIOS = ("save", "incremental", "load", "small", "grouped", "replica")

WORKER = textwrap.dedent(
    r"""
    import json, os, sys, time
    import torch
    import sluice.ckpt as ck

    scenario, store, out = sys.argv[1], sys.argv[2], sys.argv[3]
    res = {}

    def state(seed, n=16, numel=1 << 24):
        g = torch.Generator().manual_seed(seed)
        return {f"layer{i}.w": torch.rand(numel, generator=g) for i in range(n)}

    def evict(root):
        for dirpath, _, files in os.walk(root):
            for f in files:
                fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    if scenario in ("save", "incremental", "load"):
        sd = state(1)
        t0 = time.perf_counter()
        h = ck.save(sd, f"{store}/s1")
        h.staged.result()
        res["staged_s"] = time.perf_counter() - t0
        h.durable.result()
        res["durable_s"] = time.perf_counter() - t0
        if scenario == "incremental":
            for t in list(sd.values())[:1]:  # 1 of 16 tensors: about 6% of the bytes
                t.add_(1)
            t0 = time.perf_counter()
            ck.save(sd, f"{store}/s2").durable.result()
            res = {"durable_s": time.perf_counter() - t0}
        if scenario == "load":
            back = {k: torch.empty_like(v) for k, v in sd.items()}
            evict(store)
            t0 = time.perf_counter()
            ck.load(back, f"{store}/s1")
            res = {"load_s": time.perf_counter() - t0}
            assert all(torch.equal(back[k], v) for k, v in sd.items())
    elif scenario == "small":
        sd = {f"layers.{i}.norm": torch.full((16,), float(i)) for i in range(55_000)}
        t0 = time.perf_counter()
        ck.save(sd, f"{store}/s1").durable.result()
        res["durable_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.save(sd, f"{store}.pt")
        with open(f"{store}.pt", "rb+") as f:
            os.fsync(f.fileno())
        res["torch_save_s"] = time.perf_counter() - t0
    elif scenario in ("grouped", "replica"):
        import torch.distributed as dist

        rank, world, init = int(sys.argv[4]), 2, sys.argv[5]
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
        shared = state(7, n=4, numel=1 << 23)  # 128 MiB the same on both ranks
        own = state(100 + rank, n=4, numel=1 << 23)  # 128 MiB of this rank's own
        sd = {"shared": shared, "own": own}
        dist.barrier()
        t0 = time.perf_counter()
        if scenario == "grouped":
            ck.save(sd, f"{store}/s1").durable.result()
        else:
            h = ck.save(sd, f"{store}/s1", replicate=True)
            res["returned_s"] = time.perf_counter() - t0
            h.staged.result()
            res["staged_s"] = time.perf_counter() - t0
            h.durable.result()
        res["durable_s"] = time.perf_counter() - t0
        dist.barrier()
        dist.destroy_process_group()
        if rank != 0:
            sys.exit(0)
    with open(out, "w") as f:
        json.dump(res, f)
    """
)


def run_one(scenario: str, build: str, baseline: Path, work: Path, timeout: float) -> dict:
    env = dict(os.environ)
    if build == "baseline":
        env["PYTHONPATH"] = str(baseline)
    else:
        env.pop("PYTHONPATH", None)
    store = work / f"{scenario}-{build}"
    out = work / f"{scenario}-{build}.json"
    script = work / "worker.py"
    script.write_text(WORKER)
    if scenario in ("grouped", "replica"):
        init = work / f"init-{build}"
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), scenario, str(store), str(out), str(r), str(init)],
                env=env,
                cwd=work,
            )
            for r in range(2)
        ]
        codes = [p.wait(timeout=timeout) for p in procs]
    else:
        codes = [
            subprocess.run(
                [sys.executable, str(script), scenario, str(store), str(out)],
                env=env,
                cwd=work,
                timeout=timeout,
            ).returncode
        ]
    if any(codes):
        raise RuntimeError(f"{scenario} on {build}: exit {codes}")
    result = json.loads(out.read_text())
    for p in (store, Path(f"{store}.pt"), out, work / f"init-{build}"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="directory with the baseline's sluice/")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--data", default=str(REPO / "bench-data"), help="a directory on the disk")
    p.add_argument("--json", help="also write every run here")
    args = p.parse_args()
    scenarios = args.scenarios.split(",")
    Path(args.data).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ab-ckpt-", dir=args.data))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {"baseline": [], "current": []} for s in scenarios
    }
    try:
        for r in range(args.runs):
            order = ("baseline", "current") if r % 2 == 0 else ("current", "baseline")
            for s in scenarios:
                for b in order:
                    res = run_one(s, b, Path(args.baseline), work, timeout=1800)
                    runs[s][b].append(res)
                    print(f"round {r + 1} {s:<12} {b:<9} {res}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'scenario':<12} {'metric':<13} {'baseline':>22} {'current':>22} {'ratio':>6}")
    summary = {}
    for s in scenarios:
        for metric in runs[s]["current"][0]:
            vals = {b: [x[metric] for x in runs[s][b]] for b in ("baseline", "current")}
            med = {b: statistics.median(v) for b, v in vals.items()}
            cell = {b: f"{med[b]:.3f} ({min(v):.3f}-{max(v):.3f})" for b, v in vals.items()}
            ratio = med["current"] / med["baseline"] if med["baseline"] else float("nan")
            summary[f"{s}.{metric}"] = {"median": med, "runs": vals, "ratio": ratio}
            print(
                f"{s:<12} {metric:<13} {cell['baseline']:>22} {cell['current']:>22} {ratio:>6.2f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
