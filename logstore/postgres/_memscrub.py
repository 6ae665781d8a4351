"""Scrubbing erased memories out of the table's pages: ``VACUUM FULL`` of the site's partition.

A DELETE leaves the row's bytes in the heap page and its index entries, and a
plain ``VACUUM`` marks that space free without overwriting it (measured on the
test cluster: the dedupe_key stays in the b-tree). ``VACUUM FULL`` writes the
partition, its TOAST table and its indexes into new files holding the rows it
must keep only and truncates the old ones. It takes an ACCESS EXCLUSIVE lock on
the one partition (of ``MEMORY_PARTITIONS``) holding the site, so calls of sites
in other partitions go on meanwhile. Scrubs are serialised across servers by an
advisory lock, and wait at most the store's ``lock_timeout`` for the partition.

``VACUUM FULL`` cannot run inside a transaction block, so it runs after the
erasing transaction committed, on an autocommit connection of the pool.

What the rewrite must keep. ``VACUUM FULL`` copies a deleted row version too
while some transaction may still see it: it keeps every version deleted by a
transaction that does not precede the database's removal horizon (PostgreSQL
15's ``GetOldestNonRemovableTransactionId``): the oldest snapshot
(``backend_xmin``) and running transaction (``backend_xid``) of every other
session in this database or in none (a walsender's ``hot_standby_feedback``),
except lazy vacuums (``PROC_IN_VACUUM``), and every replication slot's
effective ``xmin``, every prepared transaction, minus
``vacuum_defer_cleanup_age``. (A slot's ``catalog_xmin`` holds back catalog
tables only, never ``memories``.) So the erasing transaction records its id in
``memory_scrubs`` (in the same commit), and a scrub reads, before it rewrites,
which owed erasures precede that horizon, twice: from the views, in one
statement (:data:`_AGES`), and from the server itself, the ``removable cutoff``
a lazy ``VACUUM (VERBOSE)`` of ``memory_scrubs`` reports (:func:`removal_cutoff`:
it also sees what no view shows, such as a logical slot being created with an
exported snapshot, whose effective ``xmin`` ``pg_replication_slots`` does not
show). Only erasures both readings put before the horizon are certain to be
dropped by the rewrite (which computes its horizon later, and a horizon moves
forward but for a standby's feedback, which the views show), and only their
records are deleted after it. An erasure still owed
after the rewrite is answered with what holds it (:func:`holders`, the views
again); when nothing named holds it any more (the holder ended during the
rewrite), the partition is rewritten once more, and after that it is answered
as held by :data:`UNNAMED`. A call waits up to its ``lock_timeout`` for what
holds its erasure to end before it rewrites (the short snapshots of other
calls end in milliseconds), so only a snapshot held longer is reported. The
rewrite runs ``VERBOSE``, and when its report says it kept no dead row version
at all (``0 dead row versions cannot be removed yet``, read when the server's
messages are in English), every erasure owed before it is done, whatever the
readings found.

Where the views and the horizon can disagree: the views are read one backend at
a time, so a backend leaving a lazy vacuum and starting an ``ANALYZE`` in the
instant between the reads of its progress and of its ``backend_xmin`` could be
left out; the server's cutoff, read next, still counts it. A snapshot on a
Citus worker holds the worker's horizon, which neither reading sees.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..errors import Unavailable
from ._schema import MEMORY_PARTITIONS, memory_partition

#: Advisory lock key held while a server rewrites a partition of ``memories`` (any fixed 64-bit number).
SCRUB_LOCK = 0x636D6D656D736372

#: The sessions whose snapshot (``backend_xmin``) or transaction (``backend_xid``) the removal horizon of this
#: database's tables honours (PostgreSQL 15's ``ComputeXidHorizons``): every backend of this database and every
#: backend of none (a walsender's ``hot_standby_feedback``), but not the two launchers, which have no database
#: and no feedback, and not a lazy ``VACUUM`` (manual or autovacuum, and its parallel workers: they run with
#: ``PROC_IN_VACUUM``, which the horizon skips; ``pg_stat_progress_vacuum`` lists exactly those leaders). A
#: ``VACUUM FULL`` or an ``ANALYZE`` has no such flag, and counts. Unknown values (a viewer without
#: ``pg_read_all_stats`` sees no ``backend_type`` or ``leader_pid`` of other users' sessions) count.
_HOLDING_SESSION = """
pid <> pg_backend_pid()
   AND (datid = (SELECT oid FROM pg_database WHERE datname = current_database())
        OR (datid IS NULL AND backend_type IS DISTINCT FROM 'autovacuum launcher'
            AND backend_type IS DISTINCT FROM 'logical replication launcher'))
   AND coalesce(leader_pid, pid) NOT IN (SELECT v.pid FROM pg_stat_progress_vacuum AS v)
