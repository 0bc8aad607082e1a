"""Fake of vllm@0.33.0:vllm/v1/kv_offload/base.py (the names the tier API uses)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, NamedTuple, NewType

OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(block_hash + group_idx.to_bytes(4, "big", signed=False))


class Medium(Enum):
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _state: dict = field(default_factory=dict, repr=False, init=False)


class LookupResult(Enum):
    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class ScheduleEndContext(NamedTuple):
    new_req_ids: Collection[str]
    preempted_req_ids: Collection[str]
