"""Page-cache policies for ``sluice warm``, written in Python.

A policy sees every access to the model files (a reader opened, read, mapped or advanced
through a file) and answers with byte ranges to prefetch; when memory runs short it may also
name ranges to evict. Its answers are recommendations: the Rust cache manager chunks,
orders, throttles and drops them as the machine allows.

    # mypolicy.py
    from sluice.warm import Policy, Prefetch, Target

    class RestOfFile(Policy):
        # On a file's first access, prefetch from there to its end, near GPU 0.
        # (A mapping loader's first event spans the whole mapped range, a read
        # loader's the bytes it reads, so start where the access starts.)

        def init(self, ctx):
            self.sizes = dict(ctx.files)
            self.started = set()
            return []

        def on_access(self, event):
            if event.path in self.started:
                return []
            self.started.add(event.path)
            start, end = event.offset, self.sizes.get(event.path, 0)
            if start >= end:
                return []
            return [Prefetch(event.path, start, end - start, Target.accelerator(0))]

    $ sluice warm run --policy mypolicy:RestOfFile --model /models/llama -- python serve.py

The policy runs in its own process (``python -m sluice.warm_host module:Class``), so an
exception, a hang or a crash in it never reaches the service: each call has a deadline
(500 ms, ``SLUICE_PY_POLICY_TIMEOUT_MS``), and on any fault the runtime logs it, stops the
policy and goes on as if none were installed. Print freely: ``print`` goes to stderr.

Paths are absolute, and a policy may only name the model files it was given in
``ctx.files``; a range on any other file is a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = [
    "Context",
    "Event",
    "Evict",
    "Policy",
    "Prefetch",
    "Target",
    "run_dir",
    "running",
    "status",
    "trigger",
]

ACCESS_KINDS = ("open", "read", "mmap", "progress", "explicit")


def _int(d: dict[str, Any], key: str, *, optional: bool = False) -> Optional[int]:
    value = d.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key!r} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Target:
    """Where prefetched pages should be placed: near an accelerator, or on a NUMA node."""

    kind: str
    index: int

    @classmethod
    def accelerator(cls, index: int) -> Target:
        """The NUMA node closest to this accelerator (GPU/NPU index)."""
        return cls("accelerator", index)

    @classmethod
    def numa(cls, node: int) -> Target:
        """This NUMA node."""
        return cls("numa", node)

    def to_json(self) -> dict[str, int]:
        if self.kind not in ("accelerator", "numa"):
            raise ValueError(f"target kind {self.kind!r} is neither 'accelerator' nor 'numa'")
        return {self.kind: self.index}

    @classmethod
    def from_json(cls, d: Optional[dict[str, Any]]) -> Optional[Target]:
        if d is None:
            return None
        if len(d) != 1 or next(iter(d)) not in ("accelerator", "numa"):
            raise ValueError(f"a target is {{'accelerator': n}} or {{'numa': n}}, got {d!r}")
        kind = next(iter(d))
        return cls(kind, _int(d, kind))  # type: ignore[arg-type]


@dataclass
class Context:
    """What a policy knows when it starts."""

    model_dir: str
    """The watched model directory."""
    files: list[tuple[str, int]] = field(default_factory=list)
    """Every model file under it, absolute, with its size in bytes, in name order."""
    memory_limited: bool = False
    """Whether a memory limit applies; policies may evict only then."""

    @property
    def model_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "model_dir": self.model_dir,
            "files": [[path, size] for path, size in self.files],
            "memory_limited": self.memory_limited,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Context:
        files = [(str(path), int(size)) for path, size in d.get("files", [])]
        return cls(str(d["model_dir"]), files, bool(d.get("memory_limited", False)))


@dataclass
class Event:
    """One observed access, reported after the reader was let through."""

    pid: int
    worker: Optional[int]
    """The loader worker the runtime mapped ``pid`` to, when it knows."""
    path: str
    offset: int
    len: int
    kind: str
    """``open`` (offset and len 0), ``read`` (exactly this range), ``mmap`` (the range was
    mapped), ``progress`` (a sampler saw the reader reach ``offset``) or ``explicit``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "worker": self.worker,
            "path": self.path,
            "offset": self.offset,
            "len": self.len,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        kind = d.get("kind")
        if kind not in ACCESS_KINDS:
            raise ValueError(f"event kind {kind!r} is not one of {', '.join(ACCESS_KINDS)}")
        return cls(
            pid=_int(d, "pid"),  # type: ignore[arg-type]
            worker=_int(d, "worker", optional=True),
            path=str(d["path"]),
            offset=_int(d, "offset"),  # type: ignore[arg-type]
            len=_int(d, "len"),  # type: ignore[arg-type]
            kind=kind,
        )


