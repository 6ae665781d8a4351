"""The long-term memory store as callers see it, whatever keeps the memories.

:class:`LongTermStore` is to long-term memories what :class:`logstore.MemoryStore`
is to the conversation logs: the calls the MCP tools, ``memory_context`` and the
maintenance commands make, with their semantics and errors. Two backends
implement it: :class:`.store.LongTermMemory` (a data directory) and
``logstore.postgres.PgLongTermMemory`` (a PostgreSQL database shared by many
servers). Both must behave alike; the memory test suite runs against both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .record import Memory


@dataclass(frozen=True)
class StoredMemory:
    """A memory as a store keeps it: the record and the vector stored with it.

    ``vector`` is the stored form of :mod:`.vectors` (model id, text digest,
    half floats), or None when none was stored. Carried as it is from one
    store to another, it saves the destination from encoding the memory again.
    """

    memory: Memory
    vector: dict[str, Any] | None


class LongTermStore(ABC):
    """Verify-first long-term memories, per site.

    Every write needs the token of a :meth:`verify` of exactly that change;
    a token authorises one write. Safe for many threads.
    """

    @abstractmethod
    def verify(
        self,
        site: str,
        intent: str,
        candidate: Mapping[str, Any] | None = None,
        memory_id: str | None = None,
        *,
        force: bool = False,
    ) -> tuple[list[tuple[Memory, float | None]], str, int]:
        """Related memories (each with its similarity, None for the target and dedupe matches), the token
        for exactly this change (a delete's ``force`` included) and when it expires (microseconds)."""

    @abstractmethod
    def upsert(
        self,
        site: str,
        memory: Mapping[str, Any],
        verify_token: object,
        memory_id: str | None = None,
        expected_version: int | None = None,
    ) -> Memory:
        """Create a memory (no ``memory_id``) or replace the writable fields of one; the stored record."""

    @abstractmethod
    def delete(self, site: str, memory_id: str, verify_token: object, force: bool = False) -> Memory | None:
        """Soft delete (the record) or, with ``force``, erase now (None)."""

    @abstractmethod
    def get(self, site: str, memory_id: str) -> Memory:
        """One memory, active or soft-deleted (counts as an access); NotFound when there is none."""

    @abstractmethod
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
        """Ranked memories with their readable scores, best first."""

    @abstractmethod
    def surface(self, site: str, context: str, limit: int = 2) -> list[Memory]:
        """The top ``limit`` relevant active memories for a task hint (the auto-surface)."""

    @abstractmethod
    def try_surface(self, site: str, context: str, limit: int = 2) -> list[Memory] | None:
        """:meth:`surface` when it can answer at once, without waiting or I/O; None means call :meth:`surface`."""

    @abstractmethod
    def all(self, site: str) -> list[Memory]:
        """Every memory of the site (active and soft-deleted), oldest first; not an access."""

    @abstractmethod
    def import_records(self, site: str, records: Sequence[Memory]) -> tuple[int, int]:
        """Add exported records as they were (ids, timestamps, versions); (added, already present)."""

    @abstractmethod
    def export_stored(self, site: str) -> list[StoredMemory]:
        """Every memory of the site (active and soft-deleted) with its stored vector, oldest first.

        Not an access, and no encoder runs."""

    @abstractmethod
    def import_stored(self, site: str, records: Sequence[StoredMemory]) -> tuple[int, int]:
        """:meth:`import_records` keeping the given vectors as they are (no encoder runs); a record whose
        id the site already holds with the same content counts as present. (added, already present)."""

    @abstractmethod
    def purge_expired(self, site: str) -> list[str]:
        """Erase the site's soft-deleted memories past the retention window; their ids."""

    @abstractmethod
    def sites(self) -> list[str]:
        """Sites that hold memories, sorted."""

    @abstractmethod
    def start_sweeper(self, interval_seconds: float = 3600.0) -> None:
        """Erase expired soft-deleted memories of every site now and every ``interval_seconds``, in the
        background, until :meth:`close`."""

    @abstractmethod
    def close(self) -> None:
        """Write what is pending (access times) and release everything; later calls raise Unavailable."""

    def __enter__(self) -> LongTermStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
