"""Issue 28: MLPerf Storage's kv_cache_benchmark load on its own file backend and on Sluice.

Two modes:

* ``--mode upstream``: the benchmark itself (mlcommons/storage ``kv_cache_benchmark`` at
  commit 23aa82ed, importable as ``kv_cache``; it is on no package registry, so it comes
  from a checkout: ``pip install <checkout>/kv_cache_benchmark``). Each run is its CLI, with
  its own ``NVMeBackend`` or through ``python -m sluice.integrations.mlperf``.
* ``--mode replay`` (the default, and what ``make bench-mlperf`` runs where no checkout is
  installed): the calls the benchmark makes on its storage tier with the GPU and CPU tiers
  at 0 (docs/design/kv-adapters.md §4), issued by this script: ``--users`` request threads,
  at most ``--max-concurrent-allocs`` writes at once, each request writing one whole-context
  entry (llama3.1-8b: 128 KiB a token, float16) after evicting least recently used entries
  past ``--capacity-gib`` through ``delete``, then reading the user's previous turn and a
  decode read of the new entry. The file backend is the documented ``NVMeBackend``
  behaviour (``np.save``, flush, ``fsync``; ``posix_fadvise(DONTNEED)`` then ``np.load``
  and a copy; ``unlink``), written here from the contract.

Runs alternate file, sluice, file, sluice, ... and the script prints medians (min-max) over
the runs, and sluice/file ratios: write and read latency p50 and p95 (per call, as the
benchmark times them), disk use (sampled every 0.2 s: peak, and the mean over the run's
second half) against the bytes the cache believed it held, and lost entries (a read of an
entry the cache holds that did not come back, and writes refused past capacity).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # llama3.1-8b: layers, K and V, kv heads, head dim, fp16
GIB = 1 << 30


class FileBackend:
    """The benchmark's ``NVMeBackend`` as docs/design/kv-adapters.md §4.1 describes it."""

    def __init__(self, base: Path) -> None:
        self.base_path = base
        base.mkdir(parents=True, exist_ok=True)
        self.failed_reads = self.rejected_writes = self.raced_reads = 0

    def _path(self, key: str) -> Path:
        return self.base_path / f"{key}.npy"

    def write(self, key: str, data: np.ndarray) -> float:
        start = time.perf_counter()
        with open(self._path(key), "wb") as f:
            np.save(f, data, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - start

    def read(self, key: str) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        path = self._path(key)
        if not path.exists():
            raise KeyError(key)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        data = np.array(np.load(path, allow_pickle=False))
        return data, time.perf_counter() - start

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class SluiceBackend:
    """The adapter; ``unaligned`` puts its buffers 16 bytes off a 4 KiB boundary, as
    malloc leaves numpy's, which is how the adapter ran before issue 28 (the diagnosis)."""

    def __init__(
        self, base: Path, capacity: int, block: str, unaligned: bool = False, **options: Any
    ) -> None:
        from sluice.integrations import mlperf

        if unaligned:

            def misaligned(nbytes: int) -> np.ndarray:
                raw = np.empty(nbytes + 2 * mlperf.ALIGN, np.uint8)
                off = -raw.ctypes.data % mlperf.ALIGN + 16
                return raw[off : off + nbytes]

            mlperf._aligned_empty = misaligned
        ssd = int(capacity / 0.95) + (64 << 20)
        self.b = mlperf.SluiceKVBenchBackend(str(base), block_bytes=block, ssd=ssd, **options)
        self.unaligned = unaligned
        self.aligned_empty = mlperf._aligned_empty
        self.host_s: list[float] = []  # the aligned copy
        self.device_s: list[float] = []  # the store's put_batch

    def write(self, key: str, data: np.ndarray) -> float:
        t = self.b.write(key, data)
        self.host_s.append(t.host)
        self.device_s.append(t.device)
        return t.total

    def read(self, key: str) -> tuple[np.ndarray, float]:
        data, t = self.b.read(key)
        return data, t.total

    def delete(self, key: str) -> None:
        self.b.delete(key)

    def close(self) -> None:
        self.staged_writes = self.b._store.stats()["staged_writes"]
        self.b.close()
        if self.unaligned:
            import importlib

            from sluice.integrations import mlperf

            importlib.reload(mlperf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.b, name)


def disk_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (st_blocks), as ``du`` counts them."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class Cache:
    """The benchmark's storage-tier bookkeeping: LRU entries under a byte limit, evicted
    by ``delete`` before a write that would not fit; every call timed."""

    def __init__(self, backend: Any, capacity: int, concurrent_allocs: int) -> None:
        self.backend = backend
        self.capacity = capacity
        self.entries: dict[str, list] = {}  # key -> [size, last_access, checksum]
        self.used = 0
        self.lock = threading.Lock()
        self.allocs = threading.Semaphore(concurrent_allocs)
        self.writes: list[float] = []
        self.reads: list[float] = []
        self.lost = 0

    def _make_room(self, size: int) -> None:
        while True:
            with self.lock:
                if self.used + size <= self.capacity or not self.entries:
                    self.used += size
                    return
                key = min(self.entries, key=lambda k: self.entries[k][1])
                victim_size = self.entries.pop(key)[0]
                self.used -= victim_size
            self.backend.delete(key)

    def write(self, key: str, data: np.ndarray) -> None:
        with self.allocs:
            self._make_room(data.nbytes)
            try:
                t = self.backend.write(key, data)
            except Exception:
                with self.lock:
                    self.used -= data.nbytes
                return
        with self.lock:
            self.entries[key] = [data.nbytes, time.monotonic(), data.reshape(-1)[:64].tobytes()]
            self.writes.append(t)

    def read(self, key: str) -> None:
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                return
            e[1] = time.monotonic()
        try:
            data, t = self.backend.read(key)
        except KeyError:
            return  # deleted by another request meanwhile: the benchmark's race too
        except Exception:
            with self.lock:
                self.lost += 1
            return
        with self.lock:
            self.reads.append(t)
            if key in self.entries and data.reshape(-1)[:64].tobytes() != self.entries[key][2]:
                self.lost += 1


def entry(rng: random.Random, noise: np.ndarray, tokens: int) -> np.ndarray:
    """A fresh (layers, 2, tokens, 8, 128) float16 context, copied from the noise buffer as
    the benchmark's generator does (so it lies wherever malloc puts it)."""
    n = tokens * BYTES_PER_TOKEN // 2
    start = rng.randrange(0, noise.size - n)
    data = noise[start : start + n].copy()
    return data.reshape(32, 2, tokens, 8, 128)


def run_once(kind: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    base = Path(args.dir) / kind
    shutil.rmtree(base, ignore_errors=True)
    capacity = int(args.capacity_gib * GIB)
    if kind == "file":
        backend: Any = FileBackend(base)
    else:
        name, *opts = kind.split("+")
        options = {k: int(v) if v.isdigit() else v for k, v in (o.split("=", 1) for o in opts)}
        backend = SluiceBackend(
            base, capacity, args.block, unaligned=name == "sluice-unaligned", **options
        )
    cache = Cache(backend, capacity, args.max_concurrent_allocs)
    noise = np.random.default_rng(seed).standard_normal(args.noise_mib << 19).astype(np.float16)
    stop = time.monotonic() + args.duration
    samples: list[tuple[float, int, int]] = []

    def user(u: int) -> None:
        rng = random.Random(seed * 1000 + u)
        prev: Optional[str] = None
        turn = 0
        while time.monotonic() < stop:
            turn += 1
            key = f"conv_{u}_turn_{turn}"
            cache.write(key, entry(rng, noise, rng.randint(args.min_tokens, args.max_tokens)))
            if prev is not None:
                cache.read(prev)  # the multi-turn reload of the previous turn
            cache.read(key)  # decode reads the new context
            prev = key

    threads = [threading.Thread(target=user, args=(u,)) for u in range(args.users)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        with cache.lock:
            held = cache.used
        samples.append((time.monotonic() - t0, disk_bytes(base), held))
        time.sleep(0.2)
    for t in threads:
        t.join()
    lost = cache.lost + backend.failed_reads + backend.rejected_writes
    backend.close()
    staged = getattr(backend, "staged_writes", 0)
    shutil.rmtree(base, ignore_errors=True)
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1e3 if xs else float("nan")  # noqa: E731
    split = {}
    if kind != "file":  # the adapter's aligned copy and the store's put_batch
        split = {"write_copy_p50_ms": pct(backend.host_s, 50),
                 "write_put_p50_ms": pct(backend.device_s, 50)}  # fmt: skip
    half = [s for s in samples if s[0] >= args.duration / 2] or samples
    return {
        "kind": kind,
        "writes": len(cache.writes),
        "reads": len(cache.reads),
        "write_p50_ms": pct(cache.writes, 50),
        "write_p95_ms": pct(cache.writes, 95),
        "read_p50_ms": pct(cache.reads, 50),
        "read_p95_ms": pct(cache.reads, 95),
        "disk_peak_gib": max(s[1] for s in samples) / GIB,
        "disk_mean_gib": statistics.mean(s[1] for s in half) / GIB,
        "held_mean_gib": statistics.mean(s[2] for s in half) / GIB,
        "lost_entries": lost,
        "staged_writes": staged,
        **split,
    }


def run_upstream(kind: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One run of the benchmark's own CLI; its JSON results give the latencies."""
    base = Path(args.dir) / kind
    shutil.rmtree(base, ignore_errors=True)
    out = Path(args.dir) / f"{kind}-{seed}.json"
    bench = [
        "--model", "llama3.1-8b", "--num-users", str(args.users),
        "--duration", str(args.duration), "--gpu-mem-gb", "0", "--cpu-mem-gb", "0",
        "--max-concurrent-allocs", str(args.max_concurrent_allocs),
        "--cache-dir", str(base), "--storage-capacity-gb", str(args.capacity_gib),
        "--seed", str(seed), "--output", str(out),
    ]  # fmt: skip
    if args.config:
        bench = ["--config", args.config, *bench]
    if kind == "file":
        cmd = [sys.executable, "-c", "import sys, kv_cache.cli; sys.argv[0]='kv-cache.py'; "
               "kv_cache.cli.main()", *bench]  # fmt: skip
    else:
        ssd = int(args.capacity_gib * GIB / 0.95) + (64 << 20)
        cmd = [sys.executable, "-m", "sluice.integrations.mlperf", "--sluice-ssd", str(ssd),
               "--sluice-block-bytes", args.block, "--", *bench]  # fmt: skip
    samples: list[int] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None:
        samples.append(disk_bytes(base) if base.exists() else 0)
        time.sleep(0.2)
    log = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed ({proc.returncode}):\n{log[-3000:]}")
    res = json.loads(out.read_text())
    stor = res.get("storage_io_latency_ms", res.get("storage", {}))
    shutil.rmtree(base, ignore_errors=True)
    lost = 0
    for line in log.splitlines():
        if line.startswith("sluice: ") and "failed reads" in line:
            parts = dict(p.rsplit(": ", 1) for p in line[8:].split(", ")[1:])
            lost = int(parts["failed reads"]) + int(parts["writes refused past capacity"])
    half = samples[len(samples) // 2 :] or samples
    return {
        "kind": kind,
        "write_p50_ms": stor.get("write_p50_ms", float("nan")),
        "write_p95_ms": stor.get("write_p95_ms", float("nan")),
        "read_p50_ms": stor.get("read_p50_ms", float("nan")),
        "read_p95_ms": stor.get("read_p95_ms", float("nan")),
        "disk_peak_gib": max(samples, default=0) / GIB,
        "disk_mean_gib": statistics.mean(half) / GIB if half else 0.0,
        "held_mean_gib": float("nan"),
        "lost_entries": lost,
    }


def summarize(results: list[dict[str, Any]]) -> str:
    fields = [
        ("write_p50_ms", "write p50 ms"),
        ("write_p95_ms", "write p95 ms"),
        ("read_p50_ms", "read p50 ms"),
        ("read_p95_ms", "read p95 ms"),
        ("disk_peak_gib", "disk peak GiB"),
        ("disk_mean_gib", "disk mean GiB (2nd half)"),
        ("held_mean_gib", "held by the cache GiB (2nd half)"),
        ("lost_entries", "lost entries (sum)"),
        ("staged_writes", "staged writes (sum)"),
        ("writes", "writes"),
        ("reads", "reads"),
    ]
    kinds = list(dict.fromkeys(r["kind"] for r in results))
    others = [k for k in kinds if k != "file"]
    head = " | ".join(kinds + [f"{k} / file" for k in others])
    rows = [f"| | {head} |", "|---|" + "---:|" * (len(kinds) + len(others))]
    for f, name in fields:
        by = {k: [r[f] for r in results if r["kind"] == k and f in r] for k in kinds}
        if not all(by.values()):
            continue
        if f in ("lost_entries", "staged_writes"):
            rows.append(f"| {name} | " + " | ".join(str(sum(by[k])) for k in kinds) + " |")
            continue
        med = {k: statistics.median(v) for k, v in by.items()}
        cells = [f"{med[k]:.3g} ({min(by[k]):.3g}-{max(by[k]):.3g})" for k in kinds]
        base = med.get("file")
        ratios = [f"{med[k] / base:.2f}x" if base else "" for k in others]
        rows.append(f"| {name} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["replay", "upstream", "auto"], default="auto")
    p.add_argument("--dir", default="/var/tmp/sluice-bench-mlperf")
    p.add_argument("--runs", type=int, default=3, help="runs per backend")
    p.add_argument("--duration", type=float, default=25.0, help="seconds per run")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--max-concurrent-allocs", type=int, default=2)
    p.add_argument("--capacity-gib", type=float, default=1.5)
    p.add_argument("--min-tokens", type=int, default=160)
    p.add_argument("--max-tokens", type=int, default=800)
    p.add_argument("--noise-mib", type=int, default=256)
    p.add_argument("--block", default="1MiB", help="Sluice's block size")
    p.add_argument("--config", default=None, help="upstream: the benchmark's config.yaml")
    p.add_argument("--json", default=None, help="write every run's figures here")
    p.add_argument(
        "--kinds",
        default="file,sluice",
        help="backends to alternate; sluice-unaligned (replay) is the adapter's buffers as "
        "they were before issue 28; sluice+KEY=VALUE+... passes store options (io_threads=4)",
    )
    args = p.parse_args()
    mode = args.mode
    if mode == "auto":
        try:
            import kv_cache.cli  # noqa: F401

            mode = "upstream"
        except ImportError:
            mode = "replay"
    run = run_upstream if mode == "upstream" else run_once
    print(f"mode: {mode}; {args.runs} runs per backend, alternating", flush=True)
    results = []
    for i in range(args.runs):
        kinds = args.kinds.split(",")
        order = kinds if i % 2 == 0 else kinds[::-1]
        for kind in order:
            r = run(kind, args, seed=42 + i)
            results.append(r)
            print(json.dumps(r), flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
