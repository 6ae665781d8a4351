"""``PgStore``: the :class:`~logstore.MemoryStore` on PostgreSQL.

One conversation is one row of ``conversations`` (its next seq, first and
last ``recorded_at``) plus one row of ``items`` per item. An append is one
statement in its own transaction, ``SELECT * FROM append_batch(...)``: the
function locks (or creates, then locks) the conversation row, takes the seq
range, stamps the batch with ``greatest(previous, clock)`` read after the
lock was granted, and inserts the items. Two appenders of one conversation,
in any number of server processes, therefore get consecutive, gapless ranges.
The call returns only after PostgreSQL reports the commit; with
``synchronous_commit`` on (checked at start-up and on every new connection)
that means the commit is flushed to disk, and to the synchronous standby when
one is configured.

Connections come from a ``psycopg_pool.ConnectionPool``. Statements are
prepared by the server after a few uses (psycopg's ``prepare_threshold``);
``prepare=False`` turns that off for PgBouncer in transaction-pooling mode.
Each connection may keep every statement text this store and its memory
store can run prepared (``prepared_max``, see :func:`prepared_max_for`): the
memory statements name the site's partition, so a connection serving all
partitions runs several hundred texts, and psycopg's default bound of 100
evicted them in turn (measured with ``python -m bench.probes.pg_prepared``:
9 of about 120 hot statements stayed prepared).
Per-call limits travel inside the statements (the append sets its own
``lock_timeout`` transaction-locally), and ``statement_timeout`` is set on
each new connection, so no session state is needed beyond that.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
import psycopg
import psycopg_pool
from psycopg import sql

from ..codec import decode_batch, encode_items
from ..errors import (
    ConversationFull,
    Corrupted,
    IdempotencyConflict,
    IdempotencyRedacted,
    SeqConflict,
    StoreError,
    Unavailable,
)
from ..idempotency import digest
from ..ids import ConversationId, SiteName, check_expected_next_seq, check_idempotency_key
from ..limits import MAX_CONVERSATION_ITEMS
from ..model import (
    ConversationListing,
    ConversationSummary,
    ListCursor,
    ListSelector,
    MemoryItem,
    Range,
    ReadSelector,
    SeqRange,
    Tail,
)
from ..store import MemoryStore
from ..timefmt import format_us, parse_rfc3339
from ._dsn import DEFAULT_SCHEMA
from ._errors import first_line, translate
from ._follow import Listener
from ._memsql import memory_statement_texts
from ._schema import (
    SCHEMA_VERSION,
    SQLSTATE_FULL,
    SQLSTATE_KEY_CONFLICT,
    SQLSTATE_SEQ_CONFLICT,
    ddl,
    keys_ddl,
    memories_ddl,
    partition_memories_ddl,
    scrubs_ddl,
)

logger = logging.getLogger("logstore.postgres")

#: ``synchronous_commit`` values under which a returned COMMIT is durable on the primary.
_DURABLE_COMMIT = frozenset({"on", "local", "remote_write", "remote_apply"})
#: Advisory lock key serializing concurrent schema creation (any fixed 64-bit number).
_DDL_LOCK = 0x636F6E766D656D
#: Room in ``prepared_max`` for the statements of neither statement class (credentials, followers, scrubs, checks).
PREPARED_SLACK = 64


def prepared_max_for(schema: str) -> int:
    """How many prepared statements a pooled connection keeps: every text of the conversation store and of the
    memory store (all partitions), plus ``PREPARED_SLACK``, so a round-robin over the partitions evicts none."""
    return len(_Statements(schema).texts() | memory_statement_texts(schema)) + PREPARED_SLACK


class AsyncCommitRefused(Unavailable):
    """The server acknowledges commits before they are durable (``synchronous_commit = off``)."""


class PgStore(MemoryStore):
    """A :class:`MemoryStore` on PostgreSQL; many processes may share one database.

    ``dsn`` is a libpq connection string or URI (several hosts and
    ``target_session_attrs=read-write`` make it follow a failover). The
    schema is created when missing. Raises ``Unavailable`` when the server
    cannot be reached within ``connect_timeout`` or refuses durable commits.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        lock_timeout: float = 5.0,
        statement_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        pool_min: int = 1,
        pool_max: int = 16,
        prepare: bool = True,
        allow_async_commit: bool = False,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        self.allow_async_commit = allow_async_commit
        self._closed = False
        self._lock = threading.Lock()
        self._sql = _Statements(schema)
        #: ``prepared_max`` of each pooled connection (see the module's docstring).
        self.prepared_max = prepared_max_for(schema)
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": 5 if prepare else None,
            "connect_timeout": max(1, round(connect_timeout)),
        }
        self._pool = psycopg_pool.ConnectionPool(
            dsn,
            min_size=pool_min,
            max_size=max(pool_min, pool_max),
            kwargs=kwargs,
            configure=self._configure,
            timeout=connect_timeout,
            open=False,
            name="convmem",
        )
        try:
            # Connect once synchronously so that an unreachable server is a clear error now.
            with psycopg.connect(dsn, **kwargs) as conn:
                self._check_commit_mode(conn)
                self._create_schema(conn)
        except StoreError:
            raise
        except psycopg.Error as exc:
            raise Unavailable(f"cannot use PostgreSQL at {redact_dsn(dsn)}: {first_line(exc)}") from exc
        self._pool.open(wait=False)
        #: How this store connects (for the listening connections of followers and of the memory store).
        self.connect_kwargs = kwargs
        self._listener = Listener(dsn, schema, kwargs)

    # ------------------------------------------------------------ plumbing

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Run on each new pooled connection: durability check, statement timeout, sync-rep watch."""
        mode = self._check_commit_mode(conn)
        conn.prepared_max = self.prepared_max
        conn_id = id(conn)
        conn.add_notice_handler(lambda diag: _watch_sync_rep_cancel(diag, conn_id))
        # Pin the (durable) commit mode to this session: a later server-wide change
        # to synchronous_commit = off (a reload) then cannot reach our connections.
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false), set_config('synchronous_commit', %s, false)",
            (str(max(1, round(self.statement_timeout * 1000))), mode),
        )

    def _check_commit_mode(self, conn: psycopg.Connection[Any]) -> str:
        """The session's ``synchronous_commit``; raises AsyncCommitRefused unless durable or overridden."""
        mode = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
        if mode in _DURABLE_COMMIT:
            return mode
        if self.allow_async_commit:
            logger.warning(
                "PostgreSQL runs with synchronous_commit = %s: acknowledged appends can be LOST in a crash "
                "(allowed by the explicit override)",
                mode,
            )
            return mode
        raise AsyncCommitRefused(
            f"PostgreSQL runs with synchronous_commit = {mode}: a commit is acknowledged before it is durable, "
            "so convmem refuses to serve; turn it on (or pass the explicit override to accept losing data)"
        )

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Create the schema unless it is there already (then nothing is changed, e.g. under Citus).

        Refuses a schema made by a newer convmem (a higher version in ``meta``).
        """
        version = self._schema_version(conn)
        if version is None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                conn.execute(ddl(self.schema))
            version = self._schema_version(conn)
        if version != SCHEMA_VERSION:
            raise Unavailable(
                f"schema {self.schema} is at version {version}; this convmem understands version {SCHEMA_VERSION}"
            )
        # The last object of each addition: with it, all of that addition's objects are there.
        self._add(conn, "followers", keys_ddl(self.schema))
        self._add(conn, "memory_tokens", memories_ddl(self.schema))
        self._add(conn, "memory_scrubs", scrubs_ddl(self.schema))
        self._partition_memories(conn)

    def _partition_memories(self, conn: psycopg.Connection[Any]) -> None:
        """Make an unpartitioned ``memories`` (made by an older convmem) the partitioned table, in one transaction.

        Left as it is under Citus (a distributed table is converted by the operator, see deploy/citus.sql):
        erasures then rewrite the whole table.
        """
        table = sql.SQL("{}.memories").format(sql.Identifier(self.schema)).as_string(conn)
        query = "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)"
        row = conn.execute(query, (table,)).fetchone()
        if row is None or row[0] != "r":
            return
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is not None:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            row = conn.execute(query, (table,)).fetchone()
            if row is not None and row[0] == "r":
                conn.execute(partition_memories_ddl(self.schema))

    def _add(self, conn: psycopg.Connection[Any], last: str, statements: sql.Composed) -> None:
        """Run an addition's DDL on a schema made before it, unless its last object ``last`` is there."""
        table = sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(last)).as_string(conn)
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
        if row and row[0]:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
            conn.execute(statements)

    def _schema_version(self, conn: psycopg.Connection[Any]) -> int | None:
        meta = sql.SQL("{}.meta").format(sql.Identifier(self.schema)).as_string(conn)
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (meta,)).fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute(f"SELECT value FROM {meta} WHERE key = 'schema_version'".encode()).fetchone()
        return int(row[0]) if row else None

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")

    @contextmanager
    def _conn(self, *, writing: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; driver failures become store errors."""
        self._check_open()
        started = time.monotonic()
        try:
            with self._pool.connection() as conn:
                yield conn
        except StoreError:
            raise
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            if getattr(exc, "sqlstate", None) == SQLSTATE_FULL:
                detail = exc.diag.message_detail if isinstance(exc, psycopg.Error) else None
                raise ConversationFull(MAX_CONVERSATION_ITEMS, int(detail or MAX_CONVERSATION_ITEMS + 1)) from None
            raise translate(exc, time.monotonic() - started, writing=writing) from exc

    # ---------------------------------------------------------------- API

    def append(
        self,
        site: str,
        conversation_id: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        expected_next_seq: int | None = None,
    ) -> SeqRange:
        self._check_open()
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        checked = idempotency_key is not None or expected_next_seq is not None
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)
        if expected_next_seq is not None:
            check_expected_next_seq(expected_next_seq)
        parts = encode_items(payloads)
        lock_ms = max(1, round(self.lock_timeout * 1000))
        with self._conn(writing=True) as conn:
            _SYNC_CANCELLED.discard(id(conn))
            if checked:
                # The same digest as the file engine's: of the batch's JSON array.
                dig = digest(b"[" + b",".join(parts) + b"]") if idempotency_key is not None else None
                args = (site, conversation_id, parts, MAX_CONVERSATION_ITEMS, lock_ms, idempotency_key, dig,
                        expected_next_seq)
                try:
                    row = conn.execute(self._sql.append_checked, args).fetchone()
                except psycopg.Error as exc:
                    refused = _refusal(exc, idempotency_key, expected_next_seq)
                    if refused is None:
                        raise
                    if isinstance(refused, IdempotencyConflict):  # autocommit: the connection is usable
                        refused = self._key_conflict(conn, site, conversation_id, refused, parts)
                    raise refused from None
            else:
                row = conn.execute(
                    self._sql.append, (site, conversation_id, parts, MAX_CONVERSATION_ITEMS, lock_ms)
                ).fetchone()
            if id(conn) in _SYNC_CANCELLED:
                _SYNC_CANCELLED.discard(id(conn))
                raise Unavailable(
                    "PostgreSQL committed the batch locally but stopped waiting for the synchronous standby "
                    "before it confirmed; not acknowledged (a retry may store it twice)"
                )
        assert row is not None
        return SeqRange(int(row[0]), int(row[1]))

    def read(self, site: str, conversation_id: str, selector: ReadSelector) -> list[MemoryItem]:
        self._check_open()
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        if isinstance(selector, Tail):
            if selector.count == 0:
                return []
            with self._conn() as conn:
                rows = conn.execute(self._sql.tail, (site, conversation_id, selector.count)).fetchall()
            rows.reverse()
        elif isinstance(selector, Range):
            if selector.limit == 0:
                return []
            with self._conn() as conn:
                rows = conn.execute(self._sql.range, (site, conversation_id, selector.start, selector.limit)).fetchall()
        else:
            raise TypeError(f"selector must be Tail or Range, not {type(selector).__name__}")
        return _items(site, conversation_id, rows)

    def wait_for_items(self, site: str, conversation_id: str, seq: int, timeout: float) -> bool:
        # Woken by NOTIFY from the append of any server on the database (see _follow.py).
        self._check_open()
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        probe = Range(seq, 1)
        return self._listener.wait(
            self._conn, site, conversation_id, lambda: bool(self.read_raw(site, conversation_id, probe)), timeout
        )

    def forget_conversation(self, site: str, conversation_id: str) -> int:
        """Delete one conversation's items, keys and listing row in one transaction; how many items it held."""
        self._check_open()
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        with self._conn(writing=True) as conn, conn.transaction():
            row = conn.execute(self._sql.lock_conversation, (site, conversation_id)).fetchone()
            for statement in self._sql.forget:
                conn.execute(statement, (site, conversation_id))
        return int(row[0]) if row else 0

    def _key_conflict(
        self, conn: Any, site: str, conversation_id: str, refused: IdempotencyConflict, parts: list[bytes]
    ) -> IdempotencyConflict:
        """IdempotencyRedacted when a redaction of the key's batch may be why its items differ (as the file engine)."""
        from ..redaction import redacted_in_retry

        n = refused.last_seq - refused.first_seq + 1
        rows = conn.execute(self._sql.range, (site, conversation_id, refused.first_seq, n)).fetchall()
        hidden = redacted_in_retry([bytes(r[2]) for r in rows], [bytes(p) for p in parts])
        if hidden is None:
            return refused
        seqs = [refused.first_seq + i for i in hidden]
        return IdempotencyRedacted(refused.key, refused.first_seq, refused.last_seq, seqs)

    def redact_items(self, site: str, conversation_id: str, first_seq: int, last_seq: int) -> int:
        """Replace items ``first_seq..last_seq`` (inclusive) by tombstones in one transaction; how many.

        Each row keeps its seq and ``recorded_at``; its payload becomes
        ``logstore.redaction.TOMBSTONE``. Bad ranges raise
        :class:`~logstore.redaction.RedactionError` with nothing changed.
        What the database keeps: the old row versions stay in the table's
        pages (dead tuples) until a vacuum reclaims them, and in the WAL (and
        any WAL archive or replica) until it is recycled; a ``VACUUM`` of
        ``items`` after the command removes them from the table itself.
        """
        from ..redaction import TOMBSTONE, RedactionError, check_range

        self._check_open()
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        check_range(first_seq, last_seq, None, "")
        with self._conn(writing=True) as conn, conn.transaction():
            row = conn.execute(self._sql.lock_conversation, (site, conversation_id)).fetchone()
            if row is None:
                raise RedactionError(f"conversation {conversation_id!r} does not exist in site {site!r}")
            check_range(first_seq, last_seq, int(row[0]), f"{site}/{conversation_id}")
            cur = conn.execute(self._sql.redact, (TOMBSTONE, site, conversation_id, first_seq, last_seq))
            # A key's digest is of its batch's items: those of a redacted batch go too (a digest of a
            # short payload would let anyone confirm a guess of it). Each now covers the batch as stored.
            keys = conn.execute(self._sql.keys_over, (site, conversation_id, last_seq, first_seq)).fetchall()
            if keys:
                lo, hi = min(int(k[1]) for k in keys), max(int(k[2]) for k in keys)
                rows = conn.execute(self._sql.range, (site, conversation_id, lo, hi - lo + 1)).fetchall()
                payload = {int(r[0]): bytes(r[2]) for r in rows}
                conn.cursor().executemany(
                    self._sql.set_key_digest,
                    [
                        (digest(b"[" + b",".join(payload[s] for s in range(int(f), int(t) + 1)) + b"]"), site,
                         conversation_id, key)
                        for key, f, t in keys
                    ],
                )
            return cur.rowcount

    def list_conversations(self, site: str, selector: ListSelector) -> ConversationListing:
        self._check_open()
        site = SiteName(site)
        if selector.limit == 0:
            return ConversationListing([], None)
        with self._conn() as conn:
            if selector.cursor is None:
                rows = conn.execute(self._sql.list_first, (site, selector.limit + 1)).fetchall()
            else:
                after = parse_rfc3339(selector.cursor.last_appended_at)
                conv = selector.cursor.conversation_id
                rows = conn.execute(
                    self._sql.list_after, (site, after, after, after, conv, selector.limit + 1)
                ).fetchall()
        more = len(rows) > selector.limit
        summaries = [ConversationSummary(r[0], format_us(r[1]), format_us(r[2])) for r in rows[: selector.limit]]
        nxt = ListCursor(summaries[-1].last_appended_at, summaries[-1].conversation_id) if more else None
        return ConversationListing(summaries, nxt)

    def sites(self) -> list[str]:
        with self._conn() as conn:
            return [str(r[0]) for r in conn.execute(self._sql.sites).fetchall()]

    def drop_site(self, site: str) -> None:
        self._check_open()
        site = SiteName(site)
        with self._conn(writing=True) as conn, conn.transaction():
            conn.execute(self._sql.drop_items, (site,))
            conn.execute(self._sql.drop_conversations, (site,))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._listener.close()
        self._pool.close()

    # --------------------------------------------------------- operations

    def ping(self) -> bool:
        """True when a pooled connection answers a trivial query now (for health checks)."""
        try:
            with self._conn() as conn:
                conn.execute("SELECT 1")
            return True
        except StoreError:
            return False

    def conversation_ids(self, site: str) -> list[tuple[str, int]]:
        """Every conversation of ``site`` with its item count, by id."""
        site = SiteName(site)
        with self._conn() as conn:
            return [(str(r[0]), int(r[1])) for r in conn.execute(self._sql.conversations, (site,)).fetchall()]

    def item_count(self, site: str, conversation_id: str) -> int:
        """How many items the conversation holds (0 when unknown)."""
        with self._conn() as conn:
            row = conn.execute(self._sql.count, (SiteName(site), ConversationId(conversation_id))).fetchone()
        return 0 if row is None else int(row[0])

    def raw_items(self, site: str, conversation_id: str, start: int, limit: int) -> list[tuple[int, int, bytes]]:
        """``(seq, recorded_at_us, payload_bytes)`` from ``start``, at most ``limit``, verbatim."""
        with self._conn() as conn:
            rows = conn.execute(self._sql.range, (site, conversation_id, start, limit)).fetchall()
        return [(int(s), int(t), bytes(p)) for s, t, p in rows]

    def restore_batch(
        self, site: str, conversation_id: str, first: int, recorded_at_us: int, parts: Sequence[bytes]
    ) -> None:
        """Write one batch with its original seqs and ``recorded_at`` (migration); refuses a gap or overlap."""
        site = SiteName(site)
        conversation_id = ConversationId(conversation_id)
        if not parts:
            return
        with self._conn(writing=True) as conn, conn.transaction():
            row = conn.execute(self._sql.lock_conversation, (site, conversation_id)).fetchone()
            next_seq = 0 if row is None else int(row[0])
            if next_seq != first:
                raise Unavailable(
                    f"{site}/{conversation_id}: restoring seq {first} but the conversation holds {next_seq} items"
                )
            conn.execute(
                self._sql.restore_conversation,
                (site, conversation_id, first + len(parts), recorded_at_us, recorded_at_us, recorded_at_us),
            )
            with conn.cursor() as cur:
                cur.executemany(
                    self._sql.restore_item,
                    [(site, conversation_id, first + i, recorded_at_us, p) for i, p in enumerate(parts)],
                )

    def checksum(self, site: str, conversation_id: str) -> tuple[int, int]:
        """``(count, crc32)`` over every item's seq, recorded_at and payload bytes, in seq order."""
        crc, count, start = 0, 0, 0
        while True:
            rows = self.raw_items(site, conversation_id, start, 1000)
            for seq, stamp, payload in rows:
                crc = item_crc(crc, seq, stamp, payload)
                count += 1
            if len(rows) < 1000:
                return count, crc
            start = rows[-1][0] + 1


#: Connections (by id) on which PostgreSQL gave up waiting for the synchronous standby during the
#: current append. PostgreSQL then reports COMMIT as successful with only a WARNING: the batch is
#: durable on the primary but may be missing after a failover, so it must not be acknowledged.
_SYNC_CANCELLED: set[int] = set()


def _watch_sync_rep_cancel(diag: psycopg.errors.Diagnostic, conn_id: int) -> None:
    if (diag.message_primary or "").startswith("canceling wait for synchronous replication"):
        _SYNC_CANCELLED.add(conn_id)


def item_crc(crc: int, seq: int, stamp: int, payload: bytes) -> int:
    """Fold one item into a running CRC-32 (the migration's per-conversation checksum)."""
    return zlib.crc32(payload, zlib.crc32(f"{seq}:{stamp}:".encode(), crc))


class _Statements:
    """The SQL text of every statement, with the schema name quoted in."""

    def __init__(self, schema: str) -> None:
        def q(text: str) -> bytes:
            return sql.SQL(text).format(s=sql.Identifier(schema)).as_string(None).encode()

        self.append = q("SELECT first_seq, last_seq FROM {s}.append_batch(%s, %s, %s::bytea[], %s, %s)")
        self.append_checked = q(
            "SELECT first_seq, last_seq FROM {s}.append_batch_checked(%s, %s, %s::bytea[], %s, %s, %s, %s, %s)"
        )
        self.tail = q(
            "SELECT seq, recorded_at, payload FROM {s}.items WHERE site = %s AND conversation_id = %s "
            "ORDER BY seq DESC LIMIT %s"
        )
        self.range = q(
            "SELECT seq, recorded_at, payload FROM {s}.items WHERE site = %s AND conversation_id = %s "
            "AND seq >= %s ORDER BY seq LIMIT %s"
        )
        cols = "SELECT conversation_id, created_at, last_appended_at FROM {s}.conversations WHERE site = %s "
        order = "ORDER BY last_appended_at DESC, conversation_id LIMIT %s"
        self.list_first = q(cols + order)
        self.list_after = q(
            cols + "AND last_appended_at <= %s AND (last_appended_at < %s "
            "OR (last_appended_at = %s AND conversation_id > %s)) " + order
        )
        self.sites = q("SELECT DISTINCT site FROM {s}.conversations ORDER BY site")
        self.drop_items = q("DELETE FROM {s}.items WHERE site = %s")
        self.drop_conversations = q("DELETE FROM {s}.conversations WHERE site = %s")
        self.conversations = q(
            "SELECT conversation_id, next_seq FROM {s}.conversations WHERE site = %s ORDER BY conversation_id"
        )
        self.count = q("SELECT next_seq FROM {s}.conversations WHERE site = %s AND conversation_id = %s")
        self.lock_conversation = q(
            "SELECT next_seq FROM {s}.conversations WHERE site = %s AND conversation_id = %s FOR UPDATE"
        )
        self.restore_conversation = q(
            "INSERT INTO {s}.conversations AS c (site, conversation_id, next_seq, created_at, last_appended_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (site, conversation_id) DO UPDATE "
            "SET next_seq = excluded.next_seq, last_appended_at = greatest(c.last_appended_at, %s)"
        )
        self.forget = [
            q(f"DELETE FROM {{s}}.{table} WHERE site = %s AND conversation_id = %s")
            for table in ("items", "append_keys", "followers", "conversations")
        ]
        self.redact = q(
            "UPDATE {s}.items SET payload = %s WHERE site = %s AND conversation_id = %s AND seq BETWEEN %s AND %s"
        )
        self.keys_over = q(
            "SELECT key, first_seq, last_seq FROM {s}.append_keys WHERE site = %s AND conversation_id = %s "
            "AND first_seq <= %s AND last_seq >= %s"
        )
        self.set_key_digest = q(
            "UPDATE {s}.append_keys SET digest = %s WHERE site = %s AND conversation_id = %s AND key = %s"
        )
        self.restore_item = q(
            "INSERT INTO {s}.items (site, conversation_id, seq, recorded_at, payload) VALUES (%s, %s, %s, %s, %s)"
        )

    def texts(self) -> set[bytes]:
        """Every statement text of this set."""
        out: set[bytes] = set()
        for value in vars(self).values():
            out.update(value if isinstance(value, list) else [value])
        return out


def _refusal(exc: psycopg.Error, key: str | None, expected: int | None) -> StoreError | None:
    """The IdempotencyConflict or SeqConflict ``append_batch_checked`` raised as ``exc``, else None."""
    detail = exc.diag.message_detail or ""
    if exc.sqlstate == SQLSTATE_KEY_CONFLICT and key is not None:
        first, last = (int(x) for x in detail.split(","))
        return IdempotencyConflict(key, first, last)
    if exc.sqlstate == SQLSTATE_SEQ_CONFLICT and expected is not None:
        return SeqConflict(expected, int(detail))
    return None


def _items(site: str, conversation_id: str, rows: list[Any]) -> list[MemoryItem]:
    if not rows:
        return []
    body = b"[" + b",".join(bytes(r[2]) for r in rows) + b"]"
    try:
        payloads = decode_batch(body)
    except msgspec.DecodeError:
        payloads = [_decode_one(site, conversation_id, r) for r in rows]
    if len(payloads) != len(rows):
        # Only a stored value that is not one JSON object can shift the count ("1,2" decodes as two).
        payloads = [_decode_one(site, conversation_id, r) for r in rows]
    stamps: dict[int, str] = {}
    out = []
    for r, p in zip(rows, payloads, strict=True):
        us = int(r[1])
        text = stamps.get(us)
        if text is None:
            text = stamps[us] = format_us(us)
        out.append(MemoryItem(int(r[0]), text, p))
    return out


def _decode_one(site: str, conversation_id: str, row: Any) -> dict[str, Any]:
    try:
        value = decode_batch(b"[" + bytes(row[2]) + b"]")
        if len(value) == 1:
            return value[0]
    except msgspec.DecodeError:
        pass
    raise Corrupted(
        f"postgresql table items, site {site}, conversation {conversation_id}, seq {row[0]}",
        0,
        "the stored payload is not one JSON object",
    )


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(the given DSN)"
    info.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **info)
