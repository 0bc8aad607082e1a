"""PyTorch Distributed Checkpoint (DCP) storage over a Sluice checkpoint store.

    import torch.distributed.checkpoint as dcp
    from sluice.ckpt import StorageReader, StorageWriter

    dcp.save(state, storage_writer=StorageWriter("/ckpt/step-100"))
    r = dcp.async_save(state, storage_writer=StorageWriter("/ckpt/step-200"))
    r.staging_completion.result()   # training may mutate the state
    r.upload_completion.result()    # published and synced
    dcp.load(state, storage_reader=StorageReader("/ckpt/step-200"))

DCP plans which rank writes which tensor (replicated tensors once) and keeps the global
metadata that makes resharding work; Sluice stores each written item as an entry of a
content-addressed checkpoint: chunks that repeat across items, ranks or saves are written
once, and the ranks holding a chunk share the writing by a balanced plan. The DCP metadata
is itself an entry (``.dcp/metadata``) of the checkpoint, which is published last.

``async_save`` uses the writer as its stager: ``stage`` hashes the state, agrees the write
plan with the other ranks and starts copying this rank's share into a byte-budgeted
staging pool; ``staging_completion`` resolves once that share is copied out (or, when it is
larger than the pool, written), not after a full copy of the state.

This module uses ``sluice.ckpt``'s internal API (``saving.stage``, ``loading.
grouped_read``, ``state``), the same the plain save and load run on.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader as _DcpReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.storage import WriteResult

from .. import _sluice
from ..errors import ConfigError, SluiceError, StoreFormatError, TensorNotFoundError
from . import saving, state
from .group import Group, failure, raise_first
from .loading import grouped_read
from .saving import Root

#: The entry that holds DCP's pickled global metadata.
METADATA_KEY = ".dcp/metadata"


def entry_key(index: MetadataIndex) -> str:
    """The checkpoint entry of a DCP item: its fqn, plus the shard's offsets where any
    is non-zero (``layers.0.w@512,0``)."""
    off = index.offset
    if off is None or not any(off):
        return index.fqn
    return f"{index.fqn}@{','.join(str(int(o)) for o in off)}"


def _leaf(key: str, data: Any, chunk: int) -> state.Leaf:
    """An entry's bytes: a tensor's memory (device tensors streamed, small ones packed), or
    a BYTE_IO item's serialized bytes."""
    if isinstance(data, torch.Tensor):
        return state.tensor_leaf(key, data, _sluice.ckpt_pack_below(chunk))
    raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
    return state.bytes_leaf(key, raw, {"codec": "torch.save"})


class _Save:
    """One save between ``stage`` (or ``write_data``) and ``finish``."""

    def __init__(self, staged: saving.Staged, leaves: list[state.Leaf], world: int) -> None:
        self.staged = staged
        self.sizes = {lf.key: lf.nbytes for lf in leaves}
        self.world = world

    def close(self) -> None:
        if self.staged.pushes is not None:
            self.staged.pushes.join()
        self.staged.close()


def _split(path: str) -> tuple[Root, str]:
    root, name = _sluice.ckpt_path(path)
    return Root(root), name


def _is_url(s: Any) -> bool:
    return isinstance(s, str) and s.startswith(("s3://", "gs://", "az://"))


def _parses(s: str) -> bool:
    """Whether ``s`` is a checkpoint URL (STORE/NAME) this store takes; no request made."""
    try:
        _sluice.ckpt_path(s)
        return True
    except Exception:
        return False


class _Located:
    """The checkpoint path (STORE/NAME) a writer or reader works on, from its constructor or
    from DCP's ``checkpoint_id``."""

    _call = "dcp.save"  # the DCP call that can give the path, for the message

    def _set_path(self, path: Any) -> None:
        # Kept as given: a Path would fold an object URL's "s3://" into "s3:/".
        self.path: Optional[str] = None
        if path is not None:
            self.reset(path)

    @property
    def checkpoint_id(self) -> Optional[str]:
        return self.path

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self.path = saving.fs_path(checkpoint_id, "checkpoint_id")

    def _where(self) -> tuple[Root, str]:
        if self.path is None:
            cls = type(self).__name__
            raise ConfigError(
                f"sluice.ckpt.{cls}: no checkpoint path; give {cls}(STORE/NAME) "
                f"or {self._call}(..., checkpoint_id=STORE/NAME)"
            )
        return _split(self.path)


