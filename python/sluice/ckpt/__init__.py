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
chunks the store lacks; small tensors share chunks (packs), so a state of many small
tensors writes few files. A checkpoint is visible once complete: a save that dies leaves
the previous ones as they were, and a save that fails removes the chunks it wrote when no
other save or load has the store open. The interpreter waits for a save in flight before
it exits, so a script's last save is durable when the script ends.

A store is created only in a new or empty directory, and a checkpoint only where there is
none or the store's own: a directory holding other files (a torch DCP checkpoint, another
tool's) is refused, and ``gc`` never removes a file the store did not write. Loads,
listings and ``verify`` need only read access.

With ``torch.distributed`` initialized, ``save`` and ``load`` are collective over
``group`` (default: the world): the ranks pool their digests, each unique chunk is
written once by one of the ranks that hold it (a plan balanced by the ranks' measured
write bandwidths), and rank 0 publishes one manifest. A rank whose process dies makes the
others fail at once (not at the timeout). Each rank's state is saved under its rank
(``"0/model.w"``), and loads back at the same world size; for resharding, save and load
through DCP with :class:`StorageWriter` and :class:`StorageReader`.

Non-tensor values (step counters, optimizer hyper-parameters, RNG state) are pickled, as
``torch.save`` and DCP do: load checkpoints you trust. Numpy object arrays are refused
(their bytes are pointers).

Checkpoints live on a file system: an object URL (``s3://...``) is a ``ConfigError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Union

from .. import _sluice
from ..errors import ConfigError
from .group import Group
from .loading import last_load, load
from .saving import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_STAGING_BYTES,
    DEFAULT_TIMEOUT_S,
    ByteSize,
    Replica,
    Root,
    SaveHandle,
    check_flag,
    check_sizes,
    check_timeout,
    fs_path,
    open_store,
    run,
    stage,
)
from .state import leaves

PathLike = Union[str, "os.PathLike[str]"]

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_STAGING_BYTES",
    "DEFAULT_TIMEOUT_S",
    "SaveHandle",
    "StorageReader",
    "StorageWriter",
    "gc",
    "last_load",
    "load",
    "ls",
    "manifest",
    "save",
    "verify",
]


def split(path: PathLike) -> tuple[Root, str]:
    """STORE/NAME -> (store root, checkpoint name), checked by the native layer: a path
    that names no checkpoint or climbs with '..', or a URL other than s3://, gs://, az://,
    is a ConfigError."""
    root, name = _sluice.ckpt_path(fs_path(path))
    return Root(root), name


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
    the previous save). ``timeout`` (seconds) bounds how long the ranks wait for each
    other's shares; a rank whose process died is noticed at once.

    ``replicate=True`` (grouped saves) also sends this rank's share to the next rank's
    memory before ``save`` returns, and holds the previous rank's share: should a rank die
    before its share is durable, its successor writes the share, and the checkpoint is
    still published. It holds up to ``staging_bytes`` more host memory.

    Every rank of the group must make the same call (path, ``replicate``, ``chunk_bytes``):
    ranks that differ, or that fail before the collective, make every rank raise."""
    root, name = split(path)
    chunk, staging = check_sizes(chunk_bytes, staging_bytes, bandwidth)
    timeout = check_timeout(timeout)
    check_flag(blocking, "blocking")
    check_flag(replicate, "replicate")
    grp = Group.of(group)
    prefix = f"{grp.rank}/" if grp.world > 1 else ""
    # Device tensors stream through the staging budget (small ones are copied and packed);
    # a replica needs them in host memory.
    stream_from = None if replicate else _sluice.ckpt_pack_below(chunk)
    state: list[Any] = []
    failed: Optional[BaseException] = None
    try:
        state = leaves(state_dict, prefix, stream_from)
    except BaseException as e:  # raised by every rank together, in the stage's collective
        failed = e
    staged = stage(
        state, root, name, grp, chunk, staging, bandwidth, timeout, replicate, failed=failed
    )
    replica: Optional[Replica] = None
    if replicate and grp.world > 1:
        try:
            replica = Replica.exchange(grp, staged.job, timeout, root / name)
        except BaseException as e:
            staged.job.cancel(f"the replica exchange failed: {e}")
            staged.failed = True
            if staged.pushes is not None:
                staged.pushes.join()
            staged.close()
            raise
    handle = SaveHandle(root, name)
    run(handle, staged, replica)
    if blocking:
        handle.durable.result()
    return handle


def _read(root: PathLike, call: Any) -> Any:
    """``call(store)``'s answer, the existing store at ``root`` open (read-only) for it."""
    root = fs_path(root, "store")
    _sluice.ckpt_check_store(root)
    store = open_store(root)
    try:
        return call(store)
    finally:
        store.close()


def manifest(path: PathLike) -> dict[str, Any]:
    """The manifest of checkpoint ``path`` (STORE/NAME): entries with dtype, shape and
    chunks."""
    root, name = split(path)
    return _read(root, lambda s: s.manifest(name))


def ls(store: PathLike) -> list[dict[str, Any]]:
    """The checkpoints of ``store``, oldest first, with logical, unique and shared bytes."""
    return _read(store, lambda s: s.ls())


def verify(path: PathLike) -> dict[str, Any]:
    """Re-hashes every chunk of checkpoint ``path``; ``problems`` lists the bad ones."""
    root, name = split(path)
    return _read(root, lambda s: s.verify(name))


def gc(store: PathLike, keep: int, *, grace_s: Optional[float] = None) -> dict[str, Any]:
    """Keeps the ``keep`` newest checkpoints of ``store`` and removes the rest, with every
    chunk no kept checkpoint references. Removes only what the store wrote: a checkpoint
    directory holding other files keeps them (``directories_left``). Raises
    ``StoreLockedError`` while a save or load has the store open.

    An object store (``s3://``, ``gs://``, ``az://``) has no lock: there ``gc`` leaves
    unreferenced chunks written less than ``grace_s`` seconds ago (default 3600), which a
    save in flight may be about to publish."""
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep < 2**63:
        raise ConfigError(f"keep: expected a count >= 0, got {keep!r}")
    if grace_s is not None and (
        isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)) or not grace_s >= 0
    ):
        raise ConfigError(f"grace_s: expected seconds >= 0, got {grace_s!r}")
    root = fs_path(store, "store")
    _sluice.ckpt_check_store(root)
    return _sluice.ckpt_gc(root, keep, None if grace_s is None else float(grace_s))


def __getattr__(name: str) -> Any:
    # The DCP classes subclass torch's: importing them imports torch, so only on use.
    if name in ("StorageWriter", "StorageReader"):
        from . import dcp

        return getattr(dcp, name)
    raise AttributeError(f"module 'sluice.ckpt' has no attribute {name!r}")
