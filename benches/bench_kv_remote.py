"""`make bench-kv-remote` (issue 30): the KV shared tier in an object store, block loads
against the server's parallel-GET ceiling.

The setup (root; everything it creates is removed on exit, Ctrl-C and SIGTERM included) is
bench_remote.py's: MinIO in a network namespace of its own over a veth pair, its data under
--work-dir, and one calibrated `sluice-faultproxy` per round trip asked for (--rtts, default
5 ms) that every reader at that round trip goes through.

For each block size (--blocks, default 2 MiB and 32 MiB), --gib of blocks:
1. a writer process puts them into a store whose shared tier is the bucket's prefix
   (`sluice.kv.open(remote=...)`, no proxy) and closes it: every segment is up, and each
   block's BLAKE2b is kept;
2. each round, at each round trip, every reader runs as a fresh worker process (page cache
   dropped first), in rotating order:
   - `sluice`: another store, its own directory, an SSD tier as large as the data (blocks
     found in the object store are promoted into it, as a user's store does), the same
     prefix as `remote`. It gets --probes blocks one at a time (latency per block), then
     the rest in batches of --batch-mib back to back, timed: *load GB/s*. Every block is
     hashed once all are in, outside the timing, and compared;
   - `sluice-noprom`: the same with no SSD tier (nothing promoted: network reads alone);
   - `ceiling`: the server's ceiling on the same bytes: presigned ranged GETs over
     http.client, each block's record range (and 8 MiB pieces of it, as Sluice cuts), bytes
     discarded, on 8, 16 and 32 threads, the best kept; its per-block latency is one block's
     pieces fetched at once.

The report gives medians and ranges over --runs rounds, the ratio to the ceiling (target
>= 0.8) and p50/p99 per block; it writes bench-kv-remote.{md,json,png} under --out.

CPU seconds per GB loaded (every thread of the reader's process) are reported beside the
rates: on a host where the server, the proxy and the reader share two cores, they decide.
BENCH_PERF=1 records each reader under `perf record -g` (/tmp/perf-<reader>.data).

    sudo make bench-kv-remote
    sudo .venv/bin/python benches/bench_kv_remote.py --gib 0.25 --runs 1 --out /tmp/bkr
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import resource
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_remote as br  # noqa: E402  (the MinIO, namespace and proxy set-up)
import page_cache  # noqa: E402
from minio_bench import client_env, finish, med, s3_client, servers_up  # noqa: E402

ROOT = HERE.parent
RESULT_PREFIX = "BENCH_RESULT "
MiB = 2**20
GiB = 2**30
READERS = ("sluice", "sluice-noprom", "ceiling")
CEILING_THREADS = (8, 16, 32)
PIECE = 8 * MiB  # sluice-remote's default piece
WORKER_TIMEOUT_S = 1800
MODEL = "bench-kv-remote"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="bytes of blocks per block size")
    p.add_argument("--blocks", default="2MiB,32MiB", help="block sizes")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rtts", default="5", help="round trips in ms, through the proxy")
    p.add_argument("--readers", default=",".join(READERS))
    p.add_argument("--batch-mib", type=int, default=128, help="bytes per get batch")
    p.add_argument("--probes", type=int, default=16, help="blocks fetched one at a time")
    p.add_argument("--work-dir", type=Path, default=Path("/var/tmp/sluice-bench-kv-remote"))
    p.add_argument("--minio", type=Path, default=br.DEFAULT_MINIO)
    p.add_argument("--proxy", type=Path, default=br.DEFAULT_PROXY)
    p.add_argument("--out", type=Path, default=ROOT / "docs")
    p.add_argument("--json-only", action="store_true", help="no markdown or plot")
    # Worker mode (internal).
    p.add_argument("--worker", choices=(*READERS, "writer"))
    p.add_argument("--endpoint")
    p.add_argument("--prefix")
    p.add_argument("--block-bytes", type=int)
    p.add_argument("--count", type=int)
    p.add_argument("--dir", type=Path)
    return p.parse_args(argv)


def size_bytes(s: str) -> int:
    units = {"KiB": 2**10, "MiB": MiB, "GiB": GiB}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


# ---------------------------------------------------------------------------------------------
# Workers


def keys_for(count: int) -> list[bytes]:
    return [b"bench-block-%08d" % i for i in range(count)]


def open_store(args: argparse.Namespace, **kw):
    import sluice.kv

    return sluice.kv.open(
        args.dir,
        block_bytes=args.block_bytes,
        model=MODEL,
        remote=f"s3://{br.BUCKET}/{args.prefix}",
        **kw,
    )


def run_writer(args: argparse.Namespace) -> dict[str, Any]:
    """Puts `count` random blocks and closes the store (its last pass uploads the rest)."""
    import numpy as np

    b, n = args.block_bytes, args.count
    total = b * n
    keys = keys_for(n)
    hashes = []
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    kv = open_store(args, shared=int(total * 1.25) + 64 * b)
    per = max(1, (64 * MiB) // b)
    for i in range(0, n, per):
        batch = [rng.integers(0, 256, b, dtype=np.uint8) for _ in keys[i : i + per]]
        hashes += [hashlib.blake2b(x, digest_size=16).hexdigest() for x in batch]
        ok = kv.put_batch(keys[i : i + per], batch)
        if not all(ok):
            raise SystemExit(f"put failed at block {i}: {ok}")
    kv.close()
    return {"hashes": hashes, "put_s": time.perf_counter() - t0}


def run_sluice(args: argparse.Namespace, promote: bool) -> dict[str, Any]:
    import numpy as np

    hashes = json.loads((args.work_dir / f"hashes-{args.block_bytes}.json").read_text())
    b, n = args.block_bytes, len(hashes)
    keys = keys_for(n)
    t0 = time.perf_counter()
    kv = open_store(args, ssd=(n + 64) * b if promote else 0)
    open_s = time.perf_counter() - t0
    found = kv.lookup(keys)
    mismatches: list[int] = []
    lat: list[float] = []
    probes = min(args.probes, n // 2)
    buf = [np.empty(b, np.uint8)]
    for i in range(probes):
        t = time.perf_counter()
        ok = kv.get_batch_into(keys[i : i + 1], buf)
        lat.append(time.perf_counter() - t)
        if ok != [True] or hashlib.blake2b(buf[0], digest_size=16).hexdigest() != hashes[i]:
            mismatches.append(i)
    # Batches back to back into buffers for every block, checked once all are in: a pause
    # between batches would let TCP's window close on every connection (slow start after
    # idle), which the ceiling, never pausing, would not pay.
    per = max(1, (args.batch_mib * MiB) // b)
    bufs = [np.ones(b, np.uint8) for _ in range(n - probes)]
    oks: list[bool] = []
    t, c = time.perf_counter(), cpu_s()
    for i in range(probes, n, per):
        batch = keys[i : i + per]
        oks += kv.get_batch_into(batch, bufs[i - probes : i - probes + len(batch)])
    took, cpu = time.perf_counter() - t, cpu_s() - c
    for j, good in enumerate(oks):
        digest = hashlib.blake2b(bufs[j], digest_size=16).hexdigest()
        if not good or digest != hashes[probes + j]:
            mismatches.append(probes + j)
    stats = kv.stats()
    kv.close()
    loaded = (n - probes) * b
    return {
        "open_s": open_s,
        "found": found,
        "load_s": took,
        "load_bytes": loaded,
        "load_bytes_per_s": loaded / took,
        "cpu_s": cpu,
        "latencies_s": lat,
        "mismatches": mismatches,
        "hits_shared": stats["hits_shared"],
        "read_failures": stats["foreign"]["read_failures"],
    }


def segments(client, prefix: str) -> list[tuple[str, int]]:
    """(segment key, size) of every stored segment under `prefix`."""
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=br.BUCKET, Prefix=prefix + "/"
    ):
        objs = page.get("Contents", [])
        out += [(o["Key"], o["Size"]) for o in objs if o["Key"].endswith(".skv")]
    return out


def run_ceiling(args: argparse.Namespace) -> dict[str, Any]:
    """Ranged GETs of every record's bytes (header and payload, as Sluice reads them) in
    pieces of at most PIECE, presigned, over kept-alive http.client connections."""
    b = args.block_bytes
    slot = 4096 + -(-b // 4096) * 4096  # a record's header and its padded payload
    client = s3_client(args.endpoint)
    ranges: list[tuple[str, int, int]] = []
    for key, size in segments(client, args.prefix):
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": br.BUCKET, "Key": key}, ExpiresIn=3600
        )
        for s in range(1, size // slot + (1 if size % slot >= 4096 + b else 0)):
            at = s * slot
            for p in range(0, 4096 + b, PIECE):
                ranges.append((url, at + p, min(PIECE, 4096 + b - p)))
    total = sum(n for _, _, n in ranges)
    best: dict[str, Any] = {}
    for threads in CEILING_THREADS:
        t0, c0 = time.perf_counter(), cpu_s()
        got = get_all(ranges, threads)
        took = time.perf_counter() - t0
        cpu = cpu_s() - c0
        if got != total:
            raise SystemExit(f"ceiling read {got} of {total} bytes")
        rate = total / took
        if not best or rate > best["load_bytes_per_s"]:
            best = {"load_bytes_per_s": rate, "threads": threads, "load_s": took, "cpu_s": cpu}
    # Per block: one record's pieces at once, block after block.
    per_block = -(-(4096 + b) // PIECE)
    lat = []
    for i in range(min(args.probes, len(ranges) // per_block // 2)):
        t0 = time.perf_counter()
        get_all(ranges[i * per_block : (i + 1) * per_block], per_block)
        lat.append(time.perf_counter() - t0)
    best.update(load_bytes=total, latencies_s=lat, mismatches=[])
    return best


def cpu_s() -> float:
    """CPU seconds this process (every thread) has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def get_all(ranges: list[tuple[str, int, int]], threads: int) -> int:
    """Fetches every range on `threads` threads, one kept-alive connection each, into one
    reused buffer per thread; returns the bytes read."""
    jobs, lock, done = iter(ranges), threading.Lock(), [0]

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        buf = memoryview(bytearray(PIECE))
        while True:
            with lock:
                job = next(jobs, None)
            if job is None:
                break
            url, at, length = job
            parts = urllib.parse.urlsplit(url)
            if conn is None:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
            headers = {"Range": f"bytes={at}-{at + length - 1}"}
            conn.request("GET", f"{parts.path}?{parts.query}", headers=headers)
            resp = conn.getresponse()
            if resp.status != 206:
                raise SystemExit(f"ceiling GET failed: {resp.status} {resp.reason}")
            br.read_exact(resp.readinto, buf[:length])
            with lock:
                done[0] += length

    br.run_threads(worker, threads)
    return done[0]


