"""What both memory backends decide alike from a site's current state and its search index.

The checks of a ``memory_verify`` call, the related memories it shows, the
filtering of a search's hits and the dedupe_key check before a write are the
same whether the state was read from an event log or from database rows, so
they live here, once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from . import tokens
from .errors import DuplicateMemory, InvalidMemory, NotFound
from .indexing import RetrieverLike
from .record import Fields, Memory, parse_fields


def check_verify(
    intent: str, candidate: Mapping[str, Any] | None, memory_id: str | None, force: bool
) -> Fields | None:
    """The candidate's validated fields (None for a delete); InvalidMemory naming what breaks a rule."""
    if intent not in tokens.INTENTS:
        raise InvalidMemory("intent", "expected one of create, update, delete")
    if force and intent != "delete":
        raise InvalidMemory("force", "only intent delete takes force")
    fields = parse_fields(candidate, "candidate.") if candidate is not None else None
    if intent == "create":
        if fields is None:
            raise InvalidMemory("candidate", "intent create needs the candidate memory")
        if memory_id is not None:
            raise InvalidMemory("memory_id", "intent create takes no memory_id; a new memory gets a fresh id")
    elif intent == "update":
        if memory_id is None:
            raise InvalidMemory("memory_id", "intent update needs the id of the memory to change")
        if fields is None:
            raise InvalidMemory("candidate", "intent update needs the candidate: the memory's new fields")
    else:
        if memory_id is None:
            raise InvalidMemory("memory_id", "intent delete needs the id of the memory to delete")
        if fields is not None:
            raise InvalidMemory("candidate", "intent delete takes no candidate")
    return fields


def verify_query(fields: Fields) -> str:
    """The search a verify runs for look-alikes of ``fields``: all of its text."""
    return " ".join([fields.subject, fields.summary, fields.details, *fields.tags])[:4000]


def related(
    state: Mapping[str, Memory],
    retriever: Callable[[], RetrieverLike],
    intent: str,
    fields: Fields | None,
    memory_id: str | None,
    limit: int,
    encoded: Any = None,
) -> list[tuple[Memory, float | None]]:
    """What a verify shows: the target, the active holders of the candidate's dedupe_key, then look-alikes.

    ``encoded``: the query vector of the candidate's :func:`verify_query`, if the caller encoded it already.
    """
    out: list[tuple[Memory, float | None]] = []
    seen: set[str] = set()
    target = None
    if memory_id is not None:
        target = state.get(memory_id)
        if target is None:
            raise NotFound(memory_id)
        if intent == "update" and not target.active:
            raise NotFound(memory_id, "this memory is soft-deleted and cannot be updated")
        out.append((target, None))
        seen.add(memory_id)
    if fields is not None and fields.dedupe_key is not None:
        for m in state.values():
            if m.active and m.fields.dedupe_key == fields.dedupe_key and m.memory_id not in seen:
                out.append((m, None))
                seen.add(m.memory_id)
    basis = fields if fields is not None else (target.fields if target is not None else None)
    if basis is not None and state:
        query = verify_query(basis)
        for hit in retriever().search(query, limit=limit + len(seen), encoded=encoded if basis is fields else None):
            found = state.get(hit.memory_id)
            if found is not None and found.active and hit.memory_id not in seen:
                out.append((found, float(hit.score if hit.similarity is None else hit.similarity)))
                seen.add(hit.memory_id)
            if len(out) >= limit + (1 if target is not None else 0):
                break
    return out


def ranked(
    state: Mapping[str, Memory],
    retriever: RetrieverLike,
    query: str,
    limit: int,
    category: str | None,
    tags: Sequence[str],
    include_deleted: bool,
    relevant_only: bool,
    encoded: Any = None,
) -> list[tuple[Memory, float]]:
    """The retriever's hits for ``query`` as current memories with their scores, filters applied again.

    ``encoded``: the query's vector, if the caller encoded it already (``RetrieverLike.encode_query``).
    """
    hits = retriever.search(query, limit=limit, category=category, tags=tags, include_deleted=include_deleted,
                            encoded=encoded)
    return current_hits(state, hits, limit, category, tags, include_deleted, relevant_only)


