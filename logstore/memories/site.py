"""One site's long-term memories: event log, current state, search index, locking.

Locking: ``_mutex`` serialises this process's threads; the ``lock`` file in
the site's ``memories`` directory serialises processes (shared for reads,
exclusive for writes). Every call first brings the state up to date with the
log (``_refresh``): a rewritten log (new inode) is read again from the start,
otherwise only the records past the last known end are read. So a write made
by one process is seen by every other process's next call, and checks such
as dedupe_key uniqueness and the site limit are made under the exclusive lock
against the latest state: of two processes racing to create the same key,
exactly one wins. A read whose ``stat`` of the log finds it as this process
last read it takes neither the file lock nor any other system call under the
mutex (``_reading``): there is nothing to bring up to date.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from .. import fileio, layout, links
from ..errors import Timeout, Unavailable
from ..incarnation import Incarnation, SiteGuard, is_file_at
from . import access, tokens
from .errors import MEMORY_LOCK, InvalidMemory, MemoryStoreFull, NotFound, VersionConflict
from .eventlog import EventLog, ScanResult
from .indexing import RetrieverFactory, RetrieverLike, fields_doc, to_doc
from .interface import StoredMemory
from .limits import MAX_MEMORIES_PER_SITE
from .planning import check_dedupe, check_verify, current_hits, ranked, related, surface_pick, verify_query
from .record import STATUS_ACTIVE, STATUS_DELETED, Fields, Memory, new_memory_id, parse_fields
from .state import apply, record_body

MEMORIES_DIR = "memories"
LOG_NAME = layout.segment_name(0)
LOCK_NAME = "lock"
SEARCH_DIR = "search"


def memories_dir(root: str, site: str) -> str:
    return os.path.join(layout.site_dir(root, site), MEMORIES_DIR)


@dataclass(frozen=True)
class Config:
    lock_timeout: float
    retention_us: int
    clock: Callable[[], int]
    retriever_factory: RetrieverFactory


class SiteMemories:
    """The memories of one site in one process."""

    def __init__(
        self, root: str, site: str, book: tokens.TokenBook, config: Config, guard: SiteGuard | None = None
    ) -> None:
        self.root = root
        self.site = site
        self.dir = memories_dir(root, site)
        self._site_path = layout.site_dir(root, site)
        #: Tells this site from a later one of the same name (logstore.incarnation).
        self._guard = guard or SiteGuard(os.path.join(root, layout.SITES_DIR), config.lock_timeout)
        #: The incarnation of the site the state and descriptors below belong to.
        self._incarnation: Incarnation | None = None
        self.book = book
        self.config = config
        self.log = EventLog(os.path.join(self.dir, LOG_NAME))
        self._mutex = threading.RLock()
        self._lock_fd: int | None = None
        self.state: dict[str, Memory] = {}
        #: The vector stored with each memory's latest create/update event (see .vectors), by id, kept only
        #: while no retriever holds them (from a full read of the log until the index is built); None when
        #: not kept: building an index then reads them from the log again.
        self._vecs: dict[str, Any] | None = {}
        self._end = 0
        self._next_seq = 0
        self._last_at = 0
        self._retriever: RetrieverLike | None = None
        self._touched: dict[str, int] = {}
        self._flushed_at = time.monotonic()
        self._closed = False
        self._expiry_key: tuple[int, int | None] | None = None
        self._temps_checked = False
        self._checked_us = 0
        self._oldest_deleted: int | None = None

    # ------------------------------------------------------------ locking

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the memories lock (shared or ``exclusive``) of the site as it is on disk now.

        A writer first holds the site's own lock shared (a removal waits for
        it). Both check which incarnation of the site is there: state and
        descriptors of an earlier one (removed, perhaps re-created, by another
        process) are dropped first. A closed site (its store closed, or the
        store closed it as idle past ``sites_kept``) raises Unavailable.
        """
        with self._mutex:
            if self._closed:
                raise Unavailable("these memories were closed (the store was closed, or let the site go)")
            if exclusive:
                with self._guard.writing(self._site_path) as incarnation:
                    self._same_site(incarnation)
                    fileio.makedirs_durable(self.dir)
                    with self._lock_file(True):
                        yield
                return
            incarnation = self._guard.current(self._site_path)
            self._same_site(incarnation)
            if incarnation is None or not os.path.isdir(self.dir):
                self._reset()
                yield
                return
            with self._lock_file(False):
                yield

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Hold the mutex on a state that is the log's as it is on disk now: what a read needs.

        The quick way (:meth:`_is_current`) makes one ``stat`` of the log, before the mutex, and
        no system call under it: when that stat shows the file this process has open, at the
        end it has read up to, the state (which changes only under the mutex, together with the
        inode and end it was read at) is the log's as of that stat, and the stat came after the
        read began. So a memory whose erasure (a rewrite: a new file at the path) or delete (an
        append) returned before the read began, in this process or in another, is not in it.
        Otherwise, the way of every other call: :meth:`_locked` (incarnation check, shared file
        lock, refresh). Holding the mutex while making system calls serialises this process's
        threads behind the GIL: each call gives the GIL up and must win it back from every
        thread that is ranking.
        """
        st = self._log_stat()
        with self._mutex:
            if self._is_current(st):
                yield
                return
        with self._locked(False):
            yield

    def _log_stat(self) -> os.stat_result | None:
        try:
            return os.stat(self.log.path)
        except OSError:
            return None

    def _is_current(self, st: os.stat_result | None) -> bool:
        """True when the state is that of the log ``st`` describes (mutex held; see :meth:`_reading`).

        The file at the path is the one open here (a rewrite puts a new file there, and the inode
        of the one held open cannot be reused meanwhile), as long as this process has read it; a
        site removed since has no log at the path.
        """
        return (
            st is not None
            and not self._closed
            and self._lock_fd is not None
            and self._incarnation is not None
            and self.log.fd is not None
            and st.st_ino == self.log.inode
            and st.st_size == self._end
        )

    def _same_site(self, incarnation: Incarnation | None) -> None:
        """Forget everything of an earlier incarnation of the site (mutex held)."""
        if incarnation == self._incarnation:
            return
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._reset()
        self._touched.clear()
        self._temps_checked = False
        self._expiry_key = None
        self._incarnation = incarnation

    @contextlib.contextmanager
    def _lock_file(self, exclusive: bool) -> Iterator[None]:
        """Take ``memories/lock``, checked to be the file at its path (reopened when not); refresh the state.

        A descriptor of a deleted lock file excludes no other process, so once
        locked its ``(st_dev, st_ino)`` is compared with the path's.
        """
        path = os.path.join(self.dir, LOCK_NAME)
        started = time.monotonic()
        deadline = started + self.config.lock_timeout
        delay = 0.0005
        while True:
            if self._lock_fd is None:
                links.refuse_symlinks(self.root, self.dir)  # nothing of the site is reached through a link
                self._lock_fd = fileio.open_create(path)
            fd = self._lock_fd
            if fileio.try_lock(fd, exclusive):
                if is_file_at(fd, path):
                    break
                fileio.unlock(fd)
                os.close(fd)
                self._lock_fd = None
                continue
            now = time.monotonic()
            if now >= deadline:
                raise Timeout(now - started, MEMORY_LOCK)
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.02)
        try:
            self._refresh(exclusive)
            yield
        finally:
            fileio.unlock(fd)

    # ------------------------------------------------------------ state

    def _reset(self) -> None:
        """Forget everything (the site's memories directory is gone)."""
        self.log.close()
        had = bool(self.state)
        self.state = {}
        self._vecs = {}
        self._end = self._next_seq = 0
        if had and self._retriever is not None:
            self._retriever.load([])

    def _retriever_now(self) -> RetrieverLike:
        if self._retriever is None:
            self._retriever = self.config.retriever_factory(os.path.join(self.dir, SEARCH_DIR))
            self._retriever.load(self._docs())
            _return_freed_memory()
        return self._retriever

    def _docs(self) -> list[Any]:
        """Every memory with its stored vector, for a retriever's load; the vectors are not kept after."""
        vecs = self._vecs if self._vecs is not None else self._scan_vectors()
        self._vecs = None
        return [to_doc(m, vecs.get(k)) for k, m in self.state.items()]

    def _scan_vectors(self) -> dict[str, Any]:
        """The stored vectors of the log as this process last read it (an index is rebuilt after a release)."""
        vecs: dict[str, Any] = {}
        if self.log.fd is not None and self._end > layout_header_size():
            for ev in self.log.scan(layout_header_size(), 0).events[: self._next_seq]:
                _note_vector(vecs, ev.body)
        return vecs

    def _note_vector(self, body: Mapping[str, Any]) -> None:
        """Keep an event's vector while no retriever holds the vectors (see ``_vecs``)."""
        if self._vecs is not None:
            _note_vector(self._vecs, body)

    def _vector_of(self, memory_id: str, fields: Fields) -> Any:
        """The stored form of a vector for ``fields``, computed outside the site's locks (None without a model)."""
        with self._mutex:
            retriever = self._retriever_now()
        return retriever.vector_for(fields_doc(memory_id, fields, True))

    def _refresh(self, writable: bool) -> None:
        if not self.log.exists():
            if not writable:
                self._reset()
                return
            self.log.create_if_missing()
        if writable and not self._temps_checked:
            self._remove_stale_temps()
            self._temps_checked = True
        if self.log.changed():
            links.refuse_symlinks(self.root, self.dir)  # the log was replaced: look again before opening it
            self.log.open(writable=True)
            result = self.log.scan(layout_header_size(), 0)
            self._adopt(result, writable, full=True)
            return
        if self.log.size() != self._end:
            result = self.log.scan(self._end, self._next_seq)
            self._adopt(result, writable, full=False)

    def _adopt(self, result: ScanResult, writable: bool, *, full: bool) -> None:
        if result.torn_at is not None and writable:
            self.log.cut(result.torn_at)
        if full:
            times = access.read_access(self.dir)
            state: dict[str, Memory] = {}
            self._vecs = {}
            for ev in result.events:
                apply(state, ev.body)
                self._note_vector(ev.body)
            for k, rec in state.items():  # in place: a copy of every record would leave its freed first behind
                seen = max(times.get(k, 0), self._touched.get(k, 0))
                if seen > rec.last_accessed_us:
                    state[k] = rec.touched(seen)
            self.state = state
            self._last_at = max((ev.recorded_us for ev in result.events), default=0)
            if self._retriever is not None:
                self._retriever.load(self._docs())  # else kept in _vecs until the index is built
        else:
            for ev in result.events:
                mid = apply(self.state, ev.body)
                self._note_vector(ev.body)
                self._last_at = max(self._last_at, ev.recorded_us)
                if self._retriever is not None:
                    m = self.state.get(mid)
                    if m is None:
                        self._retriever.erase(mid)
                    else:
                        self._retriever.upsert(to_doc(m, ev.body.get("vec")))
        self._end, self._next_seq = result.end, result.next_seq

    def _now(self) -> int:
        return self.config.clock()

    def _stamp(self) -> int:
        """The time of a new event: the clock, never before the log's last event."""
        at = max(self._now(), self._last_at)
        self._last_at = at
        return at

    def _write(self, body: dict[str, Any], at: int, *, index: bool = True) -> Memory | None:
        """Append one event and apply it; the index is brought up to date too (built first if ``index``:
        without it an index not built yet stays so, and is built later from the state and stored vectors)."""
        if "vec" in body and body["vec"] is None:
            del body["vec"]  # no model: nothing to store
        self._end = self.log.append(self._end, self._next_seq, at, body)
        self._next_seq += 1
        mid = apply(self.state, body)
        self._note_vector(body)
        m = self.state.get(mid)
        retriever = self._retriever_now() if index else self._retriever
        if retriever is None:
            return m
        if m is None:
            retriever.erase(mid)
        else:
            retriever.upsert(to_doc(m, body.get("vec")))
        return m

    # ------------------------------------------------------------ retention and erasure

    def _purge_locked(self) -> list[str]:
        cutoff = self._now() - self.config.retention_us
        expired = [
            m.memory_id
            for m in self.state.values()
            if m.status == STATUS_DELETED and m.deleted_us is not None and m.deleted_us <= cutoff
        ]
        if expired:
            self._erase_locked(expired)
        return expired

    def _has_expired(self) -> bool:
        """True when a soft-deleted memory is past the retention window (O(1) while nothing changes)."""
        key = (self._end, self.log.inode)
        self._checked_us = self._now()
        if self._expiry_key != key:
            self._expiry_key = key
            self._oldest_deleted = min(
                (m.deleted_us for m in self.state.values() if m.deleted_us is not None), default=None
            )
        oldest = self._oldest_deleted
        return oldest is not None and oldest <= self._now() - self.config.retention_us

    def _remove_stale_temps(self) -> None:
        """Delete temp files a crashed process (or a power cut) left behind (exclusive lock held).

        Rewrite temps hold other memories' content, which a later erasure must
        be able to reach; the others would stay behind as clutter fsck reports.
        """
        removed = False
        for name in os.listdir(self.dir):
            if _stale_temp(name):
                with contextlib.suppress(FileNotFoundError):
                    fileio.unlink(os.path.join(self.dir, name))
                    removed = True
        if removed:
            fileio.fsync_dir(self.dir)

    def _erase_locked(self, ids: Sequence[str]) -> None:
        """Rewrite the log without these memories' events, plus an erase event each; then the index."""
        self._remove_stale_temps()
        doomed = set(ids)
        full = self.log.scan(layout_header_size(), 0)
        kept = [(ev.recorded_us, ev.body) for ev in full.events if ev.memory_id not in doomed or ev.op == "erase"]
        at = self._stamp()
        kept += [(at, {"op": "erase", "id": mid, "at": at}) for mid in ids]
        self.log.rewrite(kept)
        rescan = self.log.scan(layout_header_size(), 0)
        retriever = self._retriever_now()
        for mid in ids:
            self.state.pop(mid, None)
            if self._vecs is not None:
                self._vecs.pop(mid, None)
            self._touched.pop(mid, None)
            retriever.erase(mid)
        self._end, self._next_seq = rescan.end, rescan.next_seq
        access.write_access(self.dir, {}, set(self.state))

    # ------------------------------------------------------------ API: writes

    def verify(
        self,
        intent: str,
        candidate: Mapping[str, Any] | None,
        memory_id: str | None,
        limit: int = 5,
        force: bool = False,
    ) -> tuple[list[tuple[Memory, float | None]], str, int]:
        """Related memories for a planned change, and the token that authorises exactly it.

        For a delete, the change includes ``force``: the token erases only if asked with it.
        """
        fields = check_verify(intent, candidate, memory_id, force)
        encoded = self._encoded(verify_query(fields)) if fields is not None else None
        # As search: learn the ranking the state asks for and take the retriever, rank without the mutex,
        # then make the answer from the state as it is after the ranking (a memory erased meanwhile is left out).
        probe = _Replay()
        with self._reading():
            related(self.state, probe.learning, intent, fields, memory_id, limit, encoded)
            retriever = self._retriever_now() if probe.asked is not None else None
        if retriever is not None:
            probe.rank(retriever)
        with self._reading():
            found = related(self.state, lambda: probe.replaying(self._retriever_now), intent, fields, memory_id,
                            limit, encoded)
        now = self._now()
        what = tokens.digest(intent, memory_id, fields.to_json() if fields is not None else None, force)
        return found, self.book.mint(self.site, intent, what, now), tokens.expires_us(now)

    def create(self, raw: Mapping[str, Any], token: object) -> Memory:
        fields = parse_fields(raw, "memory.")
        nonce = self.book.check(
            token, self.site, "create", tokens.digest("create", None, fields.to_json()), self._now()
        )
        vec = self._vector_of("", fields)
        with self._locked(True):
            tokens.check_unused(self.dir, nonce, self._now())
            self._purge_locked()
            if len(self.state) >= MAX_MEMORIES_PER_SITE:
                raise MemoryStoreFull(MAX_MEMORIES_PER_SITE)
            self._check_dedupe(fields, None)
            tokens.consume(self.dir, nonce, self._now())
            at = self._stamp()
            mid = new_memory_id(at)
            while mid in self.state:  # pragma: no cover - 80 random bits
                mid = new_memory_id(at)
            m = Memory(mid, fields, STATUS_ACTIVE, at, at, at, None, 1)
            stored = self._write({"op": "create", "id": mid, "at": at, "record": record_body(m), "vec": vec}, at)
            assert stored is not None
            return stored

    def update(self, memory_id: str, raw: Mapping[str, Any], token: object, expected_version: int | None) -> Memory:
        fields = parse_fields(raw, "memory.")
        what = tokens.digest("update", memory_id, fields.to_json())
        nonce = self.book.check(token, self.site, "update", what, self._now())
        vec = self._vector_of(memory_id, fields)
        with self._locked(True):
            tokens.check_unused(self.dir, nonce, self._now())
            self._purge_locked()
            cur = self.state.get(memory_id)
            if cur is None:
                raise NotFound(memory_id)
            if not cur.active:
                raise NotFound(memory_id, "this memory is soft-deleted and cannot be updated")
            if expected_version is not None and expected_version != cur.version:
                raise VersionConflict(memory_id, expected_version, cur.version)
            self._check_dedupe(fields, memory_id)
            tokens.consume(self.dir, nonce, self._now())
            at = self._stamp()
            m = replace(
                cur,
                fields=fields,
                updated_us=at,
                last_accessed_us=max(cur.last_accessed_us, at),
                version=cur.version + 1,
            )
            stored = self._write(
                {"op": "update", "id": memory_id, "at": at, "record": record_body(m), "vec": vec}, at
            )
            assert stored is not None
            return stored

    def delete(self, memory_id: str, token: object, force: bool, expected_version: int | None = None) -> Memory | None:
        """Soft delete (returns the record) or, with ``force``, erase (returns None)."""
        nonce = self.book.check_delete(token, self.site, memory_id, force, self._now())
        with self._locked(True):
            tokens.check_unused(self.dir, nonce, self._now())
            self._purge_locked()
            cur = self.state.get(memory_id)
            if cur is None:
                raise NotFound(memory_id)
            if expected_version is not None and expected_version != cur.version:
                raise VersionConflict(memory_id, expected_version, cur.version)
            tokens.consume(self.dir, nonce, self._now())
            if force:
                self._erase_locked([memory_id])
                return None
            if not cur.active:
                return cur
            at = self._stamp()
            return self._write({"op": "delete", "id": memory_id, "at": at, "version": cur.version + 1}, at)

    def _check_dedupe(self, fields: Fields, self_id: str | None) -> None:
        check_dedupe(self.state, fields, self_id)

    def purge_expired(self) -> list[str]:
        """Erase soft-deleted memories past the retention window; their ids.

        Reads call it first, so a site that is only read is purged as well.
        """
        if self._surely_nothing_due():
            return []
        with self._locked(False):
            if not self._has_expired():
                return []
        with self._locked(True):
            return self._purge_locked()

    def _surely_nothing_due(self) -> bool:
        """True when no memory can be past retention, judged without a lock from the last refresh.

        A memory another process soft-deleted since then was deleted after
        ``_checked_us``, so it cannot be due before ``_checked_us`` + retention.
        """
        if self._expiry_key is None or self._expiry_key != (self._end, self.log.inode):
            return False
        cutoff = self._now() - self.config.retention_us
        oldest = self._oldest_deleted
        return (oldest is None or oldest > cutoff) and self._checked_us > cutoff

    def import_records(self, records: Sequence[Memory]) -> tuple[int, int]:
        """Add exported records as they were (ids, timestamps, versions); (added, already present)."""
        vecs = {m.memory_id: self._vector_of(m.memory_id, m.fields) for m in records}
        return self._import([StoredMemory(m, vecs[m.memory_id]) for m in records], index=True)

    def import_stored(self, records: Sequence[StoredMemory]) -> tuple[int, int]:
        """Add records with the vectors given (never encoded here), their access times too."""
        added, present = self._import(records, index=False)
        self.flush_access()
        return added, present

    def _import(self, records: Sequence[StoredMemory], *, index: bool) -> tuple[int, int]:
        with self._locked(True):
            added = present = 0
            for s in records:
                m = s.memory
                cur = self.state.get(m.memory_id)
                if cur is not None:
                    if record_body(cur) != record_body(m):
                        raise InvalidMemory(
                            f"memories[{m.memory_id}]", "a different memory with this id already exists in the site"
                        )
                    present += 1
                    continue
                if len(self.state) >= MAX_MEMORIES_PER_SITE:
                    raise MemoryStoreFull(MAX_MEMORIES_PER_SITE)
                if m.active:
                    self._check_dedupe(m.fields, m.memory_id)
                at = max(m.updated_us, self._last_at)
                self._last_at = at
                body = {"op": "create", "id": m.memory_id, "at": at, "record": record_body(m), "vec": s.vector}
                self._write(body, at, index=index)
                if not index and m.last_accessed_us > m.updated_us:
                    self._touched[m.memory_id] = m.last_accessed_us
                    self.state[m.memory_id] = self.state[m.memory_id].touched(m.last_accessed_us)
                added += 1
            return added, present

    def export_stored(self) -> list[StoredMemory]:
        """Every memory with the vector stored in its latest create/update event, oldest first."""
        with self._locked(False):
            vecs = self._vecs if self._vecs is not None else self._scan_vectors()
            ms = sorted(self.state.values(), key=lambda m: (m.created_us, m.memory_id))
            return [StoredMemory(m, vecs.get(m.memory_id)) for m in ms]

    # ------------------------------------------------------------ API: reads

    def get(self, memory_id: str) -> Memory:
        with self._reading():
            m = self.state.get(memory_id)
            if m is None:
                raise NotFound(memory_id)
            return self._touch([m])[0]

    def search(
        self,
        query: str,
        *,
        limit: int,
        category: str | None = None,
        tags: Sequence[str] = (),
        include_deleted: bool = False,
        touch: bool = True,
        relevant_only: bool = False,
    ) -> list[tuple[Memory, float]]:
        """Ranked memories, each with its readable score (the similarity, see ``retrieval.Hit``).

        ``relevant_only`` (the auto-surface) leaves out hits below the relevance threshold.
        The query is encoded before the site's mutex is taken (see :meth:`_encoded`), and ranked
        after it is released: the mutex and the shared file lock are held twice, briefly, around
        the ranking. First to bring the state up to date and take the retriever (which ranks on
        its own, thread-safe: see ``Retriever.search``), then to turn the hits into the memories
        the state holds *now*: a hit erased or soft-deleted meanwhile, by this process or by
        another one (the second hold refreshes from the log), is left out. So no search returns
        a memory whose erasure had returned before the search took the lock the second time.
        """
        encoded = self._encoded(query)
        with self._reading():
            if not self.state:
                return []
            retriever = self._retriever_now()
        hits: list[Any] | None = None
        failed: ValueError | None = None
        try:
            hits = retriever.search(query, limit=limit, category=category, tags=tags,
                                    include_deleted=include_deleted, encoded=encoded)
        except ValueError as e:  # closed meanwhile (the site was released or closed): rank again, locked
            failed = e
        with self._reading():
            if hits is not None:
                out = current_hits(self.state, hits, limit, category, tags, include_deleted, relevant_only)
            elif retriever is self._retriever and failed is not None:
                raise failed
            else:
                out = self._search_locked(query, limit, category, tags, include_deleted, relevant_only, encoded)
            if touch and out:
                fresh = self._touch([m for m, _ in out])
                out = [(f, s) for f, (_, s) in zip(fresh, out, strict=True)]
            return out

    def _search_locked(self, query: str, limit: int, category: str | None, tags: Sequence[str],
                       include_deleted: bool, relevant_only: bool = False,
                       encoded: Any = None) -> list[tuple[Memory, float]]:
        """Ranked memories from the current state (the caller holds the lock and has refreshed)."""
        if not self.state:
            return []
        return ranked(self.state, self._retriever_now(), query, limit, category, tags, include_deleted, relevant_only,
                      encoded)

    def _encoded(self, query: str) -> Any:
        """The vector of ``query``, encoded now, before the mutex (None when the index is not built yet).

        The mutex serialises every call on the site in this process: encoding
        under it would make concurrent searches wait for each other's encodes,
        a few milliseconds each, on one core. The retriever is read without
        the mutex; if another thread replaces it meanwhile the search sees a
        vector of the same model (or encodes again when it is not).
        """
        retriever = self._retriever
        return None if retriever is None else retriever.encode_query(query)

    def try_surface(self, context: str, limit: int) -> list[Memory] | None:
        """The auto-surface for ``context`` if it is a lookup of a kept answer, with no waiting and no file
        reads or writes; else None.

        Its only system call is the ``stat`` of :meth:`_reading`'s quick way; the mutex is only tried.
        See :meth:`LongTermMemory.try_surface`. Answers what :meth:`search` and :meth:`touch` would
        (on the same state), or None when this process's view may be stale (another process wrote,
        or the file was replaced), the index is not built yet or would have to rank (the answer is
        not kept: a ranking belongs in a worker thread, not on a server's event loop), the mutex is
        held, an erasure may be due, or access times are due to be written.
        """
        st = self._log_stat()
        if not self._mutex.acquire(blocking=False):
            return None
        try:
            retriever = self._retriever
            if retriever is None or not self._is_current(st):
                return None
            if not retriever.answers_at_once(context, limit + 2):
                return None
            if time.monotonic() - self._flushed_at >= access.FLUSH_INTERVAL_S:
                return None  # the touch would write the access file: leave that to a worker thread
            if not self._surely_nothing_due() and self._has_expired():  # in memory: O(1) unless the log grew
                return None
            picked = surface_pick(self._search_locked(context, limit + 2, None, (), False, True), limit)
            return self._touch(picked, flush=False)
        finally:
            self._mutex.release()

    def all(self) -> list[Memory]:
        """Every memory (active and soft-deleted), oldest first; does not count as access."""
        with self._locked(False):
            return sorted(self.state.values(), key=lambda m: (m.created_us, m.memory_id))

    def touch(self, ms: list[Memory]) -> list[Memory]:
        """Record that these memories were just shown (surfaced); their updated records."""
        with self._mutex:
            current = [self.state.get(m.memory_id) for m in ms]
            return self._touch([m for m in current if m is not None])

    def _touch(self, ms: list[Memory], flush: bool = True) -> list[Memory]:
        now = self._now()
        out = []
        for m in ms:
            t = m.touched(now)
            self.state[m.memory_id] = t
            self._touched[m.memory_id] = t.last_accessed_us
            out.append(t)
        if flush and time.monotonic() - self._flushed_at >= access.FLUSH_INTERVAL_S:
            self.flush_access()
        return out

    def flush_access(self) -> None:
        with self._mutex:
            if self._touched and self._guard.current(self._site_path) != self._incarnation:
                self._touched.clear()  # the site was removed since: its access times go with it
            if self._touched and os.path.isdir(self.dir):
                access.write_access(self.dir, self._touched, set(self.state))
                self._touched.clear()
            self._flushed_at = time.monotonic()

    def indexed(self) -> int:
        """How many memories this process holds for the site now: its records, and its index when built
        (0 once :meth:`release` let them go)."""
        return len(self.state)

    def drop_index(self) -> None:
        """Release the search index; the next search rebuilds it from the log's stored vectors."""
        with self._mutex:
            if self._retriever is not None:
                self._retriever.close()
                self._retriever = None

    def release(self) -> None:
        """Let go of everything this process holds for the site: index, records, descriptors.

        For a store over its budget (see ``LongTermMemory``'s ``index_budget``).
        Pending access times are written first (kept, and written later, if
        that fails). The next call reads the log again from the start and the
        next search rebuilds the index from its stored vectors, without the
        model: the cost of an open. Nothing on disk changes.
        """
        with self._mutex:
            if self._closed:
                return
            with contextlib.suppress(OSError):
                self.flush_access()
            self.drop_index()
            self.log.close()
            self.state = {}
            self._vecs = {}
            self._end = self._next_seq = 0
            self._expiry_key = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            self._guard.forget(self._site_path)

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            with contextlib.suppress(OSError):
                self.flush_access()
            self._closed = True
            if self._retriever is not None:
                self._retriever.close()
                self._retriever = None
            self.log.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


_Asked = tuple[str, int, str | None, tuple[str, ...], bool]


class _Replay:
    """The one search :func:`.planning.related` asks, run between two holds of the mutex (see ``verify``).

    :meth:`learning` is the retriever of a first run under the mutex: it notes the search asked and
    answers nothing. :meth:`rank` runs that search without the mutex. :meth:`replaying` is the
    retriever of the second run: the same search is answered from those hits, any other (the state
    changed meanwhile) by the site's retriever, under the mutex.
    """

    def __init__(self) -> None:
        self.asked: _Asked | None = None
        self._encoded: Any = None
        self._hits: list[Any] | None = None
        self._fallback: Callable[[], RetrieverLike] | None = None

    def learning(self) -> RetrieverLike:
        self._fallback = None
        return cast("RetrieverLike", self)

    def replaying(self, fallback: Callable[[], RetrieverLike]) -> RetrieverLike:
        self._fallback = fallback
        return cast("RetrieverLike", self)

    def rank(self, retriever: RetrieverLike) -> None:
        assert self.asked is not None
        query, limit, category, tags, include_deleted = self.asked
        with contextlib.suppress(ValueError):  # closed meanwhile (released): ranked again under the mutex
            self._hits = retriever.search(query, limit=limit, category=category, tags=tags,
                                          include_deleted=include_deleted, encoded=self._encoded)

    def search(self, query: str, *, limit: int, category: str | None = None, tags: Sequence[str] = (),
               include_deleted: bool = False, encoded: Any = None) -> list[Any]:
        asked = (query, limit, category, tuple(tags), include_deleted)
        if self._fallback is None:
            self.asked, self._encoded = asked, encoded
            return []
        if asked == self.asked and self._hits is not None:
            return self._hits
        return self._fallback().search(query, limit=limit, category=category, tags=tags,
                                       include_deleted=include_deleted, encoded=encoded)


def _stale_temp(name: str) -> bool:
    """True for a temp file of the memories directory that no live write can be using (exclusive lock held).

    Rewrite and used-token temps are written under the exclusive lock, so any
    found now is abandoned. Access-time temps are written without the file
    lock: one is abandoned when the process its name gives is gone, or is this
    process (whose writes of it hold the site's mutex, as this call does; after
    a reboot a new process may well get the crashed one's id). The one case
    missed, a second store object on the same directory in this process mid-flush,
    only loses that flush's access times (a hint) when its temp is removed.
    """
    if ".rewrite." in name or name.startswith(tokens.USED_FILE + ".tmp."):
        return True
    prefix = access.ACCESS_FILE + ".tmp."
    if not name.startswith(prefix):
        return False
    try:
        pid = int(name[len(prefix) :])
    except ValueError:
        return False
    return pid == os.getpid() or not _process_alive(pid)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def _note_vector(vecs: dict[str, Any], body: Mapping[str, Any]) -> None:
    """Record in ``vecs`` the vector of a create/update event (none for other events); drop an erased memory's."""
    op, mid = body["op"], str(body["id"])
    if op in ("create", "update"):
        vecs[mid] = body.get("vec")
    elif op == "erase":
        vecs.pop(mid, None)


def _return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    Reading a site's log and building its index allocate several times what
    the index keeps (every event decoded, every stored vector's text); glibc
    keeps what was freed for later use, so without this a process's memory
    stays at the open's peak. Called once per index built; a few milliseconds.
    """
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim: Any = None


def layout_header_size() -> int:
    from ..frame import SEGMENT_HEADER_SIZE

    return SEGMENT_HEADER_SIZE
