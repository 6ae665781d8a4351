"""``PgLongTermMemory``: the :class:`~logstore.memories.LongTermStore` on PostgreSQL, for many servers.

Every write is one transaction on a pooled connection of a :class:`PgStore`:

1. the verify token's nonce is inserted into ``memory_tokens`` (``ON CONFLICT
   DO NOTHING RETURNING``): no row back means another write, on any server,
   used the token (``VerifyRequired`` ``used``); a write that fails later rolls
   the insert back, so a refused write leaves its token usable;
2. the site's row of ``memory_sites`` is bumped: this locks it, so the site's
   writers on every server run one after another, and numbers the change;
3. expired soft-deleted memories of the site are deleted (retention);
4. the change itself: an INSERT (the partial unique index ``memories_dedupe``
   refuses a second active memory with one dedupe_key: ``DuplicateMemory``),
   an UPDATE whose WHERE holds ``expected_version`` (checked in the statement
   that writes), or a DELETE (erasure: the row is gone at commit);
5. ``pg_notify`` tells the other servers (:mod:`._memnotify`).

Reads check the site's change counter first (:class:`._memsite.SiteView`), so
a change committed through any server is seen by every server's next call;
ranking is the file store's own retrieval, in process, fed from the rows and
their stored vectors. :meth:`PgLongTermMemory.try_surface` never answers at
once (it would have to skip that check) and always defers to ``surface``.
The retention sweep runs on one server at a time: whoever holds the advisory
lock ``SWEEP_LOCK``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
import psycopg
from psycopg import errors as pgerr

from ..errors import Unavailable
from ..ids import SiteName
from ..memories import access, tokens
from ..memories.errors import (
    DuplicateMemory,
    InvalidMemory,
    MemoryStoreFull,
    NotFound,
    VerifyRequired,
    VersionConflict,
)
from ..memories.indexing import RetrieverFactory, default_retriever, fields_doc
from ..memories.interface import LongTermStore, StoredMemory
from ..memories.limits import DEFAULT_RETENTION_SECONDS, INDEX_BUDGET, MAX_MEMORIES_PER_SITE, SITES_KEPT
from ..memories.planning import SiteUses, check_verify, ranked, related, surface_pick
from ..memories.record import (
    STATUS_ACTIVE,
    Fields,
    Memory,
    check_memory_id,
    new_memory_id,
    parse_fields,
)
from ..memories.state import record_body
from ..timefmt import now_us
from ._errors import DatabaseTimeout
from ._memnotify import ChangeListener
from ._memscrub import ScrubPending, owed_tables, partition_of, scrub
from ._memsite import SiteView, memory_from_row
from ._memsql import SWEEP_LOCK, TOKEN_SECRET_KEY, MemoryStatements
from ._store import PgStore

logger = logging.getLogger("logstore.postgres")

_T = TypeVar("_T")
#: Records imported in one transaction by :meth:`PgLongTermMemory.import_stored`.
IMPORT_BATCH = 200
_Conn = psycopg.Connection[Any]


class PgLongTermMemory(LongTermStore):
    """Long-term memories in PostgreSQL, through the connections of ``store`` (not closed by :meth:`close`).

    ``retention_seconds``, ``clock``, ``retriever_factory``, ``index_budget``
    and ``sites_kept`` mean what they mean for
    :class:`~logstore.memories.LongTermMemory`: past ``index_budget`` memories
    held over all sites, the least recently used sites' records and indexes
    are released (read again from the rows when next used); past
    ``sites_kept`` sites, the least recently used that no call is using are
    forgotten, their pending access times written first. ``listen`` starts the
    thread that refreshes sites early when another server changed them.
    """

    def __init__(
        self,
        store: PgStore,
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        clock: Callable[[], int] = now_us,
        retriever_factory: RetrieverFactory | None = None,
        listen: bool = True,
        index_budget: int = INDEX_BUDGET,
        sites_kept: int = SITES_KEPT,
    ) -> None:
        if retention_seconds < 0:
            raise ValueError("retention_seconds must not be negative")
        self._store = store
        self._sql = MemoryStatements(store.schema)
        self._retention_us = int(retention_seconds * 1_000_000)
        self._clock = clock
        self._factory = retriever_factory or default_retriever
        self._book = tokens.TokenBook(f"PostgreSQL schema {store.schema}", secret=self._load_secret)
        self._sites: dict[str, SiteView] = {}
        #: The sites by last use and the calls using each (under ``_lock``): what to release, what to forget.
        self._uses = SiteUses(self._sites, index_budget, sites_kept)
        #: The statements of each partition of ``memories`` (see :meth:`_statements_of`).
        self._by_table: dict[str, MemoryStatements] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._last_at = 0
        self._flushed_at = time.monotonic()
        self._listen = listen
        self._listener: ChangeListener | None = None

    # ------------------------------------------------------------ plumbing

    def _load_secret(self) -> bytes:
        """The token secret every server on the database shares, made by whoever asks first."""
        with self._store._conn(writing=True) as conn:
            conn.execute(self._sql.new_secret, (TOKEN_SECRET_KEY, secrets.token_hex(32)))
            row = conn.execute(self._sql.secret, (TOKEN_SECRET_KEY,)).fetchone()
        assert row is not None
        return bytes.fromhex(str(row[0]))

    def _now(self) -> int:
        return self._clock()

    def _stamp(self) -> int:
        """The time of a change: the clock, never before this server's previous change."""
        with self._lock:
            at = max(self._now(), self._last_at)
            self._last_at = at
            return at

    @contextmanager
    def _using(self, site: str) -> Iterator[SiteView]:
        """The view of ``site``, held in use for the block: never forgotten meanwhile.

        Each use moves the site to the recent end, releases the records and indexes of the least recently
        used sites past ``index_budget`` and forgets those idle past ``sites_kept``.
        """
        site = SiteName(site)
        with self._lock:
            if self._closed:
                raise Unavailable("the memory store is closed")
            view = self._sites.get(site)
        if view is None:
            statements = self._statements_of(site)
        with self._lock:
            if self._closed:
                raise Unavailable("the memory store is closed")
            view = self._sites.get(site)
            if view is None:
                view = self._sites[site] = SiteView(site, statements, self._factory)
            if self._listen and self._listener is None:
                store = self._store
                self._listener = ChangeListener(store.dsn, store.schema, store.connect_kwargs, self._heard)
            victims, gone = self._uses.begin(site)
        for victim in victims:
            victim.release()
        for g in gone:
            self._let_go(g)
        try:
            yield view
        finally:
            with self._lock:
                self._uses.end(site)

    def _let_go(self, view: SiteView) -> None:
        """Close a forgotten site's view, its pending access times written first (a hint: lost if that fails)."""
        with view.mutex:
            if view.touched:
                try:
                    with self._store._conn(writing=True) as conn:
                        view.flush(conn)
                except Exception:  # access times are a hint; forgetting a site must not fail the call for them
                    logger.warning("writing the access times of site %s failed", view.site, exc_info=True)
            view.close()

    def _statements_of(self, site: str) -> MemoryStatements:
        """The statements of ``site``, naming its partition of ``memories`` (looked up once per site).

        A statement naming the parent table locks every partition when it runs a generic plan (PostgreSQL 15
        locks all of a cached plan's relations before run-time pruning), so it would wait for another
        site's rewrite; one naming the partition locks that partition alone.
        """
        with self._store._conn() as conn:
            table = partition_of(conn, self._store.schema, site)
        with self._lock:
            found = self._by_table.get(table)
            if found is None:
                found = self._by_table[table] = MemoryStatements(self._store.schema, table)
            return found

    def _heard(self, site: str) -> None:
        """A notification from another server (or this one): bring the site up to date if held."""
        with self._lock:
            view = self._sites.get(site)
        if view is None or self._closed:
            return
        with view.mutex, self._store._conn() as conn:
            view.refresh(conn)

    @contextmanager
    def _fresh(self, view: SiteView) -> Iterator[SiteView]:
        """``view`` (in use) brought up to date, its expired soft-deleted memories erased, its mutex held.

        Access times are recorded after the block (:meth:`_touch` may write every site's, taking each
        site's mutex in turn: never with one held)."""
        with view.mutex:
            with self._store._conn() as conn:
                view.refresh(conn)
            if self._due(view):
                self._write(view, None, _nothing)
            yield view

    @contextmanager
    def _held(self, site: str) -> Iterator[SiteView]:
        """The site's view in use (:meth:`_using`) and fresh (:meth:`_fresh`)."""
        with self._using(site) as view, self._fresh(view):
            yield view

    def _due(self, view: SiteView) -> bool:
        cutoff = self._now() - self._retention_us
        return any(m.deleted_us is not None and m.deleted_us <= cutoff for m in view.state.values())

    def _write(
        self, view: SiteView, nonce: str | None, change: Callable[[_Tx], _T], *, report_purge: bool = False
    ) -> _T:
        """Run ``change`` in a write transaction of the site (steps 1-5 of the module's docstring).

        ``change(tx)`` returns what the caller wants and notes in ``tx`` what it
        wrote; after the commit the view is brought up to date with it. After an
        erasure the site's partition is rewritten: ``ScrubPending`` when the
        erased bytes may remain and the change itself erased (or ``report_purge``);
        a rewrite owed after the retention purge of another call is only logged
        (it is recorded, and the sweep retries it).
        """
        out, purged, erased = self._write_tx(view, nonce, change)
        if purged or erased:
            try:
                self._scrub(view.site)
            except ScrubPending as exc:
                if erased or report_purge:
                    raise
                logger.warning("after the retention purge of site %s: %s", view.site, exc)
        return out

    def _scrub(self, site: str) -> None:
        """Rewrite the partition of ``site`` so erased rows leave no bytes in its pages (see ``_memscrub``).

        ``ScrubPending`` when the bytes may remain: the rewrite failed, or something still sees the rows.
        """
        with self._store._conn(writing=True) as conn:
            scrub_site(conn, self._store.schema, site, self._store.lock_timeout)

    def _write_tx(
        self, view: SiteView, nonce: str | None, change: Callable[[_Tx], _T]
    ) -> tuple[_T, bool, bool]:
        """The transaction of :meth:`_write`: its result, whether retention purged rows, whether ``change`` erased."""
        site = view.site
        with view.mutex, self._store._conn(writing=True) as conn:
            before = view.seen
            started = time.monotonic()
            tx: _Tx | None = None
            try:
                with conn.transaction():
                    conn.execute(view.sql.lock_timeout, (str(max(1, round(self._store.lock_timeout * 1000))),))
                    if nonce is not None:
                        now = self._now()
                        if conn.execute(view.sql.use_token, (site, nonce, now)).fetchone() is None:
                            raise VerifyRequired(
                                "used", "verify_token was already used (each token authorises one write)"
                            )
                    row = conn.execute(view.sql.bump, (site,)).fetchone()
                    assert row is not None
                    n = int(row[0])
                    purged = [str(r[0]) for r in conn.execute(
                        view.sql.purge, (site, self._now() - self._retention_us)
                    ).fetchall()]
                    if purged:
                        conn.execute(view.sql.mark_erased, (site,))
                    tx = _Tx(conn, n)
                    out = change(tx)
                    if purged or any(isinstance(item, str) for item in tx.applied):
                        conn.execute(view.sql.owe_scrub, (site, self._now()))
                    if nonce is not None and n % 64 == 0:
                        conn.execute(view.sql.prune_tokens, (site, self._now() - tokens.USED_KEPT_US))
                    conn.execute(view.sql.notify, (f"{self._store.schema}/{site}",))
            except pgerr.UniqueViolation:
                key = tx.key if tx is not None else None
                row = conn.execute(view.sql.owner, (site, key)).fetchone() if key is not None else None
                raise DuplicateMemory(str(row[0]) if row else "", key or "") from None
            except pgerr.LockNotAvailable:
                waited = time.monotonic() - started
                raise DatabaseTimeout(waited, "waiting for another write of the site's memories") from None
            # Committed. When the view was current just before, only this change is new: apply it here.
            if before == n - 1:
                for mid in purged:
                    view.forget(mid)
                assert tx is not None
                for item in tx.applied:
                    if isinstance(item, str):
                        view.forget(item)
                    else:
                        view.put(*item)
                view.seen = n
            else:
                try:
                    view.refresh(conn)
                except psycopg.Error:  # committed all the same: the next call's counter check catches up
                    logger.warning("refreshing site %s after a write failed", site, exc_info=True)
            assert tx is not None
            return out, bool(purged), any(isinstance(item, str) for item in tx.applied)

    def _vector(self, view: SiteView, memory_id: str, fields: Fields) -> bytes | None:
        """The stored form of the vector of ``fields`` (JSON bytes), None without a model."""
        with view.mutex:
            retriever = view.retriever()
        vec = retriever.vector_for(fields_doc(memory_id, fields, True))
        return None if vec is None else msgspec.json.encode(vec)

    # ------------------------------------------------------------ API: writes

    def verify(
        self,
        site: str,
        intent: str,
        candidate: Mapping[str, Any] | None = None,
        memory_id: str | None = None,
        *,
        force: bool = False,
    ) -> tuple[list[tuple[Memory, float | None]], str, int]:
        if memory_id is not None:
            check_memory_id(memory_id)
        site = SiteName(site)  # (a bad site name is told before a bad candidate)
        fields = check_verify(intent, candidate, memory_id, force)
        with self._held(site) as view:
            found = related(view.state, view.retriever, intent, fields, memory_id, 5)
        now = self._now()
        what = tokens.digest(intent, memory_id, fields.to_json() if fields is not None else None, force)
        return found, self._book.mint(view.site, intent, what, now), tokens.expires_us(now)

    def upsert(
        self,
        site: str,
        memory: Mapping[str, Any],
        verify_token: object,
        memory_id: str | None = None,
        expected_version: int | None = None,
    ) -> Memory:
        with self._using(site) as view:
            if memory_id is None:
                if expected_version is not None:
                    raise InvalidMemory("expected_version", "only an update (with memory_id) takes expected_version")
                return self._create(view, memory, verify_token)
            check_memory_id(memory_id)
            return self._update(view, memory_id, memory, verify_token, expected_version)

    def _create(self, view: SiteView, raw: Mapping[str, Any], token: object) -> Memory:
        fields = parse_fields(raw, "memory.")
        what = tokens.digest("create", None, fields.to_json())
        nonce = self._book.check(token, view.site, "create", what, self._now())
        vec = self._vector(view, "", fields)

        def change(tx: _Tx) -> Memory:
            self._check_room(tx, view)
            at = self._stamp()
            m = Memory(new_memory_id(at), fields, STATUS_ACTIVE, at, at, at, None, 1)
            tx.key = fields.dedupe_key
            return tx.wrote(tx.conn.execute(view.sql.insert, _insert_args(view.site, m, vec, tx.n)).fetchone())

        return self._write(view, nonce, change)

    def _update(
        self, view: SiteView, memory_id: str, raw: Mapping[str, Any], token: object, expected: int | None
    ) -> Memory:
        fields = parse_fields(raw, "memory.")
        what = tokens.digest("update", memory_id, fields.to_json())
        nonce = self._book.check(token, view.site, "update", what, self._now())
        vec = self._vector(view, memory_id, fields)
        body = msgspec.json.encode(fields.to_json())

        def change(tx: _Tx) -> Memory:
            at = self._stamp()
            tx.key = fields.dedupe_key
            row = tx.conn.execute(
                view.sql.update, (body, fields.dedupe_key, vec, at, at, tx.n, view.site, memory_id, expected)
            ).fetchone()
            if row is None:
                cur = self._one(tx.conn, view, memory_id)
                if not cur.active:
                    raise NotFound(memory_id, "this memory is soft-deleted and cannot be updated")
                assert expected is not None
                raise VersionConflict(memory_id, expected, cur.version)
            return tx.wrote(row)

        return self._write(view, nonce, change)

    def _check_room(self, tx: _Tx, view: SiteView) -> None:
        """MemoryStoreFull when the site holds the most memories it may (its writers are serialised)."""
        count = tx.conn.execute(view.sql.count, (view.site,)).fetchone()
        if count is not None and int(count[0]) >= MAX_MEMORIES_PER_SITE:
            raise MemoryStoreFull(MAX_MEMORIES_PER_SITE)

    def _one(self, conn: _Conn, view: SiteView, memory_id: str) -> Memory:
        row = conn.execute(view.sql.one, (view.site, memory_id)).fetchone()
        if row is None:
            raise NotFound(memory_id)
        return memory_from_row(row)[0]

    def delete(self, site: str, memory_id: str, verify_token: object, force: bool = False) -> Memory | None:
        check_memory_id(memory_id)
        with self._using(site) as view:
            return self._delete(view, memory_id, verify_token, force)

    def _delete(self, view: SiteView, memory_id: str, verify_token: object, force: bool) -> Memory | None:
        nonce = self._book.check_delete(verify_token, view.site, memory_id, force, self._now())

        def change(tx: _Tx) -> Memory | None:
            if force:
                if tx.conn.execute(view.sql.erase, (view.site, memory_id)).fetchone() is None:
                    raise NotFound(memory_id)
                tx.conn.execute(view.sql.mark_erased, (view.site,))
                tx.applied.append(memory_id)
                return None
            at = self._stamp()
            row = tx.conn.execute(view.sql.soft_delete, (at, at, at, tx.n, view.site, memory_id)).fetchone()
            if row is None:
                return self._one(tx.conn, view, memory_id)  # soft-deleted already: as it is
            return tx.wrote(row)

        return self._write(view, nonce, change)

    def import_records(self, site: str, records: Sequence[Memory]) -> tuple[int, int]:
        added = present = 0
        with self._using(site) as view:
            for m in records:  # one transaction each: the records before a refused one stay imported
                vec = self._vector(view, m.memory_id, m.fields)
                vector = msgspec.json.decode(vec) if vec is not None else None
                a, p = self._import(view, [StoredMemory(m, vector)])
                added, present = added + a, present + p
        return added, present

    def import_stored(self, site: str, records: Sequence[StoredMemory]) -> tuple[int, int]:
        added = present = 0
        with self._using(site) as view:
            for i in range(0, len(records), IMPORT_BATCH):
                a, p = self._import(view, records[i : i + IMPORT_BATCH])
                added, present = added + a, present + p
        return added, present

    def _import(self, view: SiteView, records: Sequence[StoredMemory]) -> tuple[int, int]:
        """Insert ``records`` (their vectors as given) in one transaction; (added, already present)."""

        def change(tx: _Tx) -> tuple[int, int]:
            added = present = 0
            for s in records:
                m = s.memory
                row = tx.conn.execute(view.sql.one, (view.site, m.memory_id)).fetchone()
                if row is not None:
                    if record_body(memory_from_row(row)[0]) != record_body(m):
                        raise InvalidMemory(
                            f"memories[{m.memory_id}]", "a different memory with this id already exists in the site"
                        )
                    present += 1
                    continue
                self._check_room(tx, view)
                tx.key = m.fields.dedupe_key if m.active else None
                vec = msgspec.json.encode(s.vector) if s.vector is not None else None
                tx.wrote(tx.conn.execute(view.sql.insert, _insert_args(view.site, m, vec, tx.n)).fetchone())
                added += 1
            return added, present

        return self._write(view, None, change)

    def export_stored(self, site: str) -> list[StoredMemory]:
        with self._held(site) as view, self._store._conn() as conn:
            rows = [memory_from_row(r) for r in conn.execute(view.sql.rows_all, (view.site,)).fetchall()]
            out = [StoredMemory(m.touched(view.touched.get(m.memory_id, 0)), vec) for m, vec in rows]
        return sorted(out, key=lambda s: (s.memory.created_us, s.memory.memory_id))

    def purge_expired(self, site: str) -> list[str]:
        with self._using(site) as view, view.mutex:
            with self._store._conn() as conn:
                view.refresh(conn)
            if not self._due(view):
                return []
            cutoff = self._now() - self._retention_us
            due = sorted(
                m.memory_id for m in view.state.values() if m.deleted_us is not None and m.deleted_us <= cutoff
            )
            self._write(view, None, _nothing, report_purge=True)
            return [mid for mid in due if mid not in view.state]

    # ------------------------------------------------------------ API: reads

    def get(self, site: str, memory_id: str) -> Memory:
        check_memory_id(memory_id)
        with self._using(site) as view:
            with self._fresh(view):
                m = view.state.get(memory_id)
                if m is None:
                    raise NotFound(memory_id)
            return self._touch(view, [m])[0]

    def search(
        self,
        site: str,
        query: str,
        *,
        limit: int = 10,
        category: str | None = None,
        tags: Sequence[str] = (),
        include_deleted: bool = False,
    ) -> list[tuple[Memory, float]]:
        with self._using(site) as view:
            out = self._ranked(view, query, limit, category, tags, include_deleted, False)
            fresh = self._touch(view, [m for m, _ in out])
        by_id = {m.memory_id: m for m in fresh}
        return [(by_id.get(m.memory_id, m), s) for m, s in out]

    def _ranked(self, view: SiteView, query: str, limit: int, category: str | None, tags: Sequence[str],
                include_deleted: bool, relevant_only: bool) -> list[tuple[Memory, float]]:
        with self._fresh(view):
            if not view.state:
                return []
            return ranked(view.state, view.retriever(), query, limit, category, tags, include_deleted, relevant_only)

    def surface(self, site: str, context: str, limit: int = 2) -> list[Memory]:
        with self._using(site) as view:
            hits = self._ranked(view, context, limit + 2, None, (), False, True)
            return self._touch(view, surface_pick(hits, limit))

    def try_surface(self, site: str, context: str, limit: int = 2) -> list[Memory] | None:
        """Always None: an answer without reading the site's change counter could show an erased memory."""
        return None

    def all(self, site: str) -> list[Memory]:
        with self._held(site) as view:
            return sorted(view.state.values(), key=lambda m: (m.created_us, m.memory_id))

    def sites(self) -> list[str]:
        with self._store._conn() as conn:
            return [str(r[0]) for r in conn.execute(self._sql.sites).fetchall()]

    def _touch(self, view: SiteView, ms: list[Memory]) -> list[Memory]:
        out = view.touch(ms, self._now())
        if time.monotonic() - self._flushed_at >= access.FLUSH_INTERVAL_S:
            self.flush_access()
        return out

    def flush_access(self) -> None:
        """Write every site's pending access times (a hint: a lost flush loses no acknowledged data)."""
        self._flushed_at = time.monotonic()
        with self._lock:
            views = list(self._sites.values())
        for view in views:
            with view.mutex:
                if view.touched:
                    with self._store._conn(writing=True) as conn:
                        view.flush(conn)

    # ------------------------------------------------------------ retention and lifetime

    def start_sweeper(self, interval_seconds: float = 3600.0) -> None:
        if self._sweeper is not None:
            return

        def sweep() -> None:
            while not self._stop.is_set():
                try:
                    self.sweep_once()
                except Exception:  # retried at the next round
                    logger.warning("retention sweep of the memories failed", exc_info=True)
                self._stop.wait(interval_seconds)

        self._sweeper = threading.Thread(target=sweep, name="convmem-pg-memory-sweeper", daemon=True)
        self._sweeper.start()

    def sweep_once(self) -> list[str] | None:
        """Erase every site's expired soft-deleted memories if no other server is sweeping; the sites swept
        (None when another server holds the sweep lock)."""
        with self._store._conn() as lock_conn:
            row = lock_conn.execute(self._sql.try_sweep_lock, (SWEEP_LOCK,)).fetchone()
            if not row or not row[0]:
                return None
            try:
                cutoff = self._now() - self._retention_us
                swept = [str(r[0]) for r in lock_conn.execute(self._sql.due_sites, (cutoff,)).fetchall()]
                for site in swept:
                    if self._stop.is_set():
                        break
                    with self._using(site) as view:
                        self._write(view, None, _nothing)  # an owed rewrite is retried just below
                self._retry_scrubs()
                return swept
            finally:
                lock_conn.execute(self._sql.sweep_unlock, (SWEEP_LOCK,))

    def _retry_scrubs(self) -> None:
        """Rewrite every partition whose erasures are still owed (``memory_scrubs``); run by the sweep."""
        with self._store._conn(writing=True) as conn:
            tables = owed_tables(conn, self._store.schema)
        for table in tables:
            if self._stop.is_set():
                return
            try:
                with self._store._conn(writing=True) as conn:
                    done = scrub(conn, self._store.schema, table, self._store.lock_timeout, only_if_due=True)
            except Exception:  # psycopg's, or the store's translation of it: owed still, retried next round
                logger.warning("retrying the owed rewrite of %s failed", table, exc_info=True)
                continue
            if done.held:
                logger.warning("the owed rewrite of %s is still held by %s", table, "; ".join(done.held))

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None and self._sweeper is not threading.current_thread():
            self._sweeper.join(timeout=30)
        try:
            self.flush_access()
        except Exception:  # access times are a hint; closing must not fail for them
            logger.warning("writing access times at close failed", exc_info=True)
        with self._lock:
            self._closed = True
            views = list(self._sites.values())
            self._sites.clear()
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for view in views:
            with view.mutex:
                view.close()

    def __enter__(self) -> PgLongTermMemory:
        return self


