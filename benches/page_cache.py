"""Control the Linux page cache between benchmark runs.

A cold run needs the checkpoint out of the page cache: `sync` writes dirty pages back, then
writing 3 to /proc/sys/vm/drop_caches frees clean pages, dentries and inodes. That needs root;
without it callers must say loudly that their numbers are warm. A warm run needs the opposite,
every byte of the files resident, which reading them once through the cache provides.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
# 16 MiB reads: few syscalls, and readahead keeps the device busy meanwhile.
WARM_READ_BYTES = 16 * 2**20


def can_drop() -> bool:
    """Whether this process may drop the page cache (root, and the knob is writable)."""
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def drop() -> bool:
    """Sync and drop the page cache; returns False (and does nothing) when not allowed."""
    if not can_drop():
        return False
    os.sync()
    DROP_CACHES.write_text("3\n")
    return True


def warm(paths: Iterable[Path]) -> int:
    """Read every file once through the page cache; returns the bytes read."""
    total = 0
    buf = bytearray(WARM_READ_BYTES)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


NOT_ROOT_WARNING = """
**********************************************************************
* WARNING: cannot drop the page cache (needs root). Every "cold" run *
* below reads from a warm cache and is marked so; do not publish it. *
**********************************************************************
"""
