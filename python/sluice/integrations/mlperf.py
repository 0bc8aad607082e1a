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
old blocks. The benchmark's ``delete`` (its LRU eviction) deletes the entry's blocks
(``KvStore.delete``), so Sluice's disk use follows the benchmark's.

Capacity (issue 28): the benchmark decides what it holds by its own byte count against
``--storage-capacity-gb`` (by default 95% of the file system's free space). The runner
passes Sluice's capacity there, less :data:`CAPACITY_RESERVE` for the padding of each
entry's last block, and refuses a larger ``--storage-capacity-gb`` naming both figures.
Where the benchmark goes past its own limit anyway (an entry larger than the limit, its
eviction cap), the backend refuses the write (:class:`SluiceCapacityError`, which the
benchmark counts as a failed allocation) rather than let Sluice's policy evict an entry
the benchmark believes it holds. A store's policy therefore never evicts: 0 entries lost
silently.

Buffers are 4 KiB-aligned (an entry is copied into an aligned buffer once, a read lands
in one), so O_DIRECT moves them without the store's staging copies: those share a pool
of ``io_threads`` slots for the whole store, which the benchmark's concurrent requests
queued on (docs/benchmarks.md, "MLPerf kv_cache_benchmark").

Reads that fail are not hidden: the benchmark counts an exception from ``read`` as a
hit with 0 latency, so a failed read (a corrupt block, a block missing) raises
:class:`SluiceReadError` *and* is counted in ``failed_reads``; the runner prints that
count and exits non-zero when it is not 0. A read that loses a race with the
benchmark's own delete of the same entry raises ``KeyError``, as the benchmark's file
backend does, and is counted apart (``raced_reads``).
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
from sluice._sluice import parse_byte_size
from sluice.errors import ConfigError, SluiceIOError

from ._common import ByteSize

MLPERF_COMMIT = "23aa82ed"
log = logging.getLogger(__name__)

#: The share of Sluice's capacity the runner gives the benchmark's accounting: it counts
#: an entry's bytes, Sluice whole blocks, up to one block more per entry; at 1 MiB blocks
#: and the smallest llama3.1-8b contexts (about 20 MiB) that is under 5%.
CAPACITY_RESERVE = 0.95
ALIGN = 4096
GIB = 1 << 30


class SluiceReadError(SluiceIOError):
    """An entry the benchmark wrote could not be read back whole."""


class SluiceCapacityError(SluiceIOError):
    """A write the benchmark's accounting let past Sluice's capacity (refused, never
    stored at the cost of an entry the benchmark holds)."""


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


def _aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of uint8 starting on a 4 KiB boundary (O_DIRECT takes them as they are)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    offset = -raw.ctypes.data % ALIGN
    return raw[offset : offset + nbytes]


def sluice_capacity(ssd: ByteSize, block_bytes: ByteSize) -> tuple[int, int]:
    """The blocks an SSD budget of ``ssd`` holds, and their bytes (the store's rule:
    ``ssd // block_bytes`` whole blocks)."""
    bb = parse_byte_size("sluice_block_bytes", block_bytes)
    blocks = parse_byte_size("sluice_ssd", ssd) // bb
    return blocks, blocks * bb


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
        segment_bytes: ByteSize = "32MiB",
        **store_options: Any,
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
            segment_bytes=segment_bytes,
            kv_format=f"mlperf-kv-cache-{MLPERF_COMMIT}",
            **store_options,
        )
        self._bb = self._store.block_bytes
        stats = self._store.stats()
        tier = stats["ssd"] or stats["dram"]
        #: Blocks the store holds without evicting: the most this backend lets entries take.
        self.capacity_blocks = int(tier["capacity_blocks"])
        self._entries: dict[str, _Entry] = {}
        self._live_blocks = 0
        self._lock = threading.Lock()
        self._versions = itertools.count()
        self.failed_reads = 0
        self.raced_reads = 0
        self.rejected_writes = 0

    def _keys(self, key: str, e: _Entry) -> list[bytes]:
        return [f"{key}\0{e.version}\0{i}".encode() for i in range(e.nblocks)]

    def _reserve(self, key: str, nblocks: int, nbytes: int) -> int:
        with self._lock:
            if self._live_blocks + nblocks > self.capacity_blocks:
                self.rejected_writes += 1
                raise SluiceCapacityError(
                    f"kv bench write {key!r}: {nblocks} blocks ({nbytes} bytes) would overrun "
                    f"Sluice's capacity of {self.capacity_blocks} blocks of {self._bb} bytes, "
                    f"{self._live_blocks} of them held: the benchmark's accounting let this "
                    "write past Sluice's (pass a smaller --storage-capacity-gb)"
                )
            self._live_blocks += nblocks
            return next(self._versions)

    def _release(self, nblocks: int) -> None:
        with self._lock:
            self._live_blocks -= nblocks

    def write(self, key: str, data: np.ndarray) -> Any:
        start = time.perf_counter()
        arr = np.ascontiguousarray(data)
        raw = arr.reshape(-1).view(np.uint8)
        nblocks = max(1, -(-raw.nbytes // self._bb))
        version = self._reserve(key, nblocks, raw.nbytes)
        entry = _Entry(version, arr.shape, arr.dtype, raw.nbytes, nblocks)
        try:
            src = raw
            if raw.ctypes.data % ALIGN or raw.nbytes != nblocks * self._bb:
                src = _aligned_empty(nblocks * self._bb)
                src[: raw.nbytes] = raw
                src[raw.nbytes :] = 0
            blocks = [src[i * self._bb : (i + 1) * self._bb] for i in range(nblocks)]
            keys = self._keys(key, entry)
            host_done = time.perf_counter()
            ok = self._store.put_batch(keys, blocks)
        except BaseException:
            self._release(nblocks)
            raise
        end = time.perf_counter()
        if not all(ok):
            self._store.delete([k for k, stored in zip(keys, ok) if stored])
            self._release(nblocks)
            raise SluiceIOError(
                f"kv bench write {key!r}: {ok.count(False)} of {nblocks} blocks not stored"
            )
        with self._lock:
            old = self._entries.get(key)
            self._entries[key] = entry
        if old is not None:
            self._forget(key, old)
        return _timing(end - start, end - host_done, host_done - start)

    def _forget(self, key: str, e: _Entry) -> None:
        self._store.delete(self._keys(key, e))
        self._release(e.nblocks)

    def read(self, key: str) -> tuple[np.ndarray, Any]:
        start = time.perf_counter()
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            raise KeyError(f"Key {key} not found in Sluice KV store")
        out = _aligned_empty(entry.nblocks * self._bb)
        buffers = [out[i * self._bb : (i + 1) * self._bb] for i in range(entry.nblocks)]
        host_done = time.perf_counter()
        ok = self._store.get_batch_into(self._keys(key, entry), buffers)
        end = time.perf_counter()
        if not all(ok):
            with self._lock:
                current = self._entries.get(key) is entry
                if current:
                    self.failed_reads += 1
                else:
                    self.raced_reads += 1
            if not current:
                raise KeyError(f"Key {key} was deleted while it was read")
            msg = f"kv bench read {key!r}: block {ok.index(False)} of {entry.nblocks} missing"
            log.error("%s (the benchmark would count this as a hit)", msg)
            raise SluiceReadError(msg)
        data = out[: entry.nbytes].view(entry.dtype).reshape(entry.shape)
        return data, _timing(end - start, end - host_done, host_done - start)

    def delete(self, key: str) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None:
            self._forget(key, entry)

    def clear(self) -> None:
        with self._lock:
            entries = list(self._entries.items())
            self._entries.clear()
        for key, entry in entries:
            self._forget(key, entry)

    def held_blocks(self) -> int:
        """Blocks of the entries the benchmark holds (what the store's SSD tier holds)."""
        with self._lock:
            return self._live_blocks

    def close(self) -> None:
        self._store.close()
        if self._temp is not None:
            self._temp.cleanup()


def _capacity_flag(args: list[str]) -> Optional[float]:
    """The benchmark's ``--storage-capacity-gb`` among ``args`` (GiB), or None."""
    for i, a in enumerate(args):
        value = None
        if a == "--storage-capacity-gb" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--storage-capacity-gb="):
            value = a.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                raise ConfigError(f"--storage-capacity-gb {value!r}: not a number of GiB") from None
    return None


def capacity_args(bench_args: list[str], ssd: ByteSize, block_bytes: ByteSize) -> list[str]:
    """``bench_args`` with the benchmark's capacity set to what Sluice holds: when absent
    or 0 (the benchmark would size itself from the file system's free space), Sluice's
    capacity less :data:`CAPACITY_RESERVE`. A larger one is refused with
    :class:`~sluice.errors.ConfigError` naming both figures."""
    blocks, cap = sluice_capacity(ssd, block_bytes)
    asked = _capacity_flag(bench_args)
    if asked is None or asked <= 0:
        gib = cap * CAPACITY_RESERVE / GIB
        rest = [a for a in bench_args if not a.startswith("--storage-capacity-gb=")]
        if "--storage-capacity-gb" in rest:
            i = rest.index("--storage-capacity-gb")
            del rest[i : i + 2]
        return [*rest, "--storage-capacity-gb", f"{gib:.6f}"]
    if asked * GIB > cap:
        raise ConfigError(
            f"--storage-capacity-gb {asked:g} GiB ({int(asked * GIB)} bytes) is more than "
            f"Sluice holds: --sluice-ssd {ssd} is {blocks} blocks of {block_bytes}, "
            f"{cap} bytes ({cap / GIB:.3f} GiB); the benchmark would believe it holds "
            "entries Sluice evicted. Pass --storage-capacity-gb "
            f"{cap * CAPACITY_RESERVE / GIB:.3f} or less, or a larger --sluice-ssd"
        )
    return list(bench_args)


def main(argv: Optional[list[str]] = None) -> int:
    """Runs the benchmark's CLI with Sluice as its NVMe tier (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m sluice.integrations.mlperf")
    parser.add_argument("--sluice-block-bytes", default="1MiB")
    parser.add_argument("--sluice-ssd", default="20GiB")
    parser.add_argument("--sluice-dram", default="0")
    parser.add_argument("--sluice-policy", default="lru")
    parser.add_argument("--sluice-segment-bytes", default="32MiB")
    ours, bench_args = parser.parse_known_args(argv)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    try:
        bench_args = capacity_args(bench_args, ours.sluice_ssd, ours.sluice_block_bytes)
    except ConfigError as e:
        print(f"sluice: {e}", file=sys.stderr)
        return 2
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
            segment_bytes=ours.sluice_segment_bytes,
        )
        made.append(b)
        return b

    kv_cache.cache.NVMeBackend = functools.partial(factory)
    sys.argv = ["kv-cache.py", *bench_args]
    kv_cache.cli.main()
    failed = sum(b.failed_reads for b in made)
    raced = sum(b.raced_reads for b in made)
    rejected = sum(b.rejected_writes for b in made)
    print(
        f"sluice: {len(made)} backend(s), failed reads: {failed}, reads of an entry deleted "
        f"meanwhile: {raced}, writes refused past capacity: {rejected}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
