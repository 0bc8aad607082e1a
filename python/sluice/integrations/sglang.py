"""SGLang 0.5.23: Sluice as a HiCache L3 storage backend.

Enable it with::

    python -m sglang.launch_server ... --enable-hierarchical-cache --page-size 64 \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name":"sluice",
        "module_path":"sluice.integrations.sglang","class_name":"SluiceHiCacheStorage",
        "interface_v1":1,"path":"/nvme/sluice-kv","ssd":"200GiB"}'

SGLang's ``dynamic`` factory builds the backend as ``cls(storage_config, {})``, then
calls ``register_mem_pool_host(pool)`` and ``on_host_pools_registered()`` (docs/design/
kv-adapters.md §2). The store is opened at registration: only the host pool knows the
size of a page's pieces.

One page of the host pool is ``parts`` Sluice blocks, the buffers
``pool.get_page_buffer_meta`` names for it (MHA page_first: K then V; layer_first: K
and V per layer; MLA: one), keyed ``<page hash>/<part>``. With ``interface_v1`` the
backend reads and writes those pool pages in place (zero copy); without it, the
deprecated flat-tensor calls (``batch_get``/``batch_set``) are served too, in their own
namespace because a flat page orders its bytes differently.

SGLang keys carry neither model nor rank, so the namespace does: model, dtype, TP rank
and size (MLA pages are replicated: one namespace for all ranks), PP stage, CP/DCP
rank, layout, page size. Each scheduler process opens its own store directory.
"""

from __future__ import annotations

from typing import Any, Optional

from sluice.errors import ConfigError

from ._common import StoreOptions, leading_true, pointer_buffer

SGLANG_VERSION = "0.5.23"

# Keys the dynamic factory reads (and leaves in extra_config) or the controller reads.
_ENGINE_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")


