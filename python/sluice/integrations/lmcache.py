"""LMCache 0.5.6 (MP server mode): Sluice as an L2 adapter.

Enable it on the LMCache server with::

    lmcache server ... --l2-adapter '{"type":"plugin",
      "module_path":"sluice.integrations.lmcache","class_name":"SluiceL2Adapter",
      "adapter_params":{"path":"/nvme/sluice-kv","block_bytes":33554432,"ssd":"200GiB"}}'

LMCache's plugin loader imports the module, checks that ``SluiceL2Adapter`` subclasses
``L2AdapterInterface`` and builds it as ``cls(adapter_params, l1_memory_desc=...)``
(docs/design/kv-adapters.md §3.2). ``block_bytes`` is the size of one L1 memory object
(one chunk of one model); objects of another size fail their task.

The interface is submit / signal an eventfd / query, called from two controller threads:
- lookup-and-lock probes the store's index (no I/O) key by key and leases each hit, so
  the bitmap is ready at once; unlock is a no-op (leases end with the load or their
  timeout; sluice.kv has no explicit release);
- store and load run on two private threads with the batch calls, which release the
  GIL; a load retries past a miss, because LMCache wants a bit per key while the store
  stops a batch at its first miss.

An ``ObjectKey`` becomes ``model@kv_rank@group@salt@`` + the chunk hash, so one server
can hold several models in one store.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from sluice.errors import ConfigError

from ._common import StoreOptions, leading_true

LMCACHE_VERSION = "0.5.6"

log = logging.getLogger(__name__)


def object_key_bytes(key: Any) -> bytes:
    prefix = (
        f"{key.model_name}@{key.kv_rank}@{getattr(key, 'object_group_id', 0)}@"
        f"{getattr(key, 'cache_salt', '')}@"
    )
    return prefix.encode() + bytes(key.chunk_hash)


def _build_adapter_class() -> type:
    from lmcache.lmcache_native import Bitmap
    from lmcache.v1.distributed.internal_api import L2StoreResult
    from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface

    class SluiceL2Adapter(L2AdapterInterface):
        """A Sluice KV store as an LMCache MP-mode L2 adapter."""

        def __init__(self, config: Any, l1_memory_desc: Any = None) -> None:
            super().__init__()
            params = dict(config or {})
            if "block_bytes" not in params:
                raise ConfigError(
                    "LMCache adapter SluiceL2Adapter: adapter_params needs 'block_bytes' "
                    "(the size of one L1 memory object)"
                )
            options, engine = StoreOptions.from_config(
                params, "LMCache adapter SluiceL2Adapter", ("block_bytes",)
            )
            self._store = options.open(
                f"{options.path}/lmcache-l2",
                block_bytes=engine["block_bytes"],
                kv_format=f"lmcache-{LMCACHE_VERSION}-l2",
            )
            self._block_bytes = self._store.block_bytes
            flags = os.EFD_NONBLOCK | os.EFD_CLOEXEC
            self._store_fd = os.eventfd(0, flags)
            self._lookup_fd = os.eventfd(0, flags)
            self._load_fd = os.eventfd(0, flags)
            self._lock = threading.Lock()
            self._ids = itertools.count(1)
            self._stored: dict[int, Any] = {}
            self._looked_up: dict[int, Any] = {}
            self._loaded: dict[int, Any] = {}
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="sluice-lmcache-l2")

        # --- event fds --------------------------------------------------------------

        def get_store_event_fd(self) -> int:
            return self._store_fd

        def get_lookup_and_lock_event_fd(self) -> int:
            return self._lookup_fd

        def get_load_event_fd(self) -> int:
            return self._load_fd

        def _finish(self, table: dict, task_id: int, value: Any, fd: int) -> None:
            with self._lock:
                table[task_id] = value
            os.eventfd_write(fd, 1)

        # --- buffers ----------------------------------------------------------------

        def _buffer(self, obj: Any) -> Any:
            import torch

            t = obj.tensor
            if t is None or not t.is_contiguous():
                raise ConfigError("LMCache memory object: no contiguous CPU tensor")
            raw = t.view(torch.uint8).reshape(-1) if t.dtype != torch.uint8 else t.reshape(-1)
            if raw.numel() != self._block_bytes:
                raise ConfigError(
                    f"LMCache memory object of {raw.numel()} bytes; the store's "
                    f"block_bytes is {self._block_bytes}"
                )
            return raw

        # --- store ------------------------------------------------------------------

        def submit_store_task(self, keys: list, objects: list) -> int:
            task_id = next(self._ids)
            ks = [object_key_bytes(k) for k in keys]
            self._pool.submit(self._store_task, task_id, ks, list(objects))
            return task_id

        def _store_task(self, task_id: int, keys: list[bytes], objects: list) -> None:
            try:
                if len(keys) != len(objects):
                    raise ConfigError(f"{len(keys)} keys but {len(objects)} objects")
                ok = self._store.put_batch(keys, [self._buffer(o) for o in objects])
                result = L2StoreResult(all(ok), sum(ok) * self._block_bytes)
            except Exception as e:  # the task fails; LMCache may retry it
                log.warning("sluice L2 store task %d failed: %s", task_id, e)
                result = L2StoreResult(False, 0)
            self._finish(self._stored, task_id, result, self._store_fd)

        def pop_completed_store_tasks(self) -> dict:
            with self._lock:
                done, self._stored = self._stored, {}
            return done

        # --- lookup and lock --------------------------------------------------------

        def submit_lookup_and_lock_task(self, keys: list, group_layout_descs: Any) -> int:
            task_id = next(self._ids)
            bitmap = Bitmap(len(keys))
            for i, key in enumerate(keys):
                if self._store.lookup([object_key_bytes(key)], lease=True):
                    bitmap.set(i)
            self._finish(self._looked_up, task_id, bitmap, self._lookup_fd)
            return task_id

        def query_lookup_and_lock_result(self, task_id: int) -> Any:
            with self._lock:
                return self._looked_up.pop(task_id, None)

        def submit_unlock(self, keys: list) -> None:
            return None  # leases end at the load or at lease_timeout_ms

        # --- load -------------------------------------------------------------------

        def submit_load_task(self, keys: list, objects: list) -> int:
            task_id = next(self._ids)
            ks = [object_key_bytes(k) for k in keys]
            self._pool.submit(self._load_task, task_id, ks, list(objects))
            return task_id

        def _load_task(self, task_id: int, keys: list[bytes], objects: list) -> None:
            bitmap = Bitmap(len(keys))
            try:
                buffers = [self._buffer(o) for o in objects]
                i = 0
                while i < len(keys):
                    n = leading_true(self._store.get_batch_into(keys[i:], buffers[i:]))
                    for j in range(i, i + n):
                        bitmap.set(j)
                    i += n + 1  # key i + n missed: carry on after it
            except Exception as e:
                log.warning("sluice L2 load task %d failed: %s", task_id, e)
                bitmap = Bitmap(len(keys))  # a bad batch loads nothing
            self._finish(self._loaded, task_id, bitmap, self._load_fd)

        def query_load_result(self, task_id: int) -> Any:
            with self._lock:
                return self._loaded.pop(task_id, None)

        # --- shutdown ---------------------------------------------------------------

        def close(self) -> None:
            self._pool.shutdown(wait=True)
            self._store.close()
            for fd in (self._store_fd, self._lookup_fd, self._load_fd):
                os.close(fd)

        def store_stats(self) -> dict[str, Any]:
            return self._store.stats()

    return SluiceL2Adapter


_adapter_class: Optional[type] = None


def __getattr__(name: str) -> Any:
    # LMCache's plugin loader does getattr(module, class_name): build it on first use.
    global _adapter_class
    if name == "SluiceL2Adapter":
        if _adapter_class is None:
            _adapter_class = _build_adapter_class()
        return _adapter_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
