"""Framework-neutral plumbing: options, name selection, window iteration.

The native module hands out *windows*: buffers holding one or more tensors'
bytes. The framework modules (``sluice.torch``, ``sluice.numpy``) turn them
into tensors; this module runs the load, reports progress and keeps the
statistics of the last load.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterable
from typing import Any, Callable, NamedTuple, Optional, Union

from . import _sluice
from ._progress import Progress, ProgressCallback
from .errors import ConfigError, TensorNotFoundError

PathLike = Union[str, "os.PathLike[str]"]
NameFilter = Union[None, Iterable[str], Callable[[str], bool]]
ByteSize = Union[int, str, None]

_local = threading.local()


def last_load_stats() -> Optional[dict[str, Any]]:
    """Statistics of this thread's most recent load: engine, I/O mode, bytes, seconds."""
    return getattr(_local, "stats", None)


def set_last_load_stats(stats: Optional[dict[str, Any]]) -> None:
    """Makes ``stats`` this thread's :func:`last_load_stats` (a load made of two)."""
    _local.stats = stats


def bytes_read(stats: Optional[dict[str, Any]]) -> int:
    """What a load took from its files (``last_load_stats()``): read into buffers, or
    through a mapping when the file was in the page cache."""
    stats = stats or {}
    return int(stats.get("read_bytes", 0)) + int(stats.get("mapped_bytes", 0))


def resolve_names(
    path: PathLike, names: NameFilter, checkpoint: Any = None, allow_partial: bool = False
) -> Optional[list[str]]:
    """Turns a name filter into an explicit list (``None`` selects everything).

    ``names`` may be an iterable of tensor names or a predicate called with
    each name, e.g. ``lambda n: n.startswith("model.layers.0.")``.
    """
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    if callable(names):
        if checkpoint is None:
            checkpoint = _sluice.open_checkpoint(os.fspath(path), allow_partial=allow_partial)
        keys = checkpoint.keys()
        return [k for k in keys if names(k)]
    return list(names)


def check_options(
    *,
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    memory_limit: ByteSize = None,
) -> None:
    """Refuses, before anything is read, an option value no load can take: a
    :class:`sluice.ConfigError` naming it. Counts and sizes must be ints (not bools) in
    range, or size strings like ``"512MiB"``. The native loader applies the same rules."""
    if isinstance(direct, bool):
        direct = "on" if direct else "off"
    _sluice.check_options(
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
    )


def iter_windows(
    path: PathLike,
    names: NameFilter,
    *,
    bounded: bool,
    progress: bool = False,
    on_progress: Optional[ProgressCallback] = None,
    direct: Optional[str] = None,
    engine: Optional[str] = None,
    concurrency: Optional[int] = None,
    chunk_bytes: ByteSize = None,
    memory_limit: ByteSize = None,
    drop_cache: Optional[bool] = None,
    allow_partial: bool = False,
    checkpoint: Any = None,
    into: Optional[list[tuple[str, int, int]]] = None,
    lent: Any = None,
    pin: bool = False,
) -> Generator[Any, None, None]:
    """Yields windows as their reads complete; stops the load if abandoned.

    With ``into`` (``(name, address, bytes)`` of each destination) the reads
    land in the caller's memory, owned by ``lent``, and the windows carry no
    bytes: they report progress. ``pin`` registers the stream's buffers with
    the process's CUDA runtime (once each: they are recycled) so copies from
    them to a GPU run asynchronously; without a runtime it changes nothing."""
    _local.stats = None
    if isinstance(direct, bool):
        direct = "on" if direct else "off"
    check_options(
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
    )
    stream = _sluice.start_stream(
        os.fspath(path),
        None if into is not None else resolve_names(path, names, checkpoint, allow_partial),
        bounded=bounded,
        direct=direct,
        engine=engine,
        concurrency=concurrency,
        chunk_bytes=chunk_bytes,
        memory_limit=memory_limit,
        drop_cache=drop_cache,
        allow_partial=allow_partial,
        checkpoint=checkpoint,
        into=into,
        lent=lent,
        pin=pin,
    )
    done, total = stream.progress()
    reporter = Progress(total, progress, on_progress)
    try:
        while True:
            window = stream.next_window()
            if window is None:
                break
            yield window
            # Drop our reference before blocking for the next window, so a
            # consumer that is done with this one can have its memory reused.
            del window
            done, _ = stream.progress()
            reporter.update(done)
        _local.stats = stream.stats()
        reporter.close(done)
    finally:
        stream.close()