class _Tx:
    """One write transaction: its connection, the number of its change, what it wrote (for the view)."""

    def __init__(self, conn: _Conn, n: int) -> None:
        self.conn = conn
        self.n = n
        #: (record, stored vector) of each row written, or the id of each row erased.
        self.applied: list[tuple[Memory, Any] | str] = []
        #: The dedupe_key of the row being written (what a unique violation is about).
        self.key: str | None = None

    def wrote(self, row: Any) -> Memory:
        """Note a row just written (RETURNING ``COLUMNS``); its record."""
        m, vec = memory_from_row(row)
        self.applied.append((m, vec))
        return m


def _insert_args(site: str, m: Memory, vec: bytes | None, change: int) -> tuple[Any, ...]:
    return (
        site, m.memory_id, m.status, m.version, m.created_us, m.updated_us, m.last_accessed_us, m.deleted_us,
        m.fields.dedupe_key, msgspec.json.encode(m.fields.to_json()), vec, change,
    )


def _nothing(tx: _Tx) -> None:
    """A write that changes nothing but what every write does (retention)."""


def held_memories(store: PgStore, site: str) -> int:
    """How many memories (active and soft-deleted) ``site`` holds in the database of ``store``."""
    site = SiteName(site)
    with store._conn() as conn:
        sql_ = MemoryStatements(store.schema, partition_of(conn, store.schema, site))
        row = conn.execute(sql_.count, (site,)).fetchone()
    return int(row[0]) if row else 0


