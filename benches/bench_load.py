"""`make bench-load`: cold- and warm-cache load throughput of Sluice against the device and peers.

How a benchmark runs:
1. It generates the synthetic checkpoint if the data directory lacks it (synth_checkpoint.py).
2. It probes each reader's library in a throwaway subprocess and skips, with the reason, any
   that does not import (Sluice while it is being built, for instance).
3. Cold pass: `--runs` rounds; each round runs every reader once, rotating the starting reader
   so that none always follows the same neighbour. Before every run it syncs and drops the page
   cache. Each run is its own process: `fio` directly, the others as a worker, this same script
   with `--worker NAME`, which imports its libraries, notes its baseline RSS, allocates the
   destination, times the load and prints one result line. The parent reaps it with `os.wait4`
   for the process's peak RSS.
4. Warm pass (`--warm`, the default): before every run the page cache is dropped and the files
   are read once through it with large sequential reads, so every reader meets the same cache:
   the files resident in the 2 MiB folios a plain sequential read leaves. (Pages left by an
   earlier reader keep whatever folio size it produced, and 4 KiB folios make every mmap reader
   about 40% slower.) fio is left out and a RAM-to-destination memcpy joins as the ceiling.
5. bench_report.py turns the runs into medians, ratios and the issue's target checks, and writes
   `bench-load.md`, `bench-load.json` and `bench-load.png` under `--out`.

    make bench-load
    .venv/bin/python benches/bench_load.py --quick --readers fio,sluice-direct --out /tmp/b
"""

from __future__ import annotations

import argparse
import ast
import gc
import importlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_report
import page_cache
import synth_checkpoint
from bench_readers import READERS, Consumer, ReadContext, spot_check

RESULT_PREFIX = "BENCH_RESULT "


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The last result line a worker printed, or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX) :]) if lines else None


