"""KV blocks in GPU memory: ``KvStore.put_batch`` and ``get_batch_into`` given CUDA tensors.

Blocks move between the device and the store through two pinned host slots of
``SLOT_BYTES`` each, taken once per store from the process's pinned budget (``sluice._pinned``:
registered with CUDA once, kept registered for the next store when this one closes) and
reused: small blocks (16-128 KiB, the KV shapes of seed 002
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

import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import ExitStack
from typing import Any, Callable, Optional

import torch

from . import _pinned
from .errors import ConfigError, SluiceError

#: Bytes of one pinned staging slot (two per store): 8 MiB, 64-512 KV blocks of the sizes
#: engines page, large enough that the store's batch is one big I/O.
SLOT_BYTES = 8 << 20


def is_device(buf: Any) -> bool:
    """A tensor in GPU memory (the only device memory ``sluice.kv`` stages)."""
    return isinstance(buf, torch.Tensor) and buf.device.type == "cuda"


def host_slot(nbytes: int) -> tuple[torch.Tensor, Optional[_pinned.Buffer]]:
    """A slot's memory: pinned from the process's budget, else (the budget is used up)
    ordinary memory, whose copies are correct but synchronous."""
    buf = _pinned.take(nbytes, "sluice.kv device staging")
    if buf is None:
        return torch.empty(nbytes, dtype=torch.uint8), None
    return buf.tensor(), buf


def new_event() -> Any:
    return torch.cuda.Event()


def current_stream(device: torch.device) -> Any:
    return torch.cuda.current_stream(device)


def stream_context(stream: Any) -> Any:
    """Makes ``stream`` current on its device for the calling thread."""
    return torch.cuda.stream(stream)


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
        self.host, self._buffer = host_slot(nbytes)
        self.events: list[Any] = []

    def close(self) -> None:
        """Waits for the slot's copies and gives its memory back to the budget."""
        self.wait()
        if self._buffer is not None:
            self.host = torch.empty(0, dtype=torch.uint8)
            self._buffer.release()
            self._buffer = None

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
    """The two slots of one store, made on its first device call. Calls from several
    threads take turns (the slots are shared)."""

    def __init__(self, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.per_slot = max(1, SLOT_BYTES // block_bytes)
        self.slots = [Slot(self.per_slot * block_bytes) for _ in range(2)]
        self.lock = threading.Lock()
        self.closed = False
        self._runner: Optional[ThreadPoolExecutor] = None

    def close(self) -> None:
        """Waits for submitted batches and every queued copy, and gives the slots back."""
        if self._runner is not None:
            self._runner.shutdown(wait=True)
        with self.lock:
            self.closed = True
            for slot in self.slots:
                slot.close()

    def submit(
        self, job_id: int, kind: str, keys: list[bytes], buffers: list[Any], native: Any
    ) -> DeviceJob:
        """``put``/``get_into`` in the background, checked now. The copies go on the streams
        current for the blocks' devices at this call (the background thread makes them its
        own), so a put sees the kernels queued there before the call."""
        self._check_open()
        self.check(keys, buffers, writable=kind == "get")
        streams = [current_stream(d) for d in {b.device for b in buffers if is_device(b)}]
        run = self.put if kind == "put" else self.get_into

        def work() -> list[bool]:
            with ExitStack() as stack:
                for stream in streams:
                    stack.enter_context(stream_context(stream))
                return run(keys, buffers, native)

        if self._runner is None:
            self._runner = ThreadPoolExecutor(1, thread_name_prefix="sluice-kv-device")
        return DeviceJob(job_id, kind, self._runner.submit(work))

    def _groups(self, n: int) -> list[tuple[int, int]]:
        return [(i, min(n, i + self.per_slot)) for i in range(0, n, self.per_slot)]

    def _part(self, slot: Slot, j: int) -> torch.Tensor:
        return slot.host[j * self.block_bytes : (j + 1) * self.block_bytes]

    def _addrs(self, slot: Slot, n: int) -> list[tuple[int, int]]:
        """(address, bytes) of the slot's first ``n`` blocks, for the store's batch call."""
        base = slot.host.data_ptr()
        return [(base + j * self.block_bytes, self.block_bytes) for j in range(n)]

    def put(self, keys: list[bytes], blocks: Sequence[Any], native_put: Any) -> list[bool]:
        with self.lock:
            self._check_open()
            return self._put(keys, blocks, native_put)

    def get_into(self, keys: list[bytes], buffers: Sequence[Any], native_get: Any) -> list[bool]:
        with self.lock:
            self._check_open()
            return self._get_into(keys, buffers, native_get)

    def _check_open(self) -> None:
        if self.closed:
            raise SluiceError("sluice.kv: the store is closed")

    def check(self, keys: list[bytes], buffers: Sequence[Any], writable: bool) -> None:
        """What ``put``/``get_into`` would refuse, raised now (for the submit calls)."""
        check_counts(keys, buffers)
        for i, b in enumerate(buffers):
            (self._dest if writable else self._source)(b, i)

    def _put(
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

    def _get_into(
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


class DeviceJob:
    """A submitted batch with device buffers: the native job's interface (``id``, ``kind``,
    ``done``, ``wait``, ``result``, ``release_buffers``) over the store's device thread."""

    def __init__(self, job_id: int, kind: str, future: Future[list[bool]]) -> None:
        self.id = job_id
        self.kind = kind
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: Optional[float]) -> Optional[list[bool]]:
        if timeout is not None and math.isinf(timeout):
            timeout = None
        try:
            return self._future.result(timeout)
        except FutureTimeout:
            return None

    def result(self) -> Optional[list[bool]]:
        return self._future.result() if self._future.done() else None

    def release_buffers(self) -> None:
        """The job holds its buffers in its closure until it finishes."""