class IncompatibleKeys(NamedTuple):
    """What ``load_into`` left alone, as ``torch.nn.Module.load_state_dict`` reports it:
    destinations the checkpoint lacks, and checkpoint tensors with no destination."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def match_names(
    path: PathLike, checkpoint: Any, wanted: Iterable[str], strict: bool
) -> IncompatibleKeys:
    """The names a ``load_into`` destination and the checkpoint do not share; with
    ``strict``, any is a :class:`sluice.TensorNotFoundError` listing both kinds."""
    wanted = list(wanted)
    known = checkpoint.keys()
    known_set, wanted_set = set(known), set(wanted)
    missing = [n for n in wanted if n not in known_set]
    unexpected = [n for n in known if n not in wanted_set]
    if strict and (missing or unexpected):
        raise TensorNotFoundError(
            f"{os.fspath(path)}: strict load_into: "
            f"{len(missing)} destination(s) not in the checkpoint {missing[:5]}, "
            f"{len(unexpected)} checkpoint tensor(s) with no destination {unexpected[:5]}"
        )
    return IncompatibleKeys(missing, unexpected)


def distinct_spans(spans: dict[str, tuple[int, int]]) -> list[str]:
    """The names to read into, given each destination's ``(address, bytes)``: one per
    distinct memory range. Exact aliases (tied weights) keep the first name; a partial
    overlap is a :class:`sluice.ConfigError`."""
    keep = [name for name, (_, size) in spans.items() if size == 0]
    ordered = sorted((start, size, name) for name, (start, size) in spans.items() if size > 0)
    last: Optional[tuple[int, int, str]] = None
    for start, size, name in ordered:
        if last is not None and start < last[0] + last[1]:
            if (start, size) == last[:2]:
                continue
            raise ConfigError(
                f"destinations {last[2]!r} and {name!r} overlap in memory "
                "without being the same tensor"
            )
        keep.append(name)
        last = (start, size, name)
    return keep


def fill_destinations(
    path: PathLike,
    checkpoint: Any,
    in_place: dict[str, tuple[int, int, Any]],
    copied_bytes: int,
    copy_rest: Optional[Callable[[ProgressCallback], None]],
    progress: bool,
    on_progress: Optional[ProgressCallback],
    **options: Any,
) -> None:
    """The load behind both ``load_into`` front ends. ``in_place`` maps each name to read
    into to its destination's ``(address, bytes, owner)``; the native stream holds the
    owners until its reads end. ``copy_rest`` then fills the destinations that cannot be
    read into (``copied_bytes`` of them), reporting its progress to the callback it is
    given; one progress report spans both parts, and ``last_load_stats()`` stays the
    read's."""
    spans = {name: (start, size) for name, (start, size, _) in in_place.items()}
    lent = {name: spans[name] for name in distinct_spans(spans)}
    lent_bytes = sum(size for _, size in lent.values())
    reporter = Progress(lent_bytes + copied_bytes, progress, on_progress)
    windows = iter_windows(
        path,
        None,
        bounded=True,
        on_progress=lambda done, _total: reporter.update(done),
        checkpoint=checkpoint,
        into=[(name, start, size) for name, (start, size) in lent.items()],
        lent=[in_place[name][2] for name in lent],
        **options,
    )
    for _window in windows:
        pass
    if copy_rest is not None:
        stats = last_load_stats()
        copy_rest(lambda done, _total: reporter.update(lent_bytes + done))
        set_last_load_stats(stats)
    reporter.close(reporter.total)
