"""A terminal progress bar for long scans (stdlib only).

Draws on one line of a terminal: a bar, conversations and bytes done, the
scan rate and the time left. It draws nothing when the stream is not a
terminal, so logs and pipes stay clean.
"""

from __future__ import annotations

import shutil
import time
from typing import TextIO

from convmem.logstore.maintenance import Progress

from .common import human_bytes


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ProgressBar:
    """Callable with a :class:`~logstore.maintenance.Progress`; redraws at most every ``interval`` seconds."""

    def __init__(self, stream: TextIO, *, interval: float = 0.1, force: bool = False) -> None:
        self.stream = stream
        self.enabled = force or (hasattr(stream, "isatty") and stream.isatty())
        self.interval = interval
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        finished = p.conversations_done >= p.conversations_total
        if now - self._last_draw < self.interval and not finished:
            return
        self._last_draw = now
        self.stream.write("\r" + self.render(p, now - self.started))
        self.stream.flush()
        self._drawn = True

    def render(self, p: Progress, elapsed: float) -> str:
        """The progress line for ``p`` after ``elapsed`` seconds, fitted to the terminal."""
        width = shutil.get_terminal_size((80, 24)).columns
        frac = (
            p.bytes_done / p.bytes_total
            if p.bytes_total
            else (p.conversations_done / p.conversations_total if p.conversations_total else 1.0)
        )
        frac = min(max(frac, 0.0), 1.0)
        rate = p.bytes_done / elapsed if elapsed > 0 else 0.0
        left = (p.bytes_total - p.bytes_done) / rate if rate > 0 else 0.0
        text = (
            f" {frac * 100:3.0f}%  {p.conversations_done}/{p.conversations_total} conversations  "
            f"{human_bytes(p.bytes_done)}/{human_bytes(p.bytes_total)}  {human_bytes(rate)}/s  "
            f"ETA {_clock(left)}"
        )
        bar_width = max(width - len(text) - 3, 10)
        filled = int(bar_width * frac)
        line = f"[{'#' * filled}{'.' * (bar_width - filled)}]{text}"
        return line[: width - 1].ljust(width - 1)

    def close(self) -> None:
        """Erase the bar (call before printing the report)."""
        if self._drawn:
            width = shutil.get_terminal_size((80, 24)).columns
            self.stream.write("\r" + " " * (width - 1) + "\r")
            self.stream.flush()
            self._drawn = False
