"""The I/O calls of MLPerf Storage's kv_cache_benchmark NVMe backend, reproduced.

From mlcommons/storage, kv_cache_benchmark/kv_cache/backends.py, `NVMeBackend` (commit
d012572407ec8526a6256c21634216730301be4f):
- `write(key, data)`: `open(path, 'wb')`, `np.save(f, data, allow_pickle=False)`, `f.flush()`,
  `os.fsync(f.fileno())`, with `path = <base>/<key>.npy`;
- `read(key)`: `posix_fadvise(POSIX_FADV_DONTNEED)` on the file, `np.load(path,
  allow_pickle=False)`, then `np.array(data)` (a copy).

Their benchmark calls these from many user threads; here a pool of 16 threads shared by all
streams makes the calls, as for the file-per-block peers. Loads return the arrays `read` makes
(a new array per block, as theirs does), not the caller's buffers.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .base import KvSystem, Miss
from .workload import Workload

THREADS = 16


class MlperfNpy(KvSystem):
    durability = "np.save + flush + fsync per file"

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        self.base = root
        self.base.mkdir(parents=True, exist_ok=True)
        self.workload = workload
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="mlperf")

    def _path(self, i: int) -> Path:
        return self.base / f"{self.workload.keys[i].hex()}.npy"

    def _write(self, i: int, data: np.ndarray) -> None:
        with open(self._path(i), "wb") as f:
            np.save(f, data, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())

    def _read(self, i: int) -> np.ndarray:
        path = self._path(i)
        if not path.exists():
            raise Miss(f"block {i}: {path} not found")
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        data = np.load(path, allow_pickle=False)
        return np.array(data)

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        list(self.pool.map(self._write, indices, blocks))

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.pool.map(self._read, indices))

    def close(self) -> None:
        self.pool.shutdown()
