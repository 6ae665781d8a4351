"""What ``convmem fsck`` and ``convmem stats`` read of the long-term memories in PostgreSQL.

:func:`check_memories` reads every row of ``memories`` (and ``memory_sites``)
and reports, as :class:`~logstore.memories.check.MemoryProblem` records like
the file store's check, what a server would stumble over:

* ``record-undecodable``: ``record`` is not the JSON of valid writable fields;
* ``bad-record``: a status other than active/deleted, ``deleted_at`` set
  without the deleted status or missing with it, a version below 1, or
  ``updated_at`` before ``created_at``;
* ``dedupe-mismatch``: the ``dedupe_key`` column is not the record's, so the
  unique index guards another key than the memory has; ``dedupe-duplicate``:
  two active memories of a site share one key (the index should forbid it);
* ``vector-missing``, ``vector-undecodable``, ``vector-wrong-model``,
  ``vector-wrong-dimension``, ``vector-stale`` (made from another text) and
  ``vector-damaged`` (not finite or not unit length): a vector every server
  would have to compute again at each start;
* ``counter-missing``/``counter-behind``/``counter-inconsistent``: the site's
  ``memory_sites`` row is absent, its ``changes`` is below a row's ``change``
  (servers could miss that row), or its ``erased`` is above ``changes``.

Only the counters are repaired (``repair``): the site's counter is moved past
every row and marked erased, in the writers' own transaction order, so every
server reads the site again whole. The rest is reported and left.

:func:`memory_stats` gives the per-site counts ``stats`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ..memories.check import MemoryCheck, MemoryProblem
from ..memories.encoder import DIM, MODEL_ID
from ..memories.errors import InvalidMemory, LooksLikeSecret
from ..memories.indexing import fields_doc
from ..memories.record import STATUS_ACTIVE, STATUS_DELETED, Fields, fields_from_stored, parse_fields
from ..memories.retrieval import embedding_text
from ..memories.vectors import text_digest, unpack
from ._memsql import MemoryStatements
from ._store import PgStore

_ROWS = (
    "SELECT memory_id, status, version, created_at, updated_at, deleted_at, dedupe_key, record, vec, change "
    "FROM {s}.memories WHERE site = %s ORDER BY memory_id"
)
_SITES = "SELECT site FROM {s}.memories UNION SELECT site FROM {s}.memory_sites ORDER BY 1"
_COUNTERS = "SELECT changes, erased FROM {s}.memory_sites WHERE site = %s"
_STATS = (
    "SELECT site, count(*) FILTER (WHERE status = 'active'), count(*) FILTER (WHERE status <> 'active'), "
    "coalesce(sum(octet_length(record) + coalesce(octet_length(vec), 0)), 0), count(vec), "
    "min(deleted_at) FROM {s}.memories WHERE site = coalesce(%s, site) GROUP BY site ORDER BY site"
)
# Past every row's change, and marked erased: every server holding the site reads it again whole.
_FIX_COUNTERS = (
    "INSERT INTO {s}.memory_sites AS ms (site, changes, erased) VALUES (%(site)s, %(n)s, %(n)s) "
    "ON CONFLICT (site) DO UPDATE SET changes = greatest(ms.changes + 1, %(n)s), "
    "erased = greatest(ms.changes + 1, %(n)s)"
)


@dataclass(frozen=True)
class PgMemoryStats:
    site: str
    active: int
    deleted: int
    #: Bytes of the stored records and vectors (not table or index sizes).
    bytes: int
    vectors: int
    oldest_deleted_us: int | None

    @property
    def missing_vectors(self) -> int:
        return self.active + self.deleted - self.vectors


def _q(store: PgStore, text: str) -> bytes:
    from psycopg import sql

    return sql.SQL(text).format(s=sql.Identifier(store.schema)).as_string(None).encode()


def memory_stats(store: PgStore, site: str | None = None) -> list[PgMemoryStats]:
    """Per site holding memories: active and soft-deleted counts, bytes, vectors stored."""
    with store._conn() as conn:
        rows = conn.execute(_q(store, _STATS), (site,)).fetchall()
    return [
        PgMemoryStats(str(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]) if r[5] is not None else None)
        for r in rows
    ]


def check_memories(store: PgStore, site: str | None = None, repair: bool = False) -> MemoryCheck:
    """Check every memory row (of ``site`` only, when given); see the module's docstring."""
    report = MemoryCheck()
    with store._conn() as conn:
        sites = [site] if site is not None else [str(r[0]) for r in conn.execute(_q(store, _SITES)).fetchall()]
    for name in sites:
        with store._conn() as conn:
            rows = conn.execute(_q(store, _ROWS), (name,)).fetchall()
            counters = conn.execute(_q(store, _COUNTERS), (name,)).fetchone()
        if not rows and counters is None:
            continue
        report.sites += 1
        report.memories += len(rows)
        _check_rows(name, rows, report)
        _check_counters(store, name, rows, counters, repair, report)
    return report


