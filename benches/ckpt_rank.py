"""One rank of `make bench-ckpt`: builds its state, saves it with one writer, loads it back cold.

bench_ckpt.py starts `--world` of these per measurement (fresh processes, so a peak RSS belongs
to one save) on gloo, with `init_method=file://INIT`:

    python benches/ckpt_rank.py --rank 0 --world 2 --init /d/init --workload mixed \\
        --writer sluice --dir /d/run --bytes 1073741824 --out /d/rank-0.json

1. Builds the workload's state (touched: random normals from per-tensor seeds, or zeros), the
   same on every run, so the loaded state can be checked bit for bit against it.
2. `incremental`: saves `mixed` once (untimed), changes about 6% of its bytes (a block of rows
   of three sharded tensors, and the step) and measures the second save, to a new checkpoint
   (in the same store, for the Sluice writers).
3. After a barrier, times the save until the state may change again (unblocked) and until the
   checkpoint is on disk (durable), with /proc/self/io deltas and the peak RSS meanwhile
   (VmRSS sampled every 5 ms, and VmHWM after resetting it: the larger). Rank 0 notes the
   apparent bytes of the writer's directory before and after.
4. Rank 0 syncs and drops the page cache between two barriers; every rank loads into a fresh,
   touched, zero state of the same structure, timed from the second barrier, and compares.
5. Writes one JSON object to `--out`.

`--hash-gib N` instead times Sluice's BLAKE3 chunk hashing over an N GiB touched tensor.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import page_cache
import sluice.ckpt as ck
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from sluice import _sluice
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

WORKLOADS = ("replicated", "sharded", "mixed", "incremental")
WRITERS = ("dcp-save", "dcp-async", "torch-save", "sluice-dcp", "sluice")
SLUICE_WRITERS = ("sluice-dcp", "sluice")
# float32 rows of 1024 elements: 4 KiB, the grain every tensor's size is rounded to.
COLS = 1024
ROW_BYTES = COLS * 4
CHUNK = ck.DEFAULT_CHUNK_BYTES
STEP = 1000
RSS_INTERVAL_S = 0.005

State = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Workloads: which tensors a rank holds, each from its own seed (or zeros)


@dataclass(frozen=True)
class Spec:
    key: str
    rows: int
    seed: int | None = None  # None: zero-filled
    tie: str | None = None  # the key whose tensor this key also names


def _rank_seed(rank: int, i: int) -> int:
    return (rank + 1) * 1_000_003 + i


def layout(workload: str, rank: int, nbytes: int) -> list[Spec]:
    """This rank's tensors; their logical bytes (a tied tensor counted under both keys) sum
    to `nbytes` rounded down to 4 KiB rows."""

    def rows(fraction: float) -> int:
        return max(1, int(nbytes * fraction) // ROW_BYTES)

    if workload == "replicated":  # DDP: every rank the same tensors (one seed for all)
        return [Spec(f"rep.{i}", rows(1 / 16), seed=1 + i) for i in range(16)]
    if workload == "sharded":  # FSDP: every rank its own tensors, under its own keys
        return [
            Spec(f"shard.r{rank}.{i}", rows(1 / 16), seed=_rank_seed(rank, i)) for i in range(16)
        ]
    # mixed (and incremental): 40% sharded, 30% replicated, a tied pair (5% under two keys),
    # 20% zero-filled optimizer moments; units of 5%.
    unit = 0.05
    specs = [Spec(f"shard.r{rank}.{i}", rows(unit), seed=_rank_seed(rank, i)) for i in range(8)]
    specs += [Spec(f"rep.{i}", rows(unit), seed=1 + i) for i in range(6)]
    embed = f"tied.r{rank}.embed"
    specs += [
        Spec(embed, rows(unit), seed=_rank_seed(rank, 500)),
        Spec(f"tied.r{rank}.head", rows(unit), tie=embed),
    ]
    specs += [
        Spec(f"opt.r{rank}.{m}.{i}", rows(unit)) for m in ("exp_avg", "exp_avg_sq") for i in (0, 1)
    ]
    return specs


def build(specs: list[Spec], workload: str, zeros: bool = False) -> State:
    """The state, every byte written (touched) as a framework's parameters are; `zeros` for a
    load's destination, with the same structure (the tie included)."""
    state: State = {}
    for s in specs:
        if s.tie is not None:
            state[s.key] = state[s.tie]
        elif zeros or s.seed is None:
            state[s.key] = torch.zeros(s.rows, COLS)
        else:
            g = torch.Generator().manual_seed(s.seed)
            state[s.key] = torch.randn(s.rows, COLS, generator=g)
    if workload in ("mixed", "incremental"):
        state["step"] = 0 if zeros else STEP
    return state


