"""Searches rank outside the site's mutex and the retriever's lock; writes, deletes and erasures race them.

What must hold: a search (``memory_search``, ``memory_verify``'s related memories, the auto-surface and its
event-loop lookup) never fails because a write ran beside it, its hits are those of one state of the index,
and none started after an erasure returned (in this process or another one) shows the erased memory.
Real files, real threads, a real second process; the shipped encoder.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from memories_support import SITE, create, delete, fields

from convmem.logstore.errors import Unavailable
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.planning import verify_query
from convmem.logstore.memories.record import parse_fields
from convmem.logstore.memories.retrieval import Hit, MemoryDoc, Retriever

REPO = Path(__file__).resolve().parent.parent

HINTS = ["which animal facts does the user like", "zebra subject", "walrus details", "quokka summary",
         "shared tag", "facts about number 3", "what the user likes"]


def _raw(n: int) -> dict[str, Any]:
    return fields(n, dedupe_key=None)


class GatedRanking(Retriever):
    """A Retriever whose unlocked rankings (those on a read connection) of ``gate_text`` wait for ``release``."""

    def __init__(self, index_dir: str | None, gate_text: str) -> None:
        super().__init__(index_dir)
        self.gate_text = gate_text
        self.entered = threading.Event()
        self.release = threading.Event()

    def _ranked(self, view: Any, db: Any, query: str, *args: Any) -> tuple[Hit, ...]:
        if db is not None and query == self.gate_text:
            self.entered.set()
            assert self.release.wait(60), "never released"
        return super()._ranked(view, db, query, *args)


def _gating(gate_text: str) -> tuple[list[GatedRanking], Callable[[str], GatedRanking]]:
    """A retriever factory making :class:`GatedRanking` retrievers, and the list of those it made."""
    made: list[GatedRanking] = []

    def factory(d: str) -> GatedRanking:
        made.append(GatedRanking(d, gate_text))
        return made[-1]

    return made, factory


def test_a_search_ranks_without_holding_the_site_or_the_retriever(tmp_path: Path) -> None:
    """While one search is ranking, reads, other searches and a write of the same site complete; the waiting
    search then shows the current records, nothing erased meanwhile."""
    slow = "which animal facts does the user enjoy"
    made, factory = _gating(slow)

    with LongTermMemory(tmp_path, retriever_factory=factory) as store:
        keep = create(store, _raw(1))
        doomed = create(store, _raw(2))
        found: list[list[str]] = []
        t = threading.Thread(target=lambda: found.append([m.memory_id for m, _ in store.search(SITE, slow, limit=5)]))
        t.start()
        assert made[0].entered.wait(60)
        assert store.get(SITE, keep.memory_id).memory_id == keep.memory_id
        assert store.search(SITE, "zebra1", limit=1)[0][0].memory_id == keep.memory_id
        delete(store, doomed.memory_id, force=True)  # the write takes the mutex and the retriever's lock
        assert not found
        made[0].release.set()
        t.join(60)
        assert found, "the gated search never returned"
        assert doomed.memory_id not in found[0]
        assert keep.memory_id in found[0]


def test_a_verify_ranks_without_holding_the_site(tmp_path: Path) -> None:
    """While a verify's related memories are being ranked, reads and an erasure of the same site complete; the
    verify then shows what the state holds once the ranking is done, nothing erased meanwhile."""
    candidate = {"category": "preference", "subject": "zebra1 and zebra2 facts", "summary": "quokka1 quokka2"}
    gate = verify_query(parse_fields(candidate, "candidate."))
    made, factory = _gating(gate)

    with LongTermMemory(tmp_path, retriever_factory=factory) as store:
        keep = create(store, _raw(1))
        doomed = create(store, _raw(2))
        found: list[set[str]] = []

        def verify() -> None:
            related, _, _ = store.verify(SITE, "create", candidate)
            found.append({m.memory_id for m, _ in related})

        t = threading.Thread(target=verify)
        t.start()
        assert made[0].entered.wait(60)
        assert store.search(SITE, "zebra1", limit=1)[0][0].memory_id == keep.memory_id
        delete(store, doomed.memory_id, force=True)
        assert not found
        made[0].release.set()
        t.join(60)
        assert found == [{keep.memory_id}]


def _searched(store: LongTermMemory, hint: str) -> set[str]:
    return {m.memory_id for m, _ in store.search(SITE, hint, limit=10)}


def _verified(store: LongTermMemory, hint: str) -> set[str]:
    """The related memories a verify of a new memory like ``hint`` shows."""
    related, _, _ = store.verify(SITE, "create", {"category": "preference", "subject": hint, "summary": hint})
    return {m.memory_id for m, _ in related}


def _surfaced(store: LongTermMemory, hint: str) -> set[str]:
    return {m.memory_id for m in store.surface(SITE, hint)}


def _surfaced_at_once(store: LongTermMemory, hint: str) -> set[str]:
    """What the event loop's lookup (a kept answer) shows; nothing when it leaves the hint to a worker."""
    found = store.try_surface(SITE, hint)
    return set() if found is None else {m.memory_id for m in found}


