"""Type stub for ``sluice._sluice``, the private native module (crates/sluice-py).

The public API is in ``sluice`` (``load_file``, ``stream``, ``safe_open``, ``inspect``);
this module only converts between Python and the Rust loader. Errors it raises are the
classes of ``sluice.errors``.
"""

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypedDict, final

_StrPath = str | os.PathLike[str]
_ByteSize = int | str

__all__ = [
    "Checkpoint",
    "Stream",
    "TensorBuffer",
    "Window",
    "__version__",
    "check_options",
    "cli_main",
    "open_checkpoint",
    "start_stream",
]

__version__: str

@final
class Checkpoint:
    """A validated checkpoint (a file, a directory of shards or an index) with its
    shard files held open; reads see the files that were validated."""

    def keys(self) -> list[str]:
        """Tensor names in file order, shard by shard."""
    def metadata(self) -> dict[str, str] | None:
        """``__metadata__`` of every shard merged (later shards win), or None."""
    def info(self, name: str) -> tuple[str, list[int], str, int] | None:
        """``(dtype, shape, shard_path, nbytes)`` of ``name``, or None if absent."""
    def layout(self, name: str) -> tuple[str, list[int]] | None:
        """``(dtype, shape)`` of ``name``, or None if absent."""
    def shards(self) -> list[tuple[str, int, int, int]]:
        """``(path, tensor_count, tensor_bytes, file_len)`` per shard."""
    def read_tensor(self, name: str) -> TensorBuffer:
        """The bytes of tensor ``name`` from the held file (GIL released)."""
    def read_tensor_into(self, name: str, offset: int, address: int, len: int) -> None:
        """Reads bytes ``offset..offset + len`` of ``name`` into host memory at ``address``,
        which the caller owns for the call (GIL released); a range past the tensor is a
        ``ConfigError``."""
    def read_block(self, name: str, ranges: list[tuple[int, int]]) -> TensorBuffer:
        """The row-major block of ``name`` spanning ``ranges[d] = (lo, hi)`` per dimension."""
    def __len__(self) -> int: ...
    def __contains__(self, name: str, /) -> bool: ...

def open_checkpoint(path: _StrPath, *, allow_partial: bool = False) -> Checkpoint:
    """Reads and validates every header of the checkpoint at ``path``, keeping its files
    open (GIL released). A missing shard is an error unless ``allow_partial``."""

