"""`make bench-remote` (issue 15): loading a sharded checkpoint from S3, Sluice against peers.

The setup (root; everything it creates is removed on exit, Ctrl-C and SIGTERM included):
1. A synthetic Llama-shaped bf16 checkpoint (synth_checkpoint.py; 4 GiB in 8 shards by default)
   under --work-dir (/var/tmp, ext4), uploaded with boto3 to a MinIO server that runs in a
   network namespace of its own (`sluice-bench`), reached over a veth pair
   (host 10.231.0.1/30, namespace 10.231.0.2/30).
2. One `sluice-faultproxy` per round trip asked for (--rtts, default 0,5,20 ms), listening on
   127.0.0.1 and forwarding to MinIO. It holds every byte --delay-ms in each direction and its
   timers add about 1.4 ms more each way, so --delay-ms is calibrated: the value whose measured
   added round trip (median of small GETs, less the same GETs direct) is closest to the one
   asked for, reported with it. Every reader at a given round trip goes through the same proxy
   endpoint. `direct` is MinIO without the proxy, so the proxy's own cost shows next to its
   0 ms row.

The readers, each run as a fresh worker process (this script with --worker) that imports its
libraries, notes its baseline RSS, allocates the destination state dict and touches it
(torch.empty + zero_, bench_readers.Consumer), times the load including every copy into that
destination, and prints one result line; the parent reaps it with wait4 for its peak RSS:
- `local`: safetensors.torch.load_file over the shards on local disk, page cache dropped (the
  reference every remote number is also compared with);
- `ceiling-8`, `ceiling-32`: the server's ceiling, 8 or 32 threads of parallel ranged GETs
  (8 MiB ranges over every object) that discard the bytes: presigned URLs and http.client
  `readinto` into one reused buffer per thread, the fastest Python client measured here;
- `runai`: Run:ai model streamer over s3:// (runai-model-streamer + runai-model-streamer-s3);
- `boto3`: boto3 ranged GETs (8 MiB, 32 threads) that read each body straight into the
  preallocated destination tensors, headers read the same way;
- `sluice`: sluice.torch.load_file("s3://bucket/prefix") with default flags (the headline);
- `sluice-stream`: sluice.torch.stream over the same URL (default 512 MiB memory_limit), each
  tensor copied into the destination as it lands;
- `rclone`: an rclone mount of the prefix with the full VFS cache (Debian's rclone), fresh
  for every run with an empty cache directory, and safetensors.torch.load_file over it;
- `s3fs`: an s3fs-fuse mount of the bucket per endpoint (Debian's s3fs; skipped with the
  reason where it is not installed) and safetensors.torch.load_file over it;
- `sluice-mount-1t`, `sluice-mount-2t`: a fresh `sluice mount` of the prefix and unmodified
  safetensors.torch.load_file over it, on 1 or 2 torch threads;
- `sluice-mount-warm`: the second load through one mount (the first, untimed, fills its pool);
- `sluice-mount-disk`: a mount restarted over a `--cache-dir` a first mount filled;
- `sluice-mount-warm-disk`: the second load through a mount with `--cache-dir`, whose whole
  cached files are passed through to the kernel;
- `local-warm`: safetensors.torch.load_file over the local shards with a warm page cache.

The page cache is dropped before every run (MinIO's disk and the local shards alike). Runs are
interleaved: each round runs every (round trip, reader) pair once, rotating the order of the
round trips and of the readers inside each, so disk and network noise lands on all of them.
Each reader's result is compared once per round trip (round 1) with SHA-1 hashes of every
tensor's bytes in the source files. The report gives the median GB/s (1e9 bytes/s) over the
rounds, its ratio to the ceiling (the better of ceiling-8 and ceiling-32 at that round trip)
and to the cold local load, and the peak RSS, and checks the issue's targets. It writes
bench-remote.{md,json,png} under --out.

A reader may carry environment settings as an extra, separately labelled row, e.g.
`--readers sluice,sluice+SLUICE_REMOTE_PIECE_BYTES=33554432` (how the peers' settings were
chosen). `--from-json` rewrites the report from an earlier run's JSON without running anything.

    make bench-remote
    .venv/bin/python benches/bench_remote.py --gib 0.5 --runs 1 --rtts 0,5 --out /tmp/br
    .venv/bin/python benches/bench_remote.py --gib 2 --runs 2 --rtts 5 --no-direct --keep-data \
        --readers ceiling-8,runai,runai+RUNAI_STREAMER_OBJ_CONCURRENCY=8 --out /tmp/br
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import http.client
import importlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import page_cache
import synth_checkpoint

ROOT = Path(__file__).resolve().parent.parent
RESULT_PREFIX = "BENCH_RESULT "
GiB = 2**30
MiB = 2**20

# The server and the network namespace it runs in. Only these, loopback and the proxies'
# loopback ports are ever addressed.
NETNS = "sluice-bench"
VETH_HOST, VETH_NS = "sb-host", "sb-ns"
HOST_IP, NS_IP = "10.231.0.1", "10.231.0.2"
MINIO_PORT = 9000
BUCKET = "sluice-bench"
# Throwaway credentials of a server that lives for one benchmark run on a private address.
ACCESS_KEY, SECRET_KEY = "sluicebench", "sluicebench-secret-key"
REGION = "us-east-1"
DEFAULT_MINIO = Path.home() / ".cache/sluice/bin/minio"
DEFAULT_PROXY = ROOT / "target/release/sluice-faultproxy"
SLUICE_BIN = ROOT / "target/release/sluice"

# Peer settings (see the module docstring and docs/bench-remote.md for how they were chosen).
BOTO3_THREADS = 32
BOTO3_RANGE_BYTES = 8 * MiB
CEILING_RANGE_BYTES = 8 * MiB
HEADER_PROBE_BYTES = 64 * 1024
# Run:ai's best settings on this machine kind (2 vCPUs), from sweeps at a 5 ms round trip of
# RUNAI_STREAMER_OBJ_CONCURRENCY 2/4/8/16/32/64 and RUNAI_STREAMER_CHUNK_BYTESIZE 8/32/64 MiB:
# 4 clients with 32 MiB reads beat its defaults (8 clients, 8 MiB) by about 1.3x.
RUNAI_CONCURRENCY = 4
RUNAI_CHUNK_BYTES = 32 * MiB
SLUICE_MEMORY_LIMIT = 512 * MiB  # sluice.stream's and the loaders' documented default
WORKER_TIMEOUT_S = 900
# CPUs that other work may keep busy just before a run without the report calling it noisy.
BUSY_CPUS = 0.25


@dataclass(frozen=True)
class Reader:
    label: str
    modules: tuple[str, ...] = ()
    remote: bool = True
    # Whether it fills the destination (and so can be checked against the source hashes).
    fills: bool = True
    env: dict[str, str] = field(default_factory=dict)


READERS: dict[str, Reader] = {
    "local": Reader("safetensors load_file, cold local disk", ("safetensors.torch",), remote=False),
    "ceiling-8": Reader("ceiling: 8 parallel ranged GETs (bytes discarded)", fills=False),
    "ceiling-32": Reader("ceiling: 32 parallel ranged GETs (bytes discarded)", fills=False),
    "runai": Reader("Run:ai streamer s3://", ("runai_model_streamer", "runai_model_streamer_s3")),
    "boto3": Reader(
        f"boto3 ranged GETs ({BOTO3_RANGE_BYTES // MiB} MiB, {BOTO3_THREADS} threads)", ("boto3",)
    ),
    "sluice": Reader("Sluice load_file s3:// (default flags)", ("sluice.torch",)),
    "sluice-stream": Reader("Sluice stream s3:// (512 MiB limit)", ("sluice.torch",)),
    "sluice-into": Reader("Sluice load_into s3:// (into the parameters)", ("sluice.torch",)),
    "s3fs": Reader("s3fs-fuse mount + safetensors load_file", ("safetensors.torch",)),
    "rclone": Reader(
        "rclone mount (--vfs-cache-mode full) + safetensors load_file", ("safetensors.torch",)
    ),
    "sluice-mount-1t": Reader(
        "sluice mount + safetensors load_file, 1 torch thread", ("safetensors.torch",)
    ),
    "sluice-mount-2t": Reader(
        "sluice mount + safetensors load_file, 2 torch threads", ("safetensors.torch",)
    ),
    "sluice-mount-warm": Reader(
        "sluice mount, second load (pool warm), 2 torch threads", ("safetensors.torch",)
    ),
    "sluice-mount-warm-disk": Reader(
        "sluice mount --cache-dir, second load (whole files passed through), 2 torch threads",
        ("safetensors.torch",),
    ),
    "local-warm": Reader(
        "safetensors load_file, warm local page cache", ("safetensors.torch",), remote=False
    ),
    "sluice-mount-disk": Reader(
        "sluice mount restarted over its filled --cache-dir (page cache cold), 2 torch threads",
        ("safetensors.torch",),
    ),
}
DEFAULT_READERS = [
    *("local", "ceiling-8", "ceiling-32", "runai", "boto3", "sluice", "sluice-stream"),
    *("sluice-into", "s3fs", "rclone"),
    *("sluice-mount-1t", "sluice-mount-2t", "sluice-mount-warm", "sluice-mount-disk"),
    *("sluice-mount-warm-disk", "local-warm"),
]
CEILINGS = ("ceiling-8", "ceiling-32")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=4.0, help="checkpoint size (GiB of tensors)")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=3, help="interleaved rounds (median over them)")
    p.add_argument("--rtts", default="0,5,20", help="round trips added by the proxy, ms")
    p.add_argument(
        "--direct",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run every remote reader against MinIO without the proxy",
    )
    p.add_argument(
        "--readers",
        help=f"comma-separated subset of {','.join(READERS)}; a reader may carry environment "
        "settings as extra, separately labelled rows: sluice+SLUICE_REMOTE_CONCURRENCY=32, "
        "runai+RUNAI_STREAMER_OBJ_CONCURRENCY=32+RUNAI_STREAMER_CHUNK_BYTESIZE=16777216",
    )
    p.add_argument(
        "--runai-concurrency",
        type=int,
        default=RUNAI_CONCURRENCY,
        help="RUNAI_STREAMER_OBJ_CONCURRENCY for the runai reader",
    )
    p.add_argument(
        "--runai-chunk-mib",
        type=int,
        default=RUNAI_CHUNK_BYTES // MiB,
        help="RUNAI_STREAMER_CHUNK_BYTESIZE for the runai reader, MiB",
    )
    p.add_argument("--work-dir", default="/var/tmp/sluice-bench-remote")
    p.add_argument("--minio", default=str(DEFAULT_MINIO))
    p.add_argument("--faultproxy", default=str(DEFAULT_PROXY))
    p.add_argument("--out", default="docs", help="directory for bench-remote.{md,json,png}")
    p.add_argument(
        "--keep-data",
        action="store_true",
        help="leave the checkpoint and MinIO's data in --work-dir for the next run (development)",
    )
    p.add_argument("--keep-page-reporting", action="store_true")
    p.add_argument(
        "--from-json",
        metavar="PATH",
        help="only rewrite the report from an earlier run's bench-remote.json",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--plan", help=argparse.SUPPRESS)
    p.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.rtt_list = [float(x) for x in args.rtts.split(",") if x.strip()]
    return args


# =============================================================================================
# Worker: one reader, one run, one result line.


@dataclass
class Plan:
    """What a worker needs: the local checkpoint, the objects and where to reach them."""

    index: str
    endpoint: str | None
    bucket: str
    prefix: str
    objects: list[dict[str, Any]]  # {"key", "size", "local"} per shard, in name order
    hashes: str
    mount: str | None = None

    @staticmethod
    def load(path: str) -> Plan:
        return Plan(**json.loads(Path(path).read_text()))

    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def worker_main(args: argparse.Namespace) -> None:
    name = base_reader(args.worker)
    reader = READERS[name]
    for module in reader.modules:
        importlib.import_module(module)
    import torch  # noqa: F401  (every worker pays the same import before its baseline)
    from bench_readers import Consumer

    plan = Plan.load(args.plan)
    layout = synth_checkpoint.read_layout(plan.index)
    baseline_rss = current_rss_bytes()
    consumer = Consumer(layout) if reader.fills else None
    run = WORKER_RUNS[name]
    prepare_worker(name, plan)
    seconds, cpu_s, nbytes = timed(lambda: run(plan, consumer, layout))
    maxrss_timed = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hwm = vm_hwm_bytes()
    result: dict[str, Any] = {
        "seconds": seconds,
        "cpu_timed_s": cpu_s,
        "baseline_rss_bytes": baseline_rss,
        "maxrss_timed_bytes": maxrss_timed,
        "vm_hwm_bytes": hwm,
    }
    if consumer is not None:
        consumer.verify_complete()
        result.update(bytes=consumer.dest_bytes, dest_bytes=consumer.dest_bytes)
        if args.verify:
            result["verify"] = verify_hashes(consumer, plan.hashes)
    else:
        result.update(bytes=nbytes, dest_bytes=0)
    sluice = sys.modules.get("sluice")
    stats = getattr(sluice, "last_load_stats", None)
    result["sluice_stats"] = stats() if callable(stats) and name.startswith("sluice") else None
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


def timed(fn) -> tuple[float, float, int]:
    import gc

    gc.collect()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    nbytes = fn() or 0
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return t1 - t0, cpu, nbytes


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def vm_hwm_bytes() -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def tensor_bytes_view(tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor."""
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


