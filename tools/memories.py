"""The long-term memory side of the operator tools (hooked into fsck, export, import and stats).

* ``convmem fsck`` also checks every site's memory log (``--repair`` cuts torn
  tails and removes stale temporary files; ``--truncate-at-corruption`` drops
  damaged records and keeps every valid event);
* ``convmem export --memories`` writes a site's memories as one JSON document
  (the "download my memories" file); ``convmem import --memories`` restores
  one into a site, keeping ids, timestamps and versions;
* ``convmem stats`` adds each site's memory counts, log size and fill of the
  10,000-memory limit;
* ``convmem dump`` reads a memory log like any segment (same format).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from convmem.logstore import StoreError
from convmem.logstore.memories import LongTermMemory, LongTermStore, Memory
from convmem.logstore.memories import check as mcheck
from convmem.logstore.memories.errors import InvalidMemory
from convmem.logstore.memories.record import STATUS_ACTIVE, STATUS_DELETED, check_memory_id, parse_fields
from convmem.logstore.timefmt import format_us, now_us, parse_rfc3339

from .common import EXIT_CLEAN, EXIT_OPERATIONAL, EXIT_PROBLEMS_LEFT, EXIT_REPAIRED, fail, human_bytes, plural

EXPORT_FORMAT = "convmem-memories"
EXPORT_VERSION = 1
EXIT_BAD_INPUT = 1


def _count(n: int) -> str:
    return f"{n} memory" if n == 1 else f"{n} memories"


# ------------------------------------------------------------------ fsck


def fsck(args: argparse.Namespace, status: int, doc: dict[str, Any] | None) -> int:
    """Check the memory logs after the engine's check; print, and return the combined exit status."""
    if getattr(args, "conversation", None):
        return status
    try:
        report = mcheck.check(
            args.data_dir,
            site=args.site,
            repair=args.repair,
            drop_damaged=args.truncate_at_corruption,
            lock_timeout=args.lock_timeout,
        )
    except (OSError, StoreError) as exc:
        fail(f"checking memories failed: {exc}", EXIT_OPERATIONAL)
        return EXIT_OPERATIONAL
    mine = report_check(report, doc)
    if EXIT_OPERATIONAL in (status, mine):
        return EXIT_OPERATIONAL
    return max(status, mine)


def report_check(report: mcheck.MemoryCheck, doc: dict[str, Any] | None) -> int:
    """Print a memory check (or add it to the JSON ``doc``); its exit status as fsck counts it."""
    if doc is not None:
        doc["memory_problems"] = [p.to_dict() for p in report.problems]
        doc["memory_sites"], doc["memory_events"], doc["memories"] = report.sites, report.events, report.memories
    else:
        for p in report.problems:
            at = f" at byte {p.offset}" if p.offset is not None else ""
            state = "REPAIRED" if p.repaired else "LEFT"
            sys.stdout.write(f"{p.kind}: site {p.site}: {p.file}{at}\n    {p.detail}\n    {state}: {p.action}\n")
        left = len(report.unrepaired)
        sys.stdout.write(
            f"memories: {plural(report.sites, 'site')}, {plural(report.events, 'event')}, "
            f"{_count(report.memories)}; {plural(len(report.problems), 'problem')}, "
            f"{len(report.problems) - left} repaired, {left} left\n"
        )
    return EXIT_CLEAN if not report.problems else (EXIT_PROBLEMS_LEFT if report.unrepaired else EXIT_REPAIRED)


# ------------------------------------------------------------------ export / import


def _not_a_data_dir(data_dir: str) -> int | None:
    if not os.path.isfile(os.path.join(data_dir, "logstore.json")):
        return fail(f"{data_dir} is not a convmem data directory (no logstore.json)", EXIT_OPERATIONAL)
    return None


@contextlib.contextmanager
def _memories_of(args: argparse.Namespace) -> Iterator[LongTermStore]:
    """The long-term memory store named by DATA_DIR: a data directory, or a ``postgresql://`` DSN."""
    from convmem.logstore.postgres import PgLongTermMemory, PgStore

    pg = PgStore(args.data_dir, schema=args.pg_schema)
    with pg, PgLongTermMemory(pg, listen=False) as store:
        yield store


def _is_dsn(target: str) -> bool:
    from convmem.logstore.postgres import is_dsn

    return is_dsn(target)


def export(args: argparse.Namespace) -> int:
    """``convmem export --memories``: the site's memories (active and soft-deleted) as one JSON document.

    DATA_DIR may be a ``postgresql://`` DSN (with ``--pg-schema``): the memories a PostgreSQL store keeps.
    """
    if _is_dsn(args.data_dir):
        try:
            with _memories_of(args) as pg:
                return _write_export(args, [m.to_json() for m in pg.all(args.site)])
        except (StoreError, OSError) as exc:
            return fail(f"export failed: {exc}", EXIT_OPERATIONAL)
    bad = _not_a_data_dir(args.data_dir)
    if bad is not None:
        return bad
    try:
        with LongTermMemory(args.data_dir) as store:
            records = [m.to_json() for m in store.site(args.site).all()]
    except (StoreError, OSError) as exc:
        return fail(f"export failed: {exc}", EXIT_OPERATIONAL)
    return _write_export(args, records)


def _write_export(args: argparse.Namespace, records: list[dict[str, Any]]) -> int:
    doc = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "site": args.site,
        "exported_at": format_us(now_us()),
        "memories": records,
    }
    data = (json.dumps(doc, ensure_ascii=False, indent=2) + "\n").encode()
    try:
        if args.output:
            tmp = f"{args.output}.tmp.{os.getpid()}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, args.output)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    except OSError as exc:
        return fail(f"export failed: {exc}", EXIT_OPERATIONAL)
    sys.stderr.write(f"exported {_count(len(records))}\n")
    return EXIT_CLEAN


