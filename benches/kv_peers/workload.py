"""The KV workload: seeded random keys and blocks, and how a loaded block is checked.

Every block is a slice of one seeded random pool (64 MiB, made once) at an offset that depends
on its index, with the block's index stamped into the first 8 bytes of every 4 KiB page. So
each block differs from every other in every page, generating one costs a memcpy (24 GiB in a
few seconds, where `os.urandom` would take minutes), and any worker, in any process or venv,
can regenerate block `i` to check it.

Two checks, both outside every timed span:
- `stamps_ok`: every page of a loaded block carries the right index (1/512 of the bytes). It
  catches another key's block, a torn block and a stale page. It runs on every block of every
  throughput pass.
- `bytes_ok`: the whole block, byte for byte, against a regenerated copy. It runs on every
  block of the latency passes (a sample of a few hundred blocks per size).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

PAGE_BYTES = 4096
POOL_BYTES = 64 << 20
ALIGN_BYTES = 4096  # O_DIRECT and Sluice's direct path want page-aligned buffers.


def aligned_empty(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 array of `nbytes` (numpy aligns to 64 bytes only)."""
    raw = np.empty(nbytes + ALIGN_BYTES, np.uint8)
    start = (-raw.ctypes.data) % ALIGN_BYTES
    return raw[start : start + nbytes]


@dataclass
class Workload:
    block_bytes: int
    n_blocks: int
    seed: int

    def __post_init__(self) -> None:
        if self.block_bytes % PAGE_BYTES:
            raise ValueError(f"block_bytes {self.block_bytes} is not a multiple of 4 KiB")
        rng = np.random.default_rng(self.seed)
        self.pool = np.frombuffer(rng.bytes(POOL_BYTES + self.block_bytes), np.uint8)
        # Random 32-byte keys, as an engine's prefix-chained block hashes look.
        self.keys = [
            hashlib.blake2b(f"{self.seed}/{i}".encode(), digest_size=32).digest()
            for i in range(self.n_blocks)
        ]

    @property
    def total_bytes(self) -> int:
        return self.block_bytes * self.n_blocks

    def fill(self, i: int, out: np.ndarray) -> np.ndarray:
        """Writes block `i` into `out` (block_bytes, uint8) and returns it."""
        offset = (i * 7919 * PAGE_BYTES) % POOL_BYTES
        out[:] = self.pool[offset : offset + self.block_bytes]
        out.view(np.uint64).reshape(-1, PAGE_BYTES // 8)[:, 0] = self._stamp(i)
        return out

    def block(self, i: int) -> np.ndarray:
        return self.fill(i, aligned_empty(self.block_bytes))

    def _stamp(self, i: int) -> int:
        return (self.seed << 40) | (i + 1)

    def stamps_ok(self, i: int, got: np.ndarray) -> bool:
        flat = np.asarray(got).reshape(-1).view(np.uint8)
        if flat.nbytes != self.block_bytes:
            return False
        stamps = flat.view(np.uint64).reshape(-1, PAGE_BYTES // 8)[:, 0]
        return bool((stamps == self._stamp(i)).all())

    def bytes_ok(self, i: int, got: np.ndarray, scratch: np.ndarray) -> bool:
        flat = np.asarray(got).reshape(-1).view(np.uint8)
        return flat.nbytes == self.block_bytes and np.array_equal(flat, self.fill(i, scratch))


def shares(n_blocks: int, streams: int, seed: int) -> list[list[int]]:
    """Each stream's disjoint share of the block indices, in a seeded random order."""
    order = np.random.default_rng(seed + 1).permutation(n_blocks).tolist()
    return [order[s::streams] for s in range(streams)]


def batches(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]
