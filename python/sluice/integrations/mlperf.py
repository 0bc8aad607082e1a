"""MLPerf Storage kv_cache_benchmark (mlcommons/storage ``kv_cache_benchmark`` at commit
23aa82ed, package mlperf-kv-cache 3.0.0): Sluice as the benchmark's NVMe tier.

Run the benchmark on Sluice (from a checkout of ``kv_cache_benchmark``, installed)::

    python -m sluice.integrations.mlperf --sluice-ssd 20GiB -- \\
      --config config.yaml --model llama3.1-8b --num-users 8 --duration 60 \\
      --gpu-mem-gb 0 --cpu-mem-gb 0 --cache-dir /tmp/kvbench --seed 42

which patches ``kv_cache.cache.NVMeBackend`` (the seam of docs/design/kv-adapters.md
§4.3) with :class:`SluiceKVBenchBackend` and calls the benchmark's own ``main()``.

The benchmark stores a whole request context per key (MiB to GiB, any shape), so an
entry is split into ``block_bytes`` blocks keyed ``<key>\\0<version>\\0<i>``, the last
block zero-padded; shape and dtype stay in memory, as the benchmark keeps its own
metadata. A new write of a key gets a new version, so a rewritten key never reads the
old blocks (Sluice blocks are immutable and there is no delete: a deleted entry's
blocks are left for the store's eviction policy).

Reads that fail are not hidden: the benchmark counts an exception from ``read`` as a
hit with 0 latency, so a failed read (an entry evicted by the store's policy, a corrupt
block) raises :class:`SluiceReadError` *and* is counted in ``failed_reads``; the runner
prints that count and exits non-zero when it is not 0.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

import sluice.kv
from sluice.errors import SluiceIOError

from ._common import ByteSize

MLPERF_COMMIT = "23aa82ed"
log = logging.getLogger(__name__)


class SluiceReadError(SluiceIOError):
    """An entry the benchmark wrote could not be read back whole."""


@dataclass
class IOTiming:
    """Same fields as ``kv_cache.backends.StorageBackend.IOTiming`` (seconds)."""

    total: float
    device: float
    host: float


def _timing(total: float, device: float, host: float) -> Any:
    try:
        from kv_cache.backends import StorageBackend

        return StorageBackend.IOTiming(total=total, device=device, host=host)
    except ImportError:
        return IOTiming(total, device, host)


@dataclass
class _Entry:
    version: int
    shape: tuple
    dtype: np.dtype
    nbytes: int
    nblocks: int


class SluiceKVBenchBackend:
    """The benchmark's backend contract: ``base_path``, ``write``, ``read``,
    ``delete``, ``clear``; blocking, called from many request threads."""

    STORE_DIR = "sluice-kv"

    def __init__(
        self,
        base_path: Optional[str] = None,
        *,
        block_bytes: ByteSize = "1MiB",
        ssd: ByteSize = "20GiB",
        dram: ByteSize = 0,
        policy: str = "lru",
    ) -> None:
        self._temp = None
        if base_path is None:
            self._temp = tempfile.TemporaryDirectory(prefix="kv_cache_sluice_")
            base_path = self._temp.name
        self.base_path = Path(base_path)
        self.base_path.mkdir(parents=True, exist_ok=True)
        store_dir = self.base_path / self.STORE_DIR
        # As NVMeBackend deletes its *.npy files at startup: a run starts empty.
        shutil.rmtree(store_dir, ignore_errors=True)
        self._store = sluice.kv.open(
            store_dir,
            block_bytes=block_bytes,
            ssd=ssd,
            dram=dram,
            policy=policy,
            kv_format=f"mlperf-kv-cache-{MLPERF_COMMIT}",
        )
        self._bb = self._store.block_bytes
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._versions = itertools.count()
        self.failed_reads = 0

    def _keys(self, key: str, e: _Entry) -> list[bytes]:
        return [f"{key}\0{e.version}\0{i}".encode() for i in range(e.nblocks)]

    def write(self, key: str, data: np.ndarray) -> Any:
        start = time.perf_counter()
        arr = np.ascontiguousarray(data)
        raw = arr.reshape(-1).view(np.uint8)
        nblocks = max(1, -(-raw.nbytes // self._bb))
        entry = _Entry(next(self._versions), arr.shape, arr.dtype, raw.nbytes, nblocks)
        blocks = [raw[i * self._bb : (i + 1) * self._bb] for i in range(nblocks)]
        if blocks[-1].nbytes < self._bb:
            last = np.zeros(self._bb, np.uint8)
            last[: blocks[-1].nbytes] = blocks[-1]
            blocks[-1] = last
        host_done = time.perf_counter()
        ok = self._store.put_batch(self._keys(key, entry), blocks)
        end = time.perf_counter()
        if not all(ok):
            raise SluiceIOError(
                f"kv bench write {key!r}: {ok.count(False)} of {nblocks} blocks not stored"
            )
        with self._lock:
            self._entries[key] = entry
        return _timing(end - start, end - host_done, host_done - start)

    def read(self, key: str) -> tuple[np.ndarray, Any]:
        start = time.perf_counter()
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"Key {key} not found in Sluice KV store")
        out = np.empty(entry.nblocks * self._bb, np.uint8)
        buffers = [out[i * self._bb : (i + 1) * self._bb] for i in range(entry.nblocks)]
        host_done = time.perf_counter()
        ok = self._store.get_batch_into(self._keys(key, entry), buffers)
        end = time.perf_counter()
        if not all(ok):
            with self._lock:
                self.failed_reads += 1
            msg = f"kv bench read {key!r}: block {ok.index(False)} of {entry.nblocks} missing"
            log.error("%s (the benchmark would count this as a hit)", msg)
            raise SluiceReadError(msg)
        data = out[: entry.nbytes].view(entry.dtype).reshape(entry.shape)
        return data, _timing(end - start, end - host_done, host_done - start)

    def delete(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def close(self) -> None:
        self._store.close()
        if self._temp is not None:
            self._temp.cleanup()


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the benchmark's CLI with Sluice as its NVMe tier (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m sluice.integrations.mlperf")
    parser.add_argument("--sluice-block-bytes", default="1MiB")
    parser.add_argument("--sluice-ssd", default="20GiB")
    parser.add_argument("--sluice-dram", default="0")
    parser.add_argument("--sluice-policy", default="lru")
    ours, bench_args = parser.parse_known_args(argv)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    import kv_cache.cache
    import kv_cache.cli

    made: list[SluiceKVBenchBackend] = []

    def factory(base_path: Optional[str] = None) -> SluiceKVBenchBackend:
        b = SluiceKVBenchBackend(
            base_path,
            block_bytes=ours.sluice_block_bytes,
            ssd=ours.sluice_ssd,
            dram=ours.sluice_dram,
            policy=ours.sluice_policy,
        )
        made.append(b)
        return b

    kv_cache.cache.NVMeBackend = functools.partial(factory)
    sys.argv = ["kv-cache.py", *bench_args]
    kv_cache.cli.main()
    failed = sum(b.failed_reads for b in made)
    print(f"sluice: {len(made)} backend(s), failed reads: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
