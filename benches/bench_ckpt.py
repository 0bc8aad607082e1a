"""`make bench-ckpt`: grouped checkpoint saves and loads, Sluice against DCP and torch.save.

What it measures (issue 14): torch.distributed on gloo, CPU, one process per rank, each with
`--gib-per-rank` GiB of touched state, in four workloads (ckpt_rank.py builds them):
`replicated` (DDP: the same tensors on every rank), `sharded` (FSDP: every rank its own),
`mixed` (40% sharded, 30% replicated, a tied pair, 20% zero-filled optimizer moments, a step)
and `incremental` (mixed saved, about 6% of its bytes changed, saved again: the second save
counts). Five writers: `dcp.save` and `dcp.async_save` (DefaultStager on CPU) with
FileSystemWriter, `torch.save` per rank with fsync, Sluice through DCP (`dcp.async_save` with
`sluice.ckpt.StorageWriter`) and Sluice's own `sluice.ckpt.save`. Each checkpoint is loaded
back cold by its writer's reader into a fresh zero state and compared bit for bit.

How a benchmark runs:
1. `cargo run --release -p sluice-ckpt --example plan_bench`: the write planner for 64 ranks
   x 1,000 chunks; then BLAKE3 hashing speed over a 1 GiB touched tensor (`--hash-gib`).
2. For each world size, `--runs` rounds; each round takes every workload in turn and runs every
   writer on it, the writers' order rotating by round. A measurement is `world` fresh
   processes of ckpt_rank.py (a rendezvous file, a directory of their own), killed together
   if one fails or they outlast `--timeout`. Their directory is deleted afterwards.
3. Per (world, workload, writer) it reports medians over the rounds: seconds until unblocked
   and until durable (slowest rank), bytes the save added on disk (apparent sizes) and the
   ranks' /proc/self/io write_bytes, the cold load's seconds, rchar and read_bytes summed over
   ranks (and, for Sluice, what its grouped read read), the extra RSS while saving (the worst
   rank), and whether every rank loaded its state exactly. Then the issue's targets as
   PASS/MISS lines, and `bench-ckpt.{json,md,png}` under `--out`.

    make bench-ckpt
    .venv/bin/python benches/bench_ckpt.py --worlds 2 --gib-per-rank 0.05 --runs 1 --out /tmp/b
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from statistics import median
from typing import Any

import bench_report
import page_cache

REPO = Path(__file__).resolve().parent.parent
RANK_SCRIPT = Path(__file__).resolve().parent / "ckpt_rank.py"
GiB = 2**30
WORKLOADS = ("replicated", "sharded", "mixed", "incremental")
WRITERS = ("dcp-save", "dcp-async", "torch-save", "sluice-dcp", "sluice")
SLUICE_WRITERS = ("sluice-dcp", "sluice")
LABELS = {
    "dcp-save": "dcp.save (FileSystemWriter)",
    "dcp-async": "dcp.async_save (FileSystemWriter, DefaultStager)",
    "torch-save": "torch.save per rank + fsync",
    "sluice-dcp": "dcp.async_save (sluice.ckpt.StorageWriter)",
    "sluice": "sluice.ckpt.save / load",
}
# Sluice's bytes written on mixed, as a fraction of dcp.save's, by world size (issue 14).
MIXED_WRITE_RATIO = {2: 0.82, 4: 0.80}
DEFAULT_MIXED_WRITE_RATIO = 0.80
PLAN_TARGET_MS = 50.0
# The staging pool's default budget (sluice.ckpt.DEFAULT_STAGING_BYTES), read from the module.
try:
    import sluice.ckpt as _ck

    STAGING_BUDGET = _ck.DEFAULT_STAGING_BYTES
except ImportError:  # pragma: no cover - reported by the ranks instead
    STAGING_BUDGET = 1 << 30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,4", help="comma-separated world sizes (default 2,4)")
    p.add_argument("--gib-per-rank", type=float, default=1.0, help="state per rank (default 1)")
    p.add_argument("--runs", type=int, default=3, help="rounds per world size (default 3)")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--writers", default=",".join(WRITERS))
    p.add_argument("--out", default="docs", help="directory for bench-ckpt.{md,json,png}")
    p.add_argument(
        "--data-dir",
        default=str(REPO / "bench-data" / "ckpt"),
        help="where checkpoints are written (a disk, not tmpfs; default bench-data/ckpt)",
    )
    p.add_argument("--hash-gib", type=float, default=1.0, help="tensor for the hashing speed")
    p.add_argument("--no-plan-bench", action="store_true", help="skip cargo's plan_bench")
    p.add_argument(
        "--timeout",
        type=float,
        help="seconds one measurement may take (default 300 + 600 per GiB of the world's state)",
    )
    p.add_argument(
        "--keep-page-reporting",
        action="store_true",
        help="leave the VM's free page reporting on (see page_cache.free_page_reporting_off)",
    )
    args = p.parse_args(argv)
    args.worlds = [int(w) for w in args.worlds.split(",")]
    args.workloads = args.workloads.split(",")
    args.writers = args.writers.split(",")
    for what, got, known in (
        ("workloads", args.workloads, WORKLOADS),
        ("writers", args.writers, WRITERS),
    ):
        if set(got) - set(known):
            p.error(f"unknown {what} {sorted(set(got) - set(known))}; choose from {list(known)}")
    if min(args.worlds) < 2:
        p.error("--worlds: a grouped save needs at least 2 ranks")
    args.bytes_per_rank = int(args.gib_per_rank * GiB)
    args.data_dir = Path(args.data_dir).resolve()
    return args


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Side measurements: the planner and the hash


def run_plan_bench() -> dict[str, Any]:
    """plan_bench's output and, per layout, the cold and warm planning milliseconds."""
    cmd = ["cargo", "run", "--release", "-q", "-p", "sluice-ckpt", "--example", "plan_bench"]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e), "command": " ".join(cmd)}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}", "command": " ".join(cmd)}
    layouts = {}
    for ln in proc.stdout.splitlines():
        m = re.match(r"^(\w+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", ln)
        if m:
            layouts[m[1]] = {"cold_ms": float(m[2]), "warm_ms": float(m[3])}
    return {"command": " ".join(cmd), "output": proc.stdout.rstrip(), "layouts": layouts}