@dataclass
class Prefetch:
    """A range to prefetch. A newer answer for a ``stream`` replaces what that stream still
    had queued (MAIO: one stream per loader worker), which makes prefetch interruptible."""

    path: str
    offset: int
    len: int
    target: Optional[Target] = None
    stream: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "path": self.path,
            "offset": self.offset,
            "len": self.len,
            "target": None if self.target is None else self.target.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Prefetch:
        return cls(
            path=str(d["path"]),
            offset=_int(d, "offset"),  # type: ignore[arg-type]
            len=_int(d, "len"),  # type: ignore[arg-type]
            target=Target.from_json(d.get("target")),
            stream=_int(d, "stream", optional=True) or 0,
        )


@dataclass
class Evict:
    """A range to drop from the page cache."""

    path: str
    offset: int
    len: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "offset": self.offset, "len": self.len}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Evict:
        return cls(str(d["path"]), _int(d, "offset"), _int(d, "len"))  # type: ignore[arg-type]


class Policy:
    """Base class of Python page-cache policies; every method does nothing by default, so a
    policy overrides only what it uses. It is instantiated with no arguments."""

    def init(self, ctx: Context) -> list[Prefetch]:
        """Called once before any event; returns prefetches to start right away."""
        return []

    def wait_for_init(self) -> bool:
        """Whether the service must wait until ``init``'s prefetches are done (asked once,
        right after ``init``)."""
        return False

    def on_access(self, event: Event) -> list[Prefetch]:
        """Called for each access; returns prefetches (for each stream named, they replace
        what that stream still had queued)."""
        return []

    def evict(self, event: Optional[Event]) -> list[Evict]:
        """Called when memory is over the watermark, after an access (with it) or
        periodically (with ``None``); returns ranges to drop. ``[]`` leaves it to the kernel."""
        return []

    def exit(self) -> None:
        """Called once when the runtime stops."""


def run_dir() -> str:
    """Where running ``sluice warm`` runtimes publish their status and trigger pipes:
    ``$SLUICE_RUN_DIR``, else ``/run/sluice/warm`` for root, else
    ``$XDG_RUNTIME_DIR/sluice/warm``, else ``/tmp/sluice-warm-UID``."""
    from sluice import _sluice

    return _sluice.warm_run_dir()


def status() -> list[dict[str, Any]]:
    """The live ``sluice warm`` runtimes' status (what ``sluice warm status --json``
    prints): pid, mode, policy, model directory, bytes prefetched and evicted, reader
    position. Status files of runtimes that died are removed."""

    from sluice import _sluice

    return _sluice.warm_status()


def running() -> list[int]:
    """Pids of the live ``sluice warm`` runtimes."""
    return [s["pid"] for s in status()]


def trigger(
    path: str,
    offset: Optional[int] = None,
    length: Optional[int] = None,
    *,
    worker: Optional[int] = None,
    pid: Optional[int] = None,
) -> None:
    """Tells a running runtime that ``path`` (absolute, or relative to its model directory)
    is about to be read from ``offset`` for ``length`` bytes (default: the rest of the file):
    an explicit access event for its policy, as ``sluice warm trigger`` sends (the same
    code). ``pid`` picks the runtime when several run. Raises
    :class:`sluice.errors.NoRuntimeError` (a ``RuntimeError``) when none (or more than one,
    without ``pid``) is running, ``OSError`` when its pipe cannot be written.
    """
    import os

    from sluice import _sluice

    _sluice.warm_trigger(os.fspath(path), offset, length, worker, pid)
