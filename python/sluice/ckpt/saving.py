"""Saves: a rank's share is staged in the foreground (collective over the group), then
written and committed in the background by the native save job.

The internal API the DCP writer uses too: :func:`stage` (hash, pool tables, plan, start
the job), :class:`Staged` (the job in flight) and :func:`check_sizes`.

Durability at exit: a save's background thread is not a daemon, and the interpreter waits
for it before it exits (saying so on stderr), so a script's last ``save`` is durable when
the script ends normally. A save that fails while the interpreter waits for it says so on
stderr and makes the exit status 1; Ctrl-C during that wait exits at once with status 130
(the checkpoint is not published, earlier ones are untouched).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional, Union

from .. import _pinned, _sluice
from ..errors import ConfigError, SluiceError, StoreLockedError
from .group import Group, check_same, failure, raise_first
from .state import Leaf, at, heads_json

log = logging.getLogger("sluice.ckpt")

ByteSize = Union[int, str]

DEFAULT_CHUNK_BYTES = 4 << 20
#: The staging pool's default budget: below one full copy of a large state (a save whose
#: share is larger streams through it at the disk's pace).
DEFAULT_STAGING_BYTES = 1 << 30
#: How long a grouped save's ranks wait for each other's shares before giving up (a rank
#: whose process is gone is noticed at once, not at this timeout).
DEFAULT_TIMEOUT_S = 1800.0
#: The longest ``timeout`` taken (about 116 days).
MAX_TIMEOUT_S = 1e7
#: The dedup grain's bounds: below a page, a chunk costs more in files than it saves; past
#: 1 GiB, a one-byte change rewrites a gigabyte.
MIN_CHUNK_BYTES = 4 << 10
MAX_CHUNK_BYTES = 1 << 30
#: How long a save or load waits for a ``gc`` that holds the store before giving up.
STORE_PATIENCE_S = 60.0


def size(value: ByteSize, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected a byte size, got {value!r}")
    n = int(_sluice.ckpt_size(what, value))
    if n <= 0:
        raise ConfigError(f"{what}: must be positive, got {value!r}")
    return n


def check_sizes(
    chunk_bytes: ByteSize, staging_bytes: ByteSize, bandwidth: Optional[float]
) -> tuple[int, int]:
    """(chunk, staging) bytes, checked; ``bandwidth`` too."""
    chunk = size(chunk_bytes, "chunk_bytes")
    if not MIN_CHUNK_BYTES <= chunk <= MAX_CHUNK_BYTES:
        raise ConfigError(
            f"chunk_bytes: must be from {MIN_CHUNK_BYTES} (4 KiB) to {MAX_CHUNK_BYTES} "
            f"(1 GiB), got {chunk_bytes!r}"
        )
    staging = size(staging_bytes, "staging_bytes")
    if staging < chunk:
        raise ConfigError(f"staging_bytes ({staging}) must hold one chunk ({chunk})")
    if bandwidth is not None and not _positive(bandwidth):
        raise ConfigError(f"bandwidth: must be a positive number of bytes/s, got {bandwidth!r}")
    return chunk, staging


def _positive(v: Any) -> bool:
    """A finite number above 0 (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def check_timeout(timeout: Any) -> float:
    if not (_positive(timeout) and timeout <= MAX_TIMEOUT_S):
        raise ConfigError(
            f"timeout: must be a positive number of seconds up to {MAX_TIMEOUT_S:.0f}, "
            f"got {timeout!r}"
        )
    return float(timeout)


def check_flag(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what}: expected True or False, got {value!r}")
    return value


class Root(str):
    """A store's root as given: a directory or an object-store prefix (``s3://bucket/run``).
    A str, not a ``pathlib.Path``, which would fold ``s3://`` into ``s3:/``; ``root / name``
    joins as a path does."""

    def __truediv__(self, name: str) -> Root:
        if self in ("", "."):
            return Root(name)
        return Root(self.rstrip("/") + "/" + name if self != "/" else "/" + name)

    @property
    def parent(self) -> Root:
        head, sep, _ = self.rstrip("/").rpartition("/")
        if not sep:
            return Root(".")
        if head.endswith(":/"):  # s3://bucket: the bucket is the top
            return Root(self)
        return Root(head or "/")


def fs_path(path: Any, what: str = "path") -> str:
    """``path`` (str, bytes or os.PathLike) as a str."""
    try:
        return os.fsdecode(path)
    except TypeError:
        raise ConfigError(f"{what}: expected a file-system path, got {path!r}") from None


def open_store(root: str, create: bool = False) -> Any:
    """The store at ``root``, opened (``create``: made if absent). While a ``gc`` holds it
    (briefly, as a rule), waits up to ``STORE_PATIENCE_S`` rather than fail."""
    deadline = time.monotonic() + STORE_PATIENCE_S
    delay = 0.05
    while True:
        try:
            return _sluice.ckpt_open(str(root), create=create)
        except StoreLockedError as e:
            if time.monotonic() + delay > deadline:
                raise
            if delay == 0.05:
                log.info("%s: waiting for the store: %s", root, e)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


class Window:
    """A host buffer that device tensors come through, whole chunks at a time: taken from
    the process's pinned budget (``sluice._pinned``: registered with CUDA once and kept for
    the next save), else ordinary memory (slower copies, said once in the log)."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self._pinned = _pinned.take(nbytes, "sluice.ckpt save window")
        if self._pinned is not None:
            self.buf = self._pinned.tensor()
        else:
            self.buf = torch.empty(nbytes, dtype=torch.uint8)
        self.addr = int(self.buf.data_ptr())
        self.size = nbytes

    def close(self) -> None:
        """Gives the memory back (every copy into it was synchronous and every push staged
        its chunks before returning)."""
        if self._pinned is not None:
            self._pinned.release()
            self._pinned = None

    @staticmethod
    def for_leaves(leaves: list[Leaf], chunk: int, staging: int) -> Optional[Window]:
        """A quarter of the budget (whole chunks), no larger than the largest device
        tensor; None when no leaf is streamed."""
        biggest = max((lf.nbytes for lf in leaves if lf.addr < 0), default=0)
        if not biggest:
            return None
        want = max(chunk, (staging // 4) // chunk * chunk)
        return Window(min(want, -(-biggest // chunk) * chunk))

    def copy_in(self, t: Any, offset: int, n: int, into: int = 0) -> None:
        """Copies ``n`` bytes of tensor ``t`` from ``offset`` to ``into`` in the window."""
        import torch

        flat = t.reshape(-1).view(torch.uint8)
        self.buf[into : into + n].copy_(flat[offset : offset + n])


def hash_streamed(share: Any, leaves: list[Leaf], window: Optional[Window]) -> None:
    """Hashes the device leaves' bytes a window at a time."""
    if window is None:
        return
    for i, lf in enumerate(leaves):
        if lf.addr >= 0:
            continue
        for off in range(0, lf.nbytes, window.size):
            m = min(window.size, lf.nbytes - off)
            window.copy_in(lf.owner, off, m)
            share.hash_window(i, off, window.addr, m)


class Staged:
    """One rank's save after the foreground: the store (its lock held shared), the native
    save job, and every rank's chunk table."""

    def __init__(self, store: Any, job: Any, tables: list[bytes], where: Root, world: int) -> None:
        self.store, self.job, self.tables, self.where = store, job, tables, where
        self.world = world
        self.token: str = job.token()
        self.pushes: Optional[threading.Thread] = None
        #: Set when the save failed: closing then removes what the group's ranks wrote.
        self.failed = False

    def close(self) -> None:
        """Cancels what is unfinished, waits for the job's threads, lets go of the store.
        After a failed grouped save, removes the chunks the save's ranks wrote if the
        store is free (the last rank to let go finds it so; ``gc`` collects otherwise)."""
        self.job.close()
        self.store.close()
        if self.failed and self.world > 1:
            try:
                _sluice.ckpt_collect_failed(str(self.where.parent), self.token)
            except Exception as e:  # a clean-up: gc collects what is left
                log.info("%s: the failed save's chunks are left for gc: %s", self.where, e)


def stage(
    leaves: list[Leaf],
    root: Root,
    name: str,
    group: Group,
    chunk: int,
    staging: int,
    bandwidth: Optional[float],
    timeout: float = DEFAULT_TIMEOUT_S,
    replicate: bool = False,
    extra: Optional[dict[str, Any]] = None,
    publish: bool = True,
    failed: Optional[BaseException] = None,
    op: str = "save",
) -> Staged:
    """Hashes this rank's leaves, pools the tables over the group, lets rank 0 plan who
    writes which chunk the store lacks, and starts this rank's share (collective: a rank
    that fails at any step, ``failed`` being its error from before the call, still joins
    the next collective with its error, and all raise; so do all when the ranks' calls
    differ). ``publish=False`` stops the job at durable: DCP's coordinator publishes."""
    where = root / name
    store: Any = None
    share: Any = None
    table: Optional[bytes] = None
    error: Optional[BaseException] = failed
    call = {"op": op, "path": str(where), "replicate": replicate, "chunk_bytes": chunk}
    window: Optional[Window] = None
    try:
        if error is not None:
            raise error
        window = Window.for_leaves(leaves, chunk, staging)
        store = open_store(root, create=True)
        store.prepare(name)
        share = _sluice.CkptShare(heads_json(leaves), [lf.addr for lf in leaves], chunk)
        hash_streamed(share, leaves, window)
        table = share.table()
    except BaseException as e:
        error = e
    bw = bandwidth or _sluice.ckpt_bandwidth()
    try:
        gathered = group.all_gather((call, table, bw, failure(error)))
        check_same(where, [g[0] for g in gathered])
        raise_first(where, error, [g[3] for g in gathered])
        tables = [g[1] for g in gathered]
        plan: Any = None
        if group.rank == 0:
            try:
                plan = ("ok", _sluice.ckpt_plan(store, tables, [g[2] for g in gathered]))
            except Exception as e:
                if group.world == 1:
                    raise
                plan = ("error", failure(e))
        plan = group.broadcast(plan)
        if plan[0] == "error":
            raise SluiceError(f"{where}: rank 0 could not plan the save: {plan[1]}")
        # The pool holds what the window does not (device tensors come through both).
        pool = max(chunk, staging - (window.size if window else 0))
        job: Any = None
        try:
            job = store.start_save(
                share,
                tables,
                plan[1],
                name,
                group.rank,
                group.world,
                chunk,
                pool,
                timeout,
                replicate,
                json.dumps(extra or {}),
                [lf.owner for lf in leaves],
                publish,
            )
        except BaseException as e:
            error = e
        try:  # the start barrier: every rank's commit files exist once it passes
            group.agree(where, error)
        except BaseException:
            if job is not None:
                job.cancel("another rank failed to start")
                job.close()
            raise
    except BaseException:
        if window is not None:
            window.close()
        if store is not None:
            store.close()
        raise
    staged = Staged(store, job, tables, where, group.world)
    if window is not None and job.streamed():
        staged.pushes = threading.Thread(
            target=_push, args=(job, leaves, window), name="sluice-ckpt-push", daemon=True
        )
        staged.pushes.start()  # the window is the push thread's now; it closes it
    elif window is not None:
        window.close()
    return staged


def _push(job: Any, leaves: list[Leaf], window: Window) -> None:
    """Copies this rank's streamed chunks into the window, a window at a time, and pushes
    them into the job (which stages them before the window is reused)."""
    try:
        pending: list[tuple[bytes, int, int]] = []
        used = 0
        for digest, n, entry, offset in job.streamed():
            if used + n > window.size:
                job.push(pending)
                pending, used = [], 0
            window.copy_in(leaves[entry].owner, offset, n, used)
            pending.append((digest, n, window.addr + used))
            used += n
        if pending:
            job.push(pending)
    except BaseException as e:
        job.cancel(f"streaming device tensors failed: {e}")
    finally:
        job.end_pushes()
        window.close()


class Replica:
    """``replicate=True``: the previous rank's share, held in this rank's host memory. The
    native save job writes it if the previous rank dies before its own share is durable."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf

    @staticmethod
    def exchange(group: Group, job: Any, timeout: float, where: Root) -> Replica:
        """Sends this rank's share to the next rank and receives the previous rank's, on a
        side gloo group (collective; in the foreground, while the caller's state is alive
        and unchanged). Every rank raises if any fails."""
        import torch

        error: Optional[BaseException] = None
        sends: list[tuple[int, int]] = []
        lengths: list[int] = []
        buf: Any = None
        try:
            sends = job.replica_sends()
            lengths = job.replica_lengths()
            buf = torch.empty(sum(lengths), dtype=torch.uint8)
        except BaseException as e:
            error = e
        group.agree(where, error)
        succ, pred = (group.rank + 1) % group.world, (group.rank - 1) % group.world
        try:
            side = group.side(timeout)
            ops = [(True, succ, at(addr, n)) for addr, n in sends if n]
            off = 0
            for n in lengths:
                if n:
                    ops.append((False, pred, buf[off : off + n]))
                off += n
            group.transfer(ops, pg=side)
        except BaseException as e:
            error = SluiceError(f"{where}: replicating the staged share failed: {e}")
        group.agree(where, error)
        return Replica(buf)

    def held(self) -> tuple[int, int]:
        n = int(self.buf.numel())
        return (int(self.buf.data_ptr()) if n else 0), n


class SaveHandle:
    """A save in flight. ``staged`` resolves (to the seconds staging took) once every byte
    this rank writes is copied out of the live state; ``durable`` (to the save's report)
    once the checkpoint is published and synced. Either raises if the save failed.

    The interpreter waits for a save in flight before it exits: a script's last save is
    durable when the script ends."""

    def __init__(self, path: Root, name: str) -> None:
        self.path = path
        self.name = name
        self.staged: Future[float] = Future()
        self.durable: Future[dict[str, Any]] = Future()
        self._staged: Optional[Staged] = None
        self._cancelled = False

    def result(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """Waits until durable; the save's report."""
        return self.durable.result(timeout)

    def cancel(self) -> bool:
        """Stops the save: the checkpoint is not published, earlier ones are untouched.
        ``False`` (and nothing done) when the save had finished already."""
        if self.durable.done() or self._staged is None:
            return False
        self._cancelled = True
        self._staged.job.cancel("cancelled by the caller")
        return True

    def __repr__(self) -> str:
        state = "durable" if self.durable.done() else "staged" if self.staged.done() else "staging"
        return f"<sluice.ckpt.SaveHandle {self.path}/{self.name} {state}>"


_in_flight: set[SaveHandle] = set()
_in_flight_lock = threading.Lock()


def run(handle: SaveHandle, staged: Staged, replica: Optional[Replica]) -> threading.Thread:
    """Finishes a staged save in a background thread that the interpreter waits for at
    exit; resolves ``handle``'s futures."""
    handle._staged = staged
    with _in_flight_lock:
        _in_flight.add(handle)
    t = threading.Thread(
        target=_finish, args=(handle, staged, replica), name=f"sluice-ckpt-save-{handle.name}"
    )
    t.daemon = False  # a script's last save must be durable before the interpreter exits
    t.start()
    return t


def _finish(handle: SaveHandle, staged: Staged, replica: Optional[Replica]) -> None:
    try:
        took = staged.job.wait_staged()
        handle.staged.set_result(took)
    except BaseException as e:
        staged.job.cancel(str(e))
        handle.staged.set_exception(e)
    try:
        summary = staged.job.finish(replica.held() if replica is not None else None)
        outcome: tuple[Any, Optional[BaseException]] = (summary, None)
    except BaseException as e:
        outcome = (None, e)
        staged.failed = True
    # The store's lock goes before the futures resolve: a caller that waits for durable
    # and then collects garbage must find the store free.
    if staged.pushes is not None:
        staged.pushes.join()
    staged.close()
    summary, err = outcome
    with _in_flight_lock:
        _in_flight.discard(handle)
    if err is None:
        handle.durable.set_result(summary)
        return
    if handle._cancelled:
        log.info("the save of %s was cancelled; the checkpoint was not published", staged.where)
    elif not _exiting:  # at exit, the exit hook says it
        log.warning(
            "the save of %s failed; the checkpoint was not published: %s", staged.where, err
        )
    if not handle.staged.done():
        handle.staged.set_exception(err)
    handle.durable.set_exception(err)


#: Set once the interpreter is exiting (the saves' failures are then reported by the exit
#: hook, not logged).
_exiting = False
#: The exit status a save that failed during the exit wait asks for.
_exit_status = 0


def _wait_at_exit() -> None:
    """Runs as the interpreter shuts down, before it joins the saves' threads: says which
    saves it waits for and which failed (the exit status is then 1); Ctrl-C meanwhile
    exits at once with status 130."""
    global _exiting, _exit_status
    _exiting = True
    with _in_flight_lock:
        pending = [h for h in _in_flight if not h.durable.done()]
    waiting: Optional[SaveHandle] = None
    try:
        for h in pending:
            waiting = h
            sys.stderr.write(
                f"sluice.ckpt: waiting for the save of {h.path / h.name} to be durable "
                "before exit\n"
            )
            try:
                h.durable.result()
            except Exception as e:  # nobody is left to look at the future: say it here
                if not h._cancelled:
                    sys.stderr.write(
                        f"sluice.ckpt: the save of {h.path / h.name} failed; the checkpoint "
                        f"was not published: {e}\n"
                    )
                    _exit_status = 1
    except KeyboardInterrupt:
        where = f"{waiting.path / waiting.name} was" if waiting else "the saves were"
        sys.stderr.write(
            f"sluice.ckpt: interrupted; {where} not published (earlier checkpoints are untouched)\n"
        )
        _hard_exit(130)


def _hard_exit(status: int) -> None:
    """Exits now with ``status`` (the save threads are not waited for), streams flushed."""
    logging.shutdown()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(status)


def _exit_with_status() -> None:
    """The last exit handler (registered first): a save that failed during the exit wait
    makes the exit status 1 (the interpreter would otherwise report success)."""
    if _exit_status:
        _hard_exit(_exit_status)


atexit.register(_exit_with_status)
# Runs before the interpreter joins non-daemon threads (as concurrent.futures does).
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_wait_at_exit)