def run_hash_bench(gib: float, scratch: Path) -> dict[str, Any]:
    out = scratch / "hash.json"
    cmd = [sys.executable, str(RANK_SCRIPT), "--hash-gib", str(gib), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    result = json.loads(out.read_text())
    out.unlink()
    return result


# ---------------------------------------------------------------------------------------------
# One measurement: `world` rank processes


def run_group(
    args: argparse.Namespace, world: int, workload: str, writer: str, run: int
) -> dict[str, Any]:
    """Starts the ranks, waits (killing all of them if one fails or time runs out), and folds
    their results into one record."""
    where = args.data_dir / f"w{world}-{workload}-{writer}-r{run}"
    shutil.rmtree(where, ignore_errors=True)
    ckpt_dir = where / "data"
    ckpt_dir.mkdir(parents=True)
    init = where / "rendezvous"
    timeout = args.timeout or 300 + 600 * world * args.bytes_per_rank / GiB
    record: dict[str, Any] = {"world": world, "workload": workload, "writer": writer, "run": run}
    record["loadavg_1m"] = os.getloadavg()[0]
    procs, logs = [], []
    for rank in range(world):
        cmd = [sys.executable, str(RANK_SCRIPT), "--rank", str(rank), "--world", str(world)]
        cmd += ["--init", str(init), "--workload", workload, "--writer", writer]
        cmd += ["--dir", str(ckpt_dir), "--bytes", str(args.bytes_per_rank)]
        cmd += ["--out", str(where / f"rank-{rank}.json")]
        log_path = where / f"rank-{rank}.log"
        logs.append(log_path)
        with open(log_path, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO))
    start = time.monotonic()
    failure = None
    while any(p.poll() is None for p in procs):
        failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        if failed:
            failure = f"rank {failed[0]} exited {procs[failed[0]].returncode}"
            break
        if time.monotonic() - start > timeout:
            failure = f"timed out after {timeout:.0f} s"
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    record["wall_s"] = time.monotonic() - start
    if failure is None and any(p.returncode != 0 for p in procs):
        bad = next(r for r, p in enumerate(procs) if p.returncode != 0)
        failure = f"rank {bad} exited {procs[bad].returncode}"
    ranks = []
    for rank in range(world):
        path = where / f"rank-{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else {"error": "no result"})
    errors = [f"rank {r.get('rank', i)}: {r['error']}" for i, r in enumerate(ranks) if "error" in r]
    if failure or errors:
        record["error"] = "; ".join([*([failure] if failure else []), *errors[:2]])
        for i, path in enumerate(logs):
            tail = path.read_text(errors="replace").strip().splitlines()[-15:]
            if tail:
                log(f"    rank {i} log (last lines):\n      " + "\n      ".join(tail))
    else:
        record.update(fold(ranks))
        record["ranks"] = ranks
    shutil.rmtree(where, ignore_errors=True)
    return record


