"""The process group a save or load runs over: ranks, collectives, point-to-point transfers.

``sluice.ckpt`` runs torch.distributed's collectives in the foreground of a save or load
(pooling chunk tables, broadcasting rank 0's plan, a start barrier) and point-to-point
transfers for grouped reads and replicas. Whatever a rank fails at before a collective,
it still joins it, carrying its error, so every rank raises together and none waits on a
rank that has given up.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any, Optional

from ..errors import ConfigError, SluiceError

_side_groups: dict[tuple[int, ...], Any] = {}


@contextlib.contextmanager
def collective(what: str, who: str = "sluice.ckpt") -> Iterator[None]:
    """torch.distributed's errors (a rank gone, the group destroyed, a timeout) as a
    ``SluiceError`` saying which step of ``who`` failed."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e, SluiceError):
            raise
        raise SluiceError(
            f"{who}: the group's {what} failed (a rank gone, the process group "
            f"destroyed, or a timeout): {e}"
        ) from e


class Group:
    """A save's or load's ranks: torch.distributed's ``group`` (the world by default), or
    this process alone when torch.distributed is not initialized."""

    def __init__(self, rank: int, world: int, pg: Any, who: str = "sluice.ckpt") -> None:
        self.rank, self.world, self.pg = rank, world, pg
        self.who = who  # what the group's errors name

    @staticmethod
    def of(group: Any) -> Group:
        try:
            import torch.distributed as dist
        except ImportError:
            if group is not None:
                raise ConfigError("group= given but torch.distributed is unavailable") from None
            return Group(0, 1, None)
        if not (dist.is_available() and dist.is_initialized()):
            if group is not None:
                raise ConfigError("group= given but torch.distributed is not initialized")
            return Group(0, 1, None)
        return Group(dist.get_rank(group), dist.get_world_size(group), group)

    def all_gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        with collective("all_gather", self.who):
            dist.all_gather_object(out, obj, group=self.pg)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.rank == 0 else None]
        with collective("broadcast", self.who):
            dist.broadcast_object_list(box, src=self.global_rank(0), group=self.pg)
        return box[0]

    def global_rank(self, r: int, pg: Any = None) -> int:
        import torch.distributed as dist

        pg = pg if pg is not None else self.pg
        return dist.get_global_rank(pg, r) if pg is not None else r

    def agree(self, where: Any, error: Optional[BaseException]) -> None:
        """Every rank raises if any failed: its own error, or one naming the first rank
        that failed."""
        raise_first(where, error, self.all_gather(failure(error)))

    def side(self, timeout_s: float) -> Any:
        """A gloo group of this group's ranks for Sluice's background transfers, so that
        they never interleave with training's collectives on ``pg`` (collective on first
        use, then cached)."""
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(self.pg or dist.group.WORLD))
        side = _side_groups.get(ranks)
        if side is not None and not _alive(side):
            side = None  # destroyed with the default group since: made anew
        if side is None:
            with collective("new_group", self.who):
                side = dist.new_group(
                    list(ranks),
                    timeout=datetime.timedelta(seconds=timeout_s),
                    backend="gloo",
                    use_local_synchronization=True,
                )
            _side_groups[ranks] = side
        return side

    def transfer(self, ops: list[tuple[bool, int, Any]], pg: Any = None) -> None:
        """Runs point-to-point transfers (send?, peer rank in this group, tensor) as one
        batch, and waits for them."""
        self.wait(self.post(ops, pg))

    def post(self, ops: list[tuple[bool, int, Any]], pg: Any = None) -> list[Any]:
        """Starts :meth:`transfer`'s batch without waiting; :meth:`wait` for its works."""
        if not ops:
            return []
        import torch.distributed as dist

        pg = pg if pg is not None else self.pg
        p2p = [
            dist.P2POp(dist.isend if send else dist.irecv, t, self.global_rank(peer, pg), pg)
            for send, peer, t in ops
        ]
        with collective("point-to-point transfer", self.who):
            return list(dist.batch_isend_irecv(p2p))

    def wait(self, works: list[Any]) -> None:
        with collective("point-to-point transfer", self.who):
            for w in works:
                w.wait()


def _alive(pg: Any) -> bool:
    """Whether process group ``pg`` still exists (``destroy_process_group`` drops every
    group it made)."""
    import torch.distributed as dist

    try:
        dist.get_process_group_ranks(pg)
        return True
    except (RuntimeError, ValueError, KeyError):
        return False


def failure(e: Optional[BaseException]) -> Optional[str]:
    return None if e is None else f"{type(e).__name__}: {e}"


def check_same(where: Any, calls: list[dict[str, Any]]) -> None:
    """Refuses a collective call the ranks do not all make alike (one saves while another
    loads, or they name different checkpoints or options): every rank gets the same
    gathered ``calls``, so all raise together, naming what differs."""
    first = calls[0]
    odd = [r for r, c in enumerate(calls) if c != first]
    if not odd:
        return

    def show(c: dict[str, Any], keys: list[str]) -> str:
        return ", ".join(f"{k}={c.get(k)!r}" for k in keys)

    keys = sorted(
        {k for r in odd for k in set(first) | set(calls[r]) if first.get(k) != calls[r].get(k)}
    )
    detail = "; ".join(f"rank {r} has {show(calls[r], keys)}" for r in odd[:4])
    more = f" (and {len(odd) - 4} more ranks)" if len(odd) > 4 else ""
    raise ConfigError(
        f"{where}: the ranks disagree; every rank must make the same call: "
        f"rank 0 has {show(first, keys)}; {detail}{more}"
    )


def raise_first(where: Any, mine: Optional[BaseException], all_: list[Optional[str]]) -> None:
    """Raises this rank's own error, or one naming the first rank that failed."""
    if mine is not None:
        raise mine
    for r, f in enumerate(all_):
        if f:
            raise SluiceError(f"{where}: rank {r} failed: {f}")
