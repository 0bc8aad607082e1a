"""The process's pinned host memory for the planes that stage device tensors.

``sluice.kv`` (its CUDA blocks' staging slots) and ``sluice.ckpt`` (a save's window for CUDA
state) take their host buffers here. Each buffer is a slot of the native ``PinnedPool``:
mapped and registered with CUDA once (``cudaHostRegister`` through the process's runtime,
torch's when torch loaded one), and kept registered when given back, so the next store or
save of that size reuses it without registering again (seed 002: registering costs more than
a KV-sized transfer). All of it, held or kept, counts against one byte budget per process:
``SLUICE_PINNED_BYTES`` (a byte size, default 1 GiB). A request past the budget drops kept
buffers of other sizes first; if that is not enough the caller gets ``None`` and stages
through ordinary memory (correct, slower copies), said once in the log. Nothing waits for
another plane to give memory back, so two stores can never deadlock on it.

Without a CUDA runtime the buffers are plain page-aligned memory under the same budget.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Callable, Optional

from . import _sluice
from .errors import ConfigError

log = logging.getLogger("sluice")

DEFAULT_BUDGET = 1 << 30
ENV = "SLUICE_PINNED_BYTES"
PAGE = os.sysconf("SC_PAGE_SIZE")


def budget_from_env() -> int:
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return DEFAULT_BUDGET
    try:
        return int(_sluice.parse_byte_size(ENV, raw))
    except ConfigError as e:
        raise ConfigError(f"{ENV}={raw!r}: expected a byte size such as 1GiB ({e})") from None


class Buffer:
    """A pinned buffer held by one user until :meth:`release` (or until collected)."""

    def __init__(self, owner: Budget, pool: Any, slot: Any, nbytes: int) -> None:
        self.nbytes = nbytes
        self.address = int(slot.address)
        self.pinned = bool(pool.pinned)
        self._slot = slot
        self._done = weakref.finalize(self, owner._give_back, pool, slot, int(pool.slot_bytes))

    def numpy(self) -> Any:
        """A writable uint8 view of the buffer's first ``nbytes``; valid until release."""
        import numpy as np

        return np.asarray(self._slot)[: self.nbytes]

    def tensor(self) -> Any:
        """As :meth:`numpy`, a torch tensor sharing the memory."""
        import torch

        return torch.from_numpy(self.numpy())

    def release(self) -> None:
        """Gives the buffer back (kept registered for the next user of its size). The
        caller has waited for every copy from or into it; views must not be used after."""
        self._done()


class Budget:
    """Registered host buffers under one byte budget: held ones, and given-back ones kept
    for reuse by size."""

    def __init__(self, budget: int, make_pool: Callable[[int], Any]) -> None:
        self.budget = budget
        self._make_pool = make_pool
        self._lock = threading.Lock()
        self._kept: dict[int, list[Any]] = {}
        self._held_bytes = 0
        self._kept_bytes = 0
        self._refused_logged = False
        self.counts = {"takes": 0, "reuses": 0, "registrations": 0, "refused": 0, "peak": 0}

    def take(self, nbytes: int, what: str) -> Optional[Buffer]:
        """A buffer of at least ``nbytes``, or ``None`` when the budget cannot hold it."""
        size = -(-max(1, nbytes) // PAGE) * PAGE
        with self._lock:
            self.counts["takes"] += 1
            kept = self._kept.get(size)
            if kept:
                pool = kept.pop()
                self._kept_bytes -= size
                self.counts["reuses"] += 1
            else:
                self._drop_kept_for(size)
                if self._held_bytes + self._kept_bytes + size > self.budget:
                    self.counts["refused"] += 1
                    if not self._refused_logged:
                        self._refused_logged = True
                        log.warning(
                            "%s: %d bytes of staging do not fit the pinned budget "
                            "(%s=%d, %d held): staging through unpinned memory, slower copies",
                            what,
                            size,
                            ENV,
                            self.budget,
                            self._held_bytes,
                        )
                    return None
                pool = self._make_pool(size)
                self.counts["registrations"] += 1
            self._held_bytes += size
            self.counts["peak"] = max(self.counts["peak"], self._held_bytes + self._kept_bytes)
        slot = pool.acquire(0.0)
        if slot is None:  # a one-slot pool whose slot is free: cannot happen
            self._give_back(pool, None, size)
            raise RuntimeError(f"{what}: pinned pool of {size} bytes had no free slot")
        return Buffer(self, pool, slot, nbytes)

    def _drop_kept_for(self, size: int) -> None:
        """Unregisters kept buffers (largest first) until ``size`` more bytes fit."""
        while self._held_bytes + self._kept_bytes + size > self.budget and self._kept_bytes:
            biggest = max(s for s, pools in self._kept.items() if pools)
            self._kept[biggest].pop()  # the pool unregisters when its last reference goes
            self._kept_bytes -= biggest

    def _give_back(self, pool: Any, slot: Any, size: int) -> None:
        if slot is not None:
            slot.release()
        with self._lock:
            self._held_bytes -= size
            self._kept.setdefault(size, []).append(pool)
            self._kept_bytes += size
            self._drop_kept_for(0)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "budget": self.budget,
                "held_bytes": self._held_bytes,
                "kept_bytes": self._kept_bytes,
                "pinned": _sluice.gpu_runtime() is not None,
                **self.counts,
            }


_BUDGET: Optional[Budget] = None
_BUDGET_LOCK = threading.Lock()


def budget() -> Budget:
    """The process's budget, made on first use from ``SLUICE_PINNED_BYTES``."""
    global _BUDGET
    with _BUDGET_LOCK:
        if _BUDGET is None:
            _BUDGET = Budget(budget_from_env(), lambda size: _sluice.PinnedPool(size, 1))
        return _BUDGET


def take(nbytes: int, what: str) -> Optional[Buffer]:
    """A pinned buffer of ``nbytes`` from the process's budget, or ``None`` (see the module
    documentation)."""
    return budget().take(nbytes, what)


def pinned_stats() -> dict[str, Any]:
    """The process's pinned staging memory: ``budget``, ``held_bytes`` (in use),
    ``kept_bytes`` (registered, free for reuse), ``peak``, and counts of ``takes``,
    ``reuses``, ``registrations`` and ``refused`` requests (staged unpinned instead);
    ``pinned`` says whether a CUDA runtime registers the memory."""
    return budget().stats()