def verify_hashes(consumer, hashes_path: str) -> dict[str, Any]:
    """SHA-1 of every destination tensor against the source's; raises on any mismatch."""
    want = json.loads(Path(hashes_path).read_text())["sha1"]

    def one(item):
        name, tensor = item
        return name, hashlib.sha1(tensor_bytes_view(tensor)).hexdigest()

    with ThreadPoolExecutor(2) as pool:
        got = dict(pool.map(one, consumer.dst.items()))
    bad = sorted(n for n in want if got.get(n) != want[n])
    if bad or len(got) != len(want):
        raise AssertionError(f"{len(bad)} tensors differ from the source, e.g. {bad[:3]}")
    return {"tensors": len(got), "bit_exact": True}


# --- local disk ------------------------------------------------------------------------------


def run_local(plan: Plan, consumer, layout) -> None:
    from safetensors.torch import load_file

    for obj in plan.objects:
        consumer.take_all(load_file(obj["local"]))


def run_local_warm(plan: Plan, consumer, layout) -> None:
    run_local(plan, consumer, layout)


def run_sluice_mount(plan: Plan, consumer, layout) -> None:
    """Unmodified safetensors over `sluice mount` (SLUICE_BENCH_MOUNT: the mount point)."""
    from safetensors.torch import load_file

    mnt = os.environ["SLUICE_BENCH_MOUNT"]
    for obj in plan.objects:
        consumer.take_all(load_file(os.path.join(mnt, os.path.basename(obj["key"]))))


def read_through(paths: list[str]) -> None:
    """Reads files whole (untimed), so a second load finds them cached."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(8 * MiB):
                pass


def prepare_worker(name: str, plan: Plan) -> None:
    """Before the clock: torch threads per reader, and the first load of the warm readers."""
    import torch

    threads = {"sluice-mount-1t": 1}.get(name, 2)
    torch.set_num_threads(threads)
    if name == "local-warm":
        read_through([o["local"] for o in plan.objects])
    if name in ("sluice-mount-warm", "sluice-mount-warm-disk"):
        mnt = os.environ["SLUICE_BENCH_MOUNT"]
        read_through([os.path.join(mnt, os.path.basename(o["key"])) for o in plan.objects])


def run_s3fs(plan: Plan, consumer, layout) -> None:
    from safetensors.torch import load_file

    for obj in plan.objects:
        consumer.take_all(load_file(os.path.join(plan.mount, obj["key"])))


# --- the ceiling: parallel ranged GETs, bytes discarded ------------------------------------------


def s3_client(plan: Plan, pool: int = 10):
    import boto3
    from botocore.config import Config

    cfg = Config(
        max_pool_connections=pool,
        s3={"addressing_style": "path"},
        retries={"max_attempts": 3, "mode": "standard"},
        signature_version="s3v4",
    )
    return boto3.client(
        "s3",
        endpoint_url=plan.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=cfg,
    )


def run_ceiling(threads: int):
    def run(plan: Plan, consumer, layout) -> int:
        piece = int(os.environ.get("BENCH_CEILING_RANGE_BYTES", CEILING_RANGE_BYTES))
        client = s3_client(plan)
        targets = {}
        for obj in plan.objects:
            url = client.generate_presigned_url(
                "get_object", Params={"Bucket": plan.bucket, "Key": obj["key"]}, ExpiresIn=3600
            )
            parts = urllib.parse.urlsplit(url)
            targets[obj["key"]] = parts.path + "?" + parts.query
        host = urllib.parse.urlsplit(plan.endpoint)
        jobs = [
            (obj["key"], lo, min(lo + piece, obj["size"]))
            for obj in plan.objects
            for lo in range(0, obj["size"], piece)
        ]
        it, lock, done = iter(jobs), threading.Lock(), [0]

        def worker() -> None:
            conn = http.client.HTTPConnection(host.hostname, host.port, timeout=120)
            buf = memoryview(bytearray(piece))
            while True:
                with lock:
                    job = next(it, None)
                if job is None:
                    break
                key, lo, hi = job
                conn.request("GET", targets[key], headers={"Range": f"bytes={lo}-{hi - 1}"})
                resp = conn.getresponse()
                if resp.status not in (200, 206):
                    raise RuntimeError(f"GET {key} {lo}-{hi}: HTTP {resp.status} {resp.read()!r}")
                read_exact(resp.readinto, buf[: hi - lo])
                with lock:
                    done[0] += hi - lo
            conn.close()

        run_threads(worker, threads)
        total = sum(o["size"] for o in plan.objects)
        if done[0] != total:
            raise AssertionError(f"ceiling read {done[0]} of {total} bytes")
        return total

    return run


def read_exact(readinto, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            raise EOFError(f"body ended after {got} of {len(view)} bytes")
        got += n


def run_threads(fn, n: int) -> None:
    """Run `fn` on n threads; re-raise the first exception."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# --- boto3: ranged GETs straight into the destination ------------------------------------------