def parse_record(raw: Any, i: int) -> Memory:
    """One exported record back to a Memory; InvalidMemory naming ``memories[i].field``."""
    where = f"memories[{i}]"
    if not isinstance(raw, dict):
        raise InvalidMemory(where, "expected a JSON object")
    mid = check_memory_id(raw.get("id"), f"{where}.id")
    writable = {
        k: raw[k]
        for k in ("category", "subject", "summary", "details", "tags", "source_uris", "dedupe_key")
        if k in raw
    }
    fields = parse_fields(writable, f"{where}.")
    status = raw.get("status")
    if status not in (STATUS_ACTIVE, STATUS_DELETED):
        raise InvalidMemory(f"{where}.status", "expected 'active' or 'deleted'")
    stamps: dict[str, int | None] = {}
    for key in ("created_at", "updated_at", "last_accessed_at", "deleted_at"):
        value = raw.get(key)
        if value is None and key in ("last_accessed_at", "deleted_at"):
            stamps[key] = None
            continue
        try:
            stamps[key] = parse_rfc3339(value) if isinstance(value, str) else None
        except ValueError:
            stamps[key] = None
        if stamps[key] is None:
            raise InvalidMemory(f"{where}.{key}", "expected an RFC 3339 timestamp with microseconds and Z")
    if (status == STATUS_DELETED) != (stamps["deleted_at"] is not None):
        raise InvalidMemory(f"{where}.deleted_at", "must be set exactly when status is 'deleted'")
    version = raw.get("version")
    if type(version) is not int or version < 1:
        raise InvalidMemory(f"{where}.version", "expected an integer >= 1")
    created, updated = stamps["created_at"], stamps["updated_at"]
    assert created is not None and updated is not None
    return Memory(
        mid, fields, status, created, updated, stamps["last_accessed_at"] or updated, stamps["deleted_at"], version
    )


def restore(args: argparse.Namespace) -> int:
    """``convmem import --memories``: add an export's memories to a site (ids, timestamps, versions kept)."""
    bad = None if _is_dsn(args.data_dir) else _not_a_data_dir(args.data_dir)
    if bad is not None:
        return bad
    try:
        if args.input:
            with open(args.input, "rb") as f:
                data = f.read()
        else:
            data = sys.stdin.buffer.read()
    except OSError as exc:
        return fail(f"cannot read the input: {exc}", EXIT_OPERATIONAL)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        return fail(f"the input is not JSON: {exc}", EXIT_BAD_INPUT)
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT or doc.get("version") != EXPORT_VERSION:
        return fail(f"the input is not a {EXPORT_FORMAT} v{EXPORT_VERSION} export", EXIT_BAD_INPUT)
    raw = doc.get("memories")
    if not isinstance(raw, list):
        return fail("the input has no `memories` list", EXIT_BAD_INPUT)
    try:
        records = [parse_record(r, i) for i, r in enumerate(raw)]
    except InvalidMemory as exc:
        return fail(f"nothing imported: {exc}", EXIT_BAD_INPUT)
    if len({m.memory_id for m in records}) != len(records):
        return fail("nothing imported: the input holds one id twice", EXIT_BAD_INPUT)
    try:
        with _memories_of(args) if _is_dsn(args.data_dir) else LongTermMemory(args.data_dir) as store:
            added, present = store.import_records(args.site, records)
    except InvalidMemory as exc:
        return fail(f"import stopped: {exc} (records before it were imported)", EXIT_BAD_INPUT)
    except StoreError as exc:
        return fail(
            f"import stopped: {exc} (records before it were imported)",
            EXIT_BAD_INPUT if not exc.retryable else EXIT_OPERATIONAL,
        )
    except OSError as exc:
        return fail(f"import failed: {exc}", EXIT_OPERATIONAL)
    sys.stderr.write(f"imported {_count(added)}; {present} already present\n")
    return EXIT_CLEAN


# ------------------------------------------------------------------ stats


def stats_lines(data_dir: str, site: str | None) -> list[str]:
    lines = []
    for s in mcheck.stats(data_dir, site):
        line = (
            f"site {s.site} memories: {s.active} active, {s.deleted} soft-deleted "
            f"({s.fill * 100:.2f}% of the 10,000 limit), {plural(s.events, 'event')}, {human_bytes(s.log_bytes)} log"
        )
        if s.oldest_deleted_us is not None:
            line += f", oldest soft delete {format_us(s.oldest_deleted_us)}"
        if s.error:
            line += f"; {s.error}"
        lines.append(line)
    return lines


def stats_json(data_dir: str, site: str | None, doc: list[dict[str, Any]]) -> None:
    """Add ``memories`` to each site entry of the stats JSON (and entries for memory-only sites)."""
    by_site = {d["site"]: d for d in doc}
    for s in mcheck.stats(data_dir, site):
        entry = {
            "active": s.active,
            "deleted": s.deleted,
            "events": s.events,
            "log_bytes": s.log_bytes,
            "fill": s.fill,
            "oldest_deleted_at": format_us(s.oldest_deleted_us) if s.oldest_deleted_us is not None else None,
            "error": s.error,
        }
        if s.site in by_site:
            by_site[s.site]["memories"] = entry
        else:
            doc.append(
                {
                    "site": s.site,
                    "conversations": 0,
                    "items": 0,
                    "bytes_on_disk": 0,
                    "largest": [],
                    "damaged": [],
                    "memories": entry,
                }
            )