#: Every read that ranks: what each thread of :class:`Searchers` calls in turn.
READS = {"search": _searched, "verify": _verified, "surface": _surfaced, "try_surface": _surfaced_at_once}


class Searchers:
    """Threads searching ``store`` until :meth:`stop` (each thread in turn ``memory_search``, ``memory_verify``'s
    related memories, the auto-surface and its event-loop lookup: :data:`READS`); each read notes which memories
    were erased before it began (:meth:`erased`) and reports it if it shows one, or a memory not in ``ever``,
    or fails."""

    def __init__(self, store: LongTermMemory, threads: int, ever: set[str]) -> None:
        self.store, self.ever = store, ever
        self.gone: set[str] = set()
        self.problems: list[str] = []
        self.calls = dict.fromkeys(READS, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,)) for w in range(threads)]
        for t in self._threads:
            t.start()

    def erased(self, memory_id: str) -> None:
        """``memory_id``'s erasure has returned: no search begun from now on may show it."""
        with self._lock:
            self.gone.add(memory_id)

    def _run(self, w: int) -> None:
        i = 0
        while not self._stop.is_set():
            with self._lock:
                gone = set(self.gone)
            hint = f"{HINTS[(w + i) % len(HINTS)]} {i % 5}"
            what = list(READS)[(w + i // len(HINTS)) % len(READS)]
            i += 1
            try:
                ids = READS[what](self.store, hint)
                self.calls[what] += 1
            except Exception as exc:  # any failure is the finding
                self.problems.append(f"{what} {hint!r} raised {exc!r}")
                return
            if ids & gone:
                self.problems.append(f"{what} {hint!r} begun after the erasure of {sorted(ids & gone)} showed it")
            if not ids <= self.ever:
                self.problems.append(f"{what} {hint!r} showed unknown ids {sorted(ids - self.ever)}")

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


def test_searches_racing_writes_never_fail_and_never_show_what_was_erased(tmp_path: Path) -> None:
    """Threads search while one thread creates, updates, soft-deletes and erases; every search started after an
    erasure returned is checked for the erased memory, and every hit is a memory the store held."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    with LongTermMemory(tmp_path) as store:
        live = [create(store, _raw(n)).memory_id for n in range(12)]
        ever = set(live)
        searchers = Searchers(store, 4, ever)
        try:
            n = 100
            for _ in range(40):
                action = rnd.choice(["create", "update", "soft", "erase", "erase"])
                if action == "create" or not live:
                    m = create(store, _raw(n))
                    n += 1
                    ever.add(m.memory_id)
                    live.append(m.memory_id)
                    continue
                mid = rnd.choice(live)
                if action == "update":
                    if store.get(SITE, mid).active:
                        _, token, _ = store.verify(SITE, "update", _raw(n), mid)
                        store.upsert(SITE, _raw(n), token, memory_id=mid)
                        n += 1
                elif action == "soft":
                    delete(store, mid)
                else:
                    delete(store, mid, force=True)
                    live.remove(mid)
                    searchers.erased(mid)
        finally:
            searchers.stop()
        assert not searchers.problems, searchers.problems[:5]
        assert searchers.gone, "the run erased nothing"
        assert all(searchers.calls.values()), searchers.calls
        for hint in HINTS:
            assert not {m.memory_id for m, _ in store.search(SITE, hint, limit=50)} & searchers.gone


ERASER = textwrap.dedent(
    """
    import json, sys
    from convmem.logstore.memories import LongTermMemory
    root, site = sys.argv[1], sys.argv[2]
    store = LongTermMemory(root, lock_timeout=60)
    for line in sys.stdin:
        mid = line.strip()
        _, token, _ = store.verify(site, "delete", None, mid, force=True)
        store.delete(site, mid, token, True)
        print(json.dumps(mid), flush=True)
    store.close()
    """
)


def test_an_erasure_by_another_process_is_never_shown_by_a_later_search(tmp_path: Path) -> None:
    """A second process erases memories one by one while this one searches from threads: once the other process
    says an erasure returned, no search started after shows that memory."""
    root = tmp_path / "data"
    with LongTermMemory(root) as store:
        ids = [create(store, _raw(n)).memory_id for n in range(10)]
        store.search(SITE, "zebra", limit=10)  # the index is built: later searches rank on it
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen([sys.executable, "-c", ERASER, str(root), SITE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        searchers = Searchers(store, 3, set(ids))
        try:
            for mid in ids[:6]:
                proc.stdin.write(mid + "\n")
                proc.stdin.flush()
                assert json.loads(proc.stdout.readline()) == mid
                searchers.erased(mid)
        finally:
            searchers.stop()
            proc.stdin.close()
            proc.wait(60)
        assert proc.returncode == 0
        assert not searchers.problems, searchers.problems[:5]
        assert all(searchers.calls.values()), searchers.calls
        left = {m.memory_id for m, _ in store.search(SITE, "zebra quokka walrus", limit=20)}
        assert left == set(ids[6:])


def _docs(n: int, rnd: random.Random) -> list[MemoryDoc]:
    words = ["deploy", "friday", "metric", "units", "coffee", "editor", "database", "backup", "zebra", "quokka"]
    return [MemoryDoc(f"m{i:03d}", rnd.choice(["a", "b"]), " ".join(rnd.sample(words, 2)),
                      " ".join(rnd.sample(words, 4)), "", (rnd.choice(["t1", "t2"]),), rnd.random() > 0.2)
            for i in range(n)]


def _ranking(r: Retriever, hint: str, **kw: Any) -> list[tuple[str, float | None, bool]]:
    return [(h.memory_id, h.similarity, h.relevant) for h in r.search(hint, limit=8, **kw)]


def test_a_ranking_torn_by_a_change_is_run_again(tmp_path: Path) -> None:
    """Retriever alone: searches from threads while another thread upserts, erases and reloads. Once the changes
    stop, every search ranks as a retriever freshly loaded with the same memories does."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rnd = random.Random(seed)
    docs = _docs(60, rnd)
    r = Retriever(str(tmp_path / "idx"), answers_kept=0)
    r.load(docs)
    stop = threading.Event()
    failures: list[str] = []
    queries: Sequence[tuple[str, dict[str, Any]]] = [
        ("deploy friday", {}), ("metric units coffee", {"category": "a"}), ("zebra", {"tags": ["t1"]}),
        ("database backup editor", {"include_deleted": True})]

    def searcher(w: int) -> None:
        i = 0
        while not stop.is_set():
            q, kw = queries[(w + i) % len(queries)]
            i += 1
            try:
                hits = r.search(q, limit=8, **kw)
            except Exception as exc:  # any failure is the finding
                failures.append(f"{q!r} raised {exc!r}")
                return
            if len({h.memory_id for h in hits}) != len(hits):
                failures.append(f"{q!r} gave a memory twice")

    threads = [threading.Thread(target=searcher, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    current = {d.memory_id: d for d in docs}
    try:
        for step in range(150):
            pick = rnd.random()
            if pick < 0.5:
                d = _docs(1, rnd)[0]
                d = MemoryDoc(rnd.choice([*current, f"n{step}"]), d.category, d.subject, d.summary, d.details,
                              d.tags, d.active)
                r.upsert(d)
                current[d.memory_id] = d
            elif pick < 0.95 and current:
                mid = rnd.choice(sorted(current))
                r.erase(mid)
                del current[mid]
            else:
                r.load(list(current.values()))
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not failures, failures[:5]
    fresh = Retriever(str(tmp_path / "fresh"), answers_kept=0)
    fresh.load(list(current.values()))
    try:
        for q, kw in queries:
            got, want = _ranking(r, q, **kw), _ranking(fresh, q, **kw)
            assert [(m, rel) for m, _, rel in got] == [(m, rel) for m, _, rel in want]
            assert [s for _, s, _ in got] == pytest.approx([s for _, s, _ in want], abs=1e-3)
    finally:
        fresh.close()
        r.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_store_with_many_sites_keeps_a_bounded_number_open(tmp_path: Path) -> None:
    """Past ``sites_kept`` the least recently used idle sites are closed and forgotten: the store's map of sites and
    its descriptors stop growing, and every site still answers (opened again from its log)."""
    sites = [f"many-{i:02d}" for i in range(9)]
    with LongTermMemory(tmp_path, sites_kept=3) as store:
        made = {site: create(store, _raw(i), site=site).memory_id for i, site in enumerate(sites)}
        held: list[int] = []
        for _ in range(3):
            for i, site in enumerate(sites):
                assert store.search(site, f"zebra{i}", limit=1)[0][0].memory_id == made[site]
                assert len(store._sites) <= 3
            held.append(_open_descriptors())
        assert held[2] <= held[1], held
        early = store.site(sites[0])
        for site in sites[1:5]:
            store.search(site, "zebra", limit=1)
        with pytest.raises(Unavailable):  # closed as idle: a caller holding it learns so, and opens it again
            early.get(made[sites[0]])
        assert store.get(sites[0], made[sites[0]]).memory_id == made[sites[0]]


def test_a_site_in_use_is_never_closed_for_the_others(tmp_path: Path) -> None:
    """A search ranking on one site while calls on more than ``sites_kept`` other sites come and go: the site is not
    closed under it, and the search answers from it."""
    slow = "which animal facts does the user enjoy"
    made, factory = _gating(slow)

    with LongTermMemory(tmp_path, sites_kept=2, retriever_factory=factory) as store:
        mine = create(store, _raw(1), site="busy-site").memory_id
        found: list[list[str]] = []
        t = threading.Thread(
            target=lambda: found.append([m.memory_id for m, _ in store.search("busy-site", slow, limit=5)]))
        t.start()
        assert made[0].entered.wait(60)
        for i in range(5):
            create(store, _raw(i), site=f"other-{i}")
            assert "busy-site" in store._sites
        made[0].release.set()
        t.join(60)
        assert found == [[mine]]
        assert len(store._sites) <= 2
