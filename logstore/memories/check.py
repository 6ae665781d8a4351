"""Verifying, repairing and summarising long-term memory logs (what ``convmem fsck``/``stats`` use).

:func:`check` reads every record of each site's memory log (under the site's
memory lock, shared to report, exclusive to repair) and reports:

* ``memory-bad-header``: the segment header is invalid (nothing readable);
* ``memory-corrupt-record``: a record that fails verification, with its
  offset; the records after it are still read (salvaged);
* ``memory-torn-tail``: a write that never completed at the end of the log;
* ``memory-bad-event``: a valid record whose event does not fit the history
  (unknown id, version not one more than before, invalid fields);
* ``memory-stray-file``: a file the store does not create, including a
  temporary rewrite file a crash left behind.

``repair`` cuts torn tails and removes stray temporary rewrite files (they can
hold content that a later erasure must reach). ``drop_damaged`` also rewrites
a log without its damaged records, keeping every valid event: the damaged
bytes are *not* kept in a quarantine copy, since a copy would be out of reach
of a later erasure. Nothing else is ever changed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import fileio, layout
from ..errors import Corrupted, Timeout
from . import access, tokens
from .errors import MEMORY_LOCK, InvalidMemory
from .eventlog import Event, EventLog, rewrite_file, salvage
from .limits import MAX_MEMORIES_PER_SITE
from .record import STATUS_DELETED, WRITABLE_FIELDS, Memory, check_memory_id, parse_fields
from .site import LOCK_NAME, LOG_NAME, MEMORIES_DIR, SEARCH_DIR, memories_dir
from .state import apply

_KNOWN = {LOCK_NAME, LOG_NAME, tokens.USED_FILE, access.ACCESS_FILE, SEARCH_DIR}


@dataclass
class MemoryProblem:
    kind: str
    site: str
    file: str
    offset: int | None
    detail: str
    action: str
    repaired: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "site": self.site,
            "file": self.file,
            "offset": self.offset,
            "detail": self.detail,
            "action": self.action,
            "repaired": self.repaired,
        }


@dataclass
class MemoryCheck:
    sites: int = 0
    events: int = 0
    memories: int = 0
    problems: list[MemoryProblem] = field(default_factory=list)

    @property
    def unrepaired(self) -> list[MemoryProblem]:
        return [p for p in self.problems if not p.repaired]


def memory_sites(root: str) -> list[str]:
    base = os.path.join(root, layout.SITES_DIR)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        site = layout.decode_name(name)
        if site is not None and os.path.isdir(os.path.join(base, name, MEMORIES_DIR)):
            out.append(site)
    return sorted(out)


@contextlib.contextmanager
def site_lock(directory: str, exclusive: bool, timeout: float) -> Iterator[None]:
    fd = fileio.open_create(os.path.join(directory, LOCK_NAME))
    try:
        started = time.monotonic()
        while not fileio.try_lock(fd, exclusive):
            if time.monotonic() - started > timeout:
                raise Timeout(time.monotonic() - started, MEMORY_LOCK)
            time.sleep(0.01)
        try:
            yield
        finally:
            fileio.unlock(fd)
    finally:
        os.close(fd)


def _writable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in WRITABLE_FIELDS if k in record}


def replay_checked(events: list[Event]) -> tuple[dict[str, Memory], list[tuple[int, str]]]:
    """The state the events give, and (offset, why) for each event that does not fit the history."""
    state: dict[str, Memory] = {}
    bad: list[tuple[int, str]] = []
    for ev in events:
        body, mid = ev.body, ev.memory_id
        try:
            check_memory_id(mid, "id")
            prev = state.get(mid)
            if ev.op == "create":
                if prev is not None:
                    raise ValueError("create of an id that already exists")
                parse_fields(_writable(body["record"]))
                if int(body["record"]["version"]) < 1:
                    raise ValueError("version below 1")
            elif ev.op == "update":
                if prev is None:
                    raise ValueError("update of an unknown id")
                parse_fields(_writable(body["record"]))
                if int(body["record"]["version"]) != prev.version + 1:
                    raise ValueError(f"version {body['record']['version']} does not follow {prev.version}")
            elif ev.op == "delete":
                if prev is None:
                    raise ValueError("delete of an unknown id")
                if int(body["version"]) != prev.version + 1:
                    raise ValueError(f"version {body['version']} does not follow {prev.version}")
            apply(state, body)
        except (InvalidMemory, ValueError, KeyError, TypeError) as exc:
            bad.append((ev.offset, f"{ev.op} event for {mid}: {exc}"))
    return state, bad


def _consistent(events: list[Event]) -> list[Event]:
    """The events left after dropping damaged records, made to fit together again.

    A dropped create leaves later events of its memory without a start: an
    update (which carries the whole record) becomes the create, a delete of a
    memory that no longer exists is dropped.
    """
    known: set[str] = set()
    out: list[Event] = []
    for ev in events:
        body = ev.body
        if ev.op == "update" and ev.memory_id not in known:
            body = {**body, "op": "create"}
        elif ev.op == "delete" and ev.memory_id not in known:
            continue
        if body["op"] == "create":
            known.add(ev.memory_id)
        elif body["op"] == "erase":
            known.discard(ev.memory_id)
        out.append(Event(ev.offset, ev.seq, ev.recorded_us, body))
    return out


def check(
    root: str, *, site: str | None = None, repair: bool = False, drop_damaged: bool = False, lock_timeout: float = 30
) -> MemoryCheck:
    report = MemoryCheck()
    repair = repair or drop_damaged
    for name in [site] if site is not None else memory_sites(root):
        directory = memories_dir(root, name)
        if not os.path.isdir(directory):
            continue
        report.sites += 1
        with site_lock(directory, repair, lock_timeout):
            _check_site(root, name, directory, repair, drop_damaged, report)
    return report


def _check_site(root: str, site: str, directory: str, repair: bool, drop: bool, report: MemoryCheck) -> None:
    path = os.path.join(directory, LOG_NAME)

    def problem(kind: str, file: str, offset: int | None, detail: str, action: str, repaired: bool = False) -> None:
        report.problems.append(MemoryProblem(kind, site, file, offset, detail, action, repaired))

    for name in sorted(os.listdir(directory)):
        if name in _KNOWN:
            continue
        full = os.path.join(directory, name)
        if ".rewrite." in name or ".tmp." in name:
            if repair:
                fileio.unlink(full)
                fileio.fsync_dir(directory)
            problem(
                "memory-stray-file",
                full,
                None,
                "a temporary file left by an interrupted write",
                "removed" if repair else "run with --repair to remove it",
                repaired=repair,
            )
        else:
            problem(
                "memory-stray-file",
                full,
                None,
                "a file the memory store does not create",
                "none: move it out of the data directory if it is not needed",
            )
    if not os.path.exists(path):
        return
    try:
        events, damaged, torn = salvage(path)
    except Corrupted as exc:
        problem(
            "memory-bad-header", path, exc.offset, exc.why, "none: the log cannot be read; restore it from an export"
        )
        return
    report.events += len(events)
    if torn is not None:
        if repair:
            log = EventLog(path)
            log.open(writable=True)
            try:
                log.cut(torn)
            finally:
                log.close()
        problem(
            "memory-torn-tail",
            path,
            torn,
            "a write that never completed (never acknowledged)",
            "cut away" if repair else "run with --repair to cut it away",
            repaired=repair,
        )
    for offset, why in damaged:
        problem(
            "memory-corrupt-record",
            path,
            offset,
            why,
            "dropped; every valid event kept"
            if drop
            else "none by --repair; --truncate-at-corruption drops the damaged records and keeps every valid one",
            repaired=drop,
        )
    if damaged and drop:
        events = _consistent(events)
        rewrite_file(path, [(ev.recorded_us, ev.body) for ev in events])
    state, bad = replay_checked(events)
    for offset, why in bad:
        problem("memory-bad-event", path, offset, why, "none: report it; the store applies what it can")
    report.memories += len(state)
    if len(state) > MAX_MEMORIES_PER_SITE:
        problem(
            "memory-over-limit",
            path,
            None,
            f"{len(state)} memories, more than {MAX_MEMORIES_PER_SITE}",
            "none: new memories are refused until some are deleted",
        )


@dataclass(frozen=True)
class MemoryStats:
    site: str
    active: int
    deleted: int
    events: int
    log_bytes: int
    oldest_deleted_us: int | None
    error: str | None = None

    @property
    def fill(self) -> float:
        return (self.active + self.deleted) / MAX_MEMORIES_PER_SITE


def stats(root: str, site: str | None = None) -> list[MemoryStats]:
    out = []
    for name in [site] if site is not None else memory_sites(root):
        path = os.path.join(memories_dir(root, name), LOG_NAME)
        if not os.path.exists(path):
            continue
        try:
            events, damaged, _torn = salvage(path)
        except Corrupted as exc:
            out.append(MemoryStats(name, 0, 0, 0, os.path.getsize(path), None, str(exc)))
            continue
        state, _ = replay_checked(events)
        deleted = [m for m in state.values() if m.status == STATUS_DELETED]
        oldest = min((m.deleted_us for m in deleted if m.deleted_us is not None), default=None)
        error = f"{len(damaged)} damaged record(s); run `convmem fsck`" if damaged else None
        out.append(
            MemoryStats(
                name, len(state) - len(deleted), len(deleted), len(events), os.path.getsize(path), oldest, error
            )
        )
    return out