def modify(state: State, specs: list[Spec], nbytes: int) -> int:
    """Changes about 6% of the rank's bytes (2% in each of three sharded tensors: a block of
    rows adds 1) and the step; returns the bytes of the 4 MiB chunks the changes touch."""
    changed = 0
    sharded = [s for s in specs if s.key.startswith("shard.")][:3]
    for s in sharded:
        t = state[s.key]
        n = max(1, min(s.rows, int(nbytes * 0.02) // ROW_BYTES))
        start = min(s.rows - n, s.rows * 3 // 10)
        t[start : start + n] += 1
        changed += chunk_bytes_touched(
            s.rows * ROW_BYTES, start * ROW_BYTES, (start + n) * ROW_BYTES
        )
    state["step"] += 1
    return changed


def chunk_bytes_touched(size: int, lo: int, hi: int) -> int:
    """Bytes of the CHUNK-sized pieces of a `size`-byte tensor that overlap [lo, hi)."""
    first, last = lo // CHUNK, (hi - 1) // CHUNK
    return sum(min(CHUNK, size - k * CHUNK) for k in range(first, last + 1))


def state_bytes(state: State) -> tuple[int, int]:
    """(bytes of distinct storage, logical bytes: every key's tensor counted)."""
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    logical = sum(t.numel() * t.element_size() for t in tensors)
    distinct = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(distinct.values()), logical


def mismatches(got: State, want: State) -> list[str]:
    """Keys whose loaded value differs from the saved one (bit for bit, dtype and shape)."""
    bad = sorted(set(got) ^ set(want))
    for k, v in want.items():
        if k not in got:
            continue
        g = got[k]
        if isinstance(v, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != v.dtype or not torch.equal(g, v):
                bad.append(k)
        elif g != v:
            bad.append(k)
    return bad


# ---------------------------------------------------------------------------------------------
# Measurement helpers


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (ln.split(":") for ln in f if ":" in ln)}


def io_delta(before: dict[str, int]) -> dict[str, int]:
    after = proc_io()
    return {k: after[k] - before[k] for k in ("rchar", "wchar", "read_bytes", "write_bytes")}


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith(field):
                return int(ln.split()[1])
    return 0


class RssPeak:
    """The peak RSS from `start()` to `stop()`: VmRSS sampled every 5 ms in a thread, and
    VmHWM after resetting it (clear_refs 5) where the kernel allows; the larger of the two."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.before = self.sampled = 0
        self.samples = 0
        self.hwm_reset = False

    def _sample(self) -> None:
        while not self._stop.wait(RSS_INTERVAL_S):
            self.sampled = max(self.sampled, status_kib("VmRSS:") * 1024)
            self.samples += 1

    def start(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            pass
        self.before = self.sampled = status_kib("VmRSS:") * 1024
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        hwm = status_kib("VmHWM:") * 1024 if self.hwm_reset else 0
        peak = max(self.sampled, hwm)
        return {
            "rss_before_bytes": self.before,
            "rss_peak_sampled_bytes": self.sampled,
            "rss_hwm_bytes": hwm,
            "rss_samples": self.samples,
            "extra_rss_bytes": peak - self.before,
        }


def apparent_bytes(path: Path) -> int:
    """Apparent size of every file under `path`."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


# ---------------------------------------------------------------------------------------------
# Writers and readers


@dataclass
class Ctx:
    rank: int
    world: int
    dir: Path  # the writer's directory: checkpoint directories, or a Sluice store

    def ckpt(self, name: str) -> Path:
        return self.dir / name


def save(writer: str, state: State, ctx: Ctx, name: str) -> dict[str, Any]:
    """Saves `state` as checkpoint `name`; seconds until the call returned, until the state may
    change (unblocked) and until durable, and the writer's own report where it has one."""
    path = ctx.ckpt(name)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    if writer == "dcp-save":
        dcp.save(state, storage_writer=FileSystemWriter(path))
        out["return_s"] = out["unblocked_s"] = out["durable_s"] = time.perf_counter() - t0
    elif writer == "torch-save":
        path.mkdir(parents=True, exist_ok=True)
        with open(path / f"rank-{ctx.rank}.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        out["return_s"] = out["unblocked_s"] = out["durable_s"] = time.perf_counter() - t0
    elif writer == "sluice":
        h = ck.save(state, path)
        out["return_s"] = time.perf_counter() - t0
        h.staged.result()
        out["unblocked_s"] = time.perf_counter() - t0
        report = h.durable.result()
        out["durable_s"] = time.perf_counter() - t0
        keep = ("written_bytes", "written_bytes_rank", "unique_bytes", "logical_bytes")
        out["report"] = {k: report[k] for k in keep if k in report}
    else:  # dcp-async, sluice-dcp: AsyncSaveResponse's two futures
        stager: DefaultStager | None = None
        if writer == "dcp-async":
            opts = StagingOptions(
                use_pinned_memory=False,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=False,
            )
            stager = DefaultStager(opts)
            resp = dcp.async_save(state, storage_writer=FileSystemWriter(path), async_stager=stager)
        else:
            resp = dcp.async_save(state, storage_writer=ck.StorageWriter(path))
        out["return_s"] = time.perf_counter() - t0
        if hasattr(resp, "staging_completion"):
            resp.staging_completion.result()
            upload = resp.upload_completion
        else:  # a plain future: the state was staged when async_save returned
            out["plain_future"] = True
            upload = resp
        out["unblocked_s"] = time.perf_counter() - t0
        upload.result()
        out["durable_s"] = time.perf_counter() - t0
        if stager is not None:
            stager.close()
    return out


def load(writer: str, state: State, ctx: Ctx, name: str) -> dict[str, Any]:
    """Loads checkpoint `name` into `state` in place."""
    path = ctx.ckpt(name)
    if writer in ("dcp-save", "dcp-async"):
        dcp.load(state, storage_reader=FileSystemReader(path))
    elif writer == "torch-save":
        saved = torch.load(path / f"rank-{ctx.rank}.pt")
        for k, v in saved.items():
            if isinstance(v, torch.Tensor):
                state[k].copy_(v)
            else:
                state[k] = v
    elif writer == "sluice-dcp":
        dcp.load(state, storage_reader=ck.StorageReader(path))
    else:
        ck.load(state, path)
    if writer in SLUICE_WRITERS:
        return {"last_load": dict(ck.last_load)}
    return {}


# ---------------------------------------------------------------------------------------------
# One measurement


def measure(args: argparse.Namespace) -> dict[str, Any]:
    rank, world = args.rank, args.world
    ctx = Ctx(rank, world, Path(args.dir))
    specs = layout(args.workload, rank, args.bytes)
    state = build(specs, args.workload)
    distinct, logical = state_bytes(state)
    result: dict[str, Any] = {"state_bytes": distinct, "logical_bytes": logical}
    name = "ckpt"
    if args.workload == "incremental":
        dist.barrier()
        result["first_save"] = save(args.writer, state, ctx, "ckpt-1")
        result["changed_chunk_bytes"] = modify(state, specs, args.bytes)
        name = "ckpt-2"

    # The save, timed from a barrier.
    if rank == 0:
        result["dir_bytes_before"] = apparent_bytes(ctx.dir)
    dist.barrier()
    rss = RssPeak()
    rss.start()
    io0 = proc_io()
    result["save"] = save(args.writer, state, ctx, name)
    result["save"]["io"] = io_delta(io0)
    result["save"].update(rss.stop())
    dist.barrier()
    if rank == 0:
        result["dir_bytes_after"] = apparent_bytes(ctx.dir)

    # The load, cold, into a fresh zero state of the same structure.
    fresh = build(specs, args.workload, zeros=True)
    dist.barrier()
    if rank == 0:
        result["cache_dropped"] = page_cache.drop()
    dist.barrier()
    io0 = proc_io()
    t0 = time.perf_counter()
    result["load"] = load(args.writer, fresh, ctx, name)
    result["load"]["seconds"] = time.perf_counter() - t0
    result["load"]["io"] = io_delta(io0)
    bad = mismatches(fresh, state)
    result["exact"] = not bad
    result["mismatched_keys"] = bad[:10]
    dist.barrier()
    return result


def hash_bench(gib: float, runs: int) -> dict[str, Any]:
    """Sluice's BLAKE3 chunk hashing (4 MiB chunks) over one touched tensor."""
    t = torch.empty(int(gib * 2**30) // 4, dtype=torch.float32).uniform_()
    nbytes = t.numel() * 4
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        head = json.dumps([{"key": "t", "kind": "tensor", "nbytes": nbytes}])
        _sluice.CkptShare(head, [t.data_ptr()], CHUNK)
        seconds.append(time.perf_counter() - t0)
    s = statistics.median(seconds)
    cores = os.cpu_count() or 1
    return {
        "bytes": nbytes,
        "runs": seconds,
        "median_s": s,
        "gbps": nbytes / s / 1e9,
        "cores": cores,
        "gbps_per_core": nbytes / s / 1e9 / cores,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int)
    p.add_argument("--world", type=int)
    p.add_argument("--init", help="the file:// rendezvous file")
    p.add_argument("--workload", choices=WORKLOADS)
    p.add_argument("--writer", choices=WRITERS)
    p.add_argument("--dir", help="the writer's directory (checkpoints or a Sluice store)")
    p.add_argument("--bytes", type=int, help="this rank's logical state bytes")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: cores/world)")
    p.add_argument("--out", required=True, help="where to write the JSON result")
    p.add_argument(
        "--hash-gib", type=float, help="time BLAKE3 hashing instead (no torch.distributed)"
    )
    p.add_argument("--hash-runs", type=int, default=3)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    if args.hash_gib:
        out.write_text(json.dumps(hash_bench(args.hash_gib, args.hash_runs)))
        return
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // args.world))
    dist.init_process_group(
        "gloo", init_method=f"file://{args.init}", rank=args.rank, world_size=args.world
    )
    try:
        result = measure(args)
    except BaseException as e:
        out.write_text(
            json.dumps({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        )
        traceback.print_exc()
        # The other ranks may be waiting in a collective: the driver kills them on our exit.
        sys.stderr.flush()
        os._exit(1)
    result.update(rank=args.rank, world=args.world, workload=args.workload, writer=args.writer)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
