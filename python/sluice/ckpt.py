"""``sluice.ckpt``: checkpoints stored as content-addressed chunks, saved in the background.

    import sluice.ckpt
    h = sluice.ckpt.save(model.state_dict(), "/ckpt/step-100")   # STORE/NAME
    h.staged.result()        # the state is copied out: training may mutate it again
    ...train...
    h.durable.result()       # every chunk and the manifest are on disk (fsynced)
    sluice.ckpt.load(model.state_dict(), "/ckpt/step-100")        # in place, verified

A store (``/ckpt``) holds many checkpoints over one pool of chunks named by their BLAKE3
digest: bytes that repeat (tied weights, replicated parameters, zero-filled optimizer
moments, tensors unchanged since the last save) are stored once, and a save writes only
chunks the store lacks. A checkpoint is visible once complete: a save that dies leaves
the previous ones as they were.

With ``torch.distributed`` initialized, ``save`` and ``load`` are collective over
``group`` (default: the world): the ranks pool their digests, each unique chunk is
written once by one of the ranks that hold it (a plan balanced by the ranks' measured
write bandwidths), and rank 0 publishes one manifest. Each rank's state is saved under
its rank (``"0/model.w"``), and loads back at the same world size; for resharding, save
and load through DCP with :class:`StorageWriter` and :class:`StorageReader`.

Non-tensor values (step counters, optimizer hyper-parameters, RNG state) are pickled, as
``torch.save`` and DCP do: load checkpoints you trust.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Mapping, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from . import _sluice
from .errors import ConfigError, SluiceError, StoreFormatError, TensorNotFoundError

log = logging.getLogger("sluice.ckpt")

PathLike = Union[str, "os.PathLike[str]"]
ByteSize = Union[int, str]

__all__ = [
    "SaveHandle",
    "gc",
    "load",
    "ls",
    "manifest",
    "save",
    "verify",
]

DEFAULT_CHUNK_BYTES = 4 << 20
#: The staging pool's default budget: below one full copy of a large state (a save whose
#: share is larger streams through it at the disk's pace).
DEFAULT_STAGING_BYTES = 1 << 30
#: A rank's write bandwidth before it has measured one (bytes/s).
DEFAULT_BANDWIDTH = 1e9
#: How long rank 0 waits for the other ranks' shares before giving up on a grouped save.
DEFAULT_TIMEOUT_S = 1800.0

# This process's last measured write bandwidth: the planner's input for the next save.
_measured_bandwidth: Optional[float] = None


def _size(value: ByteSize, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a byte size, got {value!r}")
    n = int(_sluice.ckpt_size(what, value))
    if n <= 0:
        raise ConfigError(f"{what}: must be positive, got {value!r}")
    return n


def _split(path: PathLike) -> tuple[Path, str]:
    """STORE/NAME -> (store root, checkpoint name)."""
    p = Path(os.fspath(path))
    if not p.name or p.name in (".", ".."):
        raise ConfigError(f"{path}: a checkpoint path is STORE/NAME, e.g. /ckpt/step-100")
    return p.parent, p.name


# ---------------------------------------------------------------------------------------
# State dicts: flattening, tensors as host memory


def _is_tensor(v: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is how state dicts exist
        return False
    return isinstance(v, torch.Tensor)


def _is_array(v: Any) -> bool:
    import sys

    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.ndarray)


def _flatten(state: Mapping[str, Any]) -> list[tuple[str, tuple[Any, ...], Any]]:
    """(flat key, path of keys, leaf) for every leaf of nested mappings, keys joined by
    '.'; two paths that join to one key are refused."""
    if not isinstance(state, Mapping):
        raise ConfigError(f"state_dict: expected a mapping, got {type(state).__name__}")
    out: list[tuple[str, tuple[Any, ...], Any]] = []
    seen: dict[str, tuple[Any, ...]] = {}

    def walk(prefix: tuple[Any, ...], node: Mapping[Any, Any]) -> None:
        for k, v in node.items():
            path = (*prefix, k)
            if isinstance(v, Mapping) and not _is_tensor(v) and len(v) > 0:
                walk(path, v)
                continue
            key = ".".join(str(p) for p in path)
            if key in seen:
                raise ConfigError(
                    f"state_dict: {list(seen[key])!r} and {list(path)!r} both flatten to {key!r}"
                )
            seen[key] = path
            out.append((key, path, v))

    walk((), state)
    return out


def _dtype_name(t: Any) -> str:
    if _is_tensor(t):
        return str(t.dtype).removeprefix("torch.")
    return str(t.dtype)


def _streamed(t: Any) -> bool:
    """Whether a tensor's bytes are hashed and staged through a pinned host window rather
    than copied to host memory whole (a device tensor: CUDA, XPU, ...)."""
    return _is_tensor(t) and t.device.type not in ("cpu", "meta")


def _host_bytes(key: str, v: Any, stream: bool = False) -> tuple[Any, int, int]:
    """(owner, address, nbytes) of a leaf's bytes in contiguous host memory. `owner` keeps
    them alive: the tensor itself, or the host copy made for a CUDA or non-contiguous one.
    With ``stream`` a device tensor stays where it is (a contiguous copy there if need be)
    and the address is -1: its bytes come over in windows."""
    if _is_tensor(v):
        import torch

        if v.layout != torch.strided:
            raise ConfigError(f"{key}: {v.layout} tensors are not supported; save .to_dense()")
        if v.device.type == "meta":
            raise ConfigError(f"{key}: a meta tensor has no data to save")
        t = v.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if stream and _streamed(t):
            t = t.contiguous()
            return t, -1, t.numel() * t.element_size()
        if t.device.type != "cpu":
            t = t.to("cpu")
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel() * t.element_size()
        return t, (t.data_ptr() if n else 0), n
    import numpy as np

    a = np.ascontiguousarray(v)
    return a, (a.__array_interface__["data"][0] if a.nbytes else 0), a.nbytes


@dataclass
class _Leaf:
    key: str
    path: tuple[Any, ...]
    kind: str  # "tensor" | "bytes"
    owner: Any
    addr: int
    nbytes: int
    dtype: Optional[str] = None
    shape: Optional[list[int]] = None
    meta: dict[str, Any] = field(default_factory=dict)


def _leaves(state: Mapping[str, Any], prefix: str, stream: bool = False) -> list[_Leaf]:
    import numpy as np

    out = []
    for key, path, v in _flatten(state):
        name = prefix + key
        if _is_tensor(v) or _is_array(v):
            owner, addr, n = _host_bytes(name, v, stream)
            meta = {"framework": "torch" if _is_tensor(v) else "numpy"}
            leaf = _Leaf(name, path, "tensor", owner, addr, n, _dtype_name(v), list(v.shape))
            leaf.meta = meta
        else:
            blob = np.frombuffer(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
            addr = blob.__array_interface__["data"][0] if blob.nbytes else 0
            leaf = _Leaf(name, path, "bytes", blob, addr, blob.nbytes, meta={"codec": "pickle"})
        out.append(leaf)
    return out


# ---------------------------------------------------------------------------------------
# Process groups


def _group_info(group: Any) -> tuple[int, int, Any]:
    """(rank, world size, group) of the save: a single process without torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0, 1, None
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ConfigError("group= given but torch.distributed is not initialized")
        return 0, 1, None
    return dist.get_rank(group), dist.get_world_size(group), group


