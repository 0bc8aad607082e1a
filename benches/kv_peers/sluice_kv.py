"""Sluice through its public Python API, `sluice.kv`, with its default flags.

- `SluiceSsd`: the SSD tier alone (`dram=0`), a budget large enough that nothing is evicted,
  `durability="batch"` (a `put_batch` returns after its segments are fdatasynced) and
  `direct="auto"`. Each request is one `put_batch` or `get_batch_into` (the GIL is released
  for the batch), straight into the caller's page-aligned buffers.
- `SluiceDram`: the DRAM tier alone (`ssd=0`), every block resident; loads are DRAM hits.

`extra()` adds the `lookup` timing of a 1,000-key chain (the first 1,000 keys stored, a
prefix chain as an engine asks for it) and the index bytes per block from `stats()`.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from .base import KvSystem, Miss
from .workload import Workload

CHAIN_KEYS = 1000
LOOKUP_RUNS = 2000
# Sluice keeps live data under its low watermark (0.8 of the budget, less a segment, less the
# header slot of each segment), so a budget of 1.4x the data plus 1 GiB never evicts a block
# during the run. The index is sized for the budget, so its bytes per stored block grow with
# this headroom (see extra()).
SSD_HEADROOM = 1.4
SSD_SPARE_BYTES = 1 << 30


class SluiceSsd(KvSystem):
    durability = 'durability="batch": fdatasync per segment before put_batch returns'

    def _open_args(self, workload: Workload) -> dict[str, Any]:
        return {"dram": 0, "ssd": int(workload.total_bytes * SSD_HEADROOM) + SSD_SPARE_BYTES}

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        import sluice.kv

        self.workload = workload
        self.store_ = sluice.kv.open(
            root, block_bytes=workload.block_bytes, **self._open_args(workload)
        )

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        ok = self.store_.put_batch([self.workload.keys[i] for i in indices], blocks)
        if not all(ok):
            raise Miss(f"put_batch declined {ok.count(False)} of {len(ok)} blocks")

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        ok = self.store_.get_batch_into([self.workload.keys[i] for i in indices], outs)
        if not all(ok):
            first = ok.index(False)
            raise Miss(f"get_batch_into: block {indices[first]} missed ({ok.count(False)} misses)")
        return outs

    def extra(self) -> dict[str, Any]:
        stats = self.store_.stats()
        out: dict[str, Any] = {"stats": stats, **self._lookup_timings()}
        tier = stats.get("ssd") or stats.get("dram") or {}
        if tier.get("blocks"):
            out["index_bytes"] = tier.get("index_bytes")
            out["index_bytes_per_block"] = tier["index_bytes"] / tier["blocks"]
            capacity = tier["budget_bytes"] // self.workload.block_bytes
            out["index_bytes_per_budget_block"] = tier["index_bytes"] / capacity
        return out

    def _lookup_timings(self) -> dict[str, Any]:
        if self.workload.n_blocks < CHAIN_KEYS:
            return {"lookup_note": f"fewer than {CHAIN_KEYS} blocks stored"}
        chain = self.workload.keys[:CHAIN_KEYS]
        out: dict[str, Any] = {"lookup_runs": LOOKUP_RUNS}
        # The public call (what an engine pays), the same without a lease, and the native call
        # alone (no per-key conversion in kv.py), to show where the time goes.
        calls = {
            "lookup_us": lambda: self.store_.lookup(chain, lease=True),
            "lookup_nolease_us": lambda: self.store_.lookup(chain, lease=False),
            "lookup_native_us": lambda: self.store_._native.lookup(chain, True),
        }
        for key, call in calls.items():
            times = []
            for _ in range(LOOKUP_RUNS):
                t0 = time.perf_counter()
                n = call()
                times.append(time.perf_counter() - t0)
                if n != CHAIN_KEYS:
                    raise Miss(f"lookup found {n} of a {CHAIN_KEYS}-key chain")
            out[key] = median(times) * 1e6
            out[key + "_p99"] = sorted(times)[int(0.99 * len(times))] * 1e6
        return out

    def close(self) -> None:
        self.store_.close()


class SluiceDram(SluiceSsd):
    durability = "none (DRAM tier)"

    def _open_args(self, workload: Workload) -> dict[str, Any]:
        # Slots are allocated once for the whole budget. The policy keeps a sixteenth of them
        # spare (for blocks evicted while a lease pins them), so every block stays resident
        # only with 16/15 of the blocks in slots, plus slack.
        slots = workload.n_blocks + -(-workload.n_blocks // 15) + 64
        return {"dram": slots * workload.block_bytes, "ssd": 0}

    def extra(self) -> dict[str, Any]:
        stats = self.store_.stats()
        return {"stats": stats}


class SluiceSidecar(SluiceSsd):
    """The same SSD tier, owned by a `sluice kv serve` child and reached through
    `sluice.kv.connect`: what TP ranks or engines sharing one store pay. Blocks cross
    through each connection's shared memory (one copy in, or out, per block); keys and
    flags go over the Unix socket. One connection per request stream."""

    durability = 'durability="batch" in the server: fdatasync per segment before a put returns'

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        import os
        import shutil
        import subprocess

        import sluice.kv

        self.workload = workload
        repo = Path(__file__).resolve().parents[2]
        binary = os.environ.get("SLUICE_BIN") or str(repo / "target" / "release" / "sluice")
        if not Path(binary).is_file():
            binary = shutil.which("sluice") or binary
        socket = root / "kv.sock"
        ssd = self._open_args(workload)["ssd"]
        args = [binary, "kv", "serve", str(root / "store"), "--socket", str(socket)]
        args += ["--block-bytes", str(workload.block_bytes), "--ssd", str(ssd), "--dram", "0"]
        self.proc = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sluice kv serve did not start ({args})")
            time.sleep(0.02)
        # A region per connection large enough for a whole request (capped at 256 MiB).
        per_request = max(1, inflight_blocks // 4) * workload.block_bytes
        self.store_ = sluice.kv.connect(
            socket, shm=min(per_request, 256 << 20), connections=4, timeout_ms=600_000
        )

    def close(self) -> None:
        import signal

        self.store_.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
