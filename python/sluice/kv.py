"""``sluice.kv``: a tiered KV-cache block store (DRAM slots, then log-structured SSD segments).

    import numpy as np, sluice.kv
    store = sluice.kv.open("/nvme/kv", block_bytes="2MiB", dram="8GiB", ssd="200GiB",
                           model="llama-3.1-8b", dtype="bfloat16", policy="lru")
    store.put_batch(keys, blocks)              # keys: bytes; blocks: arrays of block_bytes
    n = store.lookup(keys)                     # consecutive hits from the first key, no I/O
    ok = store.get_batch_into(keys[:n], out)   # zero-copy into numpy / torch CPU buffers
    store.close()

    job = store.submit_get(keys[:n], out)      # non-blocking; job.wait() -> list[bool]
    for job in store.poll(): ...               # finished jobs, each reported once

    # Several processes (TP ranks, engines) share one store through a sidecar that owns it
    # (`sluice kv serve /nvme/kv --socket /run/sluice-kv.sock --block-bytes 2MiB ...`):
    store = sluice.kv.connect("/run/sluice-kv.sock", model="llama-3.1-8b", tp_rank=0)

A block that is missing, unreadable or fails its checksum is a miss (``False``), never
wrong bytes; after the first miss every later key of a batch is a miss too (prefix
semantics), as engines expect. The GIL is released for every batch.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

from . import _sluice

PathLike = Union[str, "os.PathLike[str]"]
ByteSize = Union[int, str]

__all__ = ["DEFAULTS", "KvJob", "KvStore", "connect", "fsck", "open", "plot_bench"]

#: Every option's default, from the Rust configs that own them (and say why each value):
#: ``policy``, ``write_mode``, ``durability``, ``direct``, ``engine``, ``io_threads``,
#: ``lease_timeout_ms``, ``shared_policy``, ``shared_refresh_ms``, ``remote_timeout_ms``, and
#: for :func:`connect`
#: ``shm_bytes``, ``connections``, ``retry_ms``, ``timeout_ms``.
DEFAULTS: dict[str, Any] = _sluice.kv_defaults()
_D = DEFAULTS


def _address(buf: Any, index: int, writable: bool) -> tuple[int, int]:
    """(address, nbytes) of a contiguous host buffer: numpy array, torch CPU tensor,
    bytearray, bytes (read-only) or memoryview."""
    if hasattr(buf, "data_ptr") and hasattr(buf, "is_contiguous"):  # torch.Tensor
        if buf.device.type != "cpu":
            from ._kv_device import is_device

            why = (
                f"buffer {index}: a {buf.device} tensor; sluice.kv takes host memory and "
                "CUDA tensors"
            )
            raise _DeviceBuffer(why) if is_device(buf) else ValueError(why)
        if not buf.is_contiguous():
            raise ValueError(f"buffer {index}: the tensor is not contiguous")
        return buf.data_ptr(), buf.numel() * buf.element_size()
    import numpy as np

    if isinstance(buf, np.ndarray):
        arr = buf
        if arr.dtype.hasobject:
            _refuse_objects(index, f"a numpy array of dtype {arr.dtype}")
    else:
        # np.frombuffer reads any buffer as bytes, pointers included: check its format.
        fmt = memoryview(buf).format
        if "O" in fmt:
            _refuse_objects(index, f"a {type(buf).__name__} buffer of format {fmt!r}")
        arr = np.frombuffer(buf, dtype=np.uint8)
    if not arr.flags.c_contiguous:
        raise ValueError(f"buffer {index}: the array is not C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"buffer {index}: read-only; get_batch_into needs writable buffers")
    return arr.__array_interface__["data"][0], arr.nbytes


class _DeviceBuffer(ValueError):
    """A CUDA tensor where a call wanted host memory: ``put_batch`` and ``get_batch_into``
    catch it and stage the batch through pinned slots; the other calls raise it."""


def _refuse_objects(index: int, what: str) -> None:
    """A buffer of Python object pointers is not block bytes: a put would store heap
    addresses, a get would overwrite the pointers."""
    from .errors import ConfigError

    raise ConfigError(
        f"buffer {index}: {what} holds Python objects, not plain bytes; "
        "pass a plain-data array (uint8, float16, ...)"
    )


def _keys(keys: Iterable[Union[bytes, bytearray, memoryview]]) -> list[bytes]:
    if isinstance(keys, list) and all(type(k) is bytes for k in keys):
        return keys  # the common case: no copy (the native call only reads them)
    out = []
    for i, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray, memoryview)):
            raise TypeError(f"key {i}: expected bytes, got {type(k).__name__}")
        out.append(bytes(k))
    return out


def _batch(
    keys: Sequence[bytes], buffers: Sequence[Any], writable: bool
) -> tuple[list[bytes], list[tuple[int, int]], list[Any]]:
    """A batch call's keys, its buffers' (address, nbytes), and the buffer objects, which
    the caller keeps alive for as long as the native side uses the addresses."""
    held = list(buffers)
    addrs = [_address(b, i, writable=writable) for i, b in enumerate(held)]
    return _keys(keys), addrs, held


class KvJob:
    """A batch submitted with :meth:`KvStore.submit_put` or :meth:`KvStore.submit_get`.

    It keeps its buffers referenced until it finishes, so the memory outlives every
    read and write into it. Each finished job is reported once: by
    :meth:`KvStore.poll`, or by :meth:`wait` / :meth:`result`, whichever comes first.
    """

    def __init__(self, native: Any, store: KvStore, buffers: list[Any]) -> None:
        self._native = native
        self._store = store
        self._buffers: Optional[list[Any]] = buffers

    @property
    def id(self) -> int:
        return int(self._native.id)

    @property
    def kind(self) -> str:
        """``"put"`` or ``"get"``."""
        return str(self._native.kind)

    def done(self) -> bool:
        return bool(self._native.done())

    def wait(self, timeout: Optional[float] = None) -> list[bool]:
        """Per-key success once the job is done (GIL released while waiting). Raises
        :class:`TimeoutError` when ``timeout`` seconds pass first (``None``, ``inf`` or a
        timeout too large for the clock: no limit)."""
        ok = self._native.wait(timeout)
        if ok is None:
            raise TimeoutError(f"kv job {self.id} ({self.kind}) not done after {timeout} s")
        return self._collected(ok)

    def result(self) -> list[bool]:
        """Per-key success; raises :class:`RuntimeError` while the job runs."""
        ok = self._native.result()
        if ok is None:
            raise RuntimeError(f"kv job {self.id} ({self.kind}) is still running")
        return self._collected(ok)

    def _collected(self, ok: list[bool]) -> list[bool]:
        self._store._jobs.pop(self.id, None)
        self._buffers = None
        self._native.release_buffers()
        return list(ok)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<sluice.kv.KvJob {self.id} {self.kind} {state}>"


class KvStore:
    """An open store (:func:`open`) or a connection to a sidecar that owns one
    (:func:`connect`): the same calls either way. Also a context manager that closes it."""

    def __init__(self, native: Any, path: str) -> None:
        self._native = native
        self.path = path
        # Submitted jobs not reported yet, by id: poll() hands back these objects.
        self._jobs: dict[int, KvJob] = {}
        self._staging: Any = None  # pinned slots for CUDA blocks, made on first use
        self._device_ids = 0

    def _device_staging(self) -> Any:
        if self._staging is None:
            from ._kv_device import DeviceStaging

            self._staging = DeviceStaging(self.block_bytes)
        return self._staging

    @property
    def block_bytes(self) -> int:
        return int(self._native.block_bytes)

    def lookup(
        self, keys: Sequence[bytes], *, lease: bool = True, worth_loading: bool = False
    ) -> int:
        """How many keys, from the first, are stored. Answered from the index, no I/O.
        With ``lease`` the blocks found stay readable until their get (or the lease
        timeout), even if evicted meanwhile. With ``worth_loading`` (the store opened
        with ``recompute_tokens_per_s``), only the prefix that loads sooner than the
        engine would recompute it, estimated from each block's tier and the load times
        measured on that tier."""
        try:
            # A list of bytes goes to the native call as it is (PyO3 borrows each key): the
            # per-key Python check below costs as much as the lookup itself.
            return int(self._native.lookup(keys, lease, worth_loading))
        except TypeError:
            return int(self._native.lookup(_keys(keys), lease, worth_loading))

    def put_batch(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> list[bool]:
        """Stores blocks (each exactly ``block_bytes``). ``True``: the block is in the
        store now. In ``write-through`` (the default) that means its record is on the SSD
        tier (synced, with ``durability="batch"``), so it survives a crash unless evicted
        since; in ``write-back`` it means DRAM holds it, and it survives a crash once DRAM
        demoted it to SSD or :meth:`sync` wrote it there. ``False``: no tier kept it (a
        policy declined it, the batch was larger than a tier, which keeps a batch's first
        blocks, or I/O failed: ``stats()["put_declined"]`` and ``["put_failures"]``).

        Blocks may be CUDA tensors: they are copied out through pinned host slots on each
        device's current stream, so after every kernel queued there before the call (the
        store gets what those kernels wrote); small blocks go to the store in batches of
        8 MiB. The call returns once every block is stored."""
        blocks = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
        try:
            ks, addrs, _ = _batch(keys, blocks, writable=False)
        except _DeviceBuffer:
            return self._device_staging().put(_keys(keys), blocks, self._native.put_batch)
        return list(self._native.put_batch(ks, addrs))

    def get_batch_into(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> list[bool]:
        """Loads blocks into writable buffers, zero-copy. ``True`` for key ``i`` means
        ``buffers[i]`` holds exactly its bytes; after the first ``False`` the rest are
        ``False`` and their buffers unspecified.

        Buffers may be CUDA tensors: blocks land in pinned host slots (8 MiB of blocks per
        store call) and their copies are queued on each buffer's device's current stream.
        Work queued on that stream after this returns sees the bytes, with no host
        synchronisation; other streams must wait for an event recorded on it."""
        buffers = buffers if isinstance(buffers, (list, tuple)) else list(buffers)
        try:
            ks, addrs, _ = _batch(keys, buffers, writable=True)
        except _DeviceBuffer:
            return self._device_staging().get_into(
                _keys(keys), buffers, self._native.get_batch_into
            )
        return list(self._native.get_batch_into(ks, addrs))

    def delete(self, keys: Sequence[bytes]) -> int:
        """Deletes blocks and returns how many of ``keys`` the store held (an absent key
        is not an error). A deleted block leaves every tier at once: a later
        :meth:`lookup` or :meth:`get_batch_into` misses, its lease ends, its DRAM bytes
        are free, and its SSD record is dead space that the store reclaims (a segment
        left with no live record is removed at once). A delete is not written to disk:
        after a restart, a block whose segment was not reclaimed yet is found again
        (keys name immutable bytes, so it is still the right block). Through
        :func:`connect`, an unreachable sidecar raises
        :class:`~sluice.errors.SluiceIOError`."""
        try:
            return int(self._native.delete(keys))
        except TypeError:
            return int(self._native.delete(_keys(keys)))

    def submit_put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> KvJob:
        """:meth:`put_batch` without waiting: arguments are checked now (errors raise
        here), the batch runs in the background. Do not change the blocks until the job is
        done. CUDA blocks are copied out on the streams current at this call, so the store
        gets what the kernels queued there before it wrote."""
        blocks = blocks if isinstance(blocks, (list, tuple)) else list(blocks)
        try:
            ks, addrs, held = _batch(keys, blocks, writable=False)
        except _DeviceBuffer:
            return self._submit_device("put", keys, blocks)
        return self._track(self._native.submit_put(ks, addrs, held), held)

    def submit_get(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> KvJob:
        """:meth:`get_batch_into` without waiting; do not touch the buffers until the
        job is done. For CUDA buffers the copies are queued on the streams current at this
        call; once the job is done, work queued on those streams sees the bytes."""
        buffers = buffers if isinstance(buffers, (list, tuple)) else list(buffers)
        try:
            ks, addrs, held = _batch(keys, buffers, writable=True)
        except _DeviceBuffer:
            return self._submit_device("get", keys, buffers)
        return self._track(self._native.submit_get(ks, addrs, held), held)

    def _submit_device(self, kind: str, keys: Sequence[bytes], buffers: Sequence[Any]) -> KvJob:
        self._device_ids -= 1  # negative: never a native job's id
        native = self._native.put_batch if kind == "put" else self._native.get_batch_into
        job = self._device_staging().submit(
            self._device_ids, kind, _keys(keys), list(buffers), native
        )
        return self._track(job, list(buffers))

    def _track(self, native: Any, held: list[Any]) -> KvJob:
        job = KvJob(native, self, held)
        self._jobs[job.id] = job
        return job

    def poll(self) -> list[KvJob]:
        """Jobs that finished since the last poll and were not waited for, each once."""
        out = []
        for job_id in self._native.poll():
            job = self._jobs.pop(int(job_id), None)
            if job is not None:
                out.append(job)
        for job_id in [i for i, j in self._jobs.items() if i < 0 and j.done()]:
            out.append(self._jobs.pop(job_id))
        return out

    def sync(self) -> None:
        """Makes every acknowledged put durable: syncs the segments (for
        ``durability="none"``) and, in ``write-back``, first writes every block only DRAM
        holds to the SSD tier (a block its policy declines stays in DRAM only, logged).
        Raises :class:`~sluice.errors.SluiceIOError` when write-back blocks could not be
        written to the SSD tier since the last sync (a full disk: errno ENOSPC), naming
        how many (``stats()["write_back_failures"]`` counts them too)."""
        self._native.sync()

    def stats(self) -> dict[str, Any]:
        """Counters: hits per tier, misses, corrupt blocks, bytes used per tier (and, per
        tier, ``capacity_blocks`` and for the SSD ``disk_bytes_limit``)."""
        return dict(self._native.stats().to_dict())

    def close(self) -> None:
        """Waits for the store's jobs and for calls running on other threads, syncs (as
        :meth:`sync`) and releases the store (for a connection: waits for its jobs and
        hangs up; the sidecar and its store go on); calls made once it began raise
        ``SluiceError``."""
        if self._staging is not None:
            self._staging.close()  # device batches and their copies first: they call the store
        self._native.close()

    def __enter__(self) -> KvStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(
    path: PathLike,
    *,
    block_bytes: ByteSize,
    dram: ByteSize = 0,
    ssd: ByteSize = 0,
    model: str = "",
    dtype: str = "",
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_stage: int = 0,
    kv_format: str = "",
    salt: str = "",
    policy: str = _D["policy"],
    dram_policy: Optional[str] = None,
    ssd_policy: Optional[str] = None,
    write_mode: str = _D["write_mode"],
    durability: str = _D["durability"],
    direct: str = _D["direct"],
    io_threads: int = _D["io_threads"],
    lease_timeout_ms: int = _D["lease_timeout_ms"],
    key_bytes: Optional[int] = None,
    segment_bytes: Optional[ByteSize] = None,
    recompute_tokens_per_s: Optional[float] = None,
    block_tokens: Optional[int] = None,
    shared_dir: Optional[PathLike] = None,
    shared: ByteSize = 0,
    shared_policy: str = _D["shared_policy"],
    shared_refresh_ms: int = _D["shared_refresh_ms"],
    remote: Optional[str] = None,
    remote_timeout_ms: int = _D["remote_timeout_ms"],
    engine: str = _D["engine"],
) -> KvStore:
    """Opens or creates the store at ``path``.

    ``dram`` and ``ssd`` are the tiers' byte budgets ("8GiB"; 0 leaves a tier out).
    ``model``, ``dtype``, ``tp_rank``, ``tp_size``, ``pp_stage``, ``kv_format`` and
    ``salt`` form the namespace: blocks of another namespace are never seen. ``policy``
    names the eviction policy of both tiers as ``sluice sim`` does (``lru``, ``arc``,
    ``s3fifo``, ``tinylfu(window=0.01)``, ...); ``dram_policy``/``ssd_policy`` override it
    per tier. ``write_mode`` is ``write-through`` (a put is acknowledged once its record
    is on SSD) or ``write-back`` (acknowledged in DRAM; durable once demoted to SSD or
    after :meth:`KvStore.sync`); ``durability`` ``batch`` (a put batch is acknowledged
    after fdatasync) or ``none``. ``dram`` and ``ssd`` hold ``dram // block_bytes`` and
    ``ssd // block_bytes`` blocks; the DRAM arena has a sixteenth more slots (spares for
    pinned blocks) and the SSD's files take more room on disk (headers, a spare segment,
    reclaim headroom): ``stats()["ssd"]["disk_bytes_limit"]`` says how much.
    ``recompute_tokens_per_s`` (the engine's prefill rate) and ``block_tokens`` enable
    ``lookup(..., worth_loading=True)``.

    ``shared_dir`` adds the shared tier: a directory other nodes mount too (NFS, Lustre).
    The store writes its own segments there (``shared`` bytes of them, ``shared_policy``
    deciding which) and reads the segments other stores sealed there, found every
    ``shared_refresh_ms``. A block read from there is copied into this node's tiers.
    ``shared=0`` only reads.

    ``remote`` (``"s3://bucket/prefix"``, ``gs://``, ``az://``) puts the shared tier in an
    object store instead of a directory, with the same options: the store's sealed shared
    segments (written under ``path/remote/`` first, ``shared`` bytes of them) go up under
    ``<remote>/<store id>/`` in the background, and those other stores put there are found
    every ``shared_refresh_ms`` and read by ranged GETs, each block verified and promoted
    into this node's tiers. A read slower than ``remote_timeout_ms``, failed or corrupt is
    a miss; lookups never wait on the network. Endpoints and credentials come from the
    environment as for remote loads (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``).

    ``engine`` is how O_DIRECT record reads run: ``auto`` streams each through io_uring
    in pieces, hashing what has landed while the rest is read (a preadv each where
    io_uring is unavailable, logged); ``io_uring`` requires it; ``threads`` never uses it.
    """
    if shared_dir is None and remote is None and shared not in (0, "0"):
        from .errors import ConfigError

        raise ConfigError(f"kv: shared = {shared!r} needs a shared_dir or a remote to write into")
    # Every keyword argument is an option of the same name (parsed in Rust, in one place).
    options = dict(locals())
    del options["path"], options["policy"]
    options["dram_policy"] = dram_policy or policy
    options["ssd_policy"] = ssd_policy or policy
    options["shared_dir"] = None if shared_dir is None else os.fspath(shared_dir)
    native = _sluice.kv_open(os.fspath(path), options)
    return KvStore(native, os.fspath(path))


def connect(
    socket: PathLike,
    *,
    model: str = "",
    dtype: str = "",
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_stage: int = 0,
    kv_format: str = "",
    salt: str = "",
    shm: ByteSize = _D["shm_bytes"],
    connections: int = _D["connections"],
    retry_ms: int = _D["retry_ms"],
    timeout_ms: int = _D["timeout_ms"],
    recompute_tokens_per_s: Optional[float] = None,
    block_tokens: Optional[int] = None,
) -> KvStore:
    """Connects to the store a ``sluice kv serve`` sidecar owns on ``socket``, so several
    processes (TP ranks, engines) share one store: its budgets, policies and blocks.

    The namespace arguments are those of :func:`open`; the block size is the server's.
    Blocks cross through ``shm`` bytes of shared memory per connection (a larger batch goes
    in parts); ``connections`` requests can run at once. The first connection must
    succeed (a missing socket or a refused namespace raises here). After that the client
    fails open: while the server is unreachable, ``lookup`` answers 0 and puts and gets
    ``False``, and it reconnects after ``retry_ms``; ``stats()["client"]`` counts this.
    """
    options = dict(locals())
    del options["socket"]
    native = _sluice.kv_connect(os.fspath(socket), options)
    return KvStore(native, os.fspath(socket))


def fsck(path: PathLike, *, repair: bool = False) -> dict[str, Any]:
    """Verifies every block of a closed store; with ``repair`` drops the bad ones. Without
    ``repair`` nothing is written (a read-only store, or read permission only, will do);
    blocks its segments' summaries list but that are gone count as bad."""
    return dict(_sluice.kv_fsck(os.fspath(path), repair).to_dict())


def plot_bench(out_dir: PathLike) -> list[str]:
    """Draws the PNGs of a ``sluice kv bench`` run from its ``bench.json``:
    ``latency_cdf.png`` (per-request load latency) and ``hit_ratio_over_time.png``
    (hit ratio per tier per window of requests, with the simulator's prediction when
    the run had ``--compare-sim``). Returns their paths."""
    from .sim import _pyplot

    plt = _pyplot()
    out = os.fspath(out_dir)
    with builtins.open(os.path.join(out, "bench.json")) as f:
        report = json.load(f)
    paths: list[str] = []

    def save(fig: Any, name: str) -> None:
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)

    lat = sorted(report.get("latencies_ms") or [])
    fig, ax = plt.subplots(figsize=(6, 4))
    if lat:
        ys = [(i + 1) / len(lat) for i in range(len(lat))]
        ax.step(lat, ys, where="post")
        ax.set_xscale("log")
    ax.set_xlabel("load latency per request (lookup + get of the hit prefix), ms")
    ax.set_ylabel("fraction of requests")
    s = report["summary"]
    ax.set_title(f"p50 {s['load_p50_ms']:.2f} ms, p99 {s['load_p99_ms']:.2f} ms")
    ax.grid(True, alpha=0.3)
    save(fig, "latency_cdf.png")

    windows = report.get("windows") or []
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [w["end_request"] for w in windows]

    def share(key: str) -> list[float]:
        return [w[key] / w["blocks"] if w["blocks"] else 0.0 for w in windows]

    ax.plot(xs, share("dram_hits"), label="DRAM hits")
    ax.plot(xs, share("ssd_hits"), label="SSD hits")
    ax.plot(xs, share("served"), label="prefix served", linestyle="--")
    sim = report.get("sim")
    if sim:
        ax.axhline(
            sim["hit_ratio"], color="grey", linestyle=":", label="sim: hit ratio (whole run)"
        )
    ax.set_xlabel("requests replayed")
    ax.set_ylabel("share of the window's blocks")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(True, alpha=0.3)
    save(fig, "hit_ratio_over_time.png")
    return paths


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "plot":
        print("usage: python -m sluice.kv plot DIR", file=sys.stderr)
        return 2
    for path in plot_bench(argv[1]):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
