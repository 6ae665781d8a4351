"""The search index as the memory stores use it: its interface, its default, and the docs fed to it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .record import Fields, Memory


class RetrieverLike(Protocol):
    """What a store needs from the search index (see :mod:`logstore.memories.retrieval`)."""

    def load(self, docs: Any) -> None: ...
    def upsert(self, doc: Any) -> None: ...
    def erase(self, memory_id: str) -> None: ...
    def search(
        self,
        query: str,
        *,
        limit: int,
        category: str | None = None,
        tags: Sequence[str] = (),
        include_deleted: bool = False,
        encoded: Any = None,
    ) -> list[Any]: ...
    def encode_query(self, query: str) -> Any: ...
    def close(self) -> None: ...
    def vector_for(self, doc: Any) -> Any: ...
    def answers_at_once(self, query: str, limit: int) -> bool: ...


#: Makes a site's retriever; given the directory it may own, or None when the store has none (PostgreSQL).
RetrieverFactory = Callable[[Any], RetrieverLike]


def default_retriever(index_dir: str | None) -> RetrieverLike:
    from .retrieval import Retriever

    return Retriever(index_dir)


def to_doc(m: Memory, vector: Any = None) -> Any:
    """What the retriever needs of ``m``; ``vector`` is the one stored with it, if any."""
    return fields_doc(m.memory_id, m.fields, m.active, vector)


def fields_doc(memory_id: str, f: Fields, active: bool, vector: Any = None) -> Any:
    from .retrieval import MemoryDoc

    return MemoryDoc(
        memory_id=memory_id,
        category=f.category,
        subject=f.subject,
        summary=f.summary,
        details=f.details,
        tags=tuple(f.tags),
        active=active,
        vector=vector,
    )