class StorageWriter(_Located, _DcpWriter, AsyncStager):
    """DCP's storage writer (and ``async_save`` stager) over a Sluice checkpoint store.

    ``path`` is STORE/NAME (``dcp.save``'s ``checkpoint_id`` may give it instead).
    ``group`` is the process group the ranks pool their chunk tables over (default: the
    world; pass the one given to ``dcp.save`` when it is not). ``chunk_bytes``,
    ``staging_bytes`` and ``bandwidth`` are as for :func:`sluice.ckpt.save`."""

    _synchronize_after_execute = False

    def __init__(
        self,
        path: Any = None,
        *,
        group: Any = None,
        chunk_bytes: saving.ByteSize = saving.DEFAULT_CHUNK_BYTES,
        staging_bytes: saving.ByteSize = saving.DEFAULT_STAGING_BYTES,
        bandwidth: Optional[float] = None,
    ) -> None:
        super().__init__()
        self.chunk, self.staging = saving.check_sizes(chunk_bytes, staging_bytes, bandwidth)
        self.bandwidth = bandwidth
        self.group = group
        self._set_path(path)
        self.is_coordinator = False
        self._staged: Optional[_Save] = None
        self._save: Optional[_Save] = None
        self._lock = threading.Lock()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        s = os.fspath(checkpoint_id)
        if _is_url(s):
            return _parses(s)
        p = Path(s)
        return (p.parent / "sluice-ckpt.json").is_file()

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.checkpoint_id)

    def __getstate__(self) -> dict[str, Any]:
        # A process-based async_save pickles the writer: the staged save stays here.
        out = self.__dict__.copy()
        out["_staged_elsewhere"] = self._staged is not None
        out["_staged"] = out["_save"] = None
        out["_lock"] = None
        return out

    def __setstate__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self._lock = threading.Lock()

    def _stage(
        self, leaves: list[state.Leaf], grp: Group, failed: Optional[BaseException]
    ) -> _Save:
        """Stages this rank's leaves (collective; ``failed``, this rank's error from
        before, makes every rank raise)."""
        root, name = self._where()
        staged = saving.stage(
            leaves,
            root,
            name,
            grp,
            self.chunk,
            self.staging,
            self.bandwidth,
            extra={"format": "torch.distributed.checkpoint"},
            publish=False,
            failed=failed,
            op="dcp.save",
        )
        return _Save(staged, leaves, grp.world)

    # -- async_save's stager ------------------------------------------------------------

    def stage(self, state_dict: dict[str, Any]) -> Future[dict[str, Any]]:
        """Hashes ``state_dict``, agrees the write plan with the other ranks (collective)
        and starts copying this rank's share out; the future resolves to ``state_dict``
        once that share no longer needs the live tensors."""
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        root, name = self._where()
        grp = Group.of(self.group)
        planner = DefaultSavePlanner()
        items: list[Any] = []
        leaves: list[state.Leaf] = []
        failed: Optional[BaseException] = None
        try:
            planner.set_up_planner(state_dict, storage_meta=None, is_coordinator=grp.rank == 0)
            items = planner.create_local_plan().items
        except BaseException as e:  # every rank raises together, below
            failed = e
        if grp.world > 1:
            # DCP's own dedup, as its coordinator will run it on the same plans: each
            # replicated item is hashed and staged by the one rank DCP will give it to.
            from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

            gathered = grp.all_gather((SavePlan(items), failure(failed)))
            raise_first(root / name, failed, [g[1] for g in gathered])
            plans = [g[0] for g in gathered]
            items = dedup_save_plans(plans, planner.dedup_save_to_lowest_rank)[grp.rank].items
        elif failed is not None:
            raise failed
        try:
            leaves = [
                _leaf(entry_key(it.index), planner.resolve_data(it), self.chunk) for it in items
            ]
        except BaseException as e:
            failed = e
        save = self._stage(leaves, grp, failed)
        with self._lock:
            if self._staged is not None:
                self._staged.close()
            self._staged = save
        out: Future[dict[str, Any]] = Future()

        def wait() -> None:
            try:
                save.staged.job.wait_staged()
                out.set_result(state_dict)
            except BaseException as e:
                out.set_exception(e)

        threading.Thread(target=wait, name="sluice-ckpt-stage", daemon=True).start()
        return out

    def synchronize_staging(self) -> None:
        with self._lock:
            save = self._staged
        if save is not None:
            save.staged.job.wait_staged()

    def close(self) -> None:
        with self._lock:
            save, self._staged = self._staged, None
        if save is not None:
            save.close()

    # -- DCP's writer contract ------------------------------------------------------------

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        if kwargs.get("use_collectives", True) is False and Group.of(self.group).world > 1:
            raise ConfigError(
                "sluice.ckpt.StorageWriter: dcp.save(use_collectives=False) is not supported; "
                "the ranks pool their chunk tables to deduplicate and plan the writes"
            )
        _check_rank(self.group, kwargs, "StorageWriter", "dcp.save")
        self._where()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        root, name = self._where()
        with self._lock:
            save, self._staged = self._staged, None
        keys = [entry_key(it.index) for it in plan.items]
        if save is None and getattr(self, "_staged_elsewhere", False):
            # async_save(async_checkpointer_type=PROCESS): staged in the trainer's process,
            # handed here after training resumed; the state here may be torn.
            raise ConfigError(
                f"{root / name}: sluice.ckpt.StorageWriter was staged in another process; "
                "use dcp.async_save's default thread executor (AsyncCheckpointerType.THREAD)"
            )
        if save is None:
            # dcp.save: this rank's items, hashed and planned with the other ranks here.
            leaves: list[state.Leaf] = []
            failed: Optional[BaseException] = None
            try:
                leaves = [
                    _leaf(k, planner.resolve_data(it), self.chunk)
                    for k, it in zip(keys, plan.items)
                ]
            except BaseException as e:  # every rank raises together, in the stage
                failed = e
            save = self._stage(leaves, Group.of(self.group), failed)
        else:
            # async_save: staged before DCP planned; every item DCP gave this rank must be
            # one staged (the live tensors may have changed since, so nothing is re-read).
            missing = [k for k in keys if k not in save.sizes]
            if missing:
                save.close()
                raise SluiceError(
                    f"{root / name}: DCP planned items that were not staged: {missing[:5]} "
                    "(async_save with a custom planner is not supported)"
                )
        try:
            save.staged.job.finish()  # durable: the chunks are written and synced
        except BaseException:
            save.staged.failed = True
            save.close()
            raise
        if self.is_coordinator:
            self._save = save
        else:
            save.close()
        results = [
            WriteResult(index=it.index, size_in_bytes=save.sizes[k], storage_data=k)
            for k, it in zip(keys, plan.items)
        ]
        fut: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        root, name = self._where()
        save, self._save = self._save, None
        if save is None:
            raise SluiceError(f"{root / name}: finish() without this rank's write_data()")
        try:
            metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
            tables = save.staged.tables
            if len(results) != len(tables):
                raise SluiceError(
                    f"{root / name}: {len(results)} ranks reported writes, "
                    f"{len(tables)} pooled chunk tables"
                )
            kept = [
                _sluice.ckpt_table_keep(t, r, {x.storage_data for x in rs})
                for r, (t, rs) in enumerate(zip(tables, results))
            ]
            meta = state.bytes_leaf(
                METADATA_KEY, pickle.dumps(metadata), {"codec": "pickle", "dcp": "metadata"}
            )
            share = _sluice.CkptShare(state.heads_json([meta]), [meta.addr], self.chunk)
            store = save.staged.store
            store.write_share(share, self.staging)
            kept.append(share.table())
            extra = {"format": "torch.distributed.checkpoint", "save_id": os.urandom(8).hex()}
            store.publish(name, kept, save.world, self.chunk, json.dumps(extra))
        finally:
            save.close()