def body_readinto(body):
    """The fastest `readinto` a botocore StreamingBody offers.

    Its urllib3 response's own readinto goes through read() (an extra copy), so the
    http.client response underneath is used when present (no decoding: S3 bodies here are
    never content-encoded).
    """
    raw = body._raw_stream
    fp = getattr(raw, "_fp", None)
    return fp.readinto if fp is not None else raw.readinto


def run_boto3(plan: Plan, consumer, layout) -> None:
    client = s3_client(plan, pool=BOTO3_THREADS)

    def header(obj):
        body = client.get_object(
            Bucket=plan.bucket, Key=obj["key"], Range=f"bytes=0-{HEADER_PROBE_BYTES - 1}"
        )["Body"].read()
        (n,) = struct.unpack("<Q", body[:8])
        if 8 + n > len(body):
            body += client.get_object(
                Bucket=plan.bucket, Key=obj["key"], Range=f"bytes={len(body)}-{8 + n - 1}"
            )["Body"].read()
        entries = json.loads(body[8 : 8 + n])
        entries.pop("__metadata__", None)
        return obj, 8 + n, entries

    jobs = []
    with ThreadPoolExecutor(BOTO3_THREADS) as pool:
        headers = list(pool.map(header, plan.objects))
    for obj, data_start, entries in headers:
        spans = sorted(
            (data_start + e["data_offsets"][0], data_start + e["data_offsets"][1], name)
            for name, e in entries.items()
        )
        starts = [s[0] for s in spans]
        end = max((s[1] for s in spans), default=data_start)
        for lo in range(data_start, end, BOTO3_RANGE_BYTES):
            jobs.append((obj["key"], lo, min(lo + BOTO3_RANGE_BYTES, end), spans, starts))
    views = {name: tensor_bytes_view(t) for name, t in consumer.dst.items()}
    filled = dict.fromkeys(views, 0)
    lock = threading.Lock()

    def fetch(job) -> None:
        key, lo, hi, spans, starts = job
        resp = client.get_object(Bucket=plan.bucket, Key=key, Range=f"bytes={lo}-{hi - 1}")
        readinto = body_readinto(resp["Body"])
        pos = lo
        i = max(0, bisect.bisect_right(starts, lo) - 1)
        while pos < hi:
            t_lo, t_hi, name = spans[i]
            if pos < t_lo:  # a gap between tensors: read and drop it
                read_exact(readinto, memoryview(bytearray(t_lo - pos)))
                pos = t_lo
                continue
            n = min(hi, t_hi) - pos
            read_exact(readinto, views[name][pos - t_lo : pos - t_lo + n])
            with lock:
                filled[name] += n
            pos += n
            i += 1
        resp["Body"].close()

    with ThreadPoolExecutor(BOTO3_THREADS) as pool:
        list(pool.map(fetch, jobs))
    for name, view in views.items():
        if filled[name] != len(view):
            raise AssertionError(f"{name}: {filled[name]} of {len(view)} bytes written")
        consumer.seen.add(name)
        consumer.taken += 1


# --- Run:ai and Sluice ---------------------------------------------------------------------------


def run_runai(plan: Plan, consumer, layout) -> None:
    from runai_model_streamer import SafetensorsStreamer

    urls = [f"s3://{plan.bucket}/{obj['key']}" for obj in plan.objects]
    with SafetensorsStreamer() as streamer:
        # owned=False: views into its reused buffers, its fastest mode; each is copied at once.
        streamer.stream_files(urls, device="cpu", owned=False)
        for name, tensor in streamer.get_tensors():
            consumer.take(name, tensor)


def run_sluice(plan: Plan, consumer, layout) -> None:
    import sluice.torch

    consumer.take_all(sluice.torch.load_file(plan.url()))


def run_sluice_stream(plan: Plan, consumer, layout) -> None:
    import sluice.torch

    for name, tensor in sluice.torch.stream(plan.url()):
        consumer.take(name, tensor)


def run_sluice_into(plan: Plan, consumer, layout) -> None:
    import sluice.torch

    sluice.torch.load_into(plan.url(), consumer.dst)
    consumer.seen.update(consumer.dst)
    consumer.taken += len(consumer.dst)


WORKER_RUNS = {
    "local": run_local,
    "s3fs": run_s3fs,
    "ceiling-8": run_ceiling(8),
    "ceiling-32": run_ceiling(32),
    "boto3": run_boto3,
    "runai": run_runai,
    "sluice": run_sluice,
    "sluice-stream": run_sluice_stream,
    "sluice-into": run_sluice_into,
    "sluice-mount-1t": run_sluice_mount,
    "sluice-mount-2t": run_sluice_mount,
    "sluice-mount-warm": run_sluice_mount,
    "sluice-mount-disk": run_sluice_mount,
    "sluice-mount-warm-disk": run_sluice_mount,
    "rclone": run_sluice_mount,
    "local-warm": run_local_warm,
}


# =============================================================================================
# Parent: server, proxies, rounds, report.


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


class Stack(contextlib.ExitStack):
    """Everything the run creates, torn down in reverse order however the run ends."""


