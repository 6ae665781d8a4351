"""The long-term memory store of a data directory: every site's memories."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .. import layout
from ..errors import Unavailable
from ..ids import SiteName
from ..incarnation import SiteGuard
from ..timefmt import now_us
from . import tokens
from .indexing import RetrieverFactory, default_retriever
from .interface import LongTermStore, StoredMemory
from .limits import DEFAULT_RETENTION_SECONDS, INDEX_BUDGET, SITES_KEPT
from .planning import SiteUses, surface_pick
from .record import Memory, check_memory_id
from .site import MEMORIES_DIR, Config, SiteMemories

logger = logging.getLogger("convmem.memories")


class LongTermMemory(LongTermStore):
    """Verify-first long-term memories, per site, on a logstore data directory.

    Safe for many threads and for several processes sharing the directory.
    ``retention_seconds`` is how long a soft-deleted memory is kept before it
    is erased; ``clock`` (microseconds since the epoch) exists so tests can
    move time forward without waiting. ``index_budget`` bounds the memories
    this process holds over all sites (records and search indexes): past it
    the least recently used sites are released, records, index and
    descriptors (read again from the log, and the index rebuilt from the
    stored vectors without the model, when next used). The site in use is
    never released, so the total may exceed the budget by that site's size
    (at most ``MAX_MEMORIES_PER_SITE``) until the next call. ``sites_kept``
    bounds the sites kept open at all (even empty ones hold descriptors):
    past it the least recently used sites no call is using are closed and
    forgotten, and opened again when next used.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        lock_timeout: float = 5.0,
        clock: Callable[[], int] = now_us,
        retriever_factory: RetrieverFactory | None = None,
        index_budget: int = INDEX_BUDGET,
        sites_kept: int = SITES_KEPT,
    ) -> None:
        self.root = os.path.abspath(os.fspath(data_dir))
        if retention_seconds < 0:
            raise ValueError("retention_seconds must not be negative")
        if not os.path.isfile(os.path.join(self.root, layout.MARKER_FILE)):
            # A new data directory: let the engine create it (and its format marker) as it would.
            from ..filestore import open_store

            open_store(self.root).close()
        self._book = tokens.TokenBook(self.root)
        self._config = Config(
            lock_timeout=lock_timeout,
            retention_us=int(retention_seconds * 1_000_000),
            clock=clock,
            retriever_factory=retriever_factory or default_retriever,
        )
        self._sites: dict[str, SiteMemories] = {}
        #: The sites by last use and the calls using each (under ``_lock``): what to release, what to close.
        self._uses = SiteUses(self._sites, index_budget, sites_kept)
        #: One per store: its sites share the descriptors telling their incarnations apart.
        self._guard = SiteGuard(os.path.join(self.root, layout.SITES_DIR), lock_timeout)
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def start_sweeper(self, interval_seconds: float = 3600.0) -> None:
        """Erase expired soft-deleted memories of every site now and every ``interval_seconds``.

        Reads and writes of a site already erase what has expired; the sweeper
        covers sites that nobody touches after a soft delete. A daemon thread,
        stopped by :meth:`close`.
        """
        if self._sweeper is not None:
            return

        def sweep() -> None:
            while not self._stop.is_set():
                for name in self.sites():
                    if self._stop.is_set():
                        return
                    try:
                        self.purge_expired(name)
                    except Exception:  # retried at the next round; a damaged site must not stop the others
                        logger.warning("retention sweep of site %s failed", name, exc_info=True)
                self._stop.wait(interval_seconds)

        self._sweeper = threading.Thread(target=sweep, name="convmem-memory-sweeper", daemon=True)
        self._sweeper.start()

    @contextlib.contextmanager
    def _read(self, site: str) -> Iterator[SiteMemories]:
        """The site in use (see :meth:`_using`), after erasing anything past the retention window."""
        with self._using(site) as s:
            s.purge_expired()
            yield s

    def site(self, site: str) -> SiteMemories:
        """The memories of ``site`` (validated site name); the store's own calls hold it in use (:meth:`_using`)
        meanwhile, a caller of this method does not: once ``sites_kept`` others were used since, it may be closed
        (its calls then raise Unavailable)."""
        with self._using(site) as s:
            return s

    @contextlib.contextmanager
    def _using(self, site: str) -> Iterator[SiteMemories]:
        """The memories of ``site``, held in use for the block: neither released nor closed meanwhile.

        Each use moves the site to the recent end, releases the least recently used sites past the index
        budget and closes those idle past ``sites_kept``.
        """
        site = SiteName(site)
        with self._lock:
            if self._closed:
                raise Unavailable("the memory store is closed")
            s = self._sites.get(site)
            if s is None:
                s = SiteMemories(self.root, site, self._book, self._config, self._guard)
                self._sites[site] = s
            victims, gone = self._uses.begin(site)
        for v in victims:
            v.release()
        for g in gone:
            g.release()  # its access times written, its descriptors (the site guard's too) closed
            g.close()
        try:
            yield s
        finally:
            with self._lock:
                self._uses.end(site)

    # Convenience wrappers, one per tool.

    def verify(
        self,
        site: str,
        intent: str,
        candidate: Mapping[str, Any] | None = None,
        memory_id: str | None = None,
        *,
        force: bool = False,
    ) -> tuple[list[tuple[Memory, float | None]], str, int]:
        """Related memories and a token for exactly this change (a delete's ``force`` included)."""
        if memory_id is not None:
            check_memory_id(memory_id)
        with self._using(site) as s:
            return s.verify(intent, candidate, memory_id, force=force)

    def upsert(
        self,
        site: str,
        memory: Mapping[str, Any],
        verify_token: object,
        memory_id: str | None = None,
        expected_version: int | None = None,
    ) -> Memory:
        if memory_id is None:
            if expected_version is not None:
                from .errors import InvalidMemory

                raise InvalidMemory("expected_version", "only an update (with memory_id) takes expected_version")
            with self._using(site) as s:
                return s.create(memory, verify_token)
        check_memory_id(memory_id)
        with self._using(site) as s:
            return s.update(memory_id, memory, verify_token, expected_version)

    def delete(self, site: str, memory_id: str, verify_token: object, force: bool = False) -> Memory | None:
        check_memory_id(memory_id)
        with self._using(site) as s:
            return s.delete(memory_id, verify_token, force)

    def get(self, site: str, memory_id: str) -> Memory:
        check_memory_id(memory_id)
        with self._read(site) as s:
            return s.get(memory_id)

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
        with self._read(site) as s:
            return s.search(query, limit=limit, category=category, tags=tags, include_deleted=include_deleted)

    def surface(self, site: str, context: str, limit: int = 2) -> list[Memory]:
        """The top ``limit`` active memories for a task hint (auto-surface); never hides one shown before."""
        with self._read(site) as s:
            return s.touch(surface_pick(s.search(context, limit=limit + 2, touch=False, relevant_only=True), limit))

    def try_surface(self, site: str, context: str, limit: int = 2) -> list[Memory] | None:
        """:meth:`surface` if it can answer at once from what this process holds; None otherwise.

        It answers only when the site's index holds the answer already (the
        same hint surfaced since the memories last changed), no other process
        wrote since this one last read, no call holds the site's mutex,
        nothing is due for erasure and no access-time flush is due: then the
        lookup is a table look-up and one ``stat``, short enough to run on a
        server's event loop. None means: call :meth:`surface` (in a worker
        thread), which ranks, waits, refreshes, purges or flushes. Never
        raises for those cases.
        """
        if self._closed:
            return None
        s = self._sites.get(SiteName(site))
        return None if s is None else s.try_surface(context, limit)

    def all(self, site: str) -> list[Memory]:
        with self._read(site) as s:
            return s.all()

    def import_records(self, site: str, records: Sequence[Memory]) -> tuple[int, int]:
        with self._using(site) as s:
            return s.import_records(records)

    def export_stored(self, site: str) -> list[StoredMemory]:
        with self._read(site) as s:
            return s.export_stored()

    def import_stored(self, site: str, records: Sequence[StoredMemory]) -> tuple[int, int]:
        with self._using(site) as s:
            return s.import_stored(records)

    def purge_expired(self, site: str) -> list[str]:
        with self._using(site) as s:
            return s.purge_expired()

    def sites(self) -> list[str]:
        """Sites that have a memories directory, sorted."""
        base = os.path.join(self.root, layout.SITES_DIR)
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

    def close(self) -> None:
        self._stop.set()
        if self._sweeper is not None and self._sweeper is not threading.current_thread():
            self._sweeper.join(timeout=30)
        with self._lock:
            self._closed = True
            sites = list(self._sites.values())
            self._sites.clear()
        for s in sites:
            s.close()

    def __enter__(self) -> LongTermMemory:
        return self