@final
class TensorBuffer:
    """One tensor's (or block's) bytes, owned by this object; numpy views it without a copy."""

    def __len__(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's array interface: a writable 1-D uint8 view of the bytes."""

@final
class Window:
    """A loaded buffer holding one or more tensors' bytes; numpy views it without a copy."""

    @property
    def shard(self) -> str:
        """The shard file the window was read from."""
    @property
    def tensors(self) -> list[tuple[str, str, tuple[int, ...], int, int]]:
        """``(name, dtype, shape, offset, nbytes)`` for each tensor in the window."""
    @property
    def __array_interface__(self) -> dict[str, Any]:
        """A writable 1-D uint8 view of the buffer (numpy's array interface, version 3)."""
    def __len__(self) -> int:
        """Bytes in the window's buffer (0 for the window of zero-byte tensors)."""

@final
class Stream:
    """A running load, iterated one window at a time; closing it stops the reads."""

    def next_window(self) -> Window | None:
        """The next finished window, or None at the end (blocks with the GIL released)."""
    def progress(self) -> tuple[int, int]:
        """``(done_bytes, total_bytes)`` of tensor data."""
    def close(self) -> None:
        """Stops the load and waits for reads in flight."""
    def stats(self) -> dict[str, Any]:
        """engine, io_mode, tensors, tensor_bytes, read_bytes, windows, seconds,
        peak_pool_bytes and files ``[(path, direct, buffered_reason)]``."""
    def __enter__(self) -> Stream: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool: ...

def check_options(
    *,
    direct: str | None = None,
    engine: str | None = None,
    concurrency: int | None = None,
    chunk_bytes: _ByteSize | None = None,
    memory_limit: _ByteSize | None = None,
) -> None:
    """Raises ``ConfigError`` naming an option value no load can take (a bool or an
    out-of-range int for a count or size included); reads neither the environment nor
    any file."""

def parse_byte_size(name: str, value: _ByteSize) -> int:
    """The bytes of option ``name`` (an int, or a size string like ``"512MiB"``), by the
    rules of every load option; ``ConfigError`` naming it otherwise."""

def stream_memory_limit(memory_limit: _ByteSize | None = None) -> int:
    """The memory limit a stream would run under: ``memory_limit`` when given, else
    ``SLUICE_MEMORY_LIMIT``, else the stream default; ``ConfigError`` for a bad value."""

def gpu_runtime() -> str | None:
    """The CUDA runtime that pins the loader's buffers (``pin=True``), opened on first
    use (torch's when torch loaded one); ``None`` where this process has none."""

@final
class PinnedPool:
    """Host memory registered with CUDA once: ``slots`` slots of ``slot_bytes`` (rounded up
    to a page), registered when made, unregistered when the pool and its slots are gone.
    Without a CUDA runtime the slots are plain memory and ``pinned`` is false."""

    def __init__(self, slot_bytes: int, slots: int) -> None: ...
    @property
    def slot_bytes(self) -> int: ...
    @property
    def pinned(self) -> bool: ...
    def acquire(self, timeout: float | None = None) -> PinnedSlot | None:
        """A slot; waits for one (at most ``timeout`` seconds, then ``None``)."""
    def stats(self) -> dict[str, Any]:
        """``slots``, ``slot_bytes``, ``pinned``, ``held``, ``acquires``,
        ``waits_for_holders``, ``lost``."""

@final
class PinnedSlot:
    """One slot, held until ``release()``; numpy views it without a copy (and keep it
    alive), but must not be used after ``release()``."""

    @property
    def address(self) -> int: ...
    @property
    def held(self) -> bool: ...
    def release(self) -> None: ...
    def __len__(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

def start_stream(
    path: _StrPath,
    names: list[str] | None = None,
    *,
    bounded: bool,
    direct: str | None = None,
    engine: str | None = None,
    concurrency: int | None = None,
    chunk_bytes: _ByteSize | None = None,
    memory_limit: _ByteSize | None = None,
    drop_cache: bool | None = None,
    allow_partial: bool | None = None,
    checkpoint: Checkpoint | None = None,
    into: list[tuple[str, int, int]] | None = None,
    lent: Any = None,
    pin: bool = False,
) -> Stream:
    """Starts a load of ``names`` (all when None).

    ``bounded=True`` streams under ``memory_limit`` with buffer reuse;
    ``bounded=False`` keeps every window valid for as long as it is held.
    ``direct`` is "auto", "on" or "off"; ``engine`` "auto", "io_uring" or "threads".
    ``into`` (``(name, address, bytes)`` per tensor, replacing ``names``) reads each
    tensor into that memory, which ``lent`` owns; the stream holds ``lent`` until its
    reads have ended.
    """

class _SimDefaults(TypedDict):
    policies: list[str]
    fractions: list[float]
    format: str
    block_tokens: int
    count_mode: bool
    threads: int

def sim_defaults() -> _SimDefaults:
    """A study's defaults (the Rust ``StudyConfig::default()``, which the CLI's flags use too)."""

def sim_run(
    traces: list[str],
    policies: str,
    fractions: list[float],
    count_mode: bool,
    threads: int,
    format: str,
    csv_columns: str | None,
    model: str | None,
    block_tokens: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Runs the study (``sluice_sim::study::run``, as ``sluice sim run`` does) with the GIL
    released; returns the rows."""

def cli_main(argv: list[str]) -> int:
    """Runs the ``sluice`` command line (``argv[0]`` is the program name) and returns
    the exit status the native binary would exit with.

    Output goes to file descriptors 1 and 2. While it runs the GIL is released and
    SIGPIPE, SIGXFSZ and (where Python handles them) SIGINT and SIGTERM are at their
    defaults, as in the binary: Ctrl-C ends the process unless the command handles
    it (``sluice warm``). The previous dispositions are restored afterwards.
    """

def warm_run_dir() -> str:
    """Where running ``sluice warm`` runtimes publish their status and trigger pipes."""

def warm_status() -> list[dict[str, Any]]:
    """The live runtimes' status, one dict per runtime (GIL released)."""

def warm_trigger(
    path: str,
    offset: int | None = None,
    length: int | None = None,
    worker: int | None = None,
    pid: int | None = None,
) -> None:
    """Sends an explicit access to a running runtime (GIL released)."""

class KvStore:
    """An open KV block store (``sluice.kv.open``), or a connection to a
    ``sluice kv serve`` sidecar (``sluice.kv.connect``)."""

    block_bytes: int
    def lookup(self, keys: list[bytes], lease: bool = True, worth_loading: bool = False) -> int: ...
    def submit_put(
        self, keys: list[bytes], buffers: list[tuple[int, int]], owners: list[object]
    ) -> KvJob: ...
    def submit_get(
        self, keys: list[bytes], buffers: list[tuple[int, int]], owners: list[object]
    ) -> KvJob: ...
    def poll(self) -> list[int]: ...
    def put_batch(self, keys: list[bytes], buffers: list[tuple[int, int]]) -> list[bool]: ...
    def get_batch_into(self, keys: list[bytes], buffers: list[tuple[int, int]]) -> list[bool]: ...
    def delete(self, keys: list[bytes]) -> int: ...
    def sync(self) -> None: ...
    def stats(self) -> KvStatsReport: ...
    def close(self) -> None: ...

class KvStatsReport:
    """A store's (or a sidecar connection's) counters, typed; ``to_dict()`` has all of
    them: per tier ``capacity_blocks``, ``allocated_bytes`` and, for the SSD,
    ``disk_bytes_limit``; a connection's ``client`` and ``server`` parts."""

    puts: int
    put_failures: int
    put_declined: int
    gets: int
    hits_dram: int
    hits_ssd: int
    misses: int
    corrupt_blocks: int
    def to_dict(self) -> dict[str, Any]: ...

class KvFsckReport:
    """What ``fsck`` found; ``to_dict()`` adds the problems (segment, slot, detail)."""

    segments: int
    good_blocks: int
    bad_blocks: int
    bad_segments: int
    bytes_verified: int
    repaired: bool
    lock: str
    def to_dict(self) -> dict[str, Any]: ...

class KvJob:
    """A submitted batch (``sluice.kv.KvJob`` wraps it)."""

    id: int
    kind: str
    def done(self) -> bool: ...
    def result(self) -> list[bool] | None: ...
    def wait(self, timeout: float | None = None) -> list[bool] | None: ...
    def release_buffers(self) -> None: ...

def kv_open(path: str, options: dict[str, Any]) -> KvStore:
    """Opens or creates a KV store (GIL released while its segments are scanned).
    ``options`` holds ``sluice.kv.open``'s keyword arguments; an unknown key or a bad value
    raises ``ConfigError`` naming it."""

def kv_connect(socket: str, options: dict[str, Any]) -> KvStore:
    """Connects to a ``sluice kv serve`` sidecar on ``socket``; ``options`` holds
    ``sluice.kv.connect``'s keyword arguments."""

def kv_fsck(path: str, repair: bool = False) -> KvFsckReport:
    """Verifies every block of a closed store (GIL released)."""

def kv_defaults() -> dict[str, Any]:
    """Every default of ``sluice.kv.open``, ``sluice.kv.connect`` and ``sluice kv serve``,
    from the Rust configs that own them."""

class _CkptEntry(TypedDict, total=False):
    kind: str
    dtype: str
    shape: list[int]
    nbytes: int
    chunks: list[dict[str, Any]]
    pack: dict[str, Any]
    meta: dict[str, Any]

class _CkptManifest(TypedDict, total=False):
    format: str
    version: int
    created_unix: int
    chunk_bytes: int
    world_size: int
    entries: dict[str, _CkptEntry]
    packs: dict[str, int]
    extra: dict[str, Any]

class _CkptInfo(TypedDict):
    name: str
    created_unix: int
    entries: int
    logical_bytes: int
    unique_bytes: int
    shared_bytes: int

class _CkptVerifyReport(TypedDict):
    chunks: int
    bytes: int
    problems: list[tuple[str, str, str]]

class _CkptCleanup(TypedDict):
    chunks_removed: int
    bytes_freed: int
    chunks_left: int

class _CkptGcReport(TypedDict):
    checkpoints_removed: list[str]
    chunks_removed: int
    bytes_freed: int
    temporaries_removed: int
    directories_left: list[str]

class _CkptJobReport(TypedDict):
    chunks_written: int
    bytes_written: int
    chunks_present: int
    staging_peak_bytes: int
    staged_s: float
    durable_s: float
    write_bytes_per_s: float

class _CkptSaveSummary(TypedDict):
    path: str
    rank: int
    world_size: int
    entries: int
    logical_bytes: int
    unique_bytes: int
    logical_bytes_rank: int
    written_bytes_rank: int
    written_bytes: int | None
    written_bytes_per_rank: list[int]
    planned_makespan_s: float
    plan_cached: bool
    stood_in_for: int | None
    rank_report: _CkptJobReport
    save_id: str

class _CkptFetchReport(TypedDict):
    read_bytes: int
    received_bytes: int
    chunks_read: int

class CkptShare:
    """A rank's state hashed into chunks (small entries packed); ``sources`` are host
    addresses, or -1 for entries streamed through ``hash_window``."""

    def __init__(self, heads: str, sources: list[int], chunk_bytes: int) -> None: ...
    def hash_window(self, entry: int, offset: int, addr: int, len: int) -> None: ...
    def table(self) -> bytes:
        """The table the other ranks see, as bytes."""

class CkptSave:
    """One rank's save in flight: staging, writing, then the commit."""

    def streamed(self) -> list[tuple[bytes, int, int, int]]: ...
    def push(self, chunks: list[tuple[bytes, int, int]]) -> None: ...
    def end_pushes(self) -> None: ...
    def wait_staged(self, timeout: float | None = None) -> float | None: ...
    def replica_sends(self) -> list[tuple[int, int]]: ...
    def replica_lengths(self) -> list[int]: ...
    def finish(self, replica: tuple[int, int] | None = None) -> _CkptSaveSummary: ...
    def cancel(self, why: str) -> None: ...
    def token(self) -> str:
        """The save's token: its commit directory under ``.pending/``."""
    def close(self) -> None: ...

class CkptFetch:
    """A load's reads on one rank."""

    def needs(self) -> bytes: ...
    def read(self, all_needs: list[bytes], rank: int) -> None: ...
    def transfers(self, rank: int) -> list[tuple[bool, int, int, int]]: ...
    def finish(self) -> _CkptFetchReport: ...
    def close(self) -> None:
        """Lets go of the store (the reads are done or abandoned)."""

class CkptStore:
    """An open checkpoint store; its lock is held shared until ``close``."""

    root: str
    is_object: bool
    def start_save(
        self,
        share: CkptShare,
        tables: list[bytes],
        plan: bytes,
        name: str,
        rank: int,
        world: int,
        chunk_bytes: int,
        staging_bytes: int,
        timeout_s: float,
        replicate: bool,
        extra: str,
        keep: object,
        publish: bool = True,
    ) -> CkptSave: ...
    def publish(
        self, name: str, tables: list[bytes], world: int, chunk_bytes: int, extra: str
    ) -> None: ...
    def write_share(self, share: CkptShare, staging_bytes: int) -> None: ...
    def prepare(self, name: str) -> None: ...
    def manifest(self, name: str) -> _CkptManifest: ...
    def fetch(self, name: str, dests: list[tuple[str, int, int]]) -> CkptFetch: ...
    def ls(self) -> list[_CkptInfo]: ...
    def verify(self, name: str) -> _CkptVerifyReport: ...
    def close(self) -> None: ...

def ckpt_open(root: str, create: bool = False) -> CkptStore:
    """Opens a checkpoint store (``create``: make it if absent; else read-only)."""

def ckpt_path(path: str) -> tuple[str, str]:
    """``STORE/NAME`` checked: (store, name)."""

def ckpt_check_store(path: str) -> None:
    """Refuses an object URL or a path with '..' as a store."""

def ckpt_size(name: str, value: int | str) -> int:
    """A byte size ("4MiB") as bytes."""

def ckpt_pack_below(chunk_bytes: int) -> int:
    """Entries below this many bytes share packs."""

def ckpt_bandwidth() -> float:
    """This process's write bandwidth for the next plan (bytes/s)."""

def ckpt_plan(store: CkptStore, tables: list[bytes], bandwidth: list[float]) -> bytes:
    """Rank 0's plan for a save (who writes what, and the save's token), as bytes."""

def ckpt_totals(tables: list[bytes]) -> tuple[int, int, int]:
    """(entries, logical bytes, content-unique bytes) of every rank's table."""

def ckpt_table_keep(table: bytes, rank: int, keep: set[str]) -> bytes:
    """A table cut down to the entries named in ``keep``."""

def ckpt_gc(root: str, keep: int, grace_s: float | None = None) -> _CkptGcReport:
    """Keeps the ``keep`` newest checkpoints of a store (in an object store, unreferenced
    chunks younger than ``grace_s`` stay)."""

def ckpt_collect_failed(root: str, token: str) -> _CkptCleanup | None:
    """After grouped save ``token`` failed: removes its ranks' new chunks and its commit
    files if the store is free now; None when another holder has it."""
