"""Grouped loading: the ranks of a torch.distributed group that load one checkpoint read each
byte from storage once between them and pass the rest over the group (seed 004, §2.3 and
§4.2: read once, share over the fabric).

Every rank opens the checkpoint's headers (no tensor bytes) and says which tensors it needs.
The tensors anyone needs are cut into rounds of at most ``memory_limit / 2`` bytes, in file
order. In each round every tensor gets one reader among the ranks that need it
(:func:`assign`): the tensors several ranks need are cut into one contiguous run per rank,
sized so that the ranks' read times even out, from the bytes each has read so far and its
read rate (measured over the load once each rank has read enough to tell, an even split
until then). A rank reads its share with the loader, and each tensor goes, point to point,
to the other ranks that need it, and only to them: ranks that need different subsets
(pipeline stages, tensor-parallel shards of another layout) receive only their own. A
round's transfers run while the next round is read, so two rounds are in memory at once.
Ranks on one host that read the same local files (:func:`page_cache_identity`) pass nothing
over the network: the reader reads buffered and the others copy the round from the page
cache once its status exchange says it is there.

Every round starts with a status exchange: a rank whose read failed says so, and every rank
raises (its own error, or one naming the rank that failed). The exchanges and transfers run on
a gloo group of the same ranks made for Sluice, with the ``timeout`` given: a rank that dies
breaks its connections and the others raise at once; one that stalls makes them raise when
the timeout passes. A rank that stops early (its consumer closed the generator) joins the next
status exchange with that news, so the others raise rather than wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import socket
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch

from . import _core, _sluice
from .errors import ConfigError, TensorNotFoundError

#: How long a grouped load waits for a rank before every rank raises.
DEFAULT_TIMEOUT_S = 600.0
#: Bytes each rank must have read (in rounds of at least ``MEASURE_ROUND``) before the plan
#: follows the measured read rates.
MEASURE_FROM = 64 << 20
MEASURE_ROUND = 16 << 20
#: Measured rates that differ less than this are noise (ranks reading side by side slow each
#: other unevenly): the plan splits evenly. Past it, each rate is held within ``CLAMP`` of
#: the median, so one odd measure cannot hand a rank everything or nothing.
SKEW = 1.5
CLAMP = 4.0
#: Set to 0 to send every tensor over the group even between ranks of one host.
SHARE_CACHE_ENV = "SLUICE_GROUP_SHARE_CACHE"
#: What the group's errors name.
WHO = "sluice grouped load"

#: This process's read rate (bytes/s) from its last grouped load: the next one's first plan.
_last_rate: Optional[float] = None


def rounds_of(sizes: Sequence[int], indices: Sequence[int], budget: int) -> list[list[int]]:
    """``indices`` (file order) cut into rounds of at most ``budget`` bytes; a tensor larger
    than the budget is a round of its own."""
    rounds: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in indices:
        if current and held + sizes[i] > budget:
            rounds.append(current)
            current, held = [], 0
        current.append(i)
        held += sizes[i]
    if current:
        rounds.append(current)
    return rounds


def assign(
    round_: Sequence[int],
    sizes: Sequence[int],
    needers: Sequence[frozenset[int]],
    rates: Sequence[float],
    loaded: list[float],
) -> list[int]:
    """The reader of each tensor of ``round_``; ``loaded`` (bytes each rank has read so
    far) is updated. A tensor one rank needs is that rank's. The others, taken by needer
    set in file order, are cut into one contiguous run per rank (a rank's reads are then one
    span, with no other rank's bytes in between), sized so that the ranks' read times
    (``loaded / rate``) come out as even as whole tensors allow."""
    owners: dict[int, int] = {}
    for i in round_:
        if len(needers[i]) == 1:
            (owners[i],) = needers[i]
            loaded[owners[i]] += sizes[i]
    shared: dict[frozenset[int], list[int]] = {}
    for i in round_:
        if i not in owners:
            shared.setdefault(needers[i], []).append(i)
    for need, run in shared.items():
        ranks = sorted(need)
        quotas = fill([loaded[r] for r in ranks], [rates[r] for r in ranks],
                      sum(sizes[i] for i in run))  # fmt: skip
        ends = list(itertools.accumulate(quotas))
        before = 0.0
        for i in run:
            middle = before + sizes[i] / 2  # the rank whose share holds the middle byte
            k = next((k for k, end in enumerate(ends) if middle < end), len(ranks) - 1)
            owners[i] = ranks[k]
            loaded[ranks[k]] += sizes[i]
            before += sizes[i]
    return [owners[i] for i in round_]


def fill(loaded: Sequence[float], rates: Sequence[float], total: float) -> list[float]:
    """Bytes each rank takes of ``total`` so that all finish together: the time ``T`` with
    ``sum(max(0, T * rate - loaded)) == total`` (ranks already past ``T`` take none)."""
    if total <= 0:
        return [0.0] * len(loaded)
    lo = min(b / r for b, r in zip(loaded, rates))
    hi = max(b / r for b, r in zip(loaded, rates)) + total / min(rates)
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(max(0.0, mid * r - b) for b, r in zip(loaded, rates)) < total:
            lo = mid
        else:
            hi = mid
    return [max(0.0, hi * r - b) for b, r in zip(loaded, rates)]


def plan_rates(measured: Sequence[Optional[float]]) -> list[float]:
    """The read rates the plan follows: even until every rank has a measure and they differ
    by more than ``SKEW``; then the measures, each within ``CLAMP`` of the median."""
    if not measured or any(m is None or m <= 0 for m in measured):
        return [1.0] * len(measured)
    rates = [float(m) for m in measured if m is not None]
    if max(rates) <= SKEW * min(rates):
        return [1.0] * len(rates)
    mid = statistics.median(rates)
    return [min(max(r, mid / CLAMP), mid * CLAMP) for r in rates]


def layout_digest(rows: Sequence[tuple[str, str, list[int], int]]) -> str:
    """What the ranks must agree on: every tensor's name, dtype, shape and size, in order."""
    h = hashlib.blake2b(digest_size=16)
    for name, dtype, shape, nbytes in rows:
        h.update(f"{name}\0{dtype}\0{shape}\0{nbytes}\n".encode())
    return h.hexdigest()


def side_group(group: Any, timeout: float) -> Any:
    """``group`` as a grouped load uses it: a gloo group of the same ranks made for Sluice
    with the load's ``timeout`` (``ckpt.group.Group``: exchanges and point-to-point
    transfers), its errors naming the grouped load."""
    from .ckpt.group import Group

    outer = Group.of(group)
    outer.who = WHO  # names a failure to make the side group too
    side = outer.side(timeout) if outer.world > 1 else None
    return Group(outer.rank, outer.world, side, WHO)


def local_stream(path: str, **options: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """This rank's own reads: the loader's stream."""
    from .torch import stream as plain

    return plain(path, **options)


def local_into(path: str, dest: dict[str, torch.Tensor], **options: Any) -> None:
    """This rank's own reads straight into destinations: the loader's ``load_into``."""
    from .torch import load_into

    load_into(path, dest, strict=False, **options)


def page_cache_identity(ckpt: Any) -> Optional[tuple[Any, ...]]:
    """What ranks that share this host's page cache over the same files have in common: the
    host (name and boot), and each shard file's device, inode, size and change time. ``None``
    for a checkpoint in an object store (its reads do not go through the page cache)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        files = []
        for shard_path, _count, _bytes, _len in ckpt.shards():
            if "://" in shard_path:
                return None
            st = os.stat(shard_path)
            files.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    return (socket.gethostname(), boot, tuple(files))


def stream(
    path: str,
    group: Any,
    names: Any,
    device: torch.device,
    memory_limit: Any,
    timeout: float,
    allow_partial: bool,
    options: dict[str, Any],
    into: Optional[dict[str, torch.Tensor]] = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of each tensor this rank's ``names`` filter selects (``None``:
    all), read by one rank of ``group`` and received by the others (collective over
    ``group``). Tensors come round by round, in file order within a round; CPU tensors for a
    CUDA ``device`` are copied there. ``into`` maps names to destinations that can take the
    checkpoint's bytes as they are (host memory, the checkpoint's dtype, contiguous): this
    rank reads its share of those straight into them, sends from them and receives into
    them, and yields the destination itself. Whatever this rank fails at before the first exchange
    (options, the checkpoint's headers, the filter) it brings to the exchange, so every rank
    raises together."""
    from .ckpt.group import failure, raise_first
    from .torch import torch_dtype, torch_shape

    global _last_rate
    link = side_group(group, timeout)
    where = path
    error: Optional[BaseException] = None
    rows: list[tuple[str, str, list[int], int]] = []
    mask = b""
    try:
        _core.check_options(memory_limit=memory_limit, **options)
        memory_limit = _sluice.stream_memory_limit(memory_limit)
        ckpt = _sluice.open_checkpoint(path, allow_partial=allow_partial)
        order = ckpt.keys()  # file order
        for name in order:
            dtype, shape, _shard, nbytes = ckpt.info(name)
            rows.append((name, dtype, list(shape), int(nbytes)))
        wanted = _core.resolve_names(path, names, checkpoint=ckpt)
        want = set(order) if wanted is None else set(wanted)
        unknown = sorted(want - set(order))
        if unknown:
            raise TensorNotFoundError(
                f"tensor {unknown[0]!r} is not in {path} ({len(unknown)} names are not)"
            )
        mask = bytes(1 if name in want else 0 for name in order)
    except BaseException as e:
        error = e
    call = {"layout": layout_digest(rows) if error is None else None}
    cache = page_cache_identity(ckpt) if error is None else None
    gathered = link.all_gather((call, mask, _last_rate, failure(error), cache))
    raise_first_or_differ(where, error, gathered)
    me = link.rank
    # Ranks that read the same local files through this host's page cache: they share a
    # round's tensors through it instead of the network.
    share = os.environ.get(SHARE_CACHE_ENV, "1") != "0"
    local = {r for r, g in enumerate(gathered) if share and cache is not None and g[4] == cache}
    if len(local) > 1 and "direct" not in options:
        options = {**options, "direct": "off"}  # buffered, so the pages stay for the others

    sizes = [r[3] for r in rows]
    needers = [frozenset(r for r, g in enumerate(gathered) if g[1][i]) for i in range(len(rows))]
    rates = plan_rates([g[2] for g in gathered])
    loaded = [0.0] * link.world
    totals = {"read_bytes": 0, "sent_bytes": 0, "received_bytes": 0, "rounds": 0,
              "cached_bytes": 0}  # fmt: skip
    read_time = 0.0
    phases = {"exchange": 0.0, "transfer_wait": 0.0, "cache": 0.0, "consumer": 0.0}  # seconds
    measured = [0, 0.0]  # bytes and seconds of this rank's rounds large enough to measure
    tensor_bytes = 0  # of the tensors this rank read (the loader's read_bytes round to pages)
    # Two rounds are in memory at once (one being sent while the next is read).
    rounds = rounds_of(sizes, [i for i in range(len(rows)) if needers[i]], memory_limit // 2)

    def read(k: int) -> _Round:
        """Round ``k``'s readers (from the rates known now, the same on every rank) and
        this rank's reads; an error is kept for the status exchange, not raised."""
        owners = assign(rounds[k], sizes, needers, rates, loaded)
        mine = [rows[i][0] for i, o in zip(rounds[k], owners) if o == me]
        got = _Round(owners, sum(sizes[i] for i, o in zip(rounds[k], owners) if o == me))
        t0 = time.perf_counter()
        try:
            got.storage = fetch(mine, got.held)
        except BaseException as e:
            got.error = e
        got.seconds = time.perf_counter() - t0
        return got

    def fetch(names: list[str], held: dict[str, torch.Tensor]) -> int:
        """Reads ``names`` on this rank (into their destinations where ``into`` has one)
        into ``held``; returns what the loader took from the files."""
        direct = {n: into[n] for n in names if n in into} if into else {}
        rest = [n for n in names if n not in direct]
        storage = 0
        if direct:
            local_into(path, direct, memory_limit=memory_limit, allow_partial=allow_partial,
                       **options)  # fmt: skip
            storage += _core.bytes_read(_core.last_load_stats())
            held.update(direct)
        if rest:
            reads = local_stream(path, names=rest, memory_limit=memory_limit,
                                 allow_partial=allow_partial, **options)  # fmt: skip
            held.update(reads)
            storage += _core.bytes_read(_core.last_load_stats())
        return storage

    # Set while this rank's consumer holds a tensor of a round that is not the last: if it
    # stops there, the others will wait for it at the next status exchange.
    awaited = False
    started = time.perf_counter()
    try:
        ahead = read(0) if rounds else None
        for k, round_ in enumerate(rounds):
            this = ahead
            assert this is not None
            totals["read_bytes"] += this.storage
            tensor_bytes += this.nbytes
            read_time += this.seconds if this.nbytes else 0.0
            if this.nbytes >= MEASURE_ROUND:  # smaller reads measure latency, not bandwidth
                measured[0] += this.nbytes
                measured[1] += this.seconds
            rate = measured[0] / measured[1] if measured[0] >= MEASURE_FROM else None
            t_ex = time.perf_counter()
            status = link.all_gather((failure(this.error), rate))
            phases["exchange"] += time.perf_counter() - t_ex
            raise_first(where, this.error, [s[0] for s in status])
            rates = plan_rates([s[1] for s in status])

            ops: list[tuple[bool, int, Any]] = []
            received: dict[str, torch.Tensor] = {}
            from_cache: list[str] = []  # read on this host by another rank: in the page cache
            for i, owner in zip(round_, this.owners):
                name, nbytes = rows[i][0], sizes[i]
                if nbytes == 0:
                    continue
                if owner == me:
                    flat = this.held[name].reshape(-1).view(torch.uint8)
                    for peer in sorted(needers[i] - {me} - local):
                        ops.append((True, peer, flat))
                        totals["sent_bytes"] += nbytes
                elif me in needers[i] and me in local and owner in local:
                    from_cache.append(name)
                elif me in needers[i]:
                    if into and name in into:
                        buf = into[name].reshape(-1).view(torch.uint8)
                    else:
                        buf = torch.empty(nbytes, dtype=torch.uint8)
                    received[name] = buf
                    ops.append((False, owner, buf))
                    totals["received_bytes"] += nbytes
            works = link.post(ops)
            cache_error: Optional[BaseException] = None
            try:  # the next round's reads run while this round's tensors travel
                if from_cache:
                    t_cache = time.perf_counter()
                    try:
                        fetch(from_cache, this.held)
                        totals["cached_bytes"] += sum(
                            this.held[n].numel() * this.held[n].element_size() for n in from_cache
                        )
                    except BaseException as e:
                        cache_error = e
                    phases["cache"] += time.perf_counter() - t_cache
                ahead = read(k + 1) if k + 1 < len(rounds) else None
            finally:
                t_wait = time.perf_counter()
                link.wait(works)
                phases["transfer_wait"] += time.perf_counter() - t_wait
            totals["rounds"] += 1
            if cache_error is not None:
                if ahead is None:
                    raise cache_error  # the last round: the others are done
                ahead.error = ahead.error or cache_error  # all raise at the next exchange
                continue
            for i in round_:
                if me not in needers[i]:
                    continue
                name, dtype, shape, _ = rows[i]
                if name in this.held:
                    tensor = this.held.pop(name)
                elif into and name in into:
                    tensor = into[name]  # received in place (or empty)
                else:
                    tdtype = torch_dtype(name, dtype)
                    tshape = torch_shape(name, dtype, shape, path)
                    buf = received.pop(name, None)
                    if buf is None:  # no bytes to send
                        tensor = torch.empty(tshape, dtype=tdtype)
                    else:
                        tensor = buf.view(tdtype).view(tshape)
                awaited = k + 1 < len(rounds)
                t_out = time.perf_counter()
                yield name, tensor if device.type == "cpu" else tensor.to(device)
                phases["consumer"] += time.perf_counter() - t_out
                awaited = False
            this.held.clear()  # what this rank read only for others
    finally:
        if awaited and link.world > 1:
            # Stopped while holding a tensor (closed early, or the consumer raised): tell
            # the others at the status exchange they wait at, so they raise now.
            with contextlib.suppress(Exception):  # they raise at their timeout instead
                link.all_gather(("this rank stopped its grouped load early", None))
        if measured[0] >= MEASURE_FROM:
            _last_rate = measured[0] / measured[1]
        _core.set_last_load_stats(
            {
                **totals,
                "tensor_bytes": tensor_bytes,
                "read_seconds": round(read_time, 6),
                **{f"{k}_seconds": round(v, 6) for k, v in phases.items()},
                "seconds": round(time.perf_counter() - started, 6),
                "world": link.world,
            }
        )


class _Round:
    """One round as this rank sees it: each tensor's reader, and what this rank read."""

    def __init__(self, owners: list[int], nbytes: int) -> None:
        self.owners = owners
        self.nbytes = nbytes
        self.held: dict[str, torch.Tensor] = {}
        self.storage = 0  # bytes the loader read or mapped for them
        self.error: Optional[BaseException] = None
        self.seconds = 0.0


def raise_first_or_differ(where: str, error: Any, gathered: list[Any]) -> None:
    """Every rank raises if one failed to open the checkpoint, or if they opened different
    ones (their tensors' names, dtypes, shapes or sizes differ)."""
    from .ckpt.group import raise_first

    raise_first(where, error, [g[3] for g in gathered])
    layouts = [g[0]["layout"] for g in gathered]
    odd = [r for r, layout in enumerate(layouts) if layout != layouts[0]]
    if odd:
        raise ConfigError(
            f"{where}: the ranks opened different checkpoints (rank {odd[0]}'s tensors "
            "differ from rank 0's in name, dtype, shape or size); a grouped load needs the same "
            "one on every rank"
        )


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigError(f"group_timeout: expected seconds, got {timeout!r}")
    if not 0 < timeout <= 1e7:
        raise ConfigError(f"group_timeout: must be a positive number of seconds, got {timeout!r}")
    return float(timeout)
