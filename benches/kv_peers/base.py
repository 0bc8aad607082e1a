"""What every system under test implements: one small class per system, run by worker.py.

A system is driven only through these calls, so every one is timed the same way:
- `open(root, workload, inflight_blocks)` creates an empty store under `root` (the worker
  deletes it after); at most `inflight_blocks` blocks are ever in flight at once;
- `register(buffer)` is called once for each large buffer the worker will store from or load
  into (Mooncake registers them with its transfer engine);
- `store(indices, blocks)` stores a request's blocks; on return they are as durable as the
  system makes them (its `durability` says how);
- `finish_store()` runs once after the last store, timed as part of it (a final sync for the
  systems that acknowledge before their bytes are on the device);
- `load(indices, outs)` loads a request's blocks and returns one array per block holding its
  bytes: `outs` itself for systems that fill the caller's buffers, the system's own buffers
  otherwise. A miss or a failed read raises `Miss`;
- `release(arrays)` hands the system's own buffers back (LMCache's reference counts);
- `extra()` adds system-specific measurements to the result (Sluice's lookup and index).

Calls may come from several threads at once (one per request stream).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .workload import Workload


class Miss(Exception):
    """A block the system should hold was not returned."""


class KvSystem:
    durability = "n/a"

    def open(self, root: Path, workload: Workload, inflight_blocks: int) -> None:
        raise NotImplementedError

    def register(self, buffer: np.ndarray) -> None:
        pass

    def store(self, indices: list[int], blocks: list[np.ndarray]) -> None:
        raise NotImplementedError

    def finish_store(self) -> None:
        pass

    def load(self, indices: list[int], outs: list[np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def release(self, arrays: list[np.ndarray]) -> None:
        pass

    def extra(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
