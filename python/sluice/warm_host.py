"""The process a Python ``sluice warm`` policy runs in: ``python -m sluice.warm_host module:Class``.

The Rust runtime starts this host, and talks to it in JSON lines: one request on stdin, one
reply on stdout, in turn. The policy lives here, not in the runtime, so that an exception, a
hang, a crash or garbage output cannot touch the service: the runtime gives each call a
deadline, and on any fault it kills this process and disables the policy.

Requests::

    {"call": "hello"}
    {"call": "init", "ctx": {"model_dir": str, "files": [[path, size], ...],
                             "memory_limited": bool}}
    {"call": "wait_for_init"}
    {"call": "on_access", "event": {"pid": int, "worker": int|null, "path": str,
                                    "offset": int, "len": int,
                                    "kind": "open"|"read"|"mmap"|"progress"|"explicit"}}
    {"call": "evict", "event": {...}|null}
    {"call": "exit"}

Replies: ``{"ok": "ClassName"}`` to hello; ``{"ok": [prefetch, ...]}`` to init and
on_access, where a prefetch is ``{"stream": int, "path": str, "offset": int, "len": int,
"target": {"accelerator": n}|{"numa": n}|null}``; ``{"ok": [{"path", "offset", "len"}, ...]}``
to evict; ``{"ok": bool}`` to wait_for_init; ``{"ok": null}`` to exit, after which the host
exits. Any exception in a call, including the import of the policy's module, is answered
``{"error": "Type: message\\n<traceback>"}`` and the host keeps serving (the runtime
disables the policy on the first one).

The protocol owns the original stdin and stdout. Before the policy's module is imported,
file descriptor 1 and ``sys.stdout`` are pointed at stderr and stdin at /dev/null, so a
policy's prints (or a C library's) cannot corrupt the stream.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import IO, Any, Optional

from .warm import Context, Event, Evict, Policy, Prefetch


def load(spec: str) -> Any:
    """Imports ``module:Class`` (``Class`` may be dotted) and instantiates it with no
    arguments. Raises ``ValueError`` for a malformed spec, ``ImportError`` for a missing
    module, ``AttributeError`` for a missing class, ``TypeError`` for a non-class."""
    module_name, sep, class_path = spec.partition(":")
    if not sep or not module_name or not class_path:
        raise ValueError(f"policy {spec!r} is not of the form module:Class")
    target: Any = importlib.import_module(module_name)
    for part in class_path.split("."):
        target = getattr(target, part)
    if not isinstance(target, type):
        raise TypeError(f"{spec} is a {type(target).__name__}, not a class")
    return target()


def _error(exc: BaseException) -> dict[str, str]:
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}\n{trace}"}


def _method(policy: Any, name: str) -> Any:
    """The policy's method, or the base class's do-nothing default when a duck-typed policy
    lacks it."""
    method = getattr(policy, name, None)
    if method is None:
        return getattr(Policy(), name)
    return method


def _encode(items: Optional[Iterable[Any]], kind: type, method: str) -> list[dict[str, Any]]:
    if items is None:
        return []
    if isinstance(items, (str, bytes, dict, Prefetch, Evict)):
        raise TypeError(f"{method} must return a list of {kind.__name__}, got {items!r}")
    out = []
    for item in items:
        if isinstance(item, kind):
            out.append(item.to_json())
        elif isinstance(item, dict):
            out.append(item)
        else:
            raise TypeError(f"{method} must return {kind.__name__} items, got {item!r}")
    return out


class Host:
    """One policy instance and the dispatch of requests to it."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.policy: Any = None
        self.load_error: Optional[dict[str, str]] = None
        try:
            self.policy = load(spec)
        except BaseException as exc:
            self.load_error = _error(exc)

    def handle(self, request: Any) -> dict[str, Any]:
        """The reply to one request; never raises. Every call fails with the import error
        when the policy could not be loaded."""
        if self.load_error is not None:
            return self.load_error
        try:
            return {"ok": self._dispatch(request)}
        except BaseException as exc:
            return _error(exc)

    def _dispatch(self, request: Any) -> Any:
        call = request.get("call") if isinstance(request, dict) else None
        if call == "hello":
            return type(self.policy).__qualname__
        if call == "init":
            ctx = Context.from_json(request["ctx"])
            return _encode(_method(self.policy, "init")(ctx), Prefetch, "init")
        if call == "on_access":
            event = Event.from_json(request["event"])
            return _encode(_method(self.policy, "on_access")(event), Prefetch, "on_access")
        if call == "evict":
            raw = request.get("event")
            event = None if raw is None else Event.from_json(raw)
            return _encode(_method(self.policy, "evict")(event), Evict, "evict")
        if call == "wait_for_init":
            answer = _method(self.policy, "wait_for_init")()
            if not isinstance(answer, bool):
                raise TypeError(f"wait_for_init must return a bool, got {answer!r}")
            return answer
        if call == "exit":
            _method(self.policy, "exit")()
            return None
        raise ValueError(f"unknown call {call!r} in request {request!r}")


def serve(host: Host, requests: IO[str], replies: IO[str]) -> int:
    """Answers each request line until ``exit``, end of input, or a failed import answered
    to ``hello``. Returns the exit status."""
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            request = None
            reply: dict[str, Any] = _error(exc)
        else:
            reply = host.handle(request)
        try:
            text = json.dumps(reply, allow_nan=False)
        except (TypeError, ValueError) as exc:
            text = json.dumps(_error(exc))
        replies.write(text + "\n")
        replies.flush()
        call = request.get("call") if isinstance(request, dict) else None
        if call == "exit" or (call == "hello" and host.load_error is not None):
            return 0 if host.load_error is None else 1
    return 0


def _take_protocol_streams() -> tuple[IO[str], IO[str]]:
    """Keeps the original stdin/stdout for the protocol and points fd 0 at /dev/null and fd 1
    (and ``sys.stdout``) at stderr."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    sys.stdout = sys.stderr
    return requests, replies


def _exit_with_parent(parent: int) -> None:
    """Exits when the runtime is gone (killed before it could close our stdin)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sluice.warm_host module:Class", file=sys.stderr)
        return 2
    requests, replies = _take_protocol_streams()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    return serve(Host(args[0]), requests, replies)


if __name__ == "__main__":
    sys.exit(main())
