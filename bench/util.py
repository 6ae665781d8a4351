"""Timing, payloads, progress and small system helpers shared by the workloads."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import string
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

#: Backend names, in the order the table shows them.
CONVMEM, SQLITE, FLOOR, POSTGRES = "convmem", "sqlite", "floor", "postgres"


def median(values: list[float]) -> float:
    """Median of ``values`` (nan when empty)."""
    return statistics.median(values) if values else float("nan")


def payloads(n: int, size: int = 1024, seed: int = 7, start: int = 0) -> list[dict[str, Any]]:
    """``n`` JSON objects whose compact encoding is about ``size`` bytes each."""
    rnd = random.Random(seed + start)
    alphabet = string.ascii_letters + string.digits + " "
    text_len = max(size - 40, 1)
    chunk = "".join(rnd.choice(alphabet) for _ in range(text_len + 64))
    return [{"role": "user" if (start + i) % 2 else "assistant", "n": start + i,
             "text": chunk[(i * 7) % 64 : (i * 7) % 64 + text_len]} for i in range(n)]


@dataclass
class Row:
    """One line of the report: a figure for each backend that has one.

    ``samples`` holds per-round values (higher is better when ``higher_better``);
    ``ratios`` holds per-round paired ratios convmem/other as *speed* ratios
    (above 1 means convmem is faster), whose median is what the table shows.
    """

    group: str
    name: str
    unit: str
    higher_better: bool = True
    samples: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, backend: str) -> float | None:
        s = self.samples.get(backend)
        return median(s) if s else None

    def speed_ratio(self, other: str) -> float | None:
        """Median over rounds of convmem's speed divided by ``other``'s (paired by round)."""
        a, b = self.samples.get(CONVMEM), self.samples.get(other)
        if not a or not b:
            return None
        pairs = [(x, y) for x, y in zip(a, b, strict=False) if x > 0 and y > 0]
        if not pairs:
            return None
        return median([x / y if self.higher_better else y / x for x, y in pairs])

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group, "name": self.name, "unit": self.unit, "higher_better": self.higher_better,
            "median": {k: self.value(k) for k in self.samples}, "samples": self.samples,
            "vs_sqlite": self.speed_ratio(SQLITE), "vs_floor": self.speed_ratio(FLOOR),
            "vs_postgres": self.speed_ratio(POSTGRES),
            "note": self.note, **({"extra": self.extra} if self.extra else {}),
        }


def rate(fn: Callable[[], Any], number: int) -> float:
    """Calls per second of ``fn`` over ``number`` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return number / (time.perf_counter() - t0)


def seconds(fn: Callable[[], Any]) -> float:
    """Wall time of one call of ``fn``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(rounds: int, fns: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each measurement once per round, backends alternating, rotating who goes first.

    Alternating inside a round means a burst of noise from a neighbour hits
    every backend about equally, so per-round ratios stay meaningful.
    """
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            out[name].append(fns[name]())
    return out


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()

    def step(self, label: str, advance: int = 0) -> None:
        """Show ``label``; count ``advance`` steps as done first."""
        self.done = min(self.done + advance, self.total)
        if not self.enabled:
            return
        width = 24
        filled = int(width * self.done / self.total)
        elapsed = time.monotonic() - self.started
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:5.0f}s {label}"
        sys.stderr.write(line[:150].ljust(150))
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 150 + "\r")
            sys.stderr.flush()


def drop_file_cache(paths: list[str]) -> int:
    """Evict the files' pages from the page cache (``POSIX_FADV_DONTNEED``); returns files evicted.

    Needs no privileges, unlike ``/proc/sys/vm/drop_caches``. Dirty pages are
    synced first so they can be evicted.
    """
    n = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def files_under(root: str) -> list[str]:
    """Every regular file below ``root``."""
    out = []
    for d, _dirs, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names)
    return out


@contextlib.contextmanager
def engine_sync_disabled() -> Iterator[None]:
    """Build bench data fast: make logstore's syncs no-ops (the bytes on disk are identical).

    Only for setting up data that is read back, never while timing appends.
    """
    from logstore import fileio

    saved = (fileio.fdatasync, fileio.fsync, fileio.fsync_dir)

    def noop(*_a: object) -> None:
        return None

    fileio.fdatasync = fileio.fsync = fileio.fsync_dir = noop  # type: ignore[assignment]
    try:
        yield
    finally:
        fileio.fdatasync, fileio.fsync, fileio.fsync_dir = saved  # type: ignore[assignment]
