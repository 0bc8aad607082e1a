"""Fake of the compiled ``lmcache.lmcache_native.Bitmap`` (0.5.6 .pyi): one bit per key."""

from __future__ import annotations


class Bitmap:
    def __init__(self, size: int, prefix_bits: int = 0) -> None:
        self._bits = [i < prefix_bits for i in range(size)]

    def set(self, index: int) -> None:
        self._bits[index] = True

    def test(self, index: int) -> bool:
        return self._bits[index]

    def __len__(self) -> int:
        return len(self._bits)

    def count_leading_ones(self) -> int:
        n = 0
        while n < len(self._bits) and self._bits[n]:
            n += 1
        return n

    def __repr__(self) -> str:
        return "".join("1" if b else "0" for b in self._bits)