def install_signal_exits() -> None:
    """SIGINT, SIGTERM and SIGHUP unwind the stack, so every cleanup callback runs.

    SIGINT gets Python's handler even where it was inherited as ignored (a job started with `&`).
    """

    def handler(signum, _frame):
        print(f"\n{signal.Signals(signum).name}: cleaning up", file=sys.stderr)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def netns_up(stack: Stack) -> None:
    remove_stale_netns()
    stack.callback(netns_down)
    sh("ip", "netns", "add", NETNS)
    sh("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NS)
    sh("ip", "link", "set", VETH_NS, "netns", NETNS)
    sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", VETH_HOST)
    sh("ip", "link", "set", VETH_HOST, "up")
    sh("ip", "-n", NETNS, "addr", "add", f"{NS_IP}/30", "dev", VETH_NS)
    sh("ip", "-n", NETNS, "link", "set", VETH_NS, "up")
    sh("ip", "-n", NETNS, "link", "set", "lo", "up")


def remove_stale_netns() -> None:
    """A namespace of ours left by a run that was killed: end what runs in it, then remove it."""
    if NETNS not in sh("ip", "netns", "list", check=False).stdout.split():
        return
    print(f"removing the network namespace {NETNS} a killed run left behind", file=sys.stderr)
    netns_down()


def netns_down() -> None:
    pids = sh("ip", "netns", "pids", NETNS, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    sh("ip", "link", "del", VETH_HOST, check=False)
    sh("ip", "netns", "del", NETNS, check=False)


def stop_process(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            print(f"{name} did not stop on SIGTERM: killing it", file=sys.stderr)
            proc.kill()
            proc.wait()


def start_minio(stack: Stack, minio: Path, data_dir: Path) -> str:
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "MINIO_ROOT_USER": ACCESS_KEY,
        "MINIO_ROOT_PASSWORD": SECRET_KEY,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    log = open(data_dir.parent / "minio.log", "ab")  # noqa: SIM115 - closed by the stack
    stack.callback(log.close)
    cmd = ["ip", "netns", "exec", NETNS, str(minio), "server", str(data_dir)]
    cmd += ["--address", f"{NS_IP}:{MINIO_PORT}", "--console-address", f"{NS_IP}:9001", "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
    stack.callback(stop_process, proc, "minio")
    endpoint = f"http://{NS_IP}:{MINIO_PORT}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"minio exited {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"{endpoint}/minio/health/live", timeout=1) as r:
                if r.status == 200:
                    return endpoint
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"minio did not answer on {endpoint} within 60 s; see {log.name}")


@dataclass
class Endpoint:
    """One way to reach the server: `direct`, or through a proxy adding `rtt_ms`."""

    key: str  # "direct" or "<rtt>ms"
    url: str
    rtt_ms: float | None
    delay_ms_arg: str | None = None
    added_rtt_ms: float | None = None  # measured: through the proxy less direct
    total_rtt_ms: float | None = None  # measured: a small GET's round trip, server time included


def launch_proxy(proxy: Path, upstream: str, delay: str) -> tuple[subprocess.Popen, str] | None:
    """A sluice-faultproxy with --delay-ms `delay`: (process, URL), or None if it refused."""
    cmd = [str(proxy), "--listen", "127.0.0.1:0", "--upstream", upstream, "--delay-ms", delay]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    line = proc.stdout.readline().strip()
    if line.startswith("listening "):
        return proc, "http://" + line.split()[1]
    proc.wait()
    return None


def start_proxy(
    stack: Stack, proxy: Path, upstream: str, rtt_ms: float, base_ms: float
) -> Endpoint:
    """The proxy whose added round trip comes closest to `rtt_ms`, calibrated by measurement.

    The proxy holds every byte --delay-ms in each direction, so a round trip gains about twice
    that, plus what its timers add (about 1.4 ms each way here). Each candidate delay from 0 to
    rtt_ms/2 is measured (median of small GETs, less `base_ms`, the same GETs made directly) and
    the closest kept; steps are 0.5 ms where the proxy takes fractions, else whole ms.
    """
    if rtt_ms == 0:
        candidates = ["0"]
    else:
        probe_fraction = launch_proxy(proxy, upstream, "0.5")
        if probe_fraction:
            stop_process(probe_fraction[0], "sluice-faultproxy probe")
        step = 0.5 if probe_fraction else 1.0
        candidates = [f"{k * step:g}" for k in range(int(rtt_ms / 2 / step) + 1)]
    best: tuple[float, str, subprocess.Popen, str, float] | None = None
    for delay in candidates:
        launched = launch_proxy(proxy, upstream, delay)
        if launched is None:
            raise SystemExit(f"sluice-faultproxy --delay-ms {delay} did not start")
        proc, url = launched
        added = measure_rtt(url) - base_ms
        if best is None or abs(added - rtt_ms) < best[0]:
            if best is not None:
                stop_process(best[2], "sluice-faultproxy")
            best = (abs(added - rtt_ms), delay, proc, url, added)
        else:
            stop_process(proc, "sluice-faultproxy")
    assert best is not None
    _, delay, proc, url, added = best
    stack.callback(stop_process, proc, f"sluice-faultproxy --delay-ms {delay}")
    print(f"{rtt_ms:g} ms round trip: --delay-ms {delay} adds {added:.2f} ms (measured)")
    return Endpoint(f"{rtt_ms:g}ms", url, rtt_ms, delay, added)


def measure_rtt(url: str, samples: int = 15) -> float:
    """Median ms of a tiny GET on one kept-alive connection: the round trip a request pays."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        conn.request("GET", "/minio/health/live")
        conn.getresponse().read()
        times.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return statistics.median(times[2:])


def upload(endpoint: str, index: Path, prefix: str) -> list[dict[str, Any]]:
    """Create the bucket and upload the shards and the index; reuse what is already there."""
    from boto3.s3.transfer import TransferConfig

    plan = Plan(str(index), endpoint, BUCKET, prefix, [], "")
    client = s3_client(plan, pool=8)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    shards = sorted(index.parent.glob("model-*-of-*.safetensors"))
    # Single PUTs: one part per object, as a model uploaded by a plain PUT is stored.
    cfg = TransferConfig(multipart_threshold=5 * GiB, max_concurrency=4)
    objects, t0, sent = [], time.perf_counter(), 0
    for path in [*shards, index]:
        key = f"{prefix}/{path.name}"
        size = path.stat().st_size
        try:
            same = client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == size
        except client.exceptions.ClientError:
            same = False
        if not same:
            client.upload_file(str(path), BUCKET, key, Config=cfg)
            sent += size
        if path != index:
            objects.append({"key": key, "size": size, "local": str(path)})
    if sent:
        dt = time.perf_counter() - t0
        print(f"uploaded {sent / 1e9:.2f} GB to MinIO in {dt:.1f} s", file=sys.stderr)
    return objects


def reference_hashes(index: Path) -> Path:
    """SHA-1 of every tensor's bytes in the source files, computed once per checkpoint."""
    out = index.parent / "sluice-bench-sha1.json"
    stamp = json.loads((index.parent / synth_checkpoint.STAMP_NAME).read_text())
    if out.exists() and json.loads(out.read_text()).get("stamp") == stamp:
        return out
    hashes, buf = {}, bytearray(64 * MiB)
    for spec in synth_checkpoint.read_layout(index):
        h = hashlib.sha1()
        with open(spec.path, "rb", buffering=0) as f:
            f.seek(spec.start)
            left = spec.nbytes
            while left:
                n = f.readinto(memoryview(buf)[: min(left, len(buf))])
                if not n:
                    raise EOFError(f"{spec.path} ends inside {spec.name}")
                h.update(memoryview(buf)[:n])
                left -= n
        hashes[spec.name] = h.hexdigest()
    out.write_text(json.dumps({"stamp": stamp, "sha1": hashes}) + "\n")
    return out


@contextlib.contextmanager
def s3fs_mount(endpoint: Endpoint, work: Path) -> Iterator[str]:
    """An s3fs-fuse mount of the bucket through `endpoint`, at its best settings here."""
    mnt = work / f"s3fs-{endpoint.key}"
    mnt.mkdir(parents=True, exist_ok=True)
    passwd = work / "s3fs-passwd"
    passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
    passwd.chmod(0o600)
    opts = [
        f"url={endpoint.url}",
        "use_path_request_style",
        f"passwd_file={passwd}",
        "parallel_count=32",
        "multipart_size=8",
        "max_stat_cache_size=1000",
        "ro",
        "endpoint=" + REGION,
    ]
    sh("s3fs", BUCKET, str(mnt), "-o", ",".join(opts))
    try:
        yield str(mnt)
    finally:
        sh("fusermount", "-u", str(mnt), check=False)
        sh("umount", "-l", str(mnt), check=False)


SLUICE_MOUNT_POOL = "6GiB"  # holds the whole 4 GiB checkpoint, so a second load is warm


def sluice_mount_up(
    ep: Endpoint, work: Path, prefix: str, env: dict[str, str], cache: Path | None = None
) -> tuple[int, str]:
    """A fresh `sluice mount` of the prefix through `ep` (a cold pool for every run), with
    the disk tier in `cache` if given."""
    mnt = work / "sluice-mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    # A reader variant `+SLUICE_MOUNT_BIN=…` runs another build of the daemon (A/B runs).
    binary = env.get("SLUICE_MOUNT_BIN", str(SLUICE_BIN))
    cmd = [binary, "mount", f"s3://{BUCKET}/{prefix}/", str(mnt), "--daemon"]
    cmd += ["--pool", SLUICE_MOUNT_POOL, "--log", str(work / "sluice-mount.log")]
    if cache is not None:
        cmd += ["--cache-dir", str(cache), "--cache-size", "8GiB"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"sluice mount failed: {r.stderr.strip()}")
    return int(r.stdout.split()[0]), str(mnt)


def fill_disk_cache(
    ep: Endpoint, work: Path, prefix: str, env: dict[str, str], objects: list[dict]
) -> Path:
    """Untimed: a first mount with a new disk tier reads every shard through (filling the
    tier), then stops; the page cache is dropped, so the timed mount reads the tier cold."""
    cache = work / "sluice-disk-cache"
    shutil.rmtree(cache, ignore_errors=True)
    daemon = sluice_mount_up(ep, work, prefix, env, cache)
    try:
        read_through([os.path.join(daemon[1], os.path.basename(o["key"])) for o in objects])
    finally:
        sluice_mount_down(daemon)
    page_cache.drop()
    return cache


RCLONE_FLAGS = [
    # Its best settings here: the full VFS cache (as in the measurement), large
    # chunks read ahead, no modtime lookups.
    *("--vfs-cache-mode", "full", "--vfs-read-ahead", "256M", "--buffer-size", "32M"),
    *("--vfs-read-chunk-size", "32M", "--vfs-read-chunk-size-limit", "off"),
    *("--no-modtime", "--read-only", "--dir-cache-time", "1h"),
]


def rclone_up(ep: Endpoint, work: Path, prefix: str) -> tuple[int, str]:
    """A fresh rclone mount of the prefix through `ep`, with an empty VFS cache."""
    mnt = work / "rclone-mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    cache = work / "rclone-cache"
    shutil.rmtree(cache, ignore_errors=True)
    # The AWS SDK inside rclone refuses AWS_CA_BUNDLE on plain HTTP, so none of the AWS_*
    # settings of this shell reach it: the remote is configured in full below.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "RCLONE_CONFIG_BENCH_TYPE": "s3",
        "RCLONE_CONFIG_BENCH_PROVIDER": "Minio",
        "RCLONE_CONFIG_BENCH_ENDPOINT": ep.url,
        "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": ACCESS_KEY,
        "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET_KEY,
        "RCLONE_CONFIG_BENCH_REGION": REGION,
    }
    log = work / "rclone.log"
    cmd = ["rclone", "mount", f"bench:{BUCKET}/{prefix}", str(mnt), *RCLONE_FLAGS]
    cmd += ["--cache-dir", str(cache), "--log-file", str(log)]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"rclone mount failed; see {log}")
        time.sleep(0.1)
    return proc.pid, str(mnt)


def process_alive(pid: int) -> bool:
    """Running (a zombie no init has reaped yet counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def sluice_mount_down(daemon: tuple[int, str]) -> int | None:
    """Stops the mount daemon; returns its peak RSS (VmHWM) in bytes."""
    pid, mnt = daemon
    hwm = None
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process_alive(pid):
        time.sleep(0.05)
    sh("umount", "-l", mnt, check=False)
    return hwm


# --- runs ----------------------------------------------------------------------------------------


def worker_env(endpoint: Endpoint | None, reader: str, extra: dict[str, str]) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "RUNAI_", "SLUICE_")) and "proxy" not in k.lower()
    }
    env.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        AWS_ALLOW_HTTP="true",
        AWS_EC2_METADATA_DISABLED="true",
        RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
        NO_PROXY="*",
        PYTHONPATH=str(Path(__file__).resolve().parent),
    )
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint.url
    env.update(READERS[reader].env)
    env.update(extra)
    return env


def run_worker(reader: str, plan_path: Path, env: dict[str, str], verify: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", base_reader(reader), "--plan", str(plan_path)]
    cmd += ["--verify"] if verify else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    timer = threading.Timer(WORKER_TIMEOUT_S, proc.kill)
    timer.start()
    try:
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, 0)
        raise
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        return {"error": f"worker exited {proc.returncode} (its stderr is above)"}
    worker = json.loads(lines[-1][len(RESULT_PREFIX) :])
    return {
        **worker,
        "maxrss_bytes": usage.ru_maxrss * 1024,
        "cpu_proc_s": usage.ru_utime + usage.ru_stime,
    }


def write_plan(work: Path, key: str, index: Path, endpoint: Endpoint | None, **kw) -> Path:
    path = work / f"plan-{key}.json"
    plan = {"index": str(index), "endpoint": endpoint.url if endpoint else None, **kw}
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return path


def round_order(
    round_no: int, readers: list[str], endpoints: list[Endpoint]
) -> list[tuple[str, Endpoint | None]]:
    """One round's (reader, endpoint) pairs: round trips and readers each rotated by the round."""
    remote = [r for r in readers if READERS[r].remote]
    blocks: list[list[tuple[str, Endpoint | None]]] = []
    for ep in rotate(endpoints, round_no):
        blocks.append([(r, ep) for r in rotate(remote, round_no)])
    for r in [r for r in readers if not READERS[r].remote]:
        blocks.insert(round_no % (len(blocks) + 1), [(r, None)])
    return [pair for block in blocks for pair in block]


def rotate(items: list, k: int) -> list:
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def service_pids(work: Path) -> list[int]:
    """This run's own long-lived processes: the server, the proxies and s3fs mounts."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        exe = os.path.basename(cmd[0]).decode(errors="replace") if cmd and cmd[0] else ""
        mine = exe in ("minio", "sluice-faultproxy", "s3fs") and any(
            str(work).encode() in arg or b"10.231.0.2" in arg for arg in cmd
        )
        if mine:
            pids.append(int(entry.name))
    return pids


def idle_cpu(work: Path, seconds: float = 0.5) -> tuple[float, float]:
    """CPUs busy over `seconds` between runs: (other work, this run's idle services).

    Nothing of the benchmark's own should run then; other work on the machine skews every
    number, so each run records it and the report flags the runs it touched.
    """
    pids = service_pids(work)
    tick = os.sysconf("SC_CLK_TCK")

    def sample() -> tuple[int, int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]
        ours = 0
        for pid in pids:
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += int(stat[11]) + int(stat[12])
        return sum(fields) - idle, sum(fields), ours

    busy0, total0, ours0 = sample()
    time.sleep(seconds)
    busy1, total1, ours1 = sample()
    ncpu = os.cpu_count() or 1
    busy = ncpu * (busy1 - busy0) / max(1, total1 - total0)
    services = (ours1 - ours0) / tick / seconds
    return max(0.0, busy - services), services


def print_run(r: dict[str, Any], rounds: int) -> None:
    head = f"[{r['round'] + 1}/{rounds}] {r['endpoint']:>7} {r['reader']:<14}"
    if "error" in r:
        print(f"{head} FAILED: {r['error']}", flush=True)
        return
    gbps = r["bytes"] / r["seconds"] / 1e9
    rss = r["maxrss_bytes"] / GiB
    ok = " bit-exact" if r.get("verify", {}).get("bit_exact") else ""
    busy = f" (other work: {r['foreign_cpus']:.1f} CPUs)" if r["foreign_cpus"] > BUSY_CPUS else ""
    print(f"{head} {gbps:7.3f} GB/s {r['seconds']:7.2f} s  peak RSS {rss:5.2f} GiB{ok}{busy}")


# --- statistics, targets, report ---------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{endpoint: {reader: stats}}; the local reference sits under every endpoint's key too."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["endpoint"], run["reader"]), []).append(run)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (ep, reader), group in groups.items():
        ok = [r for r in group if "error" not in r]
        s: dict[str, Any] = {"label": group[0]["label"], "runs": len(ok)}
        s["errors"] = len(group) - len(ok)
        if ok:
            gbps = [r["bytes"] / r["seconds"] / 1e9 for r in ok]
            s.update(median_gbps=statistics.median(gbps), min_gbps=min(gbps), max_gbps=max(gbps))
            s["median_seconds"] = statistics.median(r["seconds"] for r in ok)
            s["peak_rss_gib"] = max(r["maxrss_bytes"] for r in ok) / GiB
            s["dest_gib"] = ok[0]["dest_bytes"] / GiB
            s["rss_over_dest_gib"] = max(
                (r["maxrss_bytes"] - r["baseline_rss_bytes"] - r["dest_bytes"]) / GiB for r in ok
            )
            s["cpu_s_per_gb"] = statistics.median(r["cpu_timed_s"] / (r["bytes"] / 1e9) for r in ok)
            s["bit_exact"] = any(r.get("verify", {}).get("bit_exact") for r in ok) or None
            daemon = [r["daemon_hwm_bytes"] for r in ok if r.get("daemon_hwm_bytes")]
            s["daemon_hwm_gib"] = max(daemon) / GiB if daemon else None
        out.setdefault(ep, {})[reader] = s
    return out


def gbps(summary: dict, ep: str, reader: str) -> float | None:
    return summary.get(ep, {}).get(reader, {}).get("median_gbps")


def ceiling(summary: dict, ep: str) -> tuple[str, float] | None:
    found = [(r, gbps(summary, ep, r)) for r in CEILINGS]
    found = [(r, v) for r, v in found if v is not None]
    return max(found, key=lambda rv: rv[1]) if found else None


def check_targets(summary: dict, endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for ep in endpoints:
        if ep["rtt_ms"] is None:
            continue
        key, rtt = ep["key"], ep["rtt_ms"]
        ceil = ceiling(summary, key)
        rows.append(
            ratio_target(
                f"Sluice load_file ≥ 0.9x parallel-GET ceiling at {rtt:g} ms",
                gbps(summary, key, "sluice"),
                ceil[1] if ceil else None,
                0.9,
                ceil[0] if ceil else "ceiling",
            )
        )
    five = next(
        (ep for ep in endpoints if ep["rtt_ms"] is not None and ep["rtt_ms"] in (4, 5, 6)), None
    )
    if five:
        rows.append(
            ratio_target(
                f"Sluice load_file ≥ 2x Run:ai at {five['rtt_ms']:g} ms",
                gbps(summary, five["key"], "sluice"),
                gbps(summary, five["key"], "runai"),
                2.0,
                "runai",
            )
        )
    if five:
        key, rtt = five["key"], five["rtt_ms"]
        ceil = ceiling(summary, key)
        for reader in ("sluice-mount-1t", "sluice-mount-2t"):
            rows.append(
                ratio_target(
                    f"{reader} ≥ 0.8x parallel-GET ceiling at {rtt:g} ms",
                    gbps(summary, key, reader),
                    ceil[1] if ceil else None,
                    0.8,
                    ceil[0] if ceil else "ceiling",
                )
            )
        rows.append(
            ratio_target(
                f"sluice-mount-2t ≥ 2x s3fs at {rtt:g} ms",
                gbps(summary, key, "sluice-mount-2t"),
                gbps(summary, key, "s3fs"),
                2.0,
                "s3fs",
            )
        )
        for second in ("sluice-mount-warm", "sluice-mount-warm-disk"):
            rows.append(
                ratio_target(
                    f"{second} (second load) ≥ 0.9x warm local load at {rtt:g} ms",
                    gbps(summary, key, second),
                    gbps(summary, "local", "local-warm"),
                    0.9,
                    "local-warm",
                )
            )
    hwms = [
        s["daemon_hwm_gib"]
        for ep in summary.values()
        for s in ep.values()
        if s.get("daemon_hwm_gib") is not None
    ]
    if hwms:
        pool = float(SLUICE_MOUNT_POOL.removesuffix("GiB"))
        rows.append(
            {
                "target": f"mount daemon RSS ≤ pool ({pool:g} GiB) + 0.2 GiB",
                "value": max(hwms),
                "measured": f"{max(hwms):.2f} GiB peak (worst run)",
                "status": "PASS" if max(hwms) <= pool + 0.2 else "MISS",
            }
        )
    limit = SLUICE_MEMORY_LIMIT / GiB + 0.3
    for reader in ("sluice", "sluice-stream", "sluice-into"):
        over = [
            summary[ep][reader]["rss_over_dest_gib"]
            for ep in summary
            if summary[ep].get(reader, {}).get("rss_over_dest_gib") is not None
        ]
        name = f"{reader} RSS ≤ destination + memory_limit (0.5 GiB) + 0.3 GiB, every round trip"
        if not over:
            rows.append({"target": name, "measured": "n/a (not run)", "status": "n/a"})
            continue
        worst = max(over)
        rows.append(
            {
                "target": name,
                "value": worst,
                "measured": f"{worst:.2f} GiB over the destination (worst run)",
                "status": "PASS" if worst <= limit else "MISS",
            }
        )
    return rows


def ratio_target(name: str, value, base, want: float, base_name: str) -> dict[str, Any]:
    if value is None or not base:
        return {"target": name, "measured": "n/a (reader not run or failed)", "status": "n/a"}
    ratio = value / base
    measured = f"{ratio:.2f}x ({value:.2f} GB/s vs {base_name} {base:.2f})"
    return {
        "target": name,
        "value": ratio,
        "measured": measured,
        "status": "PASS" if ratio >= want else "MISS",
    }


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def ep_title(ep: dict[str, Any]) -> str:
    if ep["rtt_ms"] is None:
        return "direct (no proxy)"
    added = ep.get("added_rtt_ms")
    extra = f" (measured +{added:.1f})" if added is not None else ""
    return f"{ep['rtt_ms']:g} ms{extra}"


def render_markdown(meta: dict, summary: dict, targets: list[dict], runs: list[dict]) -> str:
    eps = meta["endpoints"]
    local = gbps(summary, "local", "local")
    lines = [f"### Remote load throughput ({meta['date'][:10]})", ""]
    lines += [*header_lines(meta), ""]
    busy = [r for r in runs if r.get("foreign_cpus", 0.0) > BUSY_CPUS]
    if busy:
        peak = max(r["foreign_cpus"] for r in busy)
        lines += [
            f"**WARNING: other work kept up to {peak:.1f} of {meta['machine']['nproc']} CPUs busy "
            f"just before {len(busy)} of {len(runs)} runs; those numbers are noisy.**",
            "",
        ]
    lines += ["#### GB/s (median) by round trip", ""]
    lines += pivot_table(summary, eps, local)
    lines += ["", "#### Targets", "", "| target | measured | result |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {t['status']} |" for t in targets]
    lines += ["", "#### How to read it", "", *NOTES, *run_notes(runs, eps), ""]
    lines += ["#### Every reader and round trip", ""]
    lines += [
        "| round trip | reader | GB/s | range | x ceiling | x cold local | peak RSS GiB "
        "| RSS over destination GiB | CPU s/GB | bit-exact | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for ep in [{"key": "local", "rtt_ms": None, "local": True}, *eps]:
        ceil = ceiling(summary, ep["key"])
        for s in summary.get(ep["key"], {}).values():
            v = s.get("median_gbps")
            spread = f"{s['min_gbps']:.2f}-{s['max_gbps']:.2f}" if v is not None else "failed"
            runs_txt = f"{s['runs']}" + (f" ({s['errors']} failed)" if s["errors"] else "")
            exact = {True: "yes", None: "-"}.get(s.get("bit_exact"), "NO")
            title = "local disk" if ep.get("local") else ep_title(ep)
            lines.append(
                f"| {title} | {s['label']} | {fmt(v)} | {spread} "
                f"| {fmt(v / ceil[1] if v and ceil else None)} "
                f"| {fmt(v / local if v and local else None)} "
                f"| {fmt(s.get('peak_rss_gib'))} | {fmt(s.get('rss_over_dest_gib'))} "
                f"| {fmt(s.get('cpu_s_per_gb'))} | {exact} | {runs_txt} |"
            )
    return "\n".join(lines) + "\n"


NOTES = [
    "- GB/s is tensor bytes (1e9) over the time from the reader's first call to its last copy into "
    "the destination; the ceilings count object bytes. Medians over the rounds.",
    "- The ceiling at a round trip is the better of ceiling-8 and ceiling-32 there: Python "
    "threads, presigned ranged GETs over http.client, `readinto` one reused buffer per thread. "
    "Server, proxy and client share the machine's 2 CPUs, so it is the ceiling for a client "
    "that costs about as little CPU per byte; a leaner client can pass it (x ceiling > 1).",
    "- Every destination is a dict of CPU tensors allocated and zeroed before the clock starts "
    "(bench_readers.Consumer); boto3 reads straight into it, the others are copied into it.",
    "- Peak RSS is the worker's ru_maxrss (wait4). RSS over destination = peak RSS - the "
    "worker's RSS after its imports - the destination's bytes: what the reader costs in memory. "
    "The RSS target reads it against memory_limit (512 MiB, the loaders' default) + 0.3 GiB.",
    "- bit-exact: in round 1, every tensor of every reader at every round trip hashed (SHA-1) "
    "and compared with the source shards' bytes.",
    f"- Peer settings: Run:ai with {RUNAI_CONCURRENCY} clients and {RUNAI_CHUNK_BYTES // MiB} MiB "
    "reads, the best of sweeps at 5 ms over RUNAI_STREAMER_OBJ_CONCURRENCY 2-64 and "
    "RUNAI_STREAMER_CHUNK_BYTESIZE 8-64 MiB (its defaults, 8 clients and 8 MiB, were about 1.3x "
    "slower here); boto3 and the ceilings with 8 MiB ranges (32 MiB ranges measured the same); "
    "s3fs with parallel_count=32, multipart_size=8. Sluice with no options and no SLUICE_* "
    "variables.",
]


def run_notes(runs: list[dict[str, Any]], eps: list[dict[str, Any]]) -> list[str]:
    """Notes computed from the runs: VmHWM against ru_maxrss, Sluice's own load time."""
    ok = [r for r in runs if "error" not in r]
    notes = []
    gaps = [abs(r["vm_hwm_bytes"] - r["maxrss_bytes"]) for r in ok if r.get("vm_hwm_bytes")]
    if gaps:
        notes.append(
            f"- The workers' own VmHWM differs from ru_maxrss by at most {max(gaps) / MiB:.0f} MiB."
        )
    for reader in ("sluice", "sluice-stream"):
        cells = []
        for ep in eps:
            mine = [r for r in ok if r["reader"] == reader and r["endpoint"] == ep["key"]]
            stats = [r["sluice_stats"] for r in mine if r.get("sluice_stats")]
            if stats:
                own = statistics.median(st["tensor_bytes"] / st["seconds"] / 1e9 for st in stats)
                share = statistics.median(
                    st["seconds"] / r["seconds"] for st, r in zip(stats, mine)
                )
                cells.append(f"{ep_title(ep)} {own:.2f} GB/s ({share:.0%} of its time)")
        if cells:
            what = (
                "the load before the copy into the destination"
                if reader == "sluice"
                else "the whole iteration, its copies included"
            )
            notes.append(
                f"- `{reader}` by its own clock, last_load_stats()['seconds'] ({what}): "
                + "; ".join(cells)
                + "."
            )
    return notes


def pivot_table(summary: dict, eps: list[dict], local: float | None) -> list[str]:
    """Readers down, round trips across; each cell GB/s (x ceiling)."""
    readers = [r for r in dict.fromkeys(r for ep in eps for r in summary.get(ep["key"], {}))]
    head = "| reader | " + " | ".join(ep_title(ep) for ep in eps) + " |"
    lines = [head, "|---|" + "---:|" * len(eps)]
    if local is not None:
        cells = [f"{local:.2f}" for _ in eps]
        lines.append(
            "| safetensors load_file, cold local disk (reference) | " + " | ".join(cells) + " |"
        )
    for reader in readers:
        label = next(
            summary[ep["key"]][reader]["label"]
            for ep in eps
            if reader in summary.get(ep["key"], {})
        )
        cells = []
        for ep in eps:
            v = gbps(summary, ep["key"], reader)
            ceil = ceiling(summary, ep["key"])
            if v is None:
                cells.append("-")
            elif reader in CEILINGS or not ceil:
                cells.append(f"{v:.2f}")
            else:
                cells.append(f"{v:.2f} ({v / ceil[1]:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Cells: median GB/s over the rounds (x the better ceiling at that round trip). "
        "Ratios to the cold local load are in the full table below."
    )
    return lines


def header_lines(meta: dict[str, Any]) -> list[str]:
    m, v, ck = meta["machine"], meta["versions"], meta["checkpoint"]
    shape = ck["shape"]
    return [
        f"Date: {meta['date']}. Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, "
        f"Linux {m['kernel']}, data on {m['fs']}.",
        f"Checkpoint: {ck['total_size'] / 1e9:.2f} GB of bf16 tensors in {ck['params']['shards']} "
        f"shards, Llama-like (hidden {shape['hidden']}, intermediate {shape['intermediate']}, "
        f"vocab {shape['vocab']}, layers {shape['layers']}).",
        f"Server: MinIO ({v['minio']}) in the network namespace {NETNS}, over a veth pair "
        f"({HOST_IP} ↔ {NS_IP}, MTU {meta['veth_mtu']}), single drive on {m['fs']}; the page cache "
        "is dropped before every run. Round trips added by target/release/sluice-faultproxy "
        "(it holds every byte --delay-ms in each direction; the TCP handshake is not delayed): "
        "for each round trip the whole-ms --delay-ms whose measured added round trip (median of "
        "small GETs through it, less the same GETs direct) is closest, "
        + ", ".join(
            f"{ep['rtt_ms']:g} ms: --delay-ms {ep['delay_ms_arg']} (+{ep['added_rtt_ms']:.2f} ms)"
            for ep in meta["endpoints"]
            if ep["rtt_ms"] is not None
        )
        + ".",
        "Peers: " + "; ".join(f"`{k}`: {r}" for k, r in meta["reader_labels"].items()) + ".",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        (f"Command: `{meta['make']}`, which runs " if meta.get("make") else "Command: ")
        + f"`{meta['command']}`; {meta['rounds']} interleaved rounds.",
        f"Memory: {meta.get('memory_note', '')}.",
    ]


def write_png(summary: dict, eps: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the plot")
        return False
    readers = [
        r
        for r in dict.fromkeys(r for ep in eps for r in summary.get(ep["key"], {}))
        if r not in CEILINGS
    ]
    if not readers:
        return False
    fig, ax = plt.subplots(figsize=(11, 6.5))
    width = 0.8 / len(readers)
    for i, reader in enumerate(readers):
        xs = [g + (i - (len(readers) - 1) / 2) * width for g in range(len(eps))]
        vals = [gbps(summary, ep["key"], reader) or 0 for ep in eps]
        label = next(
            summary[ep["key"]][reader]["label"]
            for ep in eps
            if reader in summary.get(ep["key"], {})
        )
        ax.bar(xs, vals, width, label=label)
    for g, ep in enumerate(eps):
        ceil = ceiling(summary, ep["key"])
        if ceil:
            ax.hlines(
                ceil[1],
                g - 0.45,
                g + 0.45,
                colors="black",
                linewidth=2,
                label="server ceiling (parallel GETs)" if g == 0 else None,
            )
    local = gbps(summary, "local", "local")
    if local:
        ax.axhline(local, color="gray", linestyle="--", label=f"cold local disk {local:.2f} GB/s")
    ax.set_xticks(range(len(eps)), [ep_title(ep) for ep in eps])
    ax.set_ylabel("GB/s (median)")
    ax.set_title("Loading a sharded checkpoint from S3 (MinIO) into preallocated CPU tensors")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def machine(data_dir: Path) -> dict[str, Any]:
    import bench_report

    return bench_report.machine(data_dir)


def versions(minio: Path) -> dict[str, str]:
    out = {"python": platform.python_version()}
    dists = ["sluice", "torch", "safetensors", "numpy", "boto3", "botocore", "urllib3"]
    dists += ["runai-model-streamer", "runai-model-streamer-s3"]
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    rev = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD", check=False).stdout.strip()
    dirty = sh("git", "-C", str(ROOT), "status", "--porcelain", "crates", "python", check=False)
    out["sluice"] += f" (git {rev}{', with uncommitted changes' if dirty.stdout.strip() else ''})"
    out["minio"] = minio_version(minio)
    if shutil.which("s3fs"):
        s3fs = sh("s3fs", "--version", check=False).stdout.splitlines()
        out["s3fs"] = s3fs[0] if s3fs else "unknown"
    return out


def minio_version(minio: Path) -> str:
    """`go install` leaves MinIO's own version string at DEVELOPMENT.GOGET: read the module's
    version (a pseudo-version naming the commit) and the Go toolchain from the binary."""
    mv = sh(str(minio), "--version", check=False).stdout.splitlines()
    own = mv[0].replace("minio version ", "") if mv else "unknown"
    if "DEVELOPMENT" not in own or not shutil.which("go"):
        return own
    info = sh("go", "version", "-m", str(minio), check=False).stdout.splitlines()
    toolchain = info[0].split(":", 1)[1].strip() if info else "go ?"
    module = next(
        (ln.split()[2] for ln in info if ln.split()[:2] == ["mod", "github.com/minio/minio"]), None
    )
    return f"github.com/minio/minio {module} (built with {toolchain})" if module else own


def probe(modules: tuple[str, ...]) -> tuple[bool, str]:
    code = "; ".join(f"import {m}" for m in modules) or "pass"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return True, ""
    lines = proc.stderr.strip().splitlines()
    return False, lines[-1] if lines else f"exit {proc.returncode}"


def base_reader(name: str) -> str:
    """`sluice+SLUICE_REMOTE_CONCURRENCY=32` runs as `sluice`, with that environment."""
    return name.split("+", 1)[0]


def register_variant(name: str) -> None:
    """A reader spec with `+ENV=VALUE` settings becomes a separately labelled reader."""
    base, *settings = name.split("+")
    if base not in READERS or not all("=" in kv for kv in settings):
        raise SystemExit(f"unknown reader {name!r}; choose from {list(READERS)} (+ENV=VALUE...)")
    if not settings:
        return
    parent = READERS[base]
    env = {**parent.env, **dict(kv.split("=", 1) for kv in settings)}
    label = f"{parent.label} [{', '.join(settings)}]"
    READERS[name] = Reader(label, parent.modules, parent.remote, parent.fills, env)


def select_readers(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    wanted = args.readers.split(",") if args.readers else list(DEFAULT_READERS)
    for name in wanted:
        register_variant(name)
    chosen, skipped = [], {}
    for name in wanted:
        reader = READERS[name]
        ok, why = probe(reader.modules)
        if base_reader(name) == "s3fs" and not shutil.which("s3fs"):
            ok, why = False, "s3fs is not installed (apt-get install s3fs)"
        if base_reader(name) == "rclone" and not shutil.which("rclone"):
            ok, why = False, "rclone is not installed (apt-get install rclone)"
        if ok:
            chosen.append(name)
        else:
            skipped[name] = why
            print(f"SKIPPING {name}: {why}", file=sys.stderr)
    return chosen, skipped


def run_benchmark(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench_remote.py needs root (network namespace, drop_caches)")
    minio, proxy = Path(args.minio), Path(args.faultproxy)
    for path, how in [
        (minio, "GOBIN=$HOME/.cache/sluice/bin go install github.com/minio/minio@latest"),
        (proxy, "cargo build --release -p sluice-testkit --bin sluice-faultproxy"),
    ]:
        if not os.access(path, os.X_OK):
            raise SystemExit(f"{path} is missing: {how}")
    READERS["runai"] = Reader(
        f"Run:ai streamer s3:// ({args.runai_concurrency} clients, "
        f"{args.runai_chunk_mib} MiB reads)",
        READERS["runai"].modules,
        env={
            "RUNAI_STREAMER_OBJ_CONCURRENCY": str(args.runai_concurrency),
            "RUNAI_STREAMER_CHUNK_BYTESIZE": str(args.runai_chunk_mib * MiB),
        },
    )
    readers, skipped = select_readers(args)
    work = Path(args.work_dir)
    install_signal_exits()
    with Stack() as stack:
        if not args.keep_data:
            stack.callback(shutil.rmtree, work, True)
        work.mkdir(parents=True, exist_ok=True)
        ckpt = work / f"ckpt-{args.gib:g}g"
        index = synth_checkpoint.generate(ckpt, int(args.gib * GiB), args.shards, args.seed)
        hashes = reference_hashes(index)
        netns_up(stack)
        direct_url = start_minio(stack, minio, work / "minio")
        prefix = ckpt.name
        objects = upload(direct_url, index, prefix)
        endpoints: list[Endpoint] = []
        if args.direct:
            endpoints.append(Endpoint("direct", direct_url, None))
        upstream = f"{NS_IP}:{MINIO_PORT}"
        base_ms = measure_rtt(direct_url)
        endpoints += [start_proxy(stack, proxy, upstream, rtt, base_ms) for rtt in args.rtt_list]
        for ep in endpoints:
            ep.total_rtt_ms = measure_rtt(ep.url)
            print(f"endpoint {ep.key:>7}: {ep.url}  small GET {ep.total_rtt_ms:.2f} ms")
        plans = {}
        for ep in endpoints:
            mount = None
            if any(base_reader(r) == "s3fs" for r in readers):
                mount = stack.enter_context(s3fs_mount(ep, work))
            plans[ep.key] = write_plan(
                work,
                ep.key,
                index,
                ep,
                bucket=BUCKET,
                prefix=prefix,
                objects=objects,
                hashes=str(hashes),
                mount=mount,
            )
        plans["local"] = write_plan(
            work,
            "local",
            index,
            None,
            bucket=BUCKET,
            prefix=prefix,
            objects=objects,
            hashes=str(hashes),
        )
        total = sum(o["size"] for o in objects)
        runs: list[dict[str, Any]] = []
        with page_cache.free_page_reporting_off(args.keep_page_reporting, 2 * total) as note:
            for round_no in range(args.runs):
                for reader, ep in round_order(round_no, readers, endpoints):
                    key = ep.key if ep else "local"
                    page_cache.drop()
                    foreign, services = idle_cpu(work)
                    env = worker_env(ep, reader, {})
                    daemon = None
                    cache = None
                    if base_reader(reader) == "sluice-mount-disk":
                        cache = fill_disk_cache(ep, work, prefix, env, objects)
                    if base_reader(reader) == "sluice-mount-warm-disk":
                        # An empty tier, filled by the worker's untimed first load.
                        cache = work / "sluice-disk-cache"
                        shutil.rmtree(cache, ignore_errors=True)
                    if base_reader(reader).startswith("sluice-mount"):
                        daemon = sluice_mount_up(ep, work, prefix, env, cache)
                        env["SLUICE_BENCH_MOUNT"] = daemon[1]
                    if base_reader(reader) == "rclone":
                        daemon = rclone_up(ep, work, prefix)
                        env["SLUICE_BENCH_MOUNT"] = daemon[1]
                    try:
                        result = run_worker(reader, plans[key], env, verify=round_no == 0)
                    finally:
                        if daemon is not None:
                            hwm = sluice_mount_down(daemon)
                            mount_log = work / "sluice-mount.log"
                            if (
                                base_reader(reader).startswith("sluice-mount")
                                and mount_log.exists()
                            ):
                                # The daemon's stop summary (pool, disk tier, passthrough).
                                tail = mount_log.read_text().strip().splitlines()[-2:]
                                print("   ", "\n    ".join(tail))
                    if cache is not None:
                        shutil.rmtree(cache, ignore_errors=True)
                    if base_reader(reader) == "rclone":
                        shutil.rmtree(work / "rclone-cache", ignore_errors=True)
                    if daemon is not None:
                        result["daemon_hwm_bytes"] = hwm
                    result.update(
                        reader=reader,
                        label=READERS[reader].label,
                        endpoint=key,
                        round=round_no,
                        foreign_cpus=foreign,
                        idle_service_cpus=services,
                    )
                    runs.append(result)
                    print_run(result, args.runs)
                    sys.stdout.flush()
        veth_mtu = Path(f"/sys/class/net/{VETH_HOST}/mtu").read_text().strip()
        meta = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "make": "make bench-remote" if os.environ.get("MAKELEVEL") else None,
            "machine": machine(work),
            "versions": versions(minio),
            "checkpoint": {
                "path": str(index),
                **json.loads((ckpt / synth_checkpoint.STAMP_NAME).read_text()),
            },
            "endpoints": [
                {
                    "key": ep.key,
                    "url": ep.url,
                    "rtt_ms": ep.rtt_ms,
                    "delay_ms_arg": ep.delay_ms_arg,
                    "added_rtt_ms": ep.added_rtt_ms,
                    "total_rtt_ms": ep.total_rtt_ms,
                }
                for ep in endpoints
            ],
            "readers": readers,
            "reader_labels": {r: READERS[r].label for r in readers},
            "reader_env": {r: READERS[r].env for r in readers if READERS[r].env},
            "skipped": skipped,
            "rounds": args.runs,
            "veth_mtu": veth_mtu,
            "memory_note": note,
        }
    write_report(meta, runs, Path(args.out))


def write_report(meta: dict[str, Any], runs: list[dict[str, Any]], out: Path) -> None:
    summary = summarize(runs)
    targets = check_targets(summary, meta["endpoints"])
    markdown = render_markdown(meta, summary, targets, runs)
    print(markdown)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-remote.md").write_text(markdown)
    doc = {"meta": meta, "summary": summary, "targets": targets, "runs": runs}
    (out / "bench-remote.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    written = ["bench-remote.md", "bench-remote.json"]
    if write_png(summary, meta["endpoints"], out / "bench-remote.png"):
        written.append("bench-remote.png")
    print("wrote " + ", ".join(str(out / w) for w in written))


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args)
        return
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        write_report(doc["meta"], doc["runs"], Path(args.out))
        return
    try:
        run_benchmark(args)
    except KeyboardInterrupt:
        print("interrupted; the namespace, server, proxies and data are removed", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
