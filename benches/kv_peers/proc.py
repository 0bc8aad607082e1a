"""Processes that must not outlive their parent: workers and the servers they start."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGKILL when the process that started it dies, so a
    parent killed with SIGKILL (no chance to clean up) leaves no worker or server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
