"""Timing, payloads, progress and small system helpers shared by the workloads."""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import string
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from convmem.logstore.background import busy_seconds
from convmem.logstore.preallocation import wait_for_extensions

#: Backend names, in the order the table shows them.
CONVMEM, SQLITE, FLOOR, POSTGRES = "convmem", "sqlite", "floor", "postgres"
#: The second peer, and the labelled extra rows: today's SQLite schema, SQLite with
#: ``synchronous=NORMAL`` (a reference, not durable per commit), the floor that
#: extends its file on every sync, SQLite behind one group-committing writer thread.
LMDB, SQLITE_TEXT, SQLITE_NORMAL, FLOOR_EXTENDING, SQLITE_GROUP = (
    "lmdb", "sqlite-text-schema", "sqlite-normal", "floor-extending", "sqlite-group")


def median(values: Sequence[float]) -> float:
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

    Two kinds of row:

    * ``per_op``: ``samples[backend]`` holds the wall time of every single
      operation, in seconds, the backends interleaved op by op. The row's
      value is the p50 (shown in ms), the throughput is ``1 / mean``.
    * per round: ``samples[backend]`` holds one figure per round (higher is
      better when ``higher_better``), the backends taking turns round by
      round; ``latencies`` may add the time of every operation inside them.

    Speed ratios are convmem's speed over the other's: above 1, convmem is faster.
    """

    group: str
    name: str
    unit: str
    higher_better: bool = True
    samples: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    per_op: bool = False
    latencies: dict[str, list[float]] = field(default_factory=dict)

    def value(self, backend: str) -> float | None:
        s = self.samples.get(backend)
        if not s:
            return None
        return percentile(s, 50) * 1000 if self.per_op else median(s)

    def stats(self, backend: str) -> dict[str, float | int | None]:
        """p50, p99 and p99.9 of one operation (ms), throughput (ops/s) and the number of samples."""
        lat = self.samples.get(backend) if self.per_op else self.latencies.get(backend)
        out: dict[str, float | int | None] = {"p50_ms": None, "p99_ms": None, "p999_ms": None, "throughput": None}
        if lat:
            out.update(p50_ms=percentile(lat, 50) * 1000, p99_ms=percentile(lat, 99) * 1000,
                       p999_ms=percentile(lat, 99.9) * 1000, ops=len(lat))
            out["throughput"] = len(lat) / sum(lat) if sum(lat) > 0 else None
        if not self.per_op and self.samples.get(backend) and self.higher_better and self.unit.endswith("/s"):
            out["throughput"] = median(self.samples[backend])
        return out

    def speed_ratio(self, other: str) -> float | None:
        r = self.ratio_ci(other)
        return None if r is None else r[0]

    def ratio_ci(self, other: str, base: str = CONVMEM) -> tuple[float, float, float] | None:
        """``base``'s speed over ``other``'s with a bootstrap 95% interval: (value, low, high).

        Per-op rows: the other's p50 time over ``base``'s. Per-round rows: the
        median of per-round paired ratios.
        """
        a, b = self.samples.get(base), self.samples.get(other)
        if not a or not b:
            return None
        if self.per_op:
            return percentile_ratio_ci(b, a)
        pairs = [x / y if self.higher_better else y / x for x, y in zip(a, b, strict=False) if x > 0 and y > 0]
        return median_ci(pairs) if pairs else None

    def to_json(self) -> dict[str, Any]:
        others = [k for k in self.samples if k != CONVMEM]
        return {
            "group": self.group, "name": self.name, "unit": self.unit, "higher_better": self.higher_better,
            "per_op": self.per_op, "samples_are": "seconds per operation" if self.per_op else f"{self.unit} per round",
            "median": {k: self.value(k) for k in self.samples},
            "stats": {k: self.stats(k) for k in self.samples},
            "vs": {k: self.ratio_ci(k) for k in others},
            "vs_sqlite": self.speed_ratio(SQLITE), "vs_floor": self.speed_ratio(FLOOR),
            "vs_postgres": self.speed_ratio(POSTGRES),
            "samples": self.samples, **({"latencies": self.latencies} if self.latencies else {}),
            "note": self.note, **({"extra": self.extra} if self.extra else {}),
        }


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation, as numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


#: Bootstrap resamples per interval; the seed is fixed so a JSON file's intervals can be recomputed.
BOOTSTRAP = 1000
BOOTSTRAP_SEED = 20261130


def percentile_ratio_ci(num: list[float], den: list[float], q: float = 50,
                        q_den: float | None = None) -> tuple[float, float, float]:
    """``percentile(num, q) / percentile(den, q_den)`` with a bootstrap 95% interval.

    The two samples are resampled independently (the conservative choice for
    backends timed in turn), or together when ``num is den``.
    """
    import numpy as np

    q_den = q if q_den is None else q_den
    value = percentile(num, q) / percentile(den, q_den)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    reps = BOOTSTRAP if max(len(a), len(b)) <= 20_000 else 200
    ia = rng.integers(0, len(a), (reps, len(a)))
    # Two statistics of one sample (p99 over p50, say) are resampled together.
    ib = ia if num is den else rng.integers(0, len(b), (reps, len(b)))
    ra = np.percentile(a[ia], q, axis=1)
    rb = np.percentile(b[ib], q_den, axis=1)
    lo, hi = np.percentile(ra / rb, [2.5, 97.5])
    return value, float(lo), float(hi)


def median_ci(values: list[float]) -> tuple[float, float, float]:
    """The median of ``values`` with a bootstrap 95% interval."""
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a = np.asarray(values, dtype=float)
    meds = np.median(a[rng.integers(0, len(a), (BOOTSTRAP, len(a)))], axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return median(values), float(lo), float(hi)


def paired_median_diff_ci(with_: list[float], without: list[float]) -> tuple[float, float, float]:
    """``median(with_) - median(without)`` with a bootstrap 95% interval, the pairs resampled together.

    ``with_[i]`` and ``without[i]`` were timed in the same round, one right after
    the other, so a round's noise (a stall of the shared machine) moves both:
    resampling rounds keeps that pairing.
    """
    import numpy as np

    if len(with_) != len(without) or not with_:
        raise ValueError("paired samples must be non-empty and of equal length")
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a, b = np.asarray(with_, dtype=float), np.asarray(without, dtype=float)
    idx = rng.integers(0, len(a), (BOOTSTRAP, len(a)))
    diffs = np.median(a[idx], axis=1) - np.median(b[idx], axis=1)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return median(with_) - median(without), float(lo), float(hi)


#: Per "workload / backend": [seconds waited for background jobs after the calls, seconds
#: of the timed calls, calls], filled by :func:`interleaved_ops`.
BACKGROUND: dict[str, list[float]] = {}
#: Per "workload / backend": {job kind: seconds the background jobs of that kind ran} (extend-ahead,
#: pool-refill; see logstore.background), for the jobs started by the calls or run after them.
BACKGROUND_KINDS: dict[str, dict[str, float]] = {}

#: Seed of the turn order in :func:`interleaved_ops` (recorded so a run can be repeated).
ORDER_SEED = 20261130


def interleaved_ops(n: int, fns: dict[str, Callable[[], Any]], before: Callable[[int], Any] | None = None,
                    progress: Progress | None = None, label: str = "") -> dict[str, list[float]]:
    """Time ``n`` single calls of each function, the functions taking turns op by op.

    Each turn runs the functions in a fresh random order (seeded, ``ORDER_SEED``),
    so no backend always follows the same neighbour (a fixed rotation showed
    about 5% between two copies of the same code); a burst of noise from
    another process hits all of them alike.

    After each call, convmem's background jobs (extend-ahead: zeroing an append
    may hand over; refilling the pool of conversation directories a first
    append claimed from; the caller waits for neither) are waited for outside
    the call's time, so their I/O never falls into another backend's timed
    call. The latencies are therefore what a caller sees; the time waited is
    added up in :data:`BACKGROUND` (the jobs' own run time per kind in
    :data:`BACKGROUND_KINDS`) and reported beside them, so that it is
    never simply left out (``python -m bench.probes.tail_probe`` shows the
    back-to-back case, where jobs overlap the next appends). Returns seconds
    per call.
    """
    out: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    order = random.Random(ORDER_SEED)
    clock = time.perf_counter
    tick = max(n // 20, 1)
    for i in range(n):
        if before is not None:
            before(i)
        turn = names[:]
        order.shuffle(turn)
        for name in turn:
            fn = fns[name]
            busy = busy_seconds()
            t0 = clock()
            fn()
            t1 = clock()
            out[name].append(t1 - t0)
            wait_for_extensions()
            key = f"{label or 'ops'} / {name}"
            acc = BACKGROUND.setdefault(key, [0.0, 0.0, 0])
            acc[0] += clock() - t1
            acc[1] += t1 - t0
            acc[2] += 1
            kinds = BACKGROUND_KINDS.setdefault(key, {})
            for kind, took in busy_seconds().items():
                if took > busy.get(kind, 0.0):
                    kinds[kind] = kinds.get(kind, 0.0) + took - busy.get(kind, 0.0)
        if progress is not None and i % tick == 0:
            progress.note(f"{label} {i:,}/{n:,}")
    return out


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
    """Progress of a run on stderr: a redrawn line on a terminal, else a line every few seconds.

    A long run is never silent: without a terminal (CI, a log file) each step
    and, at most every ``every`` seconds, the step's own progress get a line.
    """

    def __init__(self, total: int, enabled: bool | None = None, every: float = 10.0) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.tty = sys.stderr.isatty() if enabled is None else enabled
        self.every = every
        self.started = time.monotonic()
        self._last_line = 0.0
        self._label = ""

    def _line(self, label: str) -> str:
        width = 24
        filled = int(width * self.done / self.total)
        elapsed = time.monotonic() - self.started
        return f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:5.0f}s {label}"

    def step(self, label: str, advance: int = 0) -> None:
        """Show ``label``; count ``advance`` steps as done first."""
        self.done = min(self.done + advance, self.total)
        self._label = label
        if self.tty:
            sys.stderr.write("\r" + self._line(label)[:150].ljust(150))
            sys.stderr.flush()
        elif not advance:
            sys.stderr.write("bench " + self._line(label) + "\n")
            sys.stderr.flush()
            self._last_line = time.monotonic()

    def note(self, detail: str) -> None:
        """Progress inside the current step (throttled when not on a terminal)."""
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + self._line(f"{self._label}: {detail}")[:150].ljust(150))
            sys.stderr.flush()
        elif now - self._last_line >= self.every:
            sys.stderr.write("bench " + self._line(f"{self._label}: {detail}") + "\n")
            sys.stderr.flush()
            self._last_line = now

    def close(self) -> None:
        if self.tty:
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
    out: list[str] = []
    for d, _dirs, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in names)
    return out


@contextlib.contextmanager
def engine_sync_disabled() -> Iterator[None]:
    """Build bench data fast: make logstore's syncs no-ops (the bytes on disk are identical).

    Only for setting up data that is read back, never while timing appends.
    """
    from convmem.logstore import fileio

    saved = (fileio.fdatasync, fileio.fsync, fileio.fsync_dir)

    def noop(*_a: object) -> None:
        return None

    fileio.fdatasync = fileio.fsync = fileio.fsync_dir = noop  # type: ignore[assignment]
    try:
        yield
    finally:
        fileio.fdatasync, fileio.fsync, fileio.fsync_dir = saved