class StorageReader(_Located, _DcpReader):
    """DCP's storage reader over a Sluice checkpoint (STORE/NAME): every chunk is verified
    against its digest as it is read. Loads into any world size or sharding DCP's planner
    can map (resharding)."""

    def __init__(self, path: Any = None, *, group: Any = None) -> None:
        super().__init__()
        self.group = group
        self._manifest: Optional[dict[str, Any]] = None
        self._set_path(path)

    _call = "dcp.load"

    def reset(self, checkpoint_id: Any = None) -> None:
        super().reset(checkpoint_id)
        self._manifest = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        s = os.fspath(checkpoint_id)
        if _is_url(s):
            return _parses(s)
        p = Path(s)
        return (p / "manifest.json").is_file() and (p.parent / "sluice-ckpt.json").is_file()

    def _entries(self) -> dict[str, Any]:
        if self._manifest is None:
            root, name = self._where()
            store = saving.open_store(root)
            try:
                self._manifest = store.manifest(name)
            finally:
                store.close()
        return self._manifest["entries"]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        import numpy as np

        root, name = self._where()
        e = self._entries().get(METADATA_KEY)
        if e is None:
            raise StoreFormatError(
                f"{root / name}: not saved through DCP (no {METADATA_KEY!r} entry); "
                "load it with sluice.ckpt.load"
            )
        buf = np.empty(e["nbytes"], np.uint8)
        store = saving.open_store(root)
        try:  # one process alone: the grouped read without a group
            grouped_read(store, name, root / name, [(METADATA_KEY, buf)], Group(0, 1, None))
        finally:
            store.close()
        try:
            md = pickle.loads(buf.tobytes())
        except Exception as err:
            raise StoreFormatError(f"{root / name}: DCP metadata does not unpickle: {err}") from err
        if not isinstance(md, Metadata):
            raise StoreFormatError(f"{root / name}: {METADATA_KEY!r} is not DCP metadata")
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *a: Any, **k: Any
    ) -> None:
        _check_rank(self.group, k, "StorageReader", "dcp.load")
        self._metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """Reads this rank's items (collective over ``group``: each unique chunk that the
        ranks need is read by one of them and sent to the others). An item that is a whole
        stored entry is read straight into its destination when that is contiguous host
        memory; others go through a host buffer of the entry."""
        root, name = self._where()
        where = root / name
        grp = Group.of(self.group)
        dests: list[tuple[str, Any]] = []
        work: list[tuple[Any, Any, Any]] = []  # (item, buffer read into, direct target)
        failed: Optional[BaseException] = None
        store: Any = None
        try:
            entries = self._entries()
            storage = self._metadata.storage_data or {}
            buffers: dict[str, Any] = {}
            for item in plan.items:
                key = storage.get(item.storage_index)
                if key is None or key not in entries:
                    raise TensorNotFoundError(
                        f"{where}: no stored entry for {item.storage_index.fqn!r} "
                        f"at {list(item.storage_index.offset or [])}"
                    )
                e = entries[key]
                target = self._direct_target(e, item, planner)
                if target is not None and key not in buffers:
                    buffers[key] = target
                    dests.append((key, target))
                    work.append((item, target, target))
                    continue
                if key not in buffers:
                    buffers[key] = _buffer(where, key, e, item)
                    dests.append((key, buffers[key]))
                work.append((item, buffers[key], None))
            store = saving.open_store(root)
        except BaseException as e:  # raised by every rank together, in the grouped read
            failed = e
        try:
            grouped_read(store, name, where, dests, grp, failed, op="dcp.load")
        finally:
            if store is not None:
                store.close()
        for item, buf, direct in work:
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(buf.tobytes()))
                continue
            if direct is not None:
                planner.commit_tensor(item, direct)
                continue
            src = buf
            for dim, (off, n) in enumerate(zip(item.storage_offsets, item.lengths)):
                src = src.narrow(dim, int(off), int(n))
            target = planner.resolve_tensor(item).detach()
            if target.size() != src.size():
                raise StoreFormatError(
                    f"{where}: {item.storage_index.fqn!r}: stored slice "
                    f"{list(src.size())}, destination {list(target.size())}"
                )
            target.copy_(src)
            planner.commit_tensor(item, target)
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def _direct_target(e: dict[str, Any], item: Any, planner: LoadPlanner) -> Any:
        """The item's destination, when the item is the whole entry and the destination is
        contiguous host memory of the entry's dtype: read into it, no copy."""
        if item.type != LoadItemType.TENSOR or e["kind"] != "tensor":
            return None
        if list(item.lengths) != list(e["shape"] or []) or any(item.storage_offsets):
            return None
        target = planner.resolve_tensor(item).detach()
        if (
            target.device.type != "cpu"
            or not target.is_contiguous()
            or str(target.dtype).removeprefix("torch.") != e["dtype"]
            or list(target.shape) != list(e["shape"])
        ):
            return None
        return target