def _all_gather(obj: Any, group: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _broadcast(obj: Any, group: Any, world: int, rank: int) -> Any:
    if world == 1:
        return obj
    import torch.distributed as dist

    box = [obj if rank == 0 else None]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


# ---------------------------------------------------------------------------------------
# Save


class SaveHandle:
    """A save in flight. ``staged`` resolves (to the seconds staging took) once every byte
    this rank writes is copied out of the live state; ``durable`` (to the save's report)
    once the checkpoint is published and synced. Either raises if the save failed."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.staged: Future[float] = Future()
        self.durable: Future[dict[str, Any]] = Future()
        self._job: Any = None

    def result(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """Waits until durable; the save's report."""
        return self.durable.result(timeout)

    def cancel(self) -> None:
        """Stops the save: the checkpoint is not published, earlier ones are untouched."""
        if self._job is not None:
            self._job.cancel("cancelled by the caller")

    def __repr__(self) -> str:
        state = "durable" if self.durable.done() else "staged" if self.staged.done() else "staging"
        return f"<sluice.ckpt.SaveHandle {self.path}/{self.name} {state}>"


def _pending_dir(root: Path, name: str) -> Path:
    return root / ".pending" / name


def save(
    state_dict: Mapping[str, Any],
    path: PathLike,
    *,
    group: Any = None,
    chunk_bytes: ByteSize = DEFAULT_CHUNK_BYTES,
    staging_bytes: ByteSize = DEFAULT_STAGING_BYTES,
    bandwidth: Optional[float] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    blocking: bool = False,
    replicate: bool = False,
) -> SaveHandle:
    """Saves ``state_dict`` as checkpoint ``path`` (STORE/NAME) and returns at once with a
    :class:`SaveHandle`; ``blocking=True`` waits until durable. Collective over ``group``
    when torch.distributed is initialized. Do not mutate the state before
    ``handle.staged`` resolves.

    ``chunk_bytes`` is the dedup grain (default 4 MiB). ``staging_bytes`` bounds the host
    memory the save holds (default 1 GiB); a larger share streams through it.
    ``bandwidth`` declares this rank's write bytes/s for the plan (default: measured by
    the previous save).

    ``replicate=True`` (grouped saves) also sends this rank's share to the next rank's
    memory before ``staged`` resolves, and holds the previous rank's share: should a rank
    die before its share is durable, its successor writes the share, and the checkpoint
    is still published. It holds up to ``staging_bytes`` more host memory."""
    root, name = _split(path)
    chunk = _size(chunk_bytes, "chunk_bytes")
    staging = _size(staging_bytes, "staging_bytes")
    if staging < chunk:
        raise ConfigError(f"staging_bytes ({staging}) must hold one chunk ({chunk})")
    if bandwidth is not None and not bandwidth > 0:
        raise ConfigError(f"bandwidth: must be positive bytes/s, got {bandwidth!r}")
    rank, world, group = _group_info(group)
    prefix = f"{rank}/" if world > 1 else ""
    # Device tensors stream through the staging budget; a replica needs them in host memory.
    leaves = _leaves(state_dict, prefix, stream=not replicate)

    _check_name(root, name)
    st = _stage(leaves, root, name, group, rank, world, chunk, staging, bandwidth)
    store, job, tables, token = st.store, st.job, st.tables, st.token
    makespan, cached = st.makespan, st.cached
    replica: Optional[_Replica] = None
    if replicate and world > 1:
        try:
            replica = _Replica(root / name, group, rank, world, st, staging, timeout)
        except BaseException:
            job.cancel("the replica could not start")
            job.close()
            store.close()
            raise
    handle = SaveHandle(root, name)
    handle._job = job
    logical = sum(lf.nbytes for lf in leaves)
    pending = _pending_dir(root, f"{name}-{token}")

    def finish() -> None:
        global _measured_bandwidth
        try:
            took = job.wait_staged()
            if replica is not None:
                replica.wait_sent()
            handle.staged.set_result(took)
        except BaseException as e:
            handle.staged.set_exception(e)
        try:
            report = json.loads(job.wait_durable())
            if report["write_bytes_per_s"] > 0:
                _measured_bandwidth = report["write_bytes_per_s"]
            job.close()
            summary = _publish(
                store,
                root,
                name,
                rank,
                world,
                tables,
                chunk,
                report,
                pending,
                token,
                timeout,
                replica,
            )
            summary.update(
                rank=rank,
                world_size=world,
                logical_bytes_rank=logical,
                planned_makespan_s=makespan,
                plan_cached=cached,
                rank_report=report,
            )
            outcome: tuple[Any, Optional[BaseException]] = (summary, None)
        except BaseException as e:
            outcome = (None, e)
            if replica is not None:
                replica.abandon()
        # The store's lock goes before the futures resolve: a caller that waits for
        # durable and then collects garbage must find the store free.
        job.close()
        store.close()
        summary, err = outcome
        if err is None:
            handle.durable.set_result(summary)
        else:
            if not handle.staged.done():
                handle.staged.set_exception(err)
            handle.durable.set_exception(err)

    t = threading.Thread(target=finish, name=f"sluice-ckpt-save-{name}", daemon=True)
    t.start()
    if blocking:
        handle.durable.result()
    return handle


@dataclass
class _Staged:
    """A save whose chunks are planned and being written: the ranks' tables, this rank's
    write job and the store it holds open."""

    store: Any
    job: Any
    tables: list[tuple[str, bytes, bytes, list[int]]]
    token: str
    makespan: float
    cached: bool
    #: This rank's share: (digest, length, source address) of each chunk it writes.
    mine: list[tuple[bytes, int, int]]
    #: Every rank's share, as indices into its own table.
    assignments: list[bytes]


def _heads(leaves: list[_Leaf]) -> str:
    return json.dumps(
        [
            {
                "key": lf.key,
                "kind": lf.kind,
                "dtype": lf.dtype,
                "shape": lf.shape,
                "nbytes": lf.nbytes,
                "meta": lf.meta,
            }
            for lf in leaves
        ]
    )


def _flat_u8(t: Any) -> Any:
    import torch

    return t.reshape(-1).view(torch.uint8)


class _Window:
    """A host buffer (pinned where CUDA is) that device tensors come through, chunk-sized
    multiples at a time."""

    def __init__(self, nbytes: int) -> None:
        import torch

        pin = torch.cuda.is_available()
        self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.addr = int(self.buf.data_ptr())

    @staticmethod
    def for_leaves(leaves: list[_Leaf], chunk: int, staging: int) -> Optional[_Window]:
        biggest = max((lf.nbytes for lf in leaves if lf.addr < 0), default=0)
        if not biggest:
            return None
        size = max(chunk, (staging // 4) // chunk * chunk)
        return _Window(min(size, -(-biggest // chunk) * chunk))

    def pieces(self, t: Any) -> Any:
        """(offset, length) of each window's worth of ``t``'s bytes, copied in as it goes."""
        flat = _flat_u8(t)
        size = self.buf.numel()
        for off in range(0, flat.numel(), size):
            m = min(size, flat.numel() - off)
            self.buf[:m].copy_(flat[off : off + m])
            yield off, m


def _hash_leaves(
    leaves: list[_Leaf], chunk: int, window: Optional[_Window]
) -> tuple[bytes, bytes, list[int]]:
    """The chunk table of ``leaves``: host leaves hashed in place, in parallel; device
    leaves a window at a time."""
    host = [i for i, lf in enumerate(leaves) if lf.addr >= 0]
    digests, lens, counts = _sluice.ckpt_hash(
        [(leaves[i].addr, leaves[i].nbytes) for i in host], chunk
    )
    if window is None:
        return digests, lens, counts
    parts: list[tuple[bytes, bytes, int]] = [(b"", b"", 0)] * len(leaves)
    at = 0
    for i, n in zip(host, counts):
        parts[i] = (digests[32 * at : 32 * (at + n)], lens[8 * at : 8 * (at + n)], n)
        at += n
    for i, lf in enumerate(leaves):
        if lf.addr < 0:
            ds, ls, n = [], [], 0
            for _, m in window.pieces(lf.owner):
                d, ln, c = _sluice.ckpt_hash([(window.addr, m)], chunk)
                ds.append(d)
                ls.append(ln)
                n += c[0]
            parts[i] = (b"".join(ds), b"".join(ls), n)
    return (
        b"".join(p[0] for p in parts),
        b"".join(p[1] for p in parts),
        [p[2] for p in parts],
    )


class _Jobs:
    """A share with chunks of device tensors, within the staging budget: the host chunks
    go in one write job (a quarter of the budget); the device ones come over through a
    window (a quarter) in rounds, each round a write job with a quarter-budget pool, at
    most two rounds in flight (a round's job, and its pool, is closed once durable).
    Waits and reports as one job does."""

    def __init__(
        self,
        store: Any,
        host: list[tuple[bytes, int, int]],
        device: list[tuple[bytes, int, Any, int]],
        chunk: int,
        staging: int,
        keep: list[Any],
    ) -> None:
        quarter = max(chunk, (staging // 4) // chunk * chunk)
        self.host_job = store.write(host, chunk, quarter, keep) if host else None
        self.rounds: list[Any] = []  # round jobs in flight
        self.reports: list[dict[str, Any]] = []  # rounds already durable and closed
        self.window = _Window(quarter)
        self.store, self.device, self.chunk, self.quarter = store, device, chunk, quarter
        self.t0 = time.perf_counter()
        self.staged_s: Optional[float] = None
        self.error: Optional[BaseException] = None
        self.stop = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="sluice-ckpt-device", daemon=True).start()

    def _jobs(self) -> list[Any]:
        with self.lock:
            return ([self.host_job] if self.host_job is not None else []) + list(self.rounds)

    def _run(self) -> None:
        try:
            i = 0
            while i < len(self.device) and not self.stop.is_set():
                packed, at = [], 0
                while i < len(self.device) and at + self.device[i][1] <= self.quarter:
                    d, n, t, off = self.device[i]
                    self.window.buf[at : at + n].copy_(_flat_u8(t)[off : off + n])
                    packed.append((d, n, self.window.addr + at))
                    at += n
                    i += 1
                if len(self.rounds) >= 2:  # bound the pools in flight: retire the oldest
                    oldest = self.rounds[0]
                    self.reports.append(json.loads(oldest.wait_durable()))
                    with self.lock:
                        self.rounds.pop(0)
                    oldest.close()
                job = self.store.write(packed, self.chunk, self.quarter, [])
                with self.lock:
                    self.rounds.append(job)
                job.wait_staged()  # the window is free again
            if self.stop.is_set():
                raise SluiceError("cancelled")
        except BaseException as e:
            self.error = e
        finally:
            self.staged_s = time.perf_counter() - self.t0
            self.device = []  # the device tensors are no longer read
            self.done.set()

    def wait_staged(self) -> float:
        self.done.wait()
        if self.error is not None:
            raise self.error
        for j in self._jobs():
            j.wait_staged()
        return time.perf_counter() - self.t0

    def wait_durable(self) -> str:
        self.wait_staged()
        host = json.loads(self.host_job.wait_durable()) if self.host_job is not None else None
        rounds = self.reports + [json.loads(j.wait_durable()) for j in list(self.rounds)]
        reports = rounds + ([host] if host else [])
        took = time.perf_counter() - self.t0
        written = sum(r["bytes_written"] for r in reports)
        busy = sum(
            r["bytes_written"] / r["write_bytes_per_s"] for r in reports if r["write_bytes_per_s"]
        )
        return json.dumps(
            {
                "chunks_written": sum(r["chunks_written"] for r in reports),
                "bytes_written": written,
                "chunks_present": sum(r["chunks_present"] for r in reports),
                # A bound on what was held at once: the host job's pool, the window and
                # two round pools.
                "staging_peak_bytes": self.quarter
                + (host["staging_peak_bytes"] if host else 0)
                + 2 * max((r["staging_peak_bytes"] for r in rounds), default=0),
                "staged_s": self.staged_s,
                "durable_s": took,
                "write_bytes_per_s": written / busy if busy else 0.0,
            }
        )

    def cancel(self, why: str) -> None:
        self.stop.set()
        for j in self._jobs():
            j.cancel(why)

    def close(self) -> None:
        self.stop.set()
        self.done.wait()
        for j in self._jobs():
            j.close()


def _stage(
    leaves: list[_Leaf],
    root: Path,
    name: str,
    group: Any,
    rank: int,
    world: int,
    chunk: int,
    staging: int,
    bandwidth: Optional[float],
) -> _Staged:
    """Hashes this rank's leaves, pools the tables over the group, lets rank 0 plan who
    writes which chunk the store lacks, and starts this rank's share (collective)."""
    store = _sluice.ckpt_open(str(root), create=True)
    try:
        window = _Window.for_leaves(leaves, chunk, staging)
        digests, lens, counts = _hash_leaves(leaves, chunk, window)
        del window  # the write job has its own
        # This rank's chunk table travels compact: 32 bytes of digest and 8 of length a chunk.
        table = (_heads(leaves), digests, lens, counts)
        bw = bandwidth or _measured_bandwidth or DEFAULT_BANDWIDTH
        gathered = _all_gather((table, bw), group, world)
        tables = [t for t, _ in gathered]

        # Rank 0 alone decides what is already stored and who writes what: every rank then
        # follows one plan (ranks looking at the store separately could each skip a chunk).
        plan: Any = None
        if rank == 0:
            try:
                known = store.known()
                ranks = [(t[1], t[2]) for t in tables]
                assignments, makespan, cached = _sluice.ckpt_plan(
                    ranks, [b for _, b in gathered], known
                )
                plan = ("ok", assignments, makespan, cached, os.urandom(8).hex())
            except Exception as e:
                if world == 1:
                    raise
                plan = ("error", f"{type(e).__name__}: {e}")
        plan = _broadcast(plan, group, world, rank)
        if plan[0] == "error":
            raise SluiceError(f"{root / name}: rank 0 could not plan the save: {plan[1]}")
        _, assignments, makespan, cached, token = plan

        import numpy as np

        # Each chunk's leaf, and its offset within the leaf.
        leaf_of = np.repeat(np.arange(len(leaves)), counts)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        length = np.frombuffer(lens, "<u8")
        mine: list[tuple[bytes, int, int]] = []
        streamed: list[tuple[bytes, int, Any, int]] = []
        for i in np.frombuffer(assignments[rank], "<u4").tolist():
            lf = leaves[int(leaf_of[i])]
            off = (i - int(first[leaf_of[i]])) * chunk
            d, n = digests[32 * i : 32 * i + 32], int(length[i])
            if lf.addr < 0:
                streamed.append((d, n, lf.owner, off))
            else:
                mine.append((d, n, lf.addr + off))
        if streamed:
            job: Any = _Jobs(store, mine, streamed, chunk, staging, [lf.owner for lf in leaves])
        else:
            job = store.write(mine, chunk, staging, [lf.owner for lf in leaves])
    except BaseException:
        store.close()
        raise
    return _Staged(store, job, tables, token, makespan, cached, mine, assignments)


_side_groups: dict[tuple[int, ...], Any] = {}
_side_lock = threading.Lock()


def _side_group(group: Any, timeout: float) -> Any:
    """A gloo group of ``group``'s ranks for Sluice's background traffic, so that it never
    interleaves with training's collectives on ``group`` (collective on first use)."""
    import datetime

    import torch.distributed as dist

    ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    side = _side_groups.get(ranks)
    if side is None:
        side = dist.new_group(
            list(ranks),
            timeout=datetime.timedelta(seconds=timeout),
            backend="gloo",
            use_local_synchronization=True,
        )
        _side_groups[ranks] = side
    return side


def _at(addr: int, n: int) -> Any:
    """A torch.uint8 view of ``n`` bytes of host memory at ``addr`` (owned elsewhere)."""
    import ctypes

    import torch

    return torch.frombuffer((ctypes.c_uint8 * n).from_address(addr), dtype=torch.uint8)


class _Replica:
    """``replicate=True``: this rank sends its share to the next rank and receives the
    previous rank's share into host memory. Once its own share is durable it tells the
    next rank so; a rank that hears instead that the previous one is gone (its connection
    closed) writes that rank's share from the replica and marks it durable."""

    def __init__(
        self,
        where: Path,
        group: Any,
        rank: int,
        world: int,
        st: _Staged,
        staging: int,
        timeout: float,
    ) -> None:
        import numpy as np
        import torch

        self.where, self.rank, self.world = where, rank, world
        self.pred, self.succ = (rank - 1) % world, (rank + 1) % world
        shares = []
        for r in range(world):
            idx = np.frombuffer(st.assignments[r], "<u4")
            shares.append(int(np.frombuffer(st.tables[r][2], "<u8")[idx].sum()))
        if max(shares) > staging:  # the same verdict on every rank: all raise together
            r = shares.index(max(shares))
            raise ConfigError(
                f"{where}: replicate=True holds a rank's share in its successor's memory; "
                f"rank {r}'s is {shares[r]} bytes, over staging_bytes ({staging})"
            )
        table = st.tables[self.pred]
        idx = np.frombuffer(st.assignments[self.pred], "<u4").tolist()
        lens = np.frombuffer(table[2], "<u8")
        self.chunks = [(table[1][32 * i : 32 * i + 32], int(lens[i])) for i in idx]
        self.buf = torch.empty(shares[self.pred], dtype=torch.uint8)
        self.side = _side_group(group, timeout)
        self.error: Optional[BaseException] = None
        self.signalled = False
        self.thread = threading.Thread(
            target=self._exchange, args=(st.mine,), name="sluice-ckpt-replica", daemon=True
        )
        self.thread.start()

    def _peer(self, r: int) -> int:
        import torch.distributed as dist

        return dist.get_global_rank(self.side, r)

    def _exchange(self, mine: list[tuple[bytes, int, int]]) -> None:
        import torch.distributed as dist

        try:
            ops = [
                dist.P2POp(dist.isend, _at(addr, n), self._peer(self.succ), self.side)
                for _, n, addr in mine
                if n
            ]
            at = 0
            for _, n in self.chunks:
                if n:
                    view = self.buf[at : at + n]
                    ops.append(dist.P2POp(dist.irecv, view, self._peer(self.pred), self.side))
                at += n
            with _side_lock:
                for w in dist.batch_isend_irecv(ops) if ops else []:
                    w.wait()
        except BaseException as e:
            self.error = e

    def wait_sent(self) -> None:
        """Returns once this rank's share is in the next rank's memory and the previous
        rank's in this one's."""
        self.thread.join()
        if self.error is not None:
            raise SluiceError(f"{self.where}: replicating the staged share failed: {self.error}")

    def _signal(self, code: int) -> Any:
        """Tells the next rank how this rank's share ended (1 durable, 2 failed), once:
        the pending send, or None if already told."""
        import torch
        import torch.distributed as dist

        if self.signalled:
            return None
        self.signalled = True
        with _side_lock:
            return dist.isend(
                torch.full((1,), code, dtype=torch.uint8), self._peer(self.succ), self.side
            )

    def abandon(self) -> None:
        """This rank's save failed: the next rank stands in for its share."""
        try:
            send = self._signal(2)
            if send is not None:
                send.wait()
        except Exception as e:  # the next rank may be gone too
            log.debug("%s: could not tell rank %d: %s", self.where, self.succ, e)

    def stand_in(self, store: Any, chunk: int, pending: Path) -> bool:
        """Tells the next rank this share is durable and learns the previous rank's fate;
        writes its share if it failed or died first. True if this rank stood in for it."""
        import torch
        import torch.distributed as dist

        self.wait_sent()
        heard = torch.zeros(1, dtype=torch.uint8)
        mark = pending / f"rank-{self.pred}.json"
        why = "its save failed"
        send = self._signal(1)
        try:
            with _side_lock:
                recv = dist.irecv(heard, self._peer(self.pred), self.side)
            recv.wait()
            if heard.item() == 1 or mark.exists():
                return False
        except RuntimeError as e:  # a closed connection: the previous rank died
            if mark.exists():
                return False
            why = f"it is gone ({e})"
        finally:
            try:
                if send is not None:
                    send.wait()
            except RuntimeError as e:  # the next rank died: it needs nothing from here
                log.debug("%s: rank %d did not hear: %s", self.where, self.succ, e)
        log.warning("%s: rank %d: %s; writing its replicated share", self.where, self.pred, why)
        base = int(self.buf.data_ptr())
        tasks, at = [], 0
        for d, n in self.chunks:
            tasks.append((d, n, base + at))
            at += n
        job = store.write(tasks, chunk, max(chunk, at), [self.buf])
        try:
            report = json.loads(job.wait_durable())
        finally:
            job.close()
        report["written_by"] = self.rank
        tmp = pending / f".rank-{self.pred}.tmp"
        tmp.write_text(json.dumps(report))
        os.replace(tmp, mark)
        return True


def _check_name(root: Path, name: str) -> None:
    # The native layer checks the name again when it publishes; checking first fails a bad
    # name on every rank before any byte is written or any collective runs.
    if name.startswith(".") or name in ("chunks", "lock", "sluice-ckpt.json"):
        raise ConfigError(
            f"{root / name}: checkpoint name {name!r} must be a plain name "
            "(not starting with '.', not chunks, lock or sluice-ckpt.json)"
        )


def _table_sizes(tables: list[tuple[str, bytes, bytes, list[int]]]) -> tuple[int, int, int]:
    """(entries, logical bytes, content-unique bytes) of the ranks' chunk tables."""
    import numpy as np

    digests = b"".join(t[1] for t in tables)
    lens = np.frombuffer(b"".join(t[2] for t in tables), "<u8")
    _, first = np.unique(np.frombuffer(digests, "V32"), return_index=True)
    entries = sum(len(t[3]) for t in tables)
    return entries, int(lens.sum()), int(lens[first].sum())


def _publish(
    store: Any,
    root: Path,
    name: str,
    rank: int,
    world: int,
    tables: list[tuple[str, bytes, bytes, list[int]]],
    chunk: int,
    report: dict[str, Any],
    pending: Path,
    token: str,
    timeout: float,
    replica: Optional[_Replica] = None,
) -> dict[str, Any]:
    """Publishes the manifest once every rank's share is durable. Ranks meet through
    marker files in the store (no collective runs in the background, so a save never
    contends with training's own collectives): each rank marks its share durable, rank 0
    waits for all marks and publishes, the others wait for the manifest."""
    entries, logical, unique = _table_sizes(tables)
    summary: dict[str, Any] = {
        "path": str(root / name),
        "entries": entries,
        "logical_bytes": logical,
        "unique_bytes": unique,
        "written_bytes_rank": report["bytes_written"],
    }
    if world == 1:
        store.publish(name, world, chunk, tables, json.dumps({"save_id": token}))
        summary["written_bytes"] = report["bytes_written"]
        summary["written_bytes_per_rank"] = [report["bytes_written"]]
        return summary
    pending.mkdir(parents=True, exist_ok=True)
    mark = pending / f"rank-{rank}.json"
    tmp = pending / f".rank-{rank}.tmp"
    tmp.write_text(json.dumps(report))
    os.replace(tmp, mark)
    deadline = time.monotonic() + timeout
    manifest_path = root / name / "manifest.json"
    failed = pending / "failed"
    publisher = rank == 0
    # With replicate=True the previous rank's share is in this rank's memory: written here
    # if that rank died before marking it durable; rank 0's publishing too, if it was 0.
    if replica is not None and replica.stand_in(store, chunk, pending):
        summary["stood_in_for"] = replica.pred
        publisher = publisher or replica.pred == 0
    if publisher:
        marks = [pending / f"rank-{r}.json" for r in range(world)]
        while not all(m.exists() for m in marks):
            if time.monotonic() > deadline:
                failed.write_text("rank 0 timed out waiting for the other ranks")
                missing = [r for r, m in enumerate(marks) if not m.exists()]
                raise SluiceError(
                    f"{root / name}: ranks {missing} did not finish their share within "
                    f"{timeout:.0f} s; not published"
                )
            time.sleep(0.01)
        reports = [json.loads(m.read_text()) for m in marks]
        try:
            store.publish(name, world, chunk, tables, json.dumps({"save_id": token}))
        except BaseException as e:
            failed.write_text(str(e))
            raise
        summary["written_bytes"] = sum(r["bytes_written"] for r in reports)
        summary["written_bytes_per_rank"] = [r["bytes_written"] for r in reports]
        _remove_tree(pending)
        return summary
    # The manifest at this path may be an older save's (a name saved again): this save's
    # carries its token.
    seen = None
    while True:
        try:
            stamp = manifest_path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = None
        if stamp is not None and stamp != seen:
            seen = stamp
            try:
                extra = json.loads(manifest_path.read_text()).get("extra") or {}
            except (OSError, ValueError):
                extra = {}
            if extra.get("save_id") == token:
                break
        if failed.exists():
            raise SluiceError(f"{root / name}: rank 0 did not publish: {failed.read_text()}")
        if time.monotonic() > deadline:
            raise SluiceError(f"{root / name}: not published within {timeout:.0f} s")
        time.sleep(0.01)
    return summary


def _remove_tree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Grouped reads: each unique chunk read by one rank, sent to the others that need it

#: What the last load of this process read and received (bytes), for reports and benches.
last_load: dict[str, int] = {}


def _u8(buf: Any) -> Any:
    """A flat torch.uint8 view of a contiguous host tensor or array (shared memory)."""
    import torch

    if isinstance(buf, torch.Tensor):
        return (
            buf.reshape(-1).view(torch.uint8)
            if buf.numel()
            else buf.new_empty(0, dtype=torch.uint8)
        )
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(buf).reshape(-1).view(np.uint8))


def _read_plan(needs: list[dict[str, int]], world: int) -> dict[str, int]:
    """The reader of every chunk some rank needs: one of its needers, chosen so the ranks'
    read bytes are balanced (largest chunks first, each to the needer with the least so
    far). Every rank computes the same plan from the same gathered needs."""
    holders: dict[str, list[int]] = {}
    size: dict[str, int] = {}
    for r, need in enumerate(needs):
        for d, n in need.items():
            holders.setdefault(d, []).append(r)
            size[d] = n
    load = [0] * world
    reader: dict[str, int] = {}
    for d in sorted(size, key=lambda d: (-size[d], d)):
        r = min(holders[d], key=lambda r: (load[r], r))
        reader[d] = r
        load[r] += size[d]
    return reader


def _grouped_read(
    store: Any,
    where: Path,
    entries: Mapping[str, Any],
    dests: list[tuple[str, Any]],
    group: Any,
    rank: int,
    world: int,
    failed: Optional[BaseException] = None,
) -> None:
    """Fills each (key, host buffer) with its entry. Collective over ``group``: the ranks
    pool which chunks they need, each unique chunk is read (and verified) by one of its
    needers, which sends it to the others over the group; a chunk repeated within a rank
    is read once and copied. ``failed`` is this rank's error from before the call: every
    rank raises once any has failed, so none waits on a rank that has given up."""
    # digest -> [(flat uint8 view, offset, length, entry)]: where this rank needs it.
    places: dict[str, list[tuple[Any, int, int, str]]] = {}
    try:
        if failed is not None:
            raise failed
        for key, buf in dests:
            view = _u8(buf)
            at = 0
            for c in entries[key]["chunks"]:
                places.setdefault(c["d"], []).append((view, at, c["n"], key))
                at += c["n"]
            if at != view.numel():
                raise StoreFormatError(
                    f"{where}: entry {key!r}: chunks hold {at} bytes, not {view.numel()}"
                )
    except BaseException as e:
        failed = e
    need = {d: p[0][2] for d, p in places.items()}
    gathered = _all_gather((need, _failure(failed)), group, world)
    _raise_first(where, failed, [f for _, f in gathered])
    needs = [n for n, _ in gathered]
    reader = _read_plan(needs, world)
    mine = sorted(d for d, r in reader.items() if r == rank)

    def first(d: str) -> Any:
        view, at, n, _ = places[d][0]
        return view[at : at + n]

    error: Optional[BaseException] = None
    try:
        store.read_chunks(
            [
                (bytes.fromhex(d), need[d], int(first(d).data_ptr()), places[d][0][3])
                for d in mine
                if need[d]
            ]
        )
    except BaseException as e:  # every rank must learn of it before any waits on a send
        error = e
    _raise_first(where, error, _all_gather(_failure(error), group, world))
    received = 0
    if world > 1:
        import torch.distributed as dist

        def peer(r: int) -> int:
            return dist.get_global_rank(group, r) if group is not None else r

        ops = []
        for d in sorted(reader):
            src = reader[d]
            if src == rank:
                for r, their in enumerate(needs):
                    if r != rank and their.get(d):
                        ops.append(dist.P2POp(dist.isend, first(d), peer(r), group))
            elif need.get(d):
                ops.append(dist.P2POp(dist.irecv, first(d), peer(src), group))
                received += need[d]
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()
    for d, all_places in places.items():
        src = first(d)
        for view, at, n, _ in all_places[1:]:
            view[at : at + n].copy_(src)
    last_load.clear()
    last_load.update(
        read_bytes=sum(need[d] for d in mine), received_bytes=received, chunks_read=len(mine)
    )


def _failure(e: Optional[BaseException]) -> Optional[str]:
    return None if e is None else f"{type(e).__name__}: {e}"


def _raise_first(where: Path, mine: Optional[BaseException], all_: list[Optional[str]]) -> None:
    """Raises this rank's own error, or names the first rank that failed."""
    if mine is not None:
        raise mine
    for r, f in enumerate(all_):
        if f:
            raise SluiceError(f"{where}: rank {r} failed: {f}")


# ---------------------------------------------------------------------------------------
# Load


def _set_path(state: MutableMapping[Any, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = state
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def load(
    state_dict: MutableMapping[str, Any],
    path: PathLike,
    *,
    group: Any = None,
    strict: bool = True,
) -> MutableMapping[str, Any]:
    """Loads checkpoint ``path`` (STORE/NAME) into ``state_dict`` in place: tensors are
    filled (each chunk verified against its digest), other values replaced. Every key of
    ``state_dict`` must be in the checkpoint unless ``strict=False``. Returns
    ``state_dict``."""
    root, name = _split(path)
    rank, world, group = _group_info(group)
    reads: list[tuple[str, Any]] = []  # (entry, host buffer to fill)
    copies: list[tuple[Any, Any]] = []  # (destination, host buffer read into)
    blobs: list[tuple[tuple[Any, ...], str, Any]] = []
    entries: dict[str, Any] = {}
    store: Any = None
    failed: Optional[BaseException] = None
    try:
        store = _sluice.ckpt_open(str(root))
        m = json.loads(store.manifest(name))
        entries = m["entries"]
        _plan_load(state_dict, root / name, m, rank, world, strict, reads, copies, blobs)
    except BaseException as e:  # raised by every rank together, in the grouped read
        failed = e
    try:
        _grouped_read(store, root / name, entries, reads, group, rank, world, failed)
        for dst, host in copies:
            if _is_tensor(dst):
                dst.copy_(host)
            else:
                dst[...] = host
        for path_, full, buf in blobs:
            try:
                value = _unpack(buf.tobytes(), entries[full].get("meta") or {})
            except Exception as e:
                raise StoreFormatError(
                    f"{root / name}: entry {full!r} does not unpickle: {e}"
                ) from e
            _set_path(state_dict, path_, value)
        return state_dict
    finally:
        if store is not None:
            store.close()


def _plan_load(
    state_dict: Mapping[str, Any],
    where: Path,
    m: Mapping[str, Any],
    rank: int,
    world: int,
    strict: bool,
    reads: list[tuple[str, Any]],
    copies: list[tuple[Any, Any]],
    blobs: list[tuple[tuple[Any, ...], str, Any]],
) -> None:
    """Matches the state's leaves with the manifest's entries: the buffers to read into."""
    import numpy as np

    saved_world = m.get("world_size", 1) or 1
    if saved_world != world:
        raise ConfigError(
            f"{where}: saved by {saved_world} rank(s), loaded by {world}; "
            "load at the saving world size, or reshard through DCP "
            "(sluice.ckpt.StorageWriter/StorageReader)"
        )
    prefix = f"{rank}/" if world > 1 else ""
    entries = m["entries"]
    for key, path_, v in _flatten(state_dict):
        full = prefix + key
        e = entries.get(full)
        if e is None:
            if strict:
                raise TensorNotFoundError(f"{where}: no entry {full!r} in the checkpoint")
            continue
        if _is_tensor(v) or _is_array(v):
            if e["kind"] != "tensor":
                raise StoreFormatError(f"{where}: entry {full!r} is not a tensor")
            shape = list(v.shape)
            if e.get("shape") != shape or e.get("dtype") != _dtype_name(v):
                raise ConfigError(
                    f"{where}: entry {full!r} is {e.get('dtype')} {e.get('shape')}, "
                    f"the destination {_dtype_name(v)} {shape}"
                )
            host = _writable_host(v)
            if host is not v:
                copies.append((v, host))
            reads.append((full, host))
        else:
            if e["kind"] != "bytes":
                raise StoreFormatError(f"{where}: entry {full!r} is a tensor")
            buf = np.empty(e["nbytes"], np.uint8)
            reads.append((full, buf))
            blobs.append((path_, full, buf))


def _unpack(raw: bytes, meta: Mapping[str, Any]) -> Any:
    """A bytes entry's value: pickled by sluice.ckpt.save, torch.save'd by DCP."""
    if meta.get("codec") == "torch.save":
        import io

        import torch

        return torch.load(io.BytesIO(raw), weights_only=False)
    return pickle.loads(raw)


def _writable_host(v: Any) -> Any:
    """`v` itself where it is contiguous writable host memory, else a host buffer of its
    shape and dtype to read into and copy from."""
    if _is_tensor(v):
        if v.device.type == "cpu" and v.is_contiguous() and not v.is_conj() and not v.is_neg():
            return v
        import torch

        return torch.empty(v.shape, dtype=v.dtype, device="cpu")
    import numpy as np

    if v.flags.c_contiguous and v.flags.writeable:
        return v
    return np.empty(v.shape, v.dtype)


# ---------------------------------------------------------------------------------------
# Store management


def _read(root: PathLike, call: Any) -> Any:
    """``call(store)``'s JSON answer, the existing store at ``root`` open for the call."""
    store = _sluice.ckpt_open(os.fspath(root))
    try:
        return json.loads(call(store))
    finally:
        store.close()


def manifest(path: PathLike) -> dict[str, Any]:
    """The manifest of checkpoint ``path`` (STORE/NAME): entries with dtype, shape and
    chunks."""
    root, name = _split(path)
    return _read(root, lambda s: s.manifest(name))


def ls(store: PathLike) -> list[dict[str, Any]]:
    """The checkpoints of ``store``, oldest first, with logical, unique and shared bytes."""
    return _read(store, lambda s: s.ls())


def verify(path: PathLike) -> dict[str, Any]:
    """Re-hashes every chunk of checkpoint ``path``; ``problems`` lists the bad ones."""
    root, name = _split(path)
    return _read(root, lambda s: s.verify(name))


def gc(store: PathLike, keep: int) -> dict[str, Any]:
    """Keeps the ``keep`` newest checkpoints of ``store`` and removes the rest, with every
    chunk no kept checkpoint references. Raises ``StoreLockedError`` while a save or load
    has the store open."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ConfigError(f"keep: expected a count >= 0, got {keep!r}")
    return json.loads(_sluice.ckpt_gc(os.fspath(store), keep))


def __getattr__(name: str) -> Any:
    # The DCP classes subclass torch's: importing them imports torch, so only on use.
    if name in ("StorageWriter", "StorageReader"):
        from . import _ckpt_dcp

        return getattr(_ckpt_dcp, name)
    raise AttributeError(f"module 'sluice.ckpt' has no attribute {name!r}")