def drop_site_memories(store: PgStore, site: str) -> bool:
    """Delete every memory of ``site`` and its used tokens in one transaction (``site remove``); False if none.

    Counted as an erasure of the site, so every server holding the site reads it again on its next call.
    """
    site = SiteName(site)
    with store._conn() as conn:
        sql_ = MemoryStatements(store.schema, partition_of(conn, store.schema, site))
    with store._conn(writing=True) as conn, conn.transaction():
        conn.execute(sql_.bump, (site,))
        gone = conn.execute(sql_.drop_site, (site,)).fetchall()
        conn.execute(sql_.drop_tokens, (site,))
        conn.execute(sql_.mark_erased, (site,))
        if gone:
            conn.execute(sql_.owe_scrub, (site, now_us()))
        conn.execute(sql_.notify, (f"{store.schema}/{site}",))
    if gone:
        with store._conn(writing=True) as conn:
            scrub_site(conn, store.schema, site, store.lock_timeout)
    return bool(gone)


def scrub_site(conn: _Conn, schema: str, site: str, lock_timeout: float) -> None:
    """Rewrite the partition of ``site`` after its erasure committed; ``ScrubPending`` when its bytes may remain."""
    table = "memories"
    try:
        table = partition_of(conn, schema, site)
        done = scrub(conn, schema, table, lock_timeout, site, wait_s=lock_timeout)
    except psycopg.Error as exc:
        logger.warning("rewriting %s after an erasure of site %s failed", table, site, exc_info=True)
        raise ScrubPending(
            f"the memory is erased (no server shows it again), but rewriting table {table} to remove its "
            f"bytes from the pages failed ({str(exc).splitlines()[0] if str(exc) else 'no message'}); "
            "the rewrite is recorded as owed (memory_scrubs) and the retention sweep retries it",
            table, [],
        ) from exc
    if done.unnamed:
        horizon = f" (removable cutoff xid {done.cutoff})" if done.cutoff is not None else ""
        raise ScrubPending(
            f"the memory is erased (no server shows it again), but its bytes may still be in the files of table "
            f"{table}: the database's removal horizon{horizon} still keeps the deleted row versions, and this "
            "check could not name what holds it (it reads this database's sessions, replication slots, prepared "
            "transactions and vacuum_defer_cleanup_age; a snapshot on another node, such as a Citus worker, or a "
            "logical replication slot being created, is not among them); the rewrite is recorded as owed "
            "(memory_scrubs) and the retention sweep repeats it until the horizon has passed the erasure",
            table, done.held,
        )
    if done.held:
        raise ScrubPending(
            f"the memory is erased (no server shows it again), but its bytes may still be in the files of table "
            f"{table}: the rewrite had to keep the deleted row versions because {'; '.join(done.held)} can "
            "still see them; the rewrite is recorded as owed (memory_scrubs) and the retention sweep repeats it "
            "once that has ended",
            table, done.held,
        )
