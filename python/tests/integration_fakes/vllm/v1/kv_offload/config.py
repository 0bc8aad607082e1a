"""Fake of vllm@0.33.0:vllm/v1/kv_offload/config.py (OffloadingConfig and its parts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OffloadingGroupConfig:
    tokens_per_block: int
    layer_names: tuple[str, ...]
    group_id: int
    sliding_window_size_in_chunks: int | None = None


@dataclass(frozen=True)
class OffloadingModelConfig:
    name: str
    dtype: str
    max_model_len: int = 0


@dataclass(frozen=True)
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int
    data_parallel_index: int
    data_parallel_size: int
    data_parallel_rank_local: int | None
    is_parallelism_agnostic: bool


@dataclass(frozen=True)
class OffloadingConfig:
    groups: tuple[OffloadingGroupConfig, ...]
    worker_kv_bytes_per_block: int
    enable_kv_cache_events: bool
    extra_config: Mapping[str, Any]
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    replicated_layout: bool = False
    canonical_layout: bool = False
    kv_cache_layout: str | None = None
