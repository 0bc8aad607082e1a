"""Loads: each unique chunk a group needs is read once, by one of the ranks that need it,
and sent to the others (the plan is the native layer's).

The internal API the DCP reader uses too: :func:`grouped_read`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Optional

from .. import _sluice
from ..errors import ConfigError, StoreFormatError, TensorNotFoundError
from .group import Group, check_same, failure, raise_first
from .saving import Root, check_flag, fs_path, open_store
from .state import (
    address,
    at,
    dtype_name,
    flatten,
    is_array,
    is_tensor,
    set_path,
    unpack,
    writable_host,
)

#: What the last load of this process read and received (bytes), for reports and benches.
last_load: dict[str, int] = {}


def grouped_read(
    store: Any,
    name: str,
    where: Root,
    dests: list[tuple[str, Any]],
    group: Group,
    failed: Optional[BaseException] = None,
    op: str = "load",
) -> dict[str, int]:
    """Fills each (entry, host buffer) with its entry, every chunk verified. Collective
    over ``group``: the ranks pool which chunks they need, each is read by one needer and
    sent to the others. ``failed`` is this rank's error from before the call: every rank
    raises once any has failed (or the ranks' calls differ), so none waits on a rank that
    has given up."""
    fetch: Any = None
    needs = b""
    try:
        if failed is not None:
            raise failed
        fetch = store.fetch(name, [(key, *address(buf)) for key, buf in dests])
        needs = fetch.needs()
    except BaseException as e:
        failed = e
    try:
        gathered = group.all_gather(({"op": op, "path": str(where)}, needs, failure(failed)))
        check_same(where, [g[0] for g in gathered])
        raise_first(where, failed, [g[2] for g in gathered])
        error: Optional[BaseException] = None
        try:
            fetch.read([g[1] for g in gathered], group.rank)
        except BaseException as e:  # every rank must learn of it before any waits on a send
            error = e
        group.agree(where, error)
        if group.world > 1:
            ops = [(send, peer, at(addr, n)) for send, peer, addr, n in fetch.transfers(group.rank)]
            group.transfer(ops)
        report = fetch.finish()
    finally:
        if fetch is not None:
            fetch.close()  # its hold on the store goes with it
    last_load.clear()
    last_load.update(report)
    return report


def load(
    state_dict: MutableMapping[str, Any],
    path: Any,
    *,
    group: Any = None,
    strict: bool = True,
) -> MutableMapping[str, Any]:
    """Loads checkpoint ``path`` (STORE/NAME) into ``state_dict`` in place: tensors are
    filled (each chunk verified against its digest), other values replaced. Every key of
    ``state_dict`` must be in the checkpoint unless ``strict=False``. Returns
    ``state_dict``. Collective over ``group`` when torch.distributed is initialized."""
    root_s, name = _sluice.ckpt_path(fs_path(path))
    root = Root(root_s)
    check_flag(strict, "strict")
    grp = Group.of(group)
    reads: list[tuple[str, Any]] = []  # (entry, host buffer to fill)
    copies: list[tuple[Any, Any]] = []  # (destination, host buffer read into)
    blobs: list[tuple[tuple[Any, ...], str, Any]] = []
    entries: dict[str, Any] = {}
    store: Any = None
    failed: Optional[BaseException] = None
    try:
        store = open_store(root)
        m = store.manifest(name)
        entries = m["entries"]
        _plan(state_dict, root / name, m, grp, strict, reads, copies, blobs)
    except BaseException as e:  # raised by every rank together, in the grouped read
        failed = e
    try:
        grouped_read(store, name, root / name, reads, grp, failed)
        for dst, host in copies:
            if is_tensor(dst):
                import torch

                with torch.no_grad():  # a parameter that requires grad is filled in place
                    dst.copy_(host)
            else:
                dst[...] = host
        for path_, full, buf in blobs:
            try:
                value = unpack(buf.tobytes(), entries[full].get("meta") or {})
            except Exception as e:
                raise StoreFormatError(
                    f"{root / name}: entry {full!r} does not unpickle: {e}"
                ) from e
            set_path(state_dict, path_, value)
        return state_dict
    finally:
        if store is not None:
            store.close()


def _plan(
    state_dict: Mapping[str, Any],
    where: Root,
    m: Mapping[str, Any],
    grp: Group,
    strict: bool,
    reads: list[tuple[str, Any]],
    copies: list[tuple[Any, Any]],
    blobs: list[tuple[tuple[Any, ...], str, Any]],
) -> None:
    """Matches the state's leaves with the manifest's entries: the buffers to read into."""
    import numpy as np

    saved_world = m.get("world_size", 1) or 1
    if saved_world != grp.world:
        raise ConfigError(
            f"{where}: saved by {saved_world} rank(s), loaded by {grp.world}; "
            "load at the saving world size, or reshard through DCP "
            "(sluice.ckpt.StorageWriter/StorageReader)"
        )
    prefix = f"{grp.rank}/" if grp.world > 1 else ""
    entries = m["entries"]
    for key, path_, v in flatten(state_dict):
        full = prefix + key
        e = entries.get(full)
        if e is None:
            if strict:
                raise TensorNotFoundError(f"{where}: no entry {full!r} in the checkpoint")
            continue
        if is_tensor(v) or is_array(v):
            if e["kind"] != "tensor":
                raise StoreFormatError(f"{where}: entry {full!r} is not a tensor")
            if is_array(v) and v.dtype.hasobject:
                raise ConfigError(
                    f"{where}: entry {full!r}: the destination is a numpy array of dtype "
                    f"{v.dtype}, which holds pointers to Python objects; loading bytes over "
                    "them would corrupt the interpreter"
                )
            if is_array(v) and not v.flags.writeable:
                raise ConfigError(f"{where}: entry {full!r}: the destination array is read-only")
            shape = list(v.shape)
            if e.get("shape") != shape or e.get("dtype") != dtype_name(v):
                raise ConfigError(
                    f"{where}: entry {full!r} is {e.get('dtype')} {e.get('shape')}, "
                    f"the destination {dtype_name(v)} {shape}"
                )
            host = writable_host(v)
            if host is not v:
                copies.append((v, host))
            reads.append((full, host))
        else:
            if e["kind"] != "bytes":
                raise StoreFormatError(f"{where}: entry {full!r} is a tensor")
            buf = np.empty(e["nbytes"], np.uint8)
            reads.append((full, buf))
            blobs.append((path_, full, buf))
