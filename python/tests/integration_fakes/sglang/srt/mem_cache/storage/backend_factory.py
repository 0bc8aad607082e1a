"""Fake of sglang@0.5.23:.../storage/backend_factory.py, the ``dynamic`` path only:
``extra_config`` names backend_name, module_path and class_name; the class must subclass
HiCacheStorage and is built as ``cls(storage_config, kwargs)`` (kwargs is ``{}``)."""

from __future__ import annotations

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name != "dynamic" or storage_config.extra_config is None:
            raise ValueError(f"Unknown storage backend '{backend_name}'.")
        extra = storage_config.extra_config
        for field in ("backend_name", "module_path", "class_name"):
            if field not in extra:
                raise ValueError(f"Missing required field '{field}' in backend config")
        backend_cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
        if not issubclass(backend_cls, HiCacheStorage):
            raise TypeError(f"Backend class {extra['class_name']} must inherit from HiCacheStorage")
        return backend_cls(storage_config, kwargs)
