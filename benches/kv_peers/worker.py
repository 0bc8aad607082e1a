"""One system, one block size, one round: `python -m kv_peers.worker CONFIG_JSON`.

Prints progress on stderr and one `KV_RESULT {...}` line on stdout. The phases:

SSD tier (`tier == "ssd"`):
1. Store every block, `batch` blocks per request, from one stream. The timer runs around each
   store call only (the blocks are generated outside it), plus the system's `finish_store`.
2. For each stream count S: sync and drop the page cache, then S threads each load their own
   disjoint share of the blocks, in random order, `batch` blocks per request. GB/s is all
   bytes over the wall time from the start barrier to the last stream's end. Each request's
   latency is recorded, and every loaded block's page stamps are checked after its request.
3. For each S: drop the page cache again, then S threads each load single-block requests over
   their share of a sample of blocks. Each such latency is a *per-block load latency*: from
   asking for one block to having its bytes, with S streams doing the same at once. Every block
   loaded here is compared byte for byte.
DRAM tier: the same, with no page cache to drop, the loads repeated `dram_repeats` times.

Wrong bytes (a stamp or byte mismatch) end the worker with `wrong_bytes` set; a miss or an
exception ends it with `error`. Either way the worker still closes the system.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import threading
import time
import traceback
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import page_cache

from . import SYSTEMS
from .base import KvSystem
from .workload import Workload, aligned_empty, batches, shares

RESULT_PREFIX = "KV_RESULT "


class WrongBytes(Exception):
    pass


def log(cfg: dict[str, Any], msg: str) -> None:
    print(f"[{cfg['tag']}] {cfg['system']}: {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def store_all(system: KvSystem, wl: Workload, batch: int, buf: np.ndarray) -> dict[str, Any]:
    slots = [buf[j * wl.block_bytes : (j + 1) * wl.block_bytes] for j in range(batch)]
    seconds, latencies = 0.0, []
    for req in batches(list(range(wl.n_blocks)), batch):
        blocks = [wl.fill(i, slots[j]) for j, i in enumerate(req)]
        t0 = time.perf_counter()
        system.store(req, blocks)
        dt = time.perf_counter() - t0
        seconds += dt
        latencies.append(dt)
    t0 = time.perf_counter()
    system.finish_store()
    finish = time.perf_counter() - t0
    seconds += finish
    return {
        "seconds": seconds,
        "bytes": wl.total_bytes,
        "gbps": wl.total_bytes / seconds / 1e9,
        "finish_s": finish,
        "req_p50_ms": median(latencies) * 1e3,
        "req_p99_ms": pct(latencies, 0.99) * 1e3,
    }


def run_streams(
    system: KvSystem,
    wl: Workload,
    work: list[list[list[int]]],
    bufs: list[np.ndarray],
    verify: str,
) -> dict[str, Any]:
    """Each stream s runs the requests work[s]; returns wall time and request latencies."""
    streams = len(work)
    latencies: list[list[float]] = [[] for _ in range(streams)]
    failures: list[BaseException] = []
    barrier = threading.Barrier(streams + 1)

    def stream(s: int) -> None:
        slots = [
            bufs[s][j * wl.block_bytes : (j + 1) * wl.block_bytes]
            for j in range(bufs[s].nbytes // wl.block_bytes)
        ]
        scratch = aligned_empty(wl.block_bytes) if verify == "bytes" else None
        barrier.wait()
        try:
            for req in work[s]:
                t0 = time.perf_counter()
                got = system.load(req, slots[: len(req)])
                latencies[s].append(time.perf_counter() - t0)
                for i, arr in zip(req, got):
                    ok = (
                        wl.bytes_ok(i, arr, scratch)
                        if scratch is not None
                        else wl.stamps_ok(i, arr)
                    )
                    if not ok:
                        raise WrongBytes(f"block {i}: wrong bytes ({verify} check)")
                system.release(got)
        except BaseException as e:  # reported by the caller
            failures.append(e)

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(streams)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if failures:
        raise failures[0]
    flat = [x for per in latencies for x in per]
    blocks = sum(len(req) for per in work for req in per)
    return {
        "seconds": wall,
        "blocks": blocks,
        "bytes": blocks * wl.block_bytes,
        "gbps": blocks * wl.block_bytes / wall / 1e9,
        "p50_ms": median(flat) * 1e3,
        "p99_ms": pct(flat, 0.99) * 1e3,
        "requests": len(flat),
    }


def load_passes(system, wl, cfg, bufs, drop: bool) -> tuple[dict, dict]:
    loads, latency = {}, {}
    sample = shares(wl.n_blocks, 1, cfg["seed"] + 2)[0][: cfg["latency_blocks"]]
    for s in cfg["streams"]:
        if drop:
            page_cache.drop()
        work = [batches(share, cfg["batch"]) for share in shares(wl.n_blocks, s, cfg["seed"])]
        r = run_streams(system, wl, work, bufs[:s], "stamps")
        loads[str(s)] = r
        log(cfg, f"load, {s} stream(s): {r['gbps']:.2f} GB/s, request p99 {r['p99_ms']:.1f} ms")
    for s in cfg["streams"]:
        if drop:
            page_cache.drop()
        work = [[[i] for i in sample[k::s]] for k in range(s)]
        r = run_streams(system, wl, work, bufs[:s], "bytes")
        latency[str(s)] = r
        log(
            cfg, f"per-block latency, {s} stream(s): p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms"
        )
    return loads, latency


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    spec = SYSTEMS[cfg["system"]]
    wl = Workload(cfg["block_bytes"], cfg["n_blocks"], cfg["seed"])
    system: KvSystem = getattr(importlib.import_module(f"kv_peers.{spec.module}"), spec.cls)()
    streams_max = max(cfg["streams"])
    result: dict[str, Any] = {"durability": system.durability}
    system.open(Path(cfg["root"]), wl, (streams_max + 1) * cfg["batch"])
    try:
        gen = aligned_empty(cfg["batch"] * wl.block_bytes)
        bufs = [aligned_empty(cfg["batch"] * wl.block_bytes) for _ in range(streams_max)]
        for b in [gen, *bufs]:
            b.fill(0)  # fault the pages in now, not inside the first timed pass
            system.register(b)
        result["store"] = store_all(system, wl, cfg["batch"], gen)
        log(cfg, f"store: {result['store']['gbps']:.2f} GB/s")
        if spec.tier == "ssd":
            result["load"], result["latency"] = load_passes(system, wl, cfg, bufs, drop=True)
        else:
            reps = [
                load_passes(system, wl, cfg, bufs, drop=False) for _ in range(cfg["dram_repeats"])
            ]
            result["load"] = {s: _median_run([r[0][s] for r in reps]) for s in reps[0][0]}
            result["latency"] = {s: _median_run([r[1][s] for r in reps]) for s in reps[0][1]}
        result["extra"] = system.extra()
    finally:
        system.close()
    return result


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    for key in ("gbps", "p50_ms", "p99_ms", "seconds"):
        out[key] = median(r[key] for r in runs)
    out["repeats"] = len(runs)
    return out


def main() -> None:
    cfg = json.loads(sys.argv[1])
    t0 = time.perf_counter()
    try:
        result = run(cfg)
    except WrongBytes as e:
        log(cfg, f"WRONG BYTES: {e}")
        result = {"error": f"wrong bytes: {e}", "wrong_bytes": True}
    except Exception as e:  # every failure is reported, not raised
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["worker_s"] = time.perf_counter() - t0
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    result["maxrss_gib"] = usage.ru_maxrss / 2**20
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


if __name__ == "__main__":
    main()
