"""The unmodified loader that `make bench-warm` runs under each page-cache policy.

It behaves like an inference framework starting up:

1. opens the checkpoint index and each shard's header (what frameworks do first to plan the
   model; the first read of a model file is also what wakes up a reactive policy);
2. initializes: ``--init-seconds`` of pure CPU work (container and framework start-up, CUDA
   context, graph capture), touching no model data; ``--startup`` orders the two (``cpu``, the
   default: start-up first, so the first model access comes after it; ``headers-first``), or
   makes start-up read a cold non-model file first (``reads``: libraries, an image);
3. loads every tensor in file order with the stock loader and post-processes it on the CPU
   (a bfloat16 to float32 cast of every ``--cast-every``-th element: 16 by default, because on
   a serving machine the full cast runs on the accelerator and a full CPU cast would make this
   2-core machine CPU-bound rather than I/O-bound; 1 casts everything), then drops it, as the
   host copy is dropped once the tensor is on the accelerator.

``--backend mmap`` uses ``safetensors.safe_open(framework="pt")``, which maps the file, and
torch's cast; importing torch is part of the initialization time. ``--backend pread`` parses
the header and reads each tensor with plain ``read()`` calls into one reused buffer, and casts
with numpy (bfloat16 is the top half of a float32).
Prints one JSON line: init, load and total seconds, bytes loaded, a checksum, and the bytes
charged to its memory cgroup at the end of initialization (its own footprint: interpreter,
libraries, framework), which the benchmark adds to the constrained memory limit.
"""

from __future__ import annotations

import argparse
import json
import struct
import time
from pathlib import Path

import numpy as np


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--init-seconds", type=float, default=3.0)
    p.add_argument("--backend", choices=("mmap", "pread"), default="mmap")
    p.add_argument("--init-only", action="store_true", help="stop after initializing")
    p.add_argument(
        "--startup",
        choices=("cpu", "headers-first", "reads"),
        default="cpu",
        help="cpu: CPU work, then the index and headers (the first model access comes after "
        "start-up); headers-first: index and headers, then CPU work; reads: start-up reads "
        "--startup-file (libraries, a container image) cold, then CPU work, then the headers",
    )
    p.add_argument("--startup-file", help="the non-model file a 'reads' start-up reads")
    p.add_argument(
        "--cast-every",
        type=int,
        default=16,
        help="cast every Nth element to float32 (1: the whole tensor)",
    )
    return p.parse_args()


def header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    meta.pop("__metadata__", None)
    return 8 + n, meta


def busy(seconds: float) -> None:
    """CPU work that touches no file."""
    end = time.perf_counter() + seconds
    x = np.arange(1 << 16, dtype=np.float64)
    while time.perf_counter() < end:
        x = np.sqrt(x * x + 1.0)


def load_mmap(shards: list[Path], every: int) -> tuple[int, float]:
    from safetensors import safe_open

    total, check = 0, 0.0
    for shard in shards:
        _, meta = header(shard)
        order = sorted(meta, key=lambda k: meta[k]["data_offsets"][0])
        with safe_open(str(shard), framework="pt") as f:
            for name in order:
                t = f.get_tensor(name)
                converted = t.view(-1)[::every].float()
                check += float(converted[:: max(1, 4096 // every)].sum())
                total += t.numel() * t.element_size()
                del t, converted
    return total, check


def load_pread(shards: list[Path], every: int) -> tuple[int, float]:
    total, check = 0, 0.0
    buf = bytearray()
    for shard in shards:
        base, meta = header(shard)
        order = sorted(meta, key=lambda k: meta[k]["data_offsets"][0])
        with open(shard, "rb", buffering=0) as f:
            for name in order:
                start, end = meta[name]["data_offsets"]
                n = end - start
                if len(buf) < n:
                    buf = bytearray(n)
                view = memoryview(buf)[:n]
                f.seek(base + start)
                got = 0
                while got < n:
                    got += f.readinto(view[got:])
                t = np.frombuffer(view, dtype=np.uint16)[::every]
                converted = (t.astype(np.uint32) << 16).view(np.float32)
                check += float(converted[:: max(1, 4096 // every)].sum())
                total += n
    return total, check


def cgroup_usage() -> int | None:
    """Bytes charged to this process's memory cgroup now (v1 or v2), if it has one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for root, name in (
            ("/sys/fs/cgroup/memory", "memory.usage_in_bytes"),
            ("/sys/fs/cgroup/unified", "memory.current"),
            ("/sys/fs/cgroup", "memory.current"),
        ):
            if ("memory" in controllers.split(",")) != (name == "memory.usage_in_bytes"):
                continue
            f = Path(root + path) / name
            if path != "/" and f.exists():
                return int(f.read_text())
    return None


def main() -> None:
    args = parse_args()
    t0 = time.perf_counter()
    if args.backend == "mmap":
        import torch  # noqa: F401  (framework start-up: counted in the initialization)
    model = Path(args.model)

    def open_model() -> list[Path]:
        index = json.loads((model / "model.safetensors.index.json").read_text())
        shards = [model / s for s in sorted(set(index["weight_map"].values()))]
        for s in shards:
            header(s)
        return shards

    if args.startup == "headers-first":
        shards = open_model()
    if args.startup == "reads":
        with open(args.startup_file, "rb", buffering=0) as f:
            while f.read(4 << 20):
                pass
    busy(args.init_seconds - (time.perf_counter() - t0))
    if args.startup != "headers-first":
        shards = open_model()
    baseline = cgroup_usage()
    t1 = time.perf_counter()
    if args.init_only:
        print(json.dumps({"init_s": t1 - t0, "baseline_bytes": baseline}), flush=True)
        return
    load = load_mmap if args.backend == "mmap" else load_pread
    loaded, check = load(shards, max(1, args.cast_every))
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "init_s": t1 - t0,
                "load_s": t2 - t1,
                "total_s": t2 - t0,
                "bytes": loaded,
                "checksum": check,
                "baseline_bytes": baseline,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
