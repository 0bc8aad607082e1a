"""LMCache 0.5.6's local-disk backend (`LocalDiskBackend`), driven through its own calls.

Runs in .venv-kvpeers (LMCache pins numpy<=2.2.6). Configured as LMCache documents it for a
disk tier: `local_disk=<dir>`, `max_local_disk_size`, `extra_config={"use_odirect": True}`,
`local_cpu=False` (the CPU backend only stages), its default 4 disk I/O threads. What the
backend does with that (lmcache/v1/storage_backend/local_disk_backend.py at 0.5.6):
- one `<model>@<ws>@<worker>@<hash>@<dtype>.pt` file per chunk in one flat directory;
- a put is `os.open(O_DIRECT)` + one `os.write` from the staging buffer, with no fsync; it
  is acknowledged (`on_complete_callback`) when the write returns;
- `batched_get_blocking` reads each file with one `readinto` (O_DIRECT) into a staging buffer
  from the CPU backend's allocator, on its read pool.

Staging memory is page-aligned host memory, as the pinned allocator gives it on a GPU machine
(the plain CPU allocator's torch buffer is only 64-byte aligned, and O_DIRECT writes fail with
EINVAL). A store copies each block into staging (LMCache's GPU-to-CPU copy) and submits it;
a load returns the staging buffers, where LMCache hands blocks on to the GPU. The run adds one
`sync()` after the last put (timed as part of the store), since LMCache never fsyncs.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import numpy as np

from .base import KvSystem, Miss
from .workload import Workload, aligned_empty

PUT_TIMEOUT_S = 120.0


class LmcacheDisk(KvSystem):
    durability = "O_DIRECT write, no fsync (LMCache 0.5.6); one sync() after the last put"

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_allocators.host_memory_allocator import HostMemoryAllocator
        from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

        root.mkdir(parents=True, exist_ok=True)
        self.torch, self.fmt, self.workload = torch, MemoryFormat.KV_2LTD, workload
        config = LMCacheEngineConfig.from_defaults(
            chunk_size=256,
            local_cpu=False,
            max_local_cpu_size=1.0,
            local_disk=str(root),
            max_local_disk_size=workload.total_bytes * 1.2 / 2**30 + 1,
            extra_config={"use_odirect": True},
            lmcache_instance_id="sluice-bench",
        )
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        allocator = HostMemoryAllocator(4096)
        staging_bytes = (inflight_blocks + 8) * workload.block_bytes
        self.staging = aligned_empty(staging_bytes)
        allocator.allocator = TensorMemoryAllocator(torch.from_numpy(self.staging))
        self.cpu = LocalCPUBackend(config, memory_allocator=allocator)
        self.disk = LocalDiskBackend(config, self.loop, self.cpu, dst_device="cpu")
        self.keys = [
            CacheEngineKey("bench", 1, 0, int.from_bytes(k[:8], "little"), torch.uint8)
            for k in workload.keys
        ]
        self.shape = torch.Size([workload.block_bytes])
        self.held: dict[int, object] = {}
        self.held_lock = threading.Lock()

    def _bytes(self, obj) -> np.ndarray:
        return obj.tensor.view(self.torch.uint8).reshape(-1).numpy()

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        objs = []
        for block in blocks:
            obj = self.cpu.allocate(self.shape, self.torch.uint8, self.fmt)
            if obj is None:
                raise Miss("LMCache staging allocation failed")
            self._bytes(obj)[:] = block
            objs.append(obj)
        done = threading.Semaphore(0)
        self.disk.batched_submit_put_task(
            [self.keys[i] for i in indices], objs, on_complete_callback=lambda _k: done.release()
        )
        for i in indices:
            if not done.acquire(timeout=PUT_TIMEOUT_S):
                raise Miss(f"LMCache did not acknowledge the put of block {i}")
        for obj in objs:
            obj.ref_count_down()

    def finish_store(self) -> None:
        os.sync()

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        objs = self.disk.batched_get_blocking([self.keys[i] for i in indices])
        arrays = []
        for i, obj in zip(indices, objs):
            if obj is None:
                self._drop(objs)
                raise Miss(f"LMCache missed block {i}")
            arr = self._bytes(obj)
            with self.held_lock:
                self.held[id(arr)] = obj
            arrays.append(arr)
        return arrays

    def _drop(self, objs) -> None:
        for obj in objs:
            if obj is not None:
                obj.ref_count_down()

    def release(self, arrays: list[np.ndarray]) -> None:
        with self.held_lock:
            objs = [self.held.pop(id(a)) for a in arrays]
        self._drop(objs)

    def close(self) -> None:
        self.disk.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
