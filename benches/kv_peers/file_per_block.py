"""One file per block, after vLLM's file-system secondary tier (`FileSystemTierManager`).

vLLM (vllm/v1/kv_offload/tiering/fs/, vllm-project/vllm@0320ab4) stores each block as
`<root>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin`: `store_block` opens a per-thread `*.tmp`
(O_EXCL, O_DIRECT unless the directory refuses it), makes one `os.write`, and `os.replace`s it
into place, with no fsync; `load_block` opens the file and makes one `os.readv` into the
destination. 16 read and 16 write threads serve all requests. Here:
- the same hashed tree, tmp + rename publish, one write and one read per block;
- plus an `fsync` of the file before the rename, which vLLM does not do: the benchmark
  measures *durable* stores, so this peer pays for durability that vLLM skips (the directory
  entry is still not fsynced);
- `preadv` at offset 0 (what `readv` does on a fresh descriptor) into the caller's buffer;
- 16 threads shared by all request streams, as vLLM's pool is shared by all requests.

`FilePerBlockDirect` opens every file with O_DIRECT (vLLM's default; page-aligned buffers,
block sizes that are multiples of 4 KiB), `FilePerBlockBuffered` goes through the page cache.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .base import KvSystem, Miss
from .workload import Workload

THREADS = 16  # vLLM's FS tier default: 16 read and 16 write threads.


class FilePerBlockBuffered(KvSystem):
    durability = "write + fsync per file, then rename (vLLM itself does not fsync)"
    direct = False

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        self.root = root / "llama_0123456789ab_r0"
        self.workload = workload
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="fpb")
        self.flags = os.O_DIRECT if self.direct else 0

    def _path(self, i: int) -> Path:
        h = self.workload.keys[i].hex()
        return self.root / h[:3] / f"{h[3:5]}_g0" / f"{h}.bin"

    def _write_one(self, i: int, block: np.ndarray) -> None:
        path = self._path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | self.flags, 0o644)
        try:
            view = memoryview(block)
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def _read_one(self, i: int, out: np.ndarray) -> np.ndarray:
        try:
            fd = os.open(self._path(i), os.O_RDONLY | self.flags)
        except FileNotFoundError as e:
            raise Miss(f"block {i}: {e}") from e
        try:
            n = os.preadv(fd, [memoryview(out)], 0)
        finally:
            os.close(fd)
        if n != out.nbytes:
            raise Miss(f"block {i}: short read ({n} of {out.nbytes} bytes)")
        return out

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        list(self.pool.map(self._write_one, indices, blocks))

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.pool.map(self._read_one, indices, outs))

    def close(self) -> None:
        self.pool.shutdown()


class FilePerBlockDirect(FilePerBlockBuffered):
    durability = "O_DIRECT write + fsync per file, then rename (vLLM itself does not fsync)"
    direct = True