def worker_main(args: argparse.Namespace) -> None:
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.worker == "writer":
        r = run_writer(args)
    elif args.worker == "ceiling":
        r = run_ceiling(args)
    else:
        r = run_sluice(args, promote=args.worker == "sluice")
    print(RESULT_PREFIX + json.dumps(r), flush=True)


# ---------------------------------------------------------------------------------------------
# Parent: the server, the proxies, the rounds


def run_worker(
    worker: str, endpoint: str, prefix: str, block: int, args, store_dir: Path, count: int = 0
) -> dict[str, Any]:
    env = dict(os.environ, **client_env(endpoint))
    # numpy's OpenBLAS threads spin while idle (8% of a reader's samples): no BLAS here.
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker]
    cmd += ["--endpoint", endpoint, "--prefix", prefix, "--block-bytes", str(block)]
    cmd += ["--count", str(count), "--dir", str(store_dir), "--work-dir", str(args.work_dir)]
    cmd += ["--probes", str(args.probes), "--batch-mib", str(args.batch_mib)]
    if os.environ.get("BENCH_PERF") and worker != "writer":
        cmd = ["perf", "record", "-F", "999", "-g", "-o", f"/tmp/perf-{worker}.data", "--", *cmd]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False
    )
    subprocess.run(["rm", "-rf", str(store_dir)], check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"error": f"{worker}: exit {proc.returncode}: {tail}"}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """(block size, rtt) -> reader -> medians."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in runs:
        if "error" in r:
            continue
        key = f"{r['block'] // MiB} MiB @ {r['rtt']}"
        out.setdefault(key, {}).setdefault(r["reader"], {"runs": []})["runs"].append(r)
    for readers in out.values():
        for row in readers.values():
            rs = row.pop("runs")
            row["gbps"] = med([r["load_bytes_per_s"] / 1e9 for r in rs])
            row["cpu_s_per_gb"] = med([r["cpu_s"] / (r["load_bytes"] / 1e9) for r in rs])
            lat = [x for r in rs for x in r["latencies_s"]]
            row["p50_ms"] = pct(lat, 0.5) * 1e3 if lat else None
            row["p99_ms"] = pct(lat, 0.99) * 1e3 if lat else None
            row["mismatches"] = sum(len(r["mismatches"]) for r in rs)
            row["threads"] = sorted({r["threads"] for r in rs if "threads" in r})
            row["open_s"] = med([r.get("open_s") for r in rs])
    return out


def targets(summary) -> list[dict[str, Any]]:
    checks = []
    for key, w in summary.items():
        ceil = w.get("ceiling", {}).get("gbps")
        for name in ("sluice", "sluice-noprom"):
            s = w.get(name)
            if s and ceil:
                r = s["gbps"]["median"] / ceil["median"]
                checks.append(
                    {
                        "case": key,
                        "what": f"{name} load GB/s / parallel-GET ceiling",
                        "value": r,
                        "target": ">= 0.8",
                        "met": r >= 0.8,
                    }
                )
        wrong = sum(row["mismatches"] for row in w.values())
        checks.append(
            {
                "case": key,
                "what": "wrong or missing blocks",
                "value": wrong,
                "target": "0",
                "met": wrong == 0,
            }
        )
    return checks


def fmt(v: dict[str, float] | None, f: str = ".2f") -> str:
    if not v:
        return "-"
    return f"{v['median']:{f}} ({v['min']:{f}}-{v['max']:{f}})"


def markdown(meta: dict[str, Any], summary, checks) -> str:
    lines = [
        "# KV shared tier in an object store (make bench-kv-remote)",
        "",
        f"{meta['date']}, commit {meta['versions']['sluice_commit']}, `{meta['command']}`.",
        f"{meta['gib']} GiB of blocks per size, {meta['runs']} rounds, MinIO in a network "
        "namespace, round trips added by sluice-faultproxy. GB/s: median (min-max) of the "
        "batched load; latency per block over every round's probes.",
        "",
        "| case | reader | load GB/s | p50 ms/block | p99 ms/block | CPU s/GB | open s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, w in summary.items():
        for name, row in w.items():
            shown = name if name != "ceiling" else f"ceiling (GET, {row['threads']} threads)"
            p50 = "-" if row["p50_ms"] is None else f"{row['p50_ms']:.1f}"
            p99 = "-" if row["p99_ms"] is None else f"{row['p99_ms']:.1f}"
            lines.append(
                f"| {key} | {shown} | {fmt(row['gbps'], '.3f')} | {p50} | {p99} | "
                f"{fmt(row['cpu_s_per_gb'])} | {fmt(row['open_s'])} |"
            )
    lines += ["", "| case | target | value | met |", "|---|---|---|---|"]
    for c in checks:
        v = c["value"]
        shown = f"{v:.3f}" if isinstance(v, float) else str(v)
        lines.append(
            f"| {c['case']} | {c['what']} {c['target']} | {shown} | "
            f"{'yes' if c['met'] else 'MISSED'} |"
        )
    lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()), ""]
    return "\n".join(lines)


def plot(summary, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    cases = list(summary)
    names = [n for n in READERS if any(n in summary[c] for c in cases)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        xs = [j + i * width for j in range(len(cases))]
        ys = [summary[c][n]["gbps"]["median"] if n in summary[c] else 0 for c in cases]
        ax.bar(xs, ys, width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases)
    ax.set_ylabel("load GB/s")
    ax.set_title("KV blocks from MinIO through the remote tier vs parallel GETs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parent_main(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the server runs in a network namespace of its own")
    readers = [r for r in args.readers.split(",") if r]
    bad = [r for r in readers if r not in READERS]
    if bad:
        raise SystemExit(f"--readers: unknown {bad}; known: {', '.join(READERS)}")
    blocks = [size_bytes(b) for b in args.blocks.split(",") if b]
    rtts = [float(x) for x in args.rtts.split(",") if x]
    br.install_signal_exits()
    runs: list[dict[str, Any]] = []
    with br.Stack() as stack:
        upstream, endpoints = servers_up(stack, args, rtts)
        for block in blocks:
            count = max(8, int(args.gib * GiB) // block)
            prefix = f"kv-{block}"
            w = run_worker("writer", upstream, prefix, block, args, args.work_dir / "writer", count)
            if "error" in w:
                raise SystemExit(w["error"])
            (args.work_dir / f"hashes-{block}.json").write_text(json.dumps(w["hashes"]))
            print(f"{block // MiB} MiB: {count} blocks up in {w['put_s']:.1f} s", flush=True)
            for rnd in range(args.runs):
                for ep in endpoints[rnd % len(endpoints) :] + endpoints[: rnd % len(endpoints)]:
                    k = rnd % len(readers)
                    for name in readers[k:] + readers[:k]:
                        page_cache.drop()
                        r = run_worker(name, ep.url, prefix, block, args, args.work_dir / "r")
                        r.update(reader=name, block=block, rtt=ep.key, round=rnd)
                        runs.append(r)
                        brief = r.get("error") or {
                            "GB/s": round(r["load_bytes_per_s"] / 1e9, 3),
                            "p99 ms": round(pct(r["latencies_s"], 0.99) * 1e3, 1)
                            if r["latencies_s"]
                            else None,
                        }
                        print(f"round {rnd} {block // MiB} MiB {ep.key} {name}: {brief}")
    summary = summarize(runs)
    checks = targets(summary)
    dists = ("sluice", "numpy", "botocore")
    return finish(args, "bench-kv-remote", dists, endpoints, runs, summary, checks, markdown, plot)


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
        return
    raise SystemExit(parent_main(args))


if __name__ == "__main__":
    main()