def _build_backend_class() -> type:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

    class SluiceHiCacheStorage(HiCacheStorage):
        """A Sluice KV store as an SGLang HiCache storage backend."""

        def __init__(self, storage_config: Any, kwargs: Optional[dict] = None) -> None:
            extra = dict(storage_config.extra_config or {})
            self._options, engine = StoreOptions.from_config(
                extra, "SGLang backend SluiceHiCacheStorage", _ENGINE_KEYS
            )
            self._cfg = storage_config
            self._zero_copy = bool(engine.get("interface_v1", 0))
            self._store: Any = None
            self.mem_pool_host: Any = None

        # --- registration ---------------------------------------------------------

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            super().register_mem_pool_host(mem_pool_host)
            pool = mem_pool_host
            probe = torch.arange(pool.page_size, dtype=torch.int64)
            ptrs, sizes = pool.get_page_buffer_meta(probe)
            if not sizes or len(set(sizes)) != 1:
                raise ConfigError(f"SGLang host pool: page pieces of unequal sizes {sizes}")
            self._parts = len(ptrs)
            self._part_bytes = int(sizes[0])
            self._page_bytes = self._parts * self._part_bytes
            cfg = self._cfg
            mla = bool(cfg.is_mla_model)
            rank = (
                f"tp{0 if mla else cfg.tp_rank}of{1 if mla else cfg.tp_size}-pp{cfg.pp_rank}"
                f"-cp{cfg.attn_cp_rank}-dcp{cfg.dcp_rank}"
            )
            layout = ";".join(
                [
                    f"sglang-{SGLANG_VERSION}",
                    f"layout={pool.layout}",
                    f"page={pool.page_size}",
                    f"parts={self._parts}",
                    "v1" if self._zero_copy else "flat",
                    f"cp={cfg.attn_cp_size};dcp={cfg.dcp_size}",
                ]
            )
            self._store = self._options.open(
                f"{self._options.path}/sglang-{rank}",
                block_bytes=self._part_bytes,
                model=str(cfg.model_name or ""),
                dtype=str(pool.dtype).replace("torch.", ""),
                tp_rank=0 if mla else int(cfg.tp_rank),
                tp_size=1 if mla else int(cfg.tp_size),
                pp_stage=int(cfg.pp_rank),
                kv_format=layout,
            )

        def _open_store(self) -> Any:
            if self._store is None:
                raise ConfigError("SluiceHiCacheStorage: no host pool registered yet")
            return self._store

        def _block_keys(self, keys: list[str]) -> list[bytes]:
            return [f"{k}/{p}".encode() for k in keys for p in range(self._parts)]

        def _pages_ok(self, flags: list[bool], n_pages: int) -> list[bool]:
            ok = [all(flags[i * self._parts : (i + 1) * self._parts]) for i in range(n_pages)]
            n = leading_true(ok)
            return [True] * n + [False] * (n_pages - n)

        # --- zero-copy path (interface_v1) -----------------------------------------

        def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
            blocks = self._open_store().lookup(self._block_keys(keys), lease=True)
            return blocks // self._parts

        def _page_buffers(self, keys: list[str], host_indices: Any) -> list[Any]:
            pool = self.mem_pool_host
            ps = pool.page_size
            if len(host_indices) != len(keys) * ps:
                raise ConfigError(
                    f"SGLang batch: {len(keys)} keys need {len(keys) * ps} host indices "
                    f"(page size {ps}), got {len(host_indices)}"
                )
            starts = host_indices[::ps].tolist()
            for i, start in enumerate(starts):
                if start % ps or not 0 <= start <= pool.size - ps:
                    raise ConfigError(
                        f"SGLang batch: page {i} starts at host index {start}, not a page "
                        f"of the host pool (size {pool.size}, page size {ps})"
                    )
            ptrs, sizes = pool.get_page_buffer_meta(host_indices)
            return [pointer_buffer(p, s) for p, s in zip(ptrs, sizes)]

        def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None):
            store = self._open_store()
            buffers = self._page_buffers(keys, host_indices)
            block_keys = self._block_keys(keys)
            # Read only the stored prefix, so pages past the first miss stay untouched.
            n = store.lookup(block_keys, lease=True)
            got = store.get_batch_into(block_keys[:n], buffers[:n]) if n else []
            return self._pages_ok(got + [False] * (len(block_keys) - n), len(keys))

        def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None):
            store = self._open_store()
            buffers = self._page_buffers(keys, host_indices)
            put = store.put_batch(self._block_keys(keys), buffers)
            return [all(put[i * self._parts : (i + 1) * self._parts]) for i in range(len(keys))]

        # --- flat-tensor path (deprecated in SGLang, still abstract) ---------------

        def _flat_parts(self, index: int, page: Any) -> list[Any]:
            if not isinstance(page, torch.Tensor) or not page.is_contiguous():
                raise ConfigError(f"SGLang page {index}: expected a contiguous CPU tensor")
            raw = page.view(torch.uint8) if page.dtype != torch.uint8 else page
            raw = raw.reshape(-1)
            if raw.numel() != self._page_bytes:
                raise ConfigError(
                    f"SGLang page {index}: {raw.numel()} bytes, a page is {self._page_bytes}"
                )
            b = self._part_bytes
            return [raw[p * b : (p + 1) * b] for p in range(self._parts)]

        def exists(self, key: str) -> bool:
            return self.batch_exists([key]) == 1

        def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes=None):
            store = self._open_store()
            if target_locations is None:
                dtype = self.mem_pool_host.dtype
                n_el = self._page_bytes // torch.empty(0, dtype=dtype).element_size()
                target_locations = [torch.empty(n_el, dtype=dtype) for _ in keys]
            buffers = [b for i, t in enumerate(target_locations) for b in self._flat_parts(i, t)]
            block_keys = self._block_keys(keys)
            n = store.lookup(block_keys, lease=True)
            got = store.get_batch_into(block_keys[:n], buffers[:n]) if n else []
            ok = self._pages_ok(got + [False] * (len(block_keys) - n), len(keys))
            return [t if hit else None for t, hit in zip(target_locations, ok)]

        def get(self, key: str, target_location: Any = None, target_sizes: Any = None):
            targets = None if target_location is None else [target_location]
            return self.batch_get([key], targets)[0]

        def batch_set(
            self, keys: list[str], values: Any = None, target_locations=None, target_sizes=None
        ) -> bool:
            if values is None:
                raise NotImplementedError(
                    "SluiceHiCacheStorage.batch_set: only tensor values (no raw pointers)"
                )
            buffers = [b for i, v in enumerate(values) for b in self._flat_parts(i, v)]
            return all(self._open_store().put_batch(self._block_keys(keys), buffers))

        def set(self, key: str, value: Any = None, target_location=None, target_sizes=None) -> bool:
            return self.batch_set([key], None if value is None else [value])

        # --- the rest ---------------------------------------------------------------

        def clear(self) -> None:
            raise NotImplementedError(
                "SluiceHiCacheStorage.clear: sluice.kv has no bulk delete; remove the "
                "store directory while the server is stopped"
            )

        def close(self) -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        def store_stats(self) -> dict[str, Any]:
            return self._open_store().stats()

    return SluiceHiCacheStorage


_backend_class: Optional[type] = None


def __getattr__(name: str) -> Any:
    # SGLang's factory does getattr(module, class_name): build the class on first use.
    global _backend_class
    if name == "SluiceHiCacheStorage":
        if _backend_class is None:
            _backend_class = _build_backend_class()
        return _backend_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