"""

#: The ages (``age(xid)``, in one statement: one base) of everything holding back the removal horizon of
#: this database's tables, as the column ``a`` (see the module's docstring).
_AGES = f"""
SELECT greatest(age(backend_xmin), age(backend_xid)) FROM pg_stat_activity WHERE {_HOLDING_SESSION}
UNION ALL SELECT age(xmin) FROM pg_replication_slots
UNION ALL SELECT age(transaction) FROM pg_prepared_xacts WHERE database = current_database()
"""
_DEFER = "coalesce(nullif(current_setting('vacuum_defer_cleanup_age', true), '')::int, 0)"

#: What holds back the horizon at or before the erasure whose id (xid8, as text) is the parameter.
_HOLDERS = f"""
WITH x AS (SELECT age(%(xid)s::xid8::xid) AS a)
SELECT CASE WHEN datid IS NULL AND backend_type = 'walsender'
            THEN format('the hot_standby_feedback of standby %%s (walsender pid %%s)',
                        coalesce(nullif(application_name, ''), host(client_addr), 'with no name'), pid)
            ELSE format('session pid %%s%%s', pid, coalesce(' (' || concat_ws(', ', backend_type, 'user ' || usename,
                        nullif(application_name, ''), 'in a transaction since ' || xact_start::text) || ')', ''))
       END
  FROM pg_stat_activity, x
 WHERE {_HOLDING_SESSION}
   AND greatest(age(backend_xmin), age(backend_xid)) >= x.a
UNION ALL
SELECT format('replication slot %%s (xmin %%s)', slot_name, xmin) FROM pg_replication_slots, x WHERE age(xmin) >= x.a
UNION ALL
SELECT format('prepared transaction %%s', gid) FROM pg_prepared_xacts, x
 WHERE database = current_database() AND age(transaction) >= x.a
UNION ALL
SELECT format('vacuum_defer_cleanup_age = %%s', {_DEFER}) FROM x WHERE {_DEFER} > 0 AND x.a <= {_DEFER}
"""


class ScrubPending(Unavailable):
    """An erasure committed, but the rewrite that removes its bytes from the table's files is still owed.

    ``table`` is the partition, ``held`` what keeps the deleted row versions (empty when the rewrite failed).
    """

    def __init__(self, message: str, table: str, held: list[str]) -> None:
        super().__init__(message)
        self.table = table
        self.held = held


#: What ``Scrubbed.held`` says when the server's horizon keeps an owed erasure and no holder could be named.
UNNAMED = "a removal horizon this check could not name"


@dataclass
class Scrubbed:
    """What one scrub did: the seconds its rewrites took, what still holds an owed erasure (empty: none), and the
    database's removal horizon (``removable cutoff``) as last read, None when unread."""

    seconds: float = 0.0
    held: list[str] = field(default_factory=list)
    cutoff: int | None = None

    @property
    def unnamed(self) -> bool:
        """True when the erasure is still owed and nothing this check reads could be named as the holder."""
        return self.held == [UNNAMED]


