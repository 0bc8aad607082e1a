"""KV blocks in GPU memory: ``KvStore.put_batch`` and ``get_batch_into`` given CUDA tensors.

Blocks move between the device and the store through two pinned host slots of
``SLOT_BYTES`` each, allocated once per store (page-locked by torch's host allocator, so the
registration is paid once) and reused: small blocks (16-128 KiB, the KV shapes of seed 002
and seed 003's NVMe study) travel as one large store batch per slot rather than one call
each. The two slots alternate so that the copies for one group overlap the store's I/O for
the other.

Ordering (the contract on the methods):

- a put's device-to-host copies are queued on each device's current stream, so they run after
  every kernel queued there before the call: the store gets what those kernels wrote. The
  call returns once every block is in the store.
- a get's host-to-device copies are queued on the destination's current stream as each group
  lands: work queued on that stream after the call returns sees the bytes, without a host
  synchronisation. A slot is filled again only after an event recorded after its copies has
  completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import torch

from .errors import ConfigError

#: Bytes of one pinned staging slot (two per store): 8 MiB, 64-512 KV blocks of the sizes
#: engines page, large enough that the store's batch is one big I/O.
SLOT_BYTES = 8 << 20


def is_device(buf: Any) -> bool:
    """A tensor in GPU memory (the only device memory ``sluice.kv`` stages)."""
    return isinstance(buf, torch.Tensor) and buf.device.type == "cuda"


def pinned_empty(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def new_event() -> Any:
    return torch.cuda.Event()


def current_stream(device: torch.device) -> Any:
    return torch.cuda.current_stream(device)


def block_view(buf: Any, index: int, block_bytes: int) -> torch.Tensor:
    """A block as contiguous bytes, checked: a tensor of exactly ``block_bytes``."""
    if not buf.is_contiguous():
        raise ValueError(f"buffer {index}: the tensor is not contiguous")
    nbytes = buf.numel() * buf.element_size()
    if nbytes != block_bytes:
        raise ConfigError(
            f"buffer {index}: {nbytes} bytes, but this store's blocks are {block_bytes} bytes"
        )
    return buf.reshape(-1).view(torch.uint8)


def check_counts(keys: Sequence[bytes], buffers: Sequence[Any]) -> None:
    if len(keys) != len(buffers):
        raise ConfigError(f"batch: {len(keys)} keys but {len(buffers)} buffers")


class Slot:
    """One pinned staging buffer and the events that say its last copies have run (one per
    device the copies went to)."""

    def __init__(self, nbytes: int) -> None:
        self.host = pinned_empty(nbytes)
        self.events: list[Any] = []

    def wait(self) -> None:
        for event in self.events:
            event.synchronize()
        self.events = []

    def fence(self, devices: set[torch.device]) -> None:
        """Records an event after the copies just queued on each device's current stream."""
        self.events = []
        for device in devices:
            event = new_event()
            event.record(current_stream(device))
            self.events.append(event)


class DeviceStaging:
    """The two slots of one store, made on its first device call."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.per_slot = max(1, SLOT_BYTES // block_bytes)
        self.slots = [Slot(self.per_slot * block_bytes) for _ in range(2)]

    def _groups(self, n: int) -> list[tuple[int, int]]:
        return [(i, min(n, i + self.per_slot)) for i in range(0, n, self.per_slot)]

    def _part(self, slot: Slot, j: int) -> torch.Tensor:
        return slot.host[j * self.block_bytes : (j + 1) * self.block_bytes]

    def _addrs(self, slot: Slot, n: int) -> list[tuple[int, int]]:
        """(address, bytes) of the slot's first ``n`` blocks, for the store's batch call."""
        base = slot.host.data_ptr()
        return [(base + j * self.block_bytes, self.block_bytes) for j in range(n)]

    def put(
        self,
        keys: list[bytes],
        blocks: Sequence[Any],
        native_put: Callable[[list[bytes], list[tuple[int, int]]], list[bool]],
    ) -> list[bool]:
        """``put_batch`` with device blocks among ``blocks`` (host ones are staged too)."""
        check_counts(keys, blocks)
        views = [self._source(b, i) for i, b in enumerate(blocks)]
        groups = self._groups(len(keys))
        out: list[bool] = []

        def stage(g: int) -> None:
            start, end = groups[g]
            slot = self.slots[g % 2]
            slot.wait()  # its previous group's put has returned; nothing of it is queued
            devices: set[torch.device] = set()
            for j, view in enumerate(views[start:end]):
                self._part(slot, j).copy_(view, non_blocking=True)
                if view.device.type == "cuda":
                    devices.add(view.device)
            slot.fence(devices)

        if groups:
            stage(0)
        for g, (start, end) in enumerate(groups):
            if g + 1 < len(groups):
                stage(g + 1)  # the next group's copies run during this group's I/O
            slot = self.slots[g % 2]
            slot.wait()
            out += list(native_put(keys[start:end], self._addrs(slot, end - start)))
        return out

    def get_into(
        self,
        keys: list[bytes],
        buffers: Sequence[Any],
        native_get: Callable[[list[bytes], list[tuple[int, int]]], list[bool]],
    ) -> list[bool]:
        """``get_batch_into`` with device buffers among ``buffers``."""
        check_counts(keys, buffers)
        dests = [self._dest(b, i) for i, b in enumerate(buffers)]
        out: list[bool] = []
        for g, (start, end) in enumerate(self._groups(len(keys))):
            slot = self.slots[g % 2]
            slot.wait()  # the copies out of its previous group have run
            ok = list(native_get(keys[start:end], self._addrs(slot, end - start)))
            devices: set[torch.device] = set()
            for j, hit in enumerate(ok):
                if not hit:
                    break
                dest = dests[start + j]
                dest.copy_(self._part(slot, j), non_blocking=True)
                if dest.device.type == "cuda":
                    devices.add(dest.device)
            slot.fence(devices)
            out += ok
            if not all(ok):
                out += [False] * (len(keys) - len(out))
                break
        return out

    def _source(self, buf: Any, index: int) -> torch.Tensor:
        if isinstance(buf, torch.Tensor):
            return block_view(buf, index, self.block_bytes)
        import numpy as np

        return block_view(torch.from_numpy(np.frombuffer(buf, dtype=np.uint8)), index,
                          self.block_bytes)  # fmt: skip

    def _dest(self, buf: Any, index: int) -> torch.Tensor:
        if isinstance(buf, torch.Tensor):
            return block_view(buf, index, self.block_bytes)
        import numpy as np

        arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
        if not arr.flags.writeable:
            raise ValueError(f"buffer {index}: read-only; get_batch_into needs writable buffers")
        return block_view(torch.from_numpy(arr.reshape(-1).view(np.uint8)), index,
                          self.block_bytes)  # fmt: skip