# The device limit exactly as the issue defines it.
FIO_ARGS = ["--ioengine=io_uring", "--direct=1", "--bs=4M", "--iodepth=32", "--rw=read"]
# The device limit is the best of these (issue 12): fio over the shards one after another
# (one job), over the largest shard alone, and over every shard at once (a job per shard,
# as Run:ai and fastsafetensors read them).
FIO_READERS = {
    "fio": "fio (O_DIRECT, QD32, 4 MiB): one job over the shards",
    "fio-file": "fio (O_DIRECT, QD32, 4 MiB): the largest shard alone",
    "fio-shards": "fio (O_DIRECT, QD32, 4 MiB): a job per shard, all at once",
}
ALL_READERS = [*FIO_READERS, *(name for name, r in READERS.items() if r.cold)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="checkpoint directory (default bench-data/ckpt-<size>g)")
    p.add_argument("--size-gib", type=float, help="checkpoint size when generating (default 4)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, help="rounds per pass (default 3)")
    p.add_argument("--readers", help=f"comma-separated subset of {','.join(ALL_READERS)}")
    p.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--sluice-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quick", action="store_true", help="smoke test: 1 GiB, 1 round")
    p.add_argument("--out", default="docs", help="directory for bench-load.{md,json,png}")
    p.add_argument(
        "--keep-page-reporting",
        action="store_true",
        help="leave the VM's free page reporting on (see page_cache.free_page_reporting_off)",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--index", help=argparse.SUPPRESS)
    p.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.size_gib = args.size_gib or (1.0 if args.quick else 4.0)
    args.runs = args.runs or (1 if args.quick else 3)
    args.data = Path(args.data or f"bench-data/ckpt-{args.size_gib:g}g")
    return args


def parse_sluice_opts(pairs: list[str]) -> dict[str, Any]:
    """`key=value` pairs; values are Python literals where they parse (32, True), else strings."""
    opts: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise SystemExit(f"--sluice-opt {pair!r}: expected KEY=VALUE")
        try:
            opts[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            opts[key] = raw
    return opts


# ---------------------------------------------------------------------------------------------
# Worker: one reader, one run, one result line.


def worker_main(args: argparse.Namespace) -> None:
    reader = READERS[args.worker]
    for module in reader.modules:
        importlib.import_module(module)
    index = Path(args.index)
    layout = synth_checkpoint.read_layout(index)
    baseline_rss = current_rss_bytes()
    consumer = Consumer(layout)
    files = sorted({s.path for s in layout})
    ctx = ReadContext(index, files, layout, consumer, parse_sluice_opts(args.sluice_opt))
    if reader.prepare:
        reader.prepare(ctx)
    seconds, cpu_s = timed(lambda: reader.run(ctx))
    maxrss_timed = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    consumer.verify_complete()
    checked = spot_check(consumer, layout) if args.verify and reader.checkable else 0
    result = {
        "seconds": seconds,
        "bytes": consumer.dest_bytes,
        "tensors": len(layout),
        "cpu_timed_s": cpu_s,
        "baseline_rss_bytes": baseline_rss,
        "dest_bytes": consumer.dest_bytes,
        "maxrss_timed_bytes": maxrss_timed,
        "spot_checked_tensors": checked,
        "sluice_stats": sluice_stats(),
    }
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


def timed(fn) -> tuple[float, float]:
    """Wall seconds and CPU seconds (all threads) spent in `fn`."""
    gc.collect()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sluice_stats() -> Any:
    """Sluice's own account of the last load (engine chosen etc.), where it offers one."""
    sluice = sys.modules.get("sluice")
    stats = getattr(sluice, "last_load_stats", None)
    return stats() if callable(stats) else None


# ---------------------------------------------------------------------------------------------
# Parent: processes, passes, report.


def reap(proc: subprocess.Popen) -> tuple[str, int, Any]:
    """Stdout, exit code and rusage of a child, reaped with wait4 for its own rusage."""
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return out, proc.returncode, usage


def usage_fields(usage: Any) -> dict[str, float]:
    return {
        "maxrss_bytes": usage.ru_maxrss * 1024,
        "cpu_proc_s": usage.ru_utime + usage.ru_stime,
    }


def run_fio(files: list[Path], mode: str = "fio") -> dict[str, Any]:
    """fio as `mode` names it (see FIO_READERS), timed by fio itself."""
    if mode == "fio-file":
        jobs = [["--name=device-limit", f"--filename={max(files, key=lambda p: p.stat().st_size)}"]]
    elif mode == "fio-shards":
        jobs = [[f"--name=shard{i}", f"--filename={p}"] for i, p in enumerate(files)]
    else:
        names = ":".join(str(p).replace(":", "\\:") for p in files)
        jobs = [["--name=device-limit", f"--filename={names}"]]
    cmd = ["fio", "--readonly", *FIO_ARGS, *(arg for job in jobs for arg in job)]
    proc = subprocess.Popen([*cmd, "--output-format=json"], stdout=subprocess.PIPE, text=True)
    out, rc, usage = reap(proc)
    if rc != 0:
        return {"error": f"fio exited {rc}"}
    reads = [job["read"] for job in json.loads(out[out.index("{") :])["jobs"]]
    # Jobs run side by side: the slowest one's runtime is the wall time.
    seconds = max(r["runtime"] for r in reads) / 1000
    return {"seconds": seconds, "bytes": sum(r["io_bytes"] for r in reads), **usage_fields(usage)}


def run_worker(name: str, args: argparse.Namespace, index: Path, verify: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--index", str(index)]
    cmd += [f"--sluice-opt={o}" for o in args.sluice_opt] + (["--verify"] if verify else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out, rc, usage = reap(proc)
    worker = parse_result(out)
    if rc != 0 or worker is None:
        return {"error": f"worker exited {rc} (see its stderr above)"}
    return {"seconds": worker["seconds"], "bytes": worker["bytes"], **usage_fields(usage), **worker}


def probe(module: str) -> tuple[bool, str]:
    """Import `module` in a throwaway interpreter: (ok, version or the error's last line)."""
    code = f"import {module} as m; print(getattr(m, '__version__', 'unknown'))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return True, proc.stdout.strip()
    lines = proc.stderr.strip().splitlines()
    return False, lines[-1] if lines else f"exit {proc.returncode}"


def select_readers(args: argparse.Namespace) -> tuple[list[str], dict[str, tuple[bool, str]]]:
    """The readers asked for, less those whose library does not import (said loudly).

    Also returns each probed module's (ok, version or error).
    """
    wanted = args.readers.split(",") if args.readers else ALL_READERS
    unknown = set(wanted) - set(ALL_READERS) - {"memcpy"}
    if unknown:
        raise SystemExit(f"unknown readers {sorted(unknown)}; choose from {ALL_READERS}")
    results: dict[str, tuple[bool, str]] = {}
    chosen = []
    for name in wanted:
        if name in FIO_READERS:
            ok, why = _fio_available()
        else:
            top = READERS[name].modules[0].split(".")[0] if READERS[name].modules else None
            ok, why = results.setdefault(top, probe(top)) if top else (True, "")
        if ok:
            chosen.append(name)
        else:
            print(f"SKIPPING {name}: cannot import its library ({why})", file=sys.stderr)
    return chosen, results


def _fio_available() -> tuple[bool, str]:
    try:
        subprocess.run(["fio", "--version"], capture_output=True, check=True)
        return True, ""
    except (OSError, subprocess.CalledProcessError) as e:
        return False, str(e)


def run_reader(
    name: str, args: argparse.Namespace, index: Path, files: list[Path], verify: bool
) -> dict[str, Any]:
    if name in FIO_READERS:
        return run_fio(files, name)
    return run_worker(name, args, index, verify)


def run_pass(
    kind: str, readers: list[str], args: argparse.Namespace, index: Path, files: list[Path]
) -> list[dict[str, Any]]:
    """`args.runs` interleaved rounds over `readers`, cold (caches dropped) or warm."""
    runs = []
    for round_no in range(args.runs):
        shift = round_no % len(readers)
        for name in readers[shift:] + readers[:shift]:
            dropped = page_cache.drop()
            if kind == "warm":
                page_cache.warm(files)
            # Check the bytes once per reader, outside the timing, on its first cold run.
            verify = kind == "cold" and round_no == 0
            # Other work on the machine skews every number; record it to spot noisy runs.
            loadavg = os.getloadavg()[0]
            result = run_reader(name, args, index, files, verify)
            result.update(reader=name, label=label(name), kind=kind, round=round_no)
            result.update(cache_dropped=dropped, loadavg_1m=loadavg)
            runs.append(result)
            print_run(result, args.runs)
    return runs


def label(name: str) -> str:
    return FIO_READERS[name] if name in FIO_READERS else READERS[name].label


def print_run(r: dict[str, Any], rounds: int) -> None:
    head = f"[{r['kind']} {r['round'] + 1}/{rounds}] {r['reader']:<16}"
    if "error" in r:
        print(f"{head} FAILED: {r['error']}", flush=True)
        return
    gbps = r["bytes"] / r["seconds"] / 1e9
    rss = r["maxrss_bytes"] / 2**30
    print(f"{head} {gbps:7.3f} GB/s  {r['seconds']:7.2f} s  peak RSS {rss:5.2f} GiB", flush=True)


def run_benchmark(args: argparse.Namespace) -> None:
    index = synth_checkpoint.generate(args.data, int(args.size_gib * 2**30), args.shards, args.seed)
    files = sorted({s.path for s in synth_checkpoint.read_layout(index)})
    readers, probes = select_readers(args)
    if not page_cache.can_drop():
        print(page_cache.NOT_ROOT_WARNING, file=sys.stderr)
    cold = [r for r in readers if r in FIO_READERS or READERS[r].cold]
    # Each worker allocates a destination and (load_file) a second copy of the checkpoint:
    # touch that much once, with free page reporting off, so no run pays for host faults.
    prime = 2 * sum(f.stat().st_size for f in files)
    with page_cache.free_page_reporting_off(args.keep_page_reporting, prime) as memory_note:
        runs = run_pass("cold", cold, args, index, files) if cold else []
        if args.warm:
            warm = [r for r in readers if r not in FIO_READERS and READERS[r].warm]
            runs += run_pass("warm", [*dict.fromkeys([*warm, "memcpy"])], args, index, files)
    meta = bench_report.collect_meta(index, readers, page_cache.can_drop())
    meta["memory_note"] = memory_note
    meta["sluice_opts"] = parse_sluice_opts(args.sluice_opt)
    if meta["versions"]["sluice"] == "not installed" and probes.get("sluice", (False,))[0]:
        meta["versions"]["sluice"] = probes["sluice"][1]
    report = bench_report.build(meta, runs)
    print(report.markdown)
    report.write(Path(args.out))
    if not page_cache.can_drop():
        print(page_cache.NOT_ROOT_WARNING, file=sys.stderr)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
    else:
        run_benchmark(args)


if __name__ == "__main__":
    main()
