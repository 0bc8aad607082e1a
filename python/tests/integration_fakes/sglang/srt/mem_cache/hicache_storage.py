"""Fake of sglang@0.5.23:sglang/srt/mem_cache/hicache_storage.py: the config
dataclasses and the HiCacheStorage ABC (abstract methods, and the defaults a backend
inherits: batch_exists loops over exists; batch_*_v1 bodies return None; v2 raises)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional

STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    dp_rank: int = 0
    extra_config: Optional[dict] = None
    dcp_size: int = 1
    dcp_rank: int = 0
    logical_page_size: Optional[int] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[list[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def on_host_pools_registered(self) -> None:
        return None

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return None  # the 0.5.23 body is `pass`: a backend must override it

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return None  # as batch_get_v1

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None): ...

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None): ...

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None): ...

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None): ...

    @abstractmethod
    def exists(self, key) -> bool: ...

    def batch_exists(self, keys, extra_info=None) -> int:
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        return None

    def get_stats(self):
        return None
