"""Fake of lmcache@0.5.6:lmcache/v1/distributed/internal_api.py (L2StoreResult: an int,
bytes transferred on success, -1 on failure)."""

from __future__ import annotations


class L2StoreResult(int):
    def __new__(cls, success: bool, bytes_transferred: int) -> L2StoreResult:
        if bytes_transferred < 0:
            raise ValueError(f"bytes_transferred must be >= 0, got {bytes_transferred}")
        return super().__new__(cls, bytes_transferred if success else -1)

    def is_successful(self) -> bool:
        return int(self) >= 0

    def bytes_transferred(self) -> int:
        return max(int(self), 0)