def fold(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One measurement's figures from its ranks' results."""
    r0 = ranks[0]

    def total(phase: str, field: str) -> int:
        return sum(r[phase]["io"][field] for r in ranks)

    out: dict[str, Any] = {
        "unblocked_s": max(r["save"]["unblocked_s"] for r in ranks),
        "durable_s": max(r["save"]["durable_s"] for r in ranks),
        "return_s": max(r["save"]["return_s"] for r in ranks),
        "written_bytes": r0["dir_bytes_after"] - r0["dir_bytes_before"],
        "io_write_bytes": total("save", "write_bytes"),
        "load_s": max(r["load"]["seconds"] for r in ranks),
        "read_rchar": total("load", "rchar"),
        "read_disk_bytes": total("load", "read_bytes"),
        "extra_rss_bytes": max(r["save"]["extra_rss_bytes"] for r in ranks),
        "state_bytes": max(r["state_bytes"] for r in ranks),
        "logical_bytes_total": sum(r["logical_bytes"] for r in ranks),
        "exact": all(r["exact"] for r in ranks),
        "cache_dropped": bool(r0.get("cache_dropped")),
    }
    if any(r["save"].get("plain_future") for r in ranks):
        out["plain_future"] = True
    if all("last_load" in r["load"] for r in ranks):
        out["sluice_read_bytes"] = sum(r["load"]["last_load"].get("read_bytes", 0) for r in ranks)
    if "report" in r0["save"]:
        rep = r0["save"]["report"]
        out["unique_bytes"] = rep.get("unique_bytes")
        out["sluice_logical_bytes"] = rep.get("logical_bytes")
        out["sluice_written_bytes"] = rep.get("written_bytes")
    if all("changed_chunk_bytes" in r for r in ranks):
        out["changed_chunk_bytes"] = sum(r["changed_chunk_bytes"] for r in ranks)
    bad = [f"rank {r['rank']}: {r['mismatched_keys']}" for r in ranks if not r["exact"]]
    if bad:
        out["mismatches"] = bad
    return out


def print_record(r: dict[str, Any], runs: int) -> None:
    head = f"[w{r['world']} {r['run'] + 1}/{runs}] {r['workload']:<11} {r['writer']:<10}"
    if "error" in r:
        log(f"{head} FAILED: {r['error']}")
        return
    log(
        f"{head} unblocked {r['unblocked_s']:6.2f} s  durable {r['durable_s']:6.2f} s  "
        f"written {r['written_bytes'] / GiB:6.3f} GiB  load {r['load_s']:6.2f} s  "
        f"read {r['read_rchar'] / GiB:6.3f} GiB  extra RSS {r['extra_rss_bytes'] / GiB:5.2f} GiB  "
        f"{'exact' if r['exact'] else 'NOT EXACT'}  ({r['wall_s']:.0f} s)"
    )


# ---------------------------------------------------------------------------------------------
# Summary: medians, targets


FIELDS = (
    "unblocked_s",
    "durable_s",
    "return_s",
    "written_bytes",
    "io_write_bytes",
    "load_s",
    "read_rchar",
    "read_disk_bytes",
    "sluice_read_bytes",
    "extra_rss_bytes",
    "state_bytes",
    "logical_bytes_total",
    "unique_bytes",
    "sluice_logical_bytes",
    "changed_chunk_bytes",
)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """{"w<world>": {workload: {writer: medians}}}, plus each workload's unique bytes."""
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["world"], r["workload"], r["writer"]), []).append(r)
    summary: dict[str, Any] = {}
    for (world, workload, writer), group in groups.items():
        ok = [r for r in group if "error" not in r]
        s: dict[str, Any] = {"runs": len(ok), "errors": len(group) - len(ok)}
        for f in FIELDS:
            vals = [r[f] for r in ok if r.get(f) is not None]
            if vals:
                s[f] = median(vals)
        if ok:
            s["exact"] = all(r["exact"] for r in ok)
            s["worst_extra_rss_bytes"] = max(r["extra_rss_bytes"] for r in ok)
        summary.setdefault(f"w{world}", {}).setdefault(workload, {})[writer] = s
    for by_workload in summary.values():
        for writers in by_workload.values():
            direct = writers.get("sluice", {})
            unique = direct.get("unique_bytes")
            for s in writers.values():
                s["workload_unique_bytes"] = unique
                s["workload_logical_bytes"] = direct.get("sluice_logical_bytes")
    return summary


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 14's targets: each a measured ratio (value / base) against its limit. A target
    that cannot be computed (a writer left out or failed) is reported as n/a."""
    out: list[dict[str, Any]] = []

    def check(
        name: str, value: float | None, base: float | None, limit: float, detail: str
    ) -> None:
        if value is None or not base:
            out.append({"target": name, "status": "n/a", "detail": detail})
            return
        ratio = value / base
        status = "PASS" if ratio <= limit else "MISS"
        row = {"target": name, "status": status, "ratio": ratio, "limit": limit}
        out.append({**row, "value": value, "base": base, "detail": detail})

    for wkey, by_workload in summary.items():
        world = int(wkey[1:])

        def get(workload: str, writer: str, field: str, at: dict = by_workload) -> Any:
            return at.get(workload, {}).get(writer, {}).get(field)

        for workload, writers in by_workload.items():
            unique = next((s.get("workload_unique_bytes") for s in writers.values()), None)
            for sw in SLUICE_WRITERS:
                if sw not in writers:
                    continue
                head = f"w{world} {workload} {sw}:"
                written = get(workload, sw, "written_bytes")
                check(
                    f"{head} bytes written / unique bytes <= 1.01",
                    written,
                    unique,
                    1.01,
                    f"written {_gib(written)} GiB, unique {_gib(unique)} GiB",
                )
                read = get(workload, sw, "sluice_read_bytes")
                check(
                    f"{head} bytes read by the grouped load / unique bytes <= 1.01",
                    read,
                    unique,
                    1.01,
                    f"read {_gib(read)} GiB over the ranks, unique {_gib(unique)} GiB",
                )
                mine = get(workload, sw, "unblocked_s")
                theirs = get(workload, "dcp-async", "unblocked_s")
                check(
                    f"{head} unblocked / dcp.async_save's staging <= 1",
                    mine,
                    theirs,
                    1.0,
                    f"{_s(mine)} s vs {_s(theirs)} s",
                )
                rss = get(workload, sw, "worst_extra_rss_bytes")
                check(
                    f"{head} extra RSS while saving / staging budget <= 1",
                    rss,
                    float(STAGING_BUDGET),
                    1.0,
                    f"worst run and rank {_gib(rss)} GiB, budget {_gib(STAGING_BUDGET)} GiB",
                )
                if workload == "mixed":
                    limit = MIXED_WRITE_RATIO.get(world, DEFAULT_MIXED_WRITE_RATIO)
                    dcp_w = get(workload, "dcp-save", "written_bytes")
                    check(
                        f"{head} bytes written / dcp.save's <= {limit}",
                        written,
                        dcp_w,
                        limit,
                        f"{_gib(written)} GiB vs dcp.save {_gib(dcp_w)} GiB",
                    )
                if workload in ("mixed", "replicated"):
                    mine = get(workload, sw, "durable_s")
                    theirs = get(workload, "dcp-save", "durable_s")
                    check(
                        f"{head} durable / dcp.save's <= 0.9",
                        mine,
                        theirs,
                        0.9,
                        f"{_s(mine)} s vs dcp.save {_s(theirs)} s",
                    )
                if workload == "incremental":
                    changed = get(workload, sw, "changed_chunk_bytes")
                    allowed = changed + 0.01 * unique if changed is not None and unique else None
                    check(
                        f"{head} bytes written / (changed chunks + 1% of the checkpoint) <= 1",
                        written,
                        allowed,
                        1.0,
                        f"written {_gib(written)} GiB, changed chunks {_gib(changed)} GiB, "
                        f"checkpoint (unique) {_gib(unique)} GiB",
                    )
                if workload == "replicated":
                    dcp_read = get(workload, "dcp-save", "read_rchar")
                    check(
                        f"{head} bytes read / dcp.load's logical bytes read <= 1/{world}",
                        read,
                        dcp_read,
                        1 / world,
                        f"{_gib(read)} GiB vs dcp.load's rchar {_gib(dcp_read)} GiB",
                    )
    return out


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / GiB:.3f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# ---------------------------------------------------------------------------------------------
# Report files


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("torch", "numpy", "sluice"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    out["sluice_commit"] = git.stdout.strip() or "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    out["sluice_tree"] = "modified" if dirty.stdout.strip() else "clean"
    return out


def markdown(meta: dict[str, Any], summary: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    lines = [
        "## bench-ckpt: grouped checkpoint saves and loads (issue 14)",
        "",
        f"{meta['date']}, `{meta['command']}`; torch {meta['versions']['torch']}, sluice "
        f"{meta['versions']['sluice']} at {meta['versions']['sluice_commit']}; "
        f"{meta['machine']['nproc']} CPUs ({meta['machine']['cpu']}), "
        f"{meta['machine']['ram_gib']} GiB RAM, data on {meta['machine']['fs']}. "
        f"{meta['gib_per_rank']:g} GiB of state per rank, gloo on CPU; medians of "
        f"{meta['runs']} run(s); page cache dropped before every load: "
        f"{'yes' if meta['cache_dropped'] else 'NO (not root: loads are warm)'}.",
        "",
        "Unblocked: until the state may change again; durable: until the checkpoint is on "
        "disk (slowest rank, from a barrier). Written: apparent bytes the save added on disk, "
        "and x the workload's content-unique bytes (Sluice's report). Logical read: "
        "/proc/self/io rchar over the ranks (small metadata reads included; Sluice's grouped "
        "read in brackets: what it read from the store); disk read: read_bytes. Extra RSS: "
        "peak RSS while saving minus the RSS before (the worst rank), against the state per "
        "rank; the targets take the worst run. Every measurement is `world` fresh processes "
        "(torch threads: cores / world); rank 0 syncs and drops the page cache between two "
        "barriers before the load.",
        "",
    ]
    for wkey, by_workload in summary.items():
        lines += [f"### world {wkey[1:]}", ""]
        lines += ["| workload | unique GiB | logical GiB | state/rank GiB | changed chunks GiB |"]
        lines += ["|---|---:|---:|---:|---:|"]
        for workload, writers in by_workload.items():
            any_s = next((s for s in writers.values() if s["runs"]), {})
            changed = next(
                (s["changed_chunk_bytes"] for s in writers.values() if "changed_chunk_bytes" in s),
                None,
            )
            lines.append(
                f"| {workload} | {_gib(any_s.get('workload_unique_bytes'))} | "
                f"{_gib(any_s.get('logical_bytes_total'))} | {_gib(any_s.get('state_bytes'))} | "
                f"{_gib(changed)} |"
            )
        lines += [
            "",
            "| writer | workload | unblocked s | durable s | written GiB | x unique | "
            "io write GiB | load s | logical read GiB | disk read GiB | extra RSS GiB | exact |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        writers_seen = [w for w in WRITERS if any(w in ws for ws in by_workload.values())]
        for writer in writers_seen:
            for workload, writers in by_workload.items():
                s = writers.get(writer)
                if s is None:
                    continue
                if not s["runs"]:
                    failed = f"failed ({s['errors']} run(s))"
                    lines.append(f"| {writer} | {workload} | {failed} |" + " |" * 9)
                    continue
                unique = s.get("workload_unique_bytes")
                times = f"{s['written_bytes'] / unique:.2f}" if unique else "-"
                read = _gib(s.get("read_rchar"))
                if "sluice_read_bytes" in s:
                    read += f" ({_gib(s['sluice_read_bytes'])})"
                lines.append(
                    f"| {writer} | {workload} | {_s(s['unblocked_s'])} | {_s(s['durable_s'])} | "
                    f"{_gib(s['written_bytes'])} | {times} | {_gib(s.get('io_write_bytes'))} | "
                    f"{_s(s['load_s'])} | {read} | {_gib(s.get('read_disk_bytes'))} | "
                    f"{_gib(s.get('extra_rss_bytes'))} | {'yes' if s['exact'] else '**NO**'} |"
                )
        lines.append("")
    lines += ["Writers:", ""]
    lines += [f"- `{w}`: {LABELS[w]}" for w in WRITERS if w in meta["writers"]]
    lines += ["", "### Targets", ""]
    lines += [f"- {fmt_check(c)}" for c in checks]
    plan = meta.get("plan_bench") or {}
    lines += ["", "### Write planning (plan_bench)", ""]
    if "output" in plan:
        lines += ["```", plan["output"], "```"]
    else:
        lines.append(f"not run: {plan.get('error', 'skipped')}")
    h = meta.get("hash") or {}
    lines += ["", "### BLAKE3 chunk hashing", ""]
    if "gbps" in h:
        lines.append(
            f"{h['bytes'] / GiB:g} GiB touched tensor, 4 MiB chunks, median of {len(h['runs'])}: "
            f"{h['gbps']:.2f} GB/s, {h['gbps_per_core']:.2f} GB/s per core ({h['cores']} cores)."
        )
    else:
        lines.append(f"not measured: {h.get('error', 'skipped')}")
    lines.append("")
    return "\n".join(lines)


def fmt_check(c: dict[str, Any]) -> str:
    if c["status"] == "n/a":
        return f"n/a  {c['target']} ({c['detail']})"
    return (
        f"{c['status']} {c['target']}: measured {c['ratio']:.3f} (limit {c['limit']:.3g}; "
        f"{c['detail']})"
    )


def plot(summary: dict[str, Any], path: Path) -> str | None:
    """Grouped bars: per workload, one bar per writer, durable (light) over unblocked (dark);
    a subplot per world. Returns why no plot was made, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not installed ({e})"
    worlds = list(summary)
    fig, axes = plt.subplots(1, len(worlds), figsize=(7 * len(worlds), 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, wkey in zip(axes[0], worlds):
        by_workload = summary[wkey]
        workloads = list(by_workload)
        writers = [w for w in WRITERS if any(w in ws for ws in by_workload.values())]
        width = 0.8 / max(1, len(writers))
        for i, writer in enumerate(writers):
            xs = [j - 0.4 + width * (i + 0.5) for j in range(len(workloads))]
            dur = [by_workload[wl].get(writer, {}).get("durable_s", 0) for wl in workloads]
            unb = [by_workload[wl].get(writer, {}).get("unblocked_s", 0) for wl in workloads]
            c = colors[i % len(colors)]
            ax.bar(xs, dur, width, color=c, alpha=0.35, edgecolor=c)
            ax.bar(xs, unb, width * 0.6, color=c, label=writer)
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel("seconds")
        ax.set_title(f"world {wkey[1:]}: unblocked (solid) and durable (light)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ---------------------------------------------------------------------------------------------
# Main


def check_data_dir(args: argparse.Namespace) -> None:
    """The data directory must be on a disk with room for the largest measurement."""
    args.data_dir.mkdir(parents=True, exist_ok=True)
    fstype = bench_report._command(
        ["findmnt", "-n", "-o", "FSTYPE", "--target", str(args.data_dir)]
    )
    if fstype in ("tmpfs", "ramfs"):
        raise SystemExit(f"--data-dir {args.data_dir} is on {fstype}: give a directory on a disk")
    # incremental keeps two full checkpoints of the largest world until it is deleted.
    need = 2.2 * max(args.worlds) * args.bytes_per_rank + GiB
    free = shutil.disk_usage(args.data_dir).free
    if free < need:
        raise SystemExit(
            f"--data-dir {args.data_dir}: {free / GiB:.1f} GiB free, need about {need / GiB:.1f}"
        )


def run_benchmark(args: argparse.Namespace) -> int:
    check_data_dir(args)
    if not page_cache.can_drop():
        log(page_cache.NOT_ROOT_WARNING)
    meta: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "machine": bench_report.machine(args.data_dir),
        "versions": versions(),
        "worlds": args.worlds,
        "gib_per_rank": args.gib_per_rank,
        "bytes_per_rank": args.bytes_per_rank,
        "runs": args.runs,
        "workloads": args.workloads,
        "writers": args.writers,
        "data_dir": str(args.data_dir),
        "cache_dropped": page_cache.can_drop(),
        "staging_budget_bytes": STAGING_BUDGET,
    }
    if not args.no_plan_bench:
        log("plan_bench: cargo run --release -p sluice-ckpt --example plan_bench")
        meta["plan_bench"] = run_plan_bench()
        log(
            meta["plan_bench"].get(
                "output", f"plan_bench FAILED: {meta['plan_bench'].get('error')}"
            )
        )
    log(f"hashing: BLAKE3 over a {args.hash_gib:g} GiB touched tensor")
    meta["hash"] = run_hash_bench(args.hash_gib, args.data_dir)
    h = meta["hash"]
    if "gbps" in h:
        log(f"hashing: {h['gbps']:.2f} GB/s, {h['gbps_per_core']:.2f} GB/s per core")
    else:
        log(f"hashing FAILED: {h['error']}")

    records: list[dict[str, Any]] = []
    # Each rank holds its state, the loaded copy and (torch.load, DefaultStager) one more.
    prime = 3 * max(args.worlds) * args.bytes_per_rank
    started = time.monotonic()
    with page_cache.free_page_reporting_off(args.keep_page_reporting, prime) as memory_note:
        meta["memory_note"] = memory_note
        for world in args.worlds:
            for run in range(args.runs):
                shift = run % len(args.writers)
                order = args.writers[shift:] + args.writers[:shift]
                for workload in args.workloads:
                    for writer in order:
                        r = run_group(args, world, workload, writer, run)
                        records.append(r)
                        print_record(r, args.runs)
    meta["wall_s"] = time.monotonic() - started

    summary = summarize(records)
    checks = targets(summary)
    for name, lay in (meta.get("plan_bench") or {}).get("layouts", {}).items():
        ms = lay["cold_ms"]
        checks.append(
            {
                "target": f"planning 64 ranks x 1,000 chunks ({name}, cold) / "
                f"{PLAN_TARGET_MS:g} ms <= 1",
                "status": "PASS" if ms <= PLAN_TARGET_MS else "MISS",
                "ratio": ms / PLAN_TARGET_MS,
                "limit": 1.0,
                "value": ms,
                "base": PLAN_TARGET_MS,
                "detail": f"{ms:.2f} ms",
            }
        )
    report = markdown(meta, summary, checks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-ckpt.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "targets": checks, "runs": records}, indent=1)
        + "\n"
    )
    (out / "bench-ckpt.md").write_text(report)
    why = plot(summary, out / "bench-ckpt.png")
    if why:
        log(f"no bench-ckpt.png: {why}")
    print(report)
    failed = [r for r in records if "error" in r or not r.get("exact")]
    if failed:
        print(f"{len(failed)} measurement(s) failed or loaded inexactly; see bench-ckpt.json")
    if not any(args.data_dir.iterdir()):
        args.data_dir.rmdir()
    return 1 if failed else 0


def main() -> None:
    sys.exit(run_benchmark(parse_args()))


if __name__ == "__main__":
    main()