def _problem(report: MemoryCheck, kind: str, site: str, mid: str, detail: str, action: str) -> MemoryProblem:
    p = MemoryProblem(kind, site, f"memories row {mid}" if mid else "memory_sites", None, detail, action)
    report.problems.append(p)
    return p


def _check_rows(site: str, rows: list[Any], report: MemoryCheck) -> None:
    keys: dict[str, str] = {}
    for mid, status, version, created, updated, deleted, key, record, vec, _change in rows:
        mid = str(mid)
        try:
            fields = _fields(bytes(record))
        except (msgspec.DecodeError, KeyError, TypeError, InvalidMemory) as exc:
            _problem(report, "record-undecodable", site, mid, f"the record does not decode: {exc}",
                     "left: erase it (memory_delete with force) or restore it from a backup")
            continue
        bad = []
        if status not in (STATUS_ACTIVE, STATUS_DELETED):
            bad.append(f"status {status!r}")
        if (status == STATUS_DELETED) != (deleted is not None):
            bad.append(f"status {status!r} with deleted_at {'set' if deleted is not None else 'missing'}")
        if int(version) < 1:
            bad.append(f"version {version}")
        if int(updated) < int(created):
            bad.append("updated_at before created_at")
        if bad:
            _problem(report, "bad-record", site, mid, "; ".join(bad), "left: restore the memory from a backup")
        if key != fields.dedupe_key:
            _problem(report, "dedupe-mismatch", site, mid,
                     f"the dedupe_key column is {key!r}, the record's is {fields.dedupe_key!r}",
                     "left: the unique index guards the column; update the memory to write both again")
        elif key is not None and status == STATUS_ACTIVE:
            if key in keys:
                _problem(report, "dedupe-duplicate", site, mid,
                         f"dedupe_key {key!r} is also held by the active memory {keys[key]}",
                         "left: delete one of the two (the memories_dedupe index should have refused it)")
            keys.setdefault(key, mid)
        text = embedding_text(fields_doc(mid, fields, status == STATUS_ACTIVE))
        why = _vector_problem(vec, text)
        if why is not None:
            _problem(report, why[0], site, mid, why[1],
                     "left: every server computes this vector again when it loads the site; "
                     "updating the memory stores a new one")


def _fields(record: bytes) -> Fields:
    """The writable fields of a stored record, checked as a write checks them (but for credentials: a record
    written before a rule was added is still a record)."""
    raw = msgspec.json.decode(record)
    if not isinstance(raw, dict):
        raise TypeError("not a JSON object")
    fields = fields_from_stored(raw)
    try:
        parse_fields(raw)
    except LooksLikeSecret:
        pass
    return fields


def _vector_problem(vec: Any, text: str) -> tuple[str, str] | None:
    if vec is None:
        return "vector-missing", "no vector is stored"
    try:
        stored = msgspec.json.decode(bytes(vec))
    except msgspec.DecodeError as exc:
        return "vector-undecodable", f"the stored vector does not decode: {exc}"
    if not isinstance(stored, dict) or not isinstance(stored.get("f16"), str):
        return "vector-undecodable", "the stored vector is not an object with f16"
    if stored.get("model") != MODEL_ID:
        return "vector-wrong-model", f"made by model {stored.get('model')!r}, not {MODEL_ID!r}"
    f16 = stored["f16"]
    if len(f16) != 4 * ((2 * DIM + 2) // 3):
        return "vector-wrong-dimension", f"{len(f16)} base64 characters, not those of {DIM} dimensions"
    if stored.get("text") != text_digest(text):
        return "vector-stale", "made from another text than the memory has"
    if unpack(stored, MODEL_ID, text, DIM) is None:
        return "vector-damaged", "the vector is not finite or not of unit length"
    return None


def _check_counters(store: PgStore, site: str, rows: list[Any], counters: Any, repair: bool,
                    report: MemoryCheck) -> None:
    top = max((int(r[9]) for r in rows), default=0)
    found: list[MemoryProblem] = []
    if counters is None:
        found.append(_problem(report, "counter-missing", site, "", "the site holds memories but no memory_sites row",
                              "servers may not notice the site's changes; run fsck --repair"))
    else:
        changes, erased = int(counters[0]), int(counters[1])
        if changes < top:
            found.append(_problem(report, "counter-behind", site, "",
                                  f"changes is {changes}, a row was written at change {top}",
                                  "servers may miss rows written since; run fsck --repair"))
        if erased > changes:
            found.append(_problem(report, "counter-inconsistent", site, "", f"erased {erased} > changes {changes}",
                                  "servers may read the site again at every call; run fsck --repair"))
    if not found or not repair:
        return
    sql_ = MemoryStatements(store.schema)
    with store._conn(writing=True) as conn, conn.transaction():
        conn.execute(_q(store, _FIX_COUNTERS), {"site": site, "n": top + 1})
        conn.execute(sql_.notify, (f"{store.schema}/{site}",))
    for p in found:
        p.repaired = True
        p.action = "the counter was moved past every row and marked erased: every server reads the site again"
