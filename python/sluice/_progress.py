"""Progress reporting: a callback, and an optional bar on stderr."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

ProgressCallback = Callable[[int, int], None]

# Redraw at most ten times a second: smooth to the eye, negligible cost.
_REDRAW_SECONDS = 0.1
_BAR_WIDTH = 30


class Progress:
    """Feeds ``(done_bytes, total_bytes)`` to a callback and draws a bar.

    The bar is drawn only when ``show_bar`` is set and stderr is a terminal;
    elsewhere a single summary line is printed at the end instead.
    """

    def __init__(self, total: int, show_bar: bool, callback: Optional[ProgressCallback]):
        self.total = total
        self.callback = callback
        self.show_bar = show_bar
        self.tty = show_bar and sys.stderr.isatty()
        self.started = time.perf_counter()
        self._last_draw = 0.0

    def update(self, done: int) -> None:
        if self.callback is not None:
            self.callback(done, self.total)
        if self.tty:
            now = time.perf_counter()
            if now - self._last_draw >= _REDRAW_SECONDS or done >= self.total:
                self._last_draw = now
                self._draw(done, now)

    def _draw(self, done: int, now: float) -> None:
        fraction = done / self.total if self.total else 1.0
        filled = int(fraction * _BAR_WIDTH)
        rate = done / max(now - self.started, 1e-9) / 1e9
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        sys.stderr.write(
            f"\rsluice [{bar}] {fraction:6.1%} {done / 1e9:.2f}/{self.total / 1e9:.2f} GB "
            f"{rate:.2f} GB/s"
        )
        sys.stderr.flush()

    def close(self, done: int) -> None:
        if self.tty:
            self._draw(done, time.perf_counter())
            sys.stderr.write("\n")
        elif self.show_bar:
            secs = time.perf_counter() - self.started
            rate = done / 1e9 / max(secs, 1e-9)
            sys.stderr.write(f"sluice: {done / 1e9:.2f} GB in {secs:.2f} s ({rate:.2f} GB/s)\n")
