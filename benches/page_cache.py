"""Control the Linux page cache between benchmark runs.

A cold run needs the checkpoint out of the page cache: `sync` writes dirty pages back, then
writing 3 to /proc/sys/vm/drop_caches frees clean pages, dentries and inodes. That needs root;
without it callers must say loudly that their numbers are warm. A warm run needs the opposite,
every byte of the files resident, which reading them once through the cache provides.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator
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


def prime(nbytes: int) -> None:
    """Touches `nbytes` of fresh memory once, in a child process.

    Not in this process: a child started with vfork (as subprocess does) inherits the
    parent's high-water RSS into its own ``ru_maxrss`` at exec, so priming here would make
    every later worker report a peak RSS of at least ``nbytes``.
    """
    code = (
        "import os, sys; n = int(sys.argv[1]); b = bytearray(n); p = os.sysconf('SC_PAGE_SIZE');"
        " b[::p] = b'\\x01' * len(range(0, n, p))"
    )
    subprocess.run([sys.executable, "-c", code, str(max(0, nbytes))], check=True)


# Every benchmark that frees and reallocates gigabytes runs with this off (see below).
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters/page_reporting_order")


@contextlib.contextmanager
def free_page_reporting_off(keep: bool, prime_bytes: int) -> Iterator[str]:
    """Turns a VM's free page reporting off for the benchmark and back on after it.

    With virtio-balloon free page reporting, free memory is handed back to the host about two
    seconds after it is freed, and the next guest touch of such a page faults on the host.
    Every round frees the model's page cache (drop_caches) and then allocates it again, so
    which phase of which run pays for those faults depends on timing, not on the policy: on
    this VM the same load phase from a fully cached model took 0.5 s or 1.1-2.9 s. Reporting
    is off while the benchmark runs (``page_reporting_order`` above the largest page order),
    and ``prime_bytes`` of memory are touched once so the runs start on host-backed pages.
    Yields a note for the report.
    """
    if keep or not PAGE_REPORTING.exists():
        yield "free page reporting: " + ("left on" if keep else "not present")
        return
    before = PAGE_REPORTING.read_text().strip()
    for order in ("11", "10"):
        try:
            PAGE_REPORTING.write_text(order)
            break
        except OSError:
            continue
    now = PAGE_REPORTING.read_text().strip()
    try:
        prime(prime_bytes)
        yield f"free page reporting: off (page_reporting_order {before} -> {now}) for the run"
    finally:
        PAGE_REPORTING.write_text(before)


NOT_ROOT_WARNING = """
**********************************************************************
* WARNING: cannot drop the page cache (needs root). Every "cold" run *
* below reads from a warm cache and is marked so; do not publish it. *
**********************************************************************
"""
