"""The DRAM ceiling: a numpy copy of the same resident blocks into the same buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import KvSystem
from .workload import Workload


class Memcpy(KvSystem):
    durability = "none (process memory)"

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        self.blocks: dict[int, np.ndarray] = {}

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        for i, b in zip(indices, blocks):
            self.blocks[i] = b.copy()

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        for i, out in zip(indices, outs):
            np.copyto(out, self.blocks[i])
        return outs