def _check_rank(group: Any, kwargs: dict[str, Any], cls: str, call: str) -> None:
    """Refuses a DCP call whose rank is not this process's rank in ``group``: the ranks
    pool their tables over ``group``, so DCP must run over the same ranks (a process
    group given to DCP and not to the writer, or ``no_dist=True`` in a group)."""
    dcp_rank = kwargs.get("rank")
    grp = Group.of(group)
    if dcp_rank is not None and dcp_rank != grp.rank:
        raise ConfigError(
            f"sluice.ckpt.{cls}: {call} runs this process as rank {dcp_rank}, its group "
            f"as rank {grp.rank} of {grp.world}; give {cls}(..., group=) the process group "
            f"given to {call} (no_dist=True is not supported in a group)"
        )


def _buffer(where: Root, key: str, e: dict[str, Any], item: Any) -> Any:
    """A host buffer holding the whole of entry ``key``."""
    if e["kind"] == "bytes":
        import numpy as np

        if item.type != LoadItemType.BYTE_IO:
            raise StoreFormatError(f"{where}: entry {key!r} holds bytes, DCP asks a tensor")
        return np.empty(e["nbytes"], np.uint8)
    if item.type != LoadItemType.TENSOR:
        raise StoreFormatError(f"{where}: entry {key!r} is a tensor, DCP asks bytes")
    dtype = getattr(torch, e["dtype"] or "", None)
    if not isinstance(dtype, torch.dtype):
        raise StoreFormatError(f"{where}: entry {key!r} has unknown dtype {e['dtype']!r}")
    return torch.empty(e["shape"], dtype=dtype)