def partition_of(conn: psycopg.Connection[Any], schema: str, site: str) -> str:
    """The table holding ``site``'s memories: its partition, or ``memories`` when the table is not partitioned."""
    table = sql.SQL("{}.memories").format(sql.Identifier(schema)).as_string(conn)
    row = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone()
    if row is None or row[0] != "p":
        return "memories"
    row = conn.execute(
        "SELECT r FROM generate_series(0, %s - 1) AS r WHERE satisfies_hash_partition(%s::regclass, %s, r, %s::text)",
        (MEMORY_PARTITIONS, table, MEMORY_PARTITIONS, site),
    ).fetchone()
    assert row is not None
    return memory_partition(int(row[0]))


def _in_table(schema: str, table: str) -> sql.Composable:
    """The condition on ``memory_scrubs.site`` of the sites whose rows ``table`` holds."""
    if table == "memories":
        return sql.SQL("true")
    remainder = int(table.removeprefix("memories_p"))
    parent = sql.SQL("{}.memories").format(sql.Identifier(schema))
    return sql.SQL("satisfies_hash_partition({}::regclass, {}, {}, site)").format(
        sql.Literal(parent.as_string(None)), sql.Literal(MEMORY_PARTITIONS), sql.Literal(remainder)
    )


_KEPT = re.compile(r"^(\d+) dead row versions cannot be removed yet")
_CUTOFF = re.compile(r"^removable cutoff: (\d+)", re.MULTILINE)


