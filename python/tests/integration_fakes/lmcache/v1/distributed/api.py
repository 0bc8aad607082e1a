"""Fake of lmcache@0.5.6:lmcache/v1/distributed/api.py (ObjectKey)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectKey:
    chunk_hash: bytes
    model_name: str
    kv_rank: int
    object_group_id: int = 0
    cache_salt: str = ""

    @staticmethod
    def IntHash2Bytes(chunk_hash: int) -> bytes:
        return chunk_hash.to_bytes(4, byteorder="big")
