"""`make bench-kv`: the KV-cache block store against the device and its peers, side by side.

For each block size (256 KiB, 2 MiB, 32 MiB by default) and each of `--runs` rounds:
1. fio on the data directory: a sequential O_DIRECT write of `--size-gib`, then O_DIRECT random
   reads of whole blocks at queue depths 1/8/32 x 1/4 jobs (kv_peers/fio.py).
2. Every SSD-tier system, in an order that rotates each round: store `--size-gib` of random
   blocks durably, drop the page cache, load them all back with 1 and with 4 request streams,
   then time single-block loads (the per-block latency). One worker process per system
   (kv_peers/worker.py), with the peers whose pins clash with Sluice's in .venv-kvpeers.
3. The DRAM-tier systems (memcpy, Sluice's DRAM tier, Mooncake) on `--dram-gib` of blocks.
The data of each system is deleted before the next one runs, so the disk holds one data set.

The device limit at a block size is the best of fio's random reads and every peer's load in
the same run (issue 13). kv_peers/report.py turns the runs into medians, ratios and the
issue's targets, and writes bench-kv.md, bench-kv.json and bench-kv.png under `--out`.

A peer that fails (import error, a server that does not start, a timeout, wrong bytes) is
reported as failed and the rest runs on. The exit code is 1 only if Sluice fails or returns
wrong bytes.

    make bench-kv
    .venv/bin/python benches/bench_kv.py --sizes 2MiB --size-gib 1 --runs 1 --systems sluice,fio
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import page_cache
from kv_peers import SYSTEMS, fio
from kv_peers import report as kv_report
from kv_peers.proc import die_with_parent
from kv_peers.worker import RESULT_PREFIX

BENCHES = Path(__file__).resolve().parent
REPO = BENCHES.parent
UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30}
ALL = ["fio", *SYSTEMS]


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]iB)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256KiB, 2MiB)")
    return int(m.group(1)) * UNITS.get((m.group(2) or "").lower(), 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="256KiB,2MiB,32MiB", help="block sizes, comma-separated")
    p.add_argument(
        "--size-gib",
        default="8,24,24",
        help="GiB of blocks per size: one number for all, or one per --sizes entry",
    )
    p.add_argument("--dram-gib", type=float, default=4.0, help="GiB of blocks for the DRAM tier")
    p.add_argument("--systems", "--only", help=f"comma-separated subset of {','.join(ALL)}")
    p.add_argument("--streams", default="1,4", help="request stream counts to load with")
    p.add_argument("--batch", type=int, default=16, help="blocks per request")
    p.add_argument("--runs", type=int, default=3, help="rounds (medians are over rounds)")
    p.add_argument("--latency-blocks", type=int, default=512, help="single-block loads per pass")
    p.add_argument("--latency-gib", type=float, default=4.0, help="cap on their bytes")
    p.add_argument("--dram-repeats", type=int, default=3, help="load passes per DRAM worker")
    p.add_argument("--fio-runtime", type=int, default=10, help="seconds per fio read config")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--data", default=str(REPO / "bench-data" / "kv"), help="scratch directory")
    p.add_argument("--out", default=str(REPO / "bench-data" / "bench-kv"))
    p.add_argument("--peers-python", default=str(REPO / ".venv-kvpeers" / "bin" / "python"))
    p.add_argument("--timeout-s", type=float, help="per worker (default 600 s + 90 s per GiB)")
    p.add_argument("--keep-page-reporting", action="store_true")
    p.add_argument(
        "--report-only", metavar="JSON", help="rebuild the report from a bench-kv.json, no runs"
    )
    args = p.parse_args(argv)
    args.sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    gib = [float(x) for x in args.size_gib.split(",")]
    if len(gib) not in (1, len(args.sizes)):
        p.error("--size-gib takes one number or one per --sizes entry")
    args.size_gib = gib * len(args.sizes) if len(gib) == 1 else gib
    args.streams = [int(s) for s in args.streams.split(",")]
    args.systems = args.systems.split(",") if args.systems else ALL
    unknown = set(args.systems) - set(ALL)
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {ALL}")
    args.data = Path(args.data).resolve()
    return args


# ---------------------------------------------------------------------------------------------
# Workers


class Runner:
    """Starts workers in their own process group, so a timeout or Ctrl-C ends the worker and
    every server it started (and each dies with this process even if it is SIGKILLed);
    echoes their progress lines and keeps the rest for errors."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.current: subprocess.Popen | None = None

    def python_for(self, venv: str) -> str | None:
        if venv == "main":
            return sys.executable
        return self.args.peers_python if Path(self.args.peers_python).exists() else None

    def run(self, name: str, cfg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        python = self.python_for(SYSTEMS[name].venv)
        if python is None:
            return {"error": f"no {self.args.peers_python} (make bench-kv builds .venv-kvpeers)"}
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCHES), env.get("PYTHONPATH")]))
        cmd = [python, "-m", "kv_peers.worker", json.dumps(cfg)]
        self.current = subprocess.Popen(
            cmd,
            cwd=BENCHES,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        tail: collections.deque[str] = collections.deque(maxlen=20)
        stdout: list[str] = []
        readers = [
            threading.Thread(target=self._echo, args=(self.current.stderr, tail), daemon=True),
            threading.Thread(target=lambda: stdout.extend(self.current.stdout), daemon=True),
        ]
        for t in readers:
            t.start()
        try:
            self.current.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return {"error": f"timed out after {timeout_s:.0f} s"}
        except BaseException:  # Ctrl-C or SIGTERM: end the worker now, then go on unwinding
            self.kill()
            raise
        for t in readers:
            t.join(5)
        out = "".join(stdout)
        rc, self.current = self.current.returncode, None
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
        if not lines:
            why = next((ln for ln in reversed(tail) if ln.strip()), "no output")
            return {"error": f"worker exited {rc}: {why.strip()[:300]}"}
        result = json.loads(lines[-1][len(RESULT_PREFIX) :])
        if "error" in result:
            for ln in tail:
                print(f"    {ln.rstrip()}", file=sys.stderr)
        return result

    @staticmethod
    def _echo(stream, tail: collections.deque) -> None:
        for line in stream:
            if line.startswith("[kv "):
                print(line, end="", file=sys.stderr, flush=True)
            else:
                tail.append(line)

    def kill(self) -> None:
        proc, self.current = self.current, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------------------------
# Rounds


def size_name(block_bytes: int) -> str:
    for unit, n in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if block_bytes % n == 0:
            return f"{block_bytes // n}{unit}"
    return f"{block_bytes}B"


def worker_cfg(args, name, block_bytes, n_blocks, round_no, tag) -> dict[str, Any]:
    latency_cap = max(8, int(args.latency_gib * 2**30) // block_bytes)
    return {
        "system": name,
        "tag": tag,
        "block_bytes": block_bytes,
        "n_blocks": n_blocks,
        "seed": args.seed * 1000 + round_no,
        "root": str(args.data / name),
        "batch": args.batch,
        "streams": args.streams,
        "latency_blocks": min(n_blocks, args.latency_blocks, latency_cap),
        "dram_repeats": args.dram_repeats,
    }


def run_system(runner, args, name, block_bytes, gib, round_no) -> dict[str, Any]:
    n_blocks = max(1, int(gib * 2**30) // block_bytes)
    tag = f"kv {size_name(block_bytes)} r{round_no + 1}/{args.runs}"
    cfg = worker_cfg(args, name, block_bytes, n_blocks, round_no, tag)
    root = Path(cfg["root"])
    shutil.rmtree(root, ignore_errors=True)
    need = n_blocks * block_bytes * 1.1 + 2**30
    free = shutil.disk_usage(args.data).free
    if SYSTEMS[name].tier == "ssd" and free < need:
        return {"error": f"not enough free disk: {free / 2**30:.1f} GiB, needs {need / 2**30:.1f}"}
    timeout_s = args.timeout_s or 600 + 90 * gib
    print(f"[{tag}] {name}: starting ({n_blocks} blocks)", file=sys.stderr, flush=True)
    try:
        result = runner.run(name, cfg, timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "error" in result:
        print(f"[{tag}] {name}: FAILED: {result['error']}", file=sys.stderr, flush=True)
    result.update(n_blocks=n_blocks, loadavg_1m=os.getloadavg()[0])
    return result


def run_fio(args, block_bytes, gib, round_no) -> dict[str, Any]:
    tag = f"kv {size_name(block_bytes)} r{round_no + 1}/{args.runs}"
    print(f"[{tag}] fio: write, then randread at {len(fio.READ_CONFIGS)} configs", file=sys.stderr)
    total = max(1, int(gib * 2**30) // block_bytes) * block_bytes
    result = fio.run(args.data / "fio.dat", block_bytes, total, args.fio_runtime)
    for config, r in result.items():
        if config != "error":
            print(f"[{tag}] fio {config}: {r['gbps']:.2f} GB/s", file=sys.stderr, flush=True)
    if "error" in result:
        print(f"[{tag}] fio: FAILED: {result['error']}", file=sys.stderr, flush=True)
    return result


def run_all(args: argparse.Namespace, runner: Runner) -> list[dict[str, Any]]:
    ssd = [n for n in args.systems if n in SYSTEMS and SYSTEMS[n].tier == "ssd"]
    dram = [n for n in args.systems if n in SYSTEMS and SYSTEMS[n].tier == "dram"]
    runs: list[dict[str, Any]] = []
    for block_bytes, gib in zip(args.sizes, args.size_gib):
        for round_no in range(args.runs):
            base = {"block_bytes": block_bytes, "round": round_no}
            if "fio" in args.systems:
                runs.append({**base, "system": "fio", **run_fio(args, block_bytes, gib, round_no)})
            shift = round_no % max(1, len(ssd))
            for name in ssd[shift:] + ssd[:shift]:
                r = run_system(runner, args, name, block_bytes, gib, round_no)
                runs.append({**base, "system": name, "gib": gib, **r})
            for name in dram:
                r = run_system(runner, args, name, block_bytes, args.dram_gib, round_no)
                runs.append({**base, "system": name, "gib": args.dram_gib, **r})
    return runs


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def report_only(args: argparse.Namespace) -> int:
    doc = json.loads(Path(args.report_only).read_text())
    report = kv_report.build(doc["meta"], doc["runs"])
    print(report.markdown)
    report.write(Path(args.out))
    return 0


def main() -> int:
    args = parse_args()
    if args.report_only:
        return report_only(args)
    args.started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.data.mkdir(parents=True, exist_ok=True)
    if not page_cache.can_drop():
        print(page_cache.NOT_ROOT_WARNING, file=sys.stderr)
    runner = Runner(args)
    # A SIGTERM ends the run like Ctrl-C does: the worker's process group is killed below.
    signal.signal(signal.SIGTERM, _interrupt)
    # Workers allocate their buffers afresh each run: prime memory once with reporting off.
    prime = (max(args.streams) + 1) * args.batch * max(args.sizes) + int(args.dram_gib * 2**30)
    try:
        with page_cache.free_page_reporting_off(args.keep_page_reporting, prime) as memory_note:
            runs = run_all(args, runner)
    except KeyboardInterrupt:
        print("interrupted: stopping the worker and its servers", file=sys.stderr)
        return 130
    finally:
        runner.kill()
        shutil.rmtree(args.data, ignore_errors=True)
    meta = kv_report.collect_meta(args, memory_note, page_cache.can_drop())
    report = kv_report.build(meta, runs)
    print(report.markdown)
    report.write(Path(args.out))
    failed = [
        r
        for r in runs
        if r["system"] in SYSTEMS and SYSTEMS[r["system"]].is_sluice and "error" in r
    ]
    for r in failed:
        print(f"SLUICE FAILED ({r['system']}, {size_name(r['block_bytes'])}): {r['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