def removal_cutoff(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The database's removal horizon now, as the server computes it: the ``removable cutoff`` (a 32-bit xid) that
    a lazy ``VACUUM (VERBOSE)`` of the small table ``memory_scrubs`` reports (every plain table of a database has
    one horizon). None when the report is not there: messages not in English (``lc_messages``), or the table
    locked by another vacuum (``SKIP_LOCKED``); then the horizon check of the views alone decides."""
    messages: list[str] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        messages.append(diag.message_primary or "")

    conn.add_notice_handler(note)
    try:
        conn.execute(
            sql.SQL("VACUUM (VERBOSE, SKIP_LOCKED) {}.memory_scrubs").format(sql.Identifier(schema)), prepare=False
        )
    finally:
        conn.remove_notice_handler(note)
    for message in messages:
        found = _CUTOFF.search(message)
        if found:
            return int(found.group(1))
    return None


def precedes(xid: str, cutoff: int) -> bool:
    """Whether transaction ``xid`` (a xid8, as text) precedes the 32-bit ``cutoff``: the row versions it deleted are
    removable below that horizon (PostgreSQL's ``TransactionIdPrecedes``, modulo 2**32)."""
    return ((int(xid) - cutoff) & 0xFFFFFFFF) >= 0x80000000


def kept_versions(details: list[str]) -> int | None:
    """How many deleted row versions ``VACUUM (FULL, VERBOSE)`` reported it had to keep (from the DETAIL of its
    notices); None when its report is not there or not in English (``lc_messages``): then the horizon check
    alone decides."""
    for detail in details:
        found = _KEPT.match(detail)
        if found:
            return int(found.group(1))
    return None


def holders(conn: psycopg.Connection[Any], xid: str) -> list[str]:
    """What may still see row versions deleted by transaction ``xid`` (a xid8, as text); empty: nothing."""
    return [str(r[0]) for r in conn.execute(_HOLDERS.encode(), {"xid": xid}).fetchall()]


def owed_tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """The tables (partitions) with an owed rewrite, oldest debt first."""
    rows = conn.execute(
        sql.SQL("SELECT site FROM {}.memory_scrubs ORDER BY owed_since, site").format(sql.Identifier(schema))
    ).fetchall()
    out: list[str] = []
    for (site,) in rows:
        table = partition_of(conn, schema, str(site))
        if table not in out:
            out.append(table)
    return out


def scrub(
    conn: psycopg.Connection[Any], schema: str, table: str, lock_timeout_s: float, site: str | None = None,
    *, only_if_due: bool = False, wait_s: float = 0.0,
) -> Scrubbed:
    """Rewrite ``schema.table`` without the row versions of its owed erasures (autocommit ``conn``).

    ``held`` of the result names what still holds ``site``'s owed erasure (with no ``site``: the table's oldest
    owed erasure); psycopg errors (a lock not granted in time, a lost connection) leave the records owed.
    Before a rewrite, it waits up to ``wait_s`` seconds in all for what holds that erasure to end (a snapshot
    of an ordinary call ends within milliseconds); the rewrite is not done while that wait goes on, and no
    advisory lock is held. ``only_if_due``: no rewrite when it would clear no record (all are still held).
    """
    s = sql.Identifier(schema)
    in_table = _in_table(schema, table)
    owed_now_q = sql.SQL(
        "SELECT site, erased_xid::text, age(erased_xid::xid) > "
        "greatest(coalesce((SELECT max(a) FROM (" + _AGES + ") AS c(a)), 0), 0) + " + _DEFER
        + " FROM {s}.memory_scrubs WHERE {t}"
    ).format(s=s, t=in_table)
    clear_q = sql.SQL("DELETE FROM {s}.memory_scrubs WHERE site = %s AND erased_xid = %s::xid8").format(s=s)
    if site is not None:
        owed_q = sql.SQL("SELECT erased_xid::text FROM {s}.memory_scrubs WHERE site = %s").format(s=s)
        owed_args: tuple[Any, ...] = (site,)
    else:
        owed_q = sql.SQL(
            "SELECT erased_xid::text FROM {s}.memory_scrubs WHERE {t} ORDER BY erased_xid LIMIT 1"
        ).format(s=s, t=in_table)
        owed_args = ()
    vacuum = sql.SQL("VACUUM (FULL, VERBOSE) {}.{}").format(s, sql.Identifier(table))
    done = Scrubbed()
    notes: list[str] = []

    def note(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_detail or "")  # read now: the diagnostic is valid during the call only

    deadline = time.monotonic() + wait_s
    for _ in range(2):
        target = conn.execute(owed_q, owed_args).fetchone()
        if target is not None:
            _wait_for_holders(conn, str(target[0]), deadline)
        conn.execute("SELECT pg_advisory_lock(%s)", (SCRUB_LOCK,))
        try:
            owed_now = conn.execute(owed_now_q).fetchall()
            # Read after the views: the rewrite below computes its horizon later still, at or past this one.
            done.cutoff = removal_cutoff(conn, schema)
            safe = [row for row in owed_now if row[2] and (done.cutoff is None or precedes(row[1], done.cutoff))]
            if only_if_due and not safe:
                owed = conn.execute(owed_q, owed_args).fetchone()
                done.held = holders(conn, str(owed[0])) if owed is not None else []
                if owed is not None and not done.held and done.cutoff is not None and not precedes(
                    str(owed[0]), done.cutoff
                ):
                    done.held = [UNNAMED]  # the server's horizon keeps it: a rewrite now could not drop it
                if done.held or owed is None:
                    return done
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (str(max(1, round(lock_timeout_s * 1000))),))
            started = time.monotonic()
            notes.clear()
            conn.add_notice_handler(note)
            try:
                conn.execute(vacuum, prepare=False)
            finally:
                conn.remove_notice_handler(note)
                conn.execute("SELECT set_config('lock_timeout', '0', false)")
            done.seconds += time.monotonic() - started
            if kept_versions(notes) == 0:
                safe = owed_now  # the rewrite kept no deleted version at all: every erasure before it is gone
            for row in safe:
                conn.execute(clear_q, (row[0], row[1]))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SCRUB_LOCK,))
        owed = conn.execute(owed_q, owed_args).fetchone()
        if owed is None:
            done.held = []
            return done
        done.held = holders(conn, str(owed[0]))
        if done.held and time.monotonic() >= deadline:
            return done
        # Owed, and what holds it ended during the rewrite, or may end before the deadline: once more.
    if not done.held:
        done.held = [UNNAMED]
    return done


def _wait_for_holders(conn: psycopg.Connection[Any], xid: str, deadline: float) -> None:
    """Wait until nothing may see the row versions transaction ``xid`` deleted, or until ``deadline``."""
    pause = 0.01
    while time.monotonic() < deadline and holders(conn, xid):
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)