def current_hits(
    state: Mapping[str, Memory],
    hits: Sequence[Any],
    limit: int,
    category: str | None,
    tags: Sequence[str],
    include_deleted: bool,
    relevant_only: bool,
) -> list[tuple[Memory, float]]:
    """The retriever's ``hits`` as memories of ``state`` with their scores: a hit ``state`` no longer holds (or
    no longer passes the filters) is left out, so hits ranked on an older state show nothing erased since."""
    out: list[tuple[Memory, float]] = []
    for hit in hits:
        if relevant_only and not hit.relevant:
            continue
        m = state.get(hit.memory_id)
        if m is None or (not include_deleted and not m.active):
            continue
        if category is not None and m.fields.category != category:
            continue
        if tags and not set(tags) <= set(m.fields.tags):
            continue
        out.append((m, float(hit.score if hit.similarity is None else hit.similarity)))
        if len(out) >= limit:
            break
    return out


def check_dedupe(state: Mapping[str, Memory], fields: Fields, self_id: str | None) -> None:
    """DuplicateMemory when another active memory of ``state`` holds ``fields``' dedupe_key."""
    key = fields.dedupe_key
    if key is None:
        return
    for m in state.values():
        if m.active and m.memory_id != self_id and m.fields.dedupe_key == key:
            raise DuplicateMemory(m.memory_id, key)


def surface_pick(hits: Sequence[tuple[Memory, float]], limit: int) -> list[Memory]:
    """The first ``limit`` of ``hits``, skipping a memory whose ``dedupe_key`` an earlier one already has."""
    out: list[Memory] = []
    keys: set[str] = set()
    for m, _ in hits:
        key = m.fields.dedupe_key
        if key is not None and key in keys:
            continue
        if key is not None:
            keys.add(key)
        out.append(m)
        if len(out) >= limit:
            break
    return out


class Indexed(Protocol):
    """A site as the index budget sees it."""

    def indexed(self) -> int: ...


_S = TypeVar("_S", bound=Indexed)


def over_budget(sites: Mapping[str, _S], recent: Sequence[str] | Any, current: str, budget: int) -> list[_S]:
    """The least recently used sites whose indexes must go for the rest to fit ``budget`` memories.

    ``recent`` names the sites by last use, least recent first. The site in
    use is never released; its own index may be built after this check, so
    the total can exceed the budget by one site's index until the next call.
    """
    total = sum(s.indexed() for s in sites.values())
    out = []
    for name in recent:
        if total <= budget:
            break
        s = sites[name]
        if name != current and s.indexed():
            total -= s.indexed()
            out.append(s)
    return out


class SiteUses(Generic[_S]):
    """A store's sites by last use and the calls using each: what to release and what to forget.

    Both stores keep one, changed under their own lock. Invariants: ``recent``
    names exactly the sites of ``sites``, least recently used first; a site
    some call is using (``begin`` without its ``end`` yet) is never forgotten.
    """

    def __init__(self, sites: dict[str, _S], budget: int, kept: int) -> None:
        self.sites = sites
        self.budget = budget
        self.kept = max(1, kept)
        self.recent: OrderedDict[str, None] = OrderedDict()
        self.users: dict[str, int] = {}

    def begin(self, site: str) -> tuple[list[_S], list[_S]]:
        """``site`` (in ``sites``) is used by one more call, from now on the most recent: the sites whose
        records and indexes must be released to fit the budget, and those taken out of ``sites`` (idle,
        least recently used) so that the rest fit ``kept``."""
        self.users[site] = self.users.get(site, 0) + 1
        self.recent[site] = None
        self.recent.move_to_end(site)
        victims = over_budget(self.sites, self.recent, site, self.budget)
        gone: list[_S] = []
        excess = len(self.sites) - self.kept
        for name in list(self.recent):
            if excess <= 0:
                break
            if name not in self.users:
                gone.append(self.sites.pop(name))
                del self.recent[name]
                excess -= 1
        return victims, gone

    def end(self, site: str) -> None:
        """One call using ``site`` is over."""
        left = self.users[site] - 1
        if left:
            self.users[site] = left
        else:
            del self.users[site]
