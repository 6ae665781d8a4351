"""Stored vectors: written once with the memory's event, trusted only after every check, recomputed otherwise.

Also the per-site table of query vectors and the relevance flag the auto-surface relies on. Everything runs
the shipped encoder on real files.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memories_support import SITE, create, fields, update

from convmem.logstore.memories import LongTermMemory, eventlog
from convmem.logstore.memories import vectors as V
from convmem.logstore.memories.encoder import DIM, MODEL_ID, Encoder, default_encoder
from convmem.logstore.memories.retrieval import MemoryDoc, Retriever, Tuning, embedding_text
from convmem.logstore.memories.site import LOG_NAME, memories_dir


class Counting:
    """The shipped encoder, counting the texts it is asked to encode."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.model_id = inner.model_id
        self.texts: list[str] = []

    def embed_one(self, text: str) -> Any:
        self.texts.append(text)
        return self.inner.embed_one(text)

    def embed(self, texts: Sequence[str]) -> Any:
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _log(root: Path) -> str:
    return os.path.join(memories_dir(str(root), SITE), LOG_NAME)


def _events(root: Path) -> list[eventlog.Event]:
    return eventlog.salvage(_log(root))[0]


def _retriever_of(store: LongTermMemory) -> Retriever:
    r = store.site(SITE)._retriever
    assert isinstance(r, Retriever)
    return r


def _retriever_of_site(store: LongTermMemory, site: str) -> Retriever:
    r = store._sites[site]._retriever
    assert isinstance(r, Retriever)
    return r


def test_pack_unpack_round_trip_and_every_rejection() -> None:
    enc = default_encoder()
    text = "Measurement units. The user prefers metric units"
    vec = enc.embed_one(text)
    stored = V.pack(vec, MODEL_ID, text)
    back = V.unpack(stored, MODEL_ID, text, DIM)
    assert back is not None and np.array_equal(back, V.rounded(vec))
    assert float(back @ vec) > 0.9999
    raw = base64.b64decode(stored["f16"])
    bad_norm = base64.b64encode((np.frombuffer(raw, "<f2") * np.float16(2)).astype("<f2").tobytes()).decode()
    nan = base64.b64encode(np.full(DIM, np.nan, dtype="<f2").tobytes()).decode()
    for broken in (
        None,
        "not a mapping",
        {**stored, "model": "another-model"},  # stale: another model
        V.pack(vec, MODEL_ID, text + " edited"),  # stale: made from another text
        {**stored, "f16": stored["f16"][:-4]},  # short
        {**stored, "f16": "!" * len(stored["f16"])},  # not base64
        {**stored, "f16": bad_norm},  # not a unit vector
        {**stored, "f16": nan},  # not finite
    ):
        assert V.unpack(broken, MODEL_ID, text, DIM) is None, broken


def test_create_and_update_store_the_vector_once(tmp_path: Path) -> None:
    counting = Counting(default_encoder())
    with LongTermMemory(tmp_path, retriever_factory=lambda d: Retriever(d, embedder=counting)) as store:
        m = create(store, fields(1))
        update(store, m.memory_id, fields(1, summary="the user now likes capybara facts"))
        events = _events(tmp_path)
        assert [e.op for e in events] == ["create", "update"]
        for ev in events:
            rec = ev.body["record"]
            doc = MemoryDoc(rec["id"], rec["category"], rec["subject"], rec["summary"], rec["details"],
                            tuple(rec["tags"]), True)
            assert V.unpack(ev.body["vec"], MODEL_ID, embedding_text(doc), DIM) is not None
        writes = len(counting.texts)
    # A new process (a new store) opens the site from the stored vectors: no memory text is encoded.
    counting.texts.clear()
    with LongTermMemory(tmp_path, retriever_factory=lambda d: Retriever(d, embedder=counting)) as store:
        hits = store.search(SITE, "capybara facts", limit=1)
        assert [m.memory_id for m, _ in hits] == [m.memory_id]
        assert _retriever_of(store).recomputed == 0
        assert counting.texts == ["capybara facts"]  # the query only
    assert writes >= 2


def test_damaged_or_missing_vectors_are_recomputed_not_trusted(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        a = create(store, fields(1, summary="the user keeps bees on the balcony"))
        b = create(store, fields(2, summary="the production database is PostgreSQL"))
        c = create(store, fields(3, summary="sourdough bread is baked on Sundays"))
    events = _events(tmp_path)
    bodies = [dict(e.body) for e in events]
    # a: the vector of another memory (a plausible unit vector, wrong text digest); b: no vector at all;
    # c: its vector scaled (fails the unit-length check).
    bodies[0]["vec"] = dict(bodies[1]["vec"])
    del bodies[1]["vec"]
    raw = np.frombuffer(base64.b64decode(bodies[2]["vec"]["f16"]), "<f2") * np.float16(0.5)
    bodies[2]["vec"] = {**bodies[2]["vec"], "f16": base64.b64encode(raw.astype("<f2").tobytes()).decode()}
    eventlog.rewrite_file(_log(tmp_path), [(e.recorded_us, body) for e, body in zip(events, bodies, strict=True)])
    with LongTermMemory(tmp_path) as store:
        top = {q: store.search(SITE, q, limit=1)[0][0].memory_id
               for q in ("honey and beekeeping", "which SQL server runs in prod", "baking bread at the weekend")}
        assert _retriever_of(store).recomputed == 3
        assert top == {"honey and beekeeping": a.memory_id, "which SQL server runs in prod": b.memory_id,
                       "baking bread at the weekend": c.memory_id}


def test_query_vectors_are_cached_per_site_and_bounded(tmp_path: Path) -> None:
    counting = Counting(default_encoder())
    r = Retriever(str(tmp_path / "idx"), embedder=counting, answers_kept=0, query_vectors_kept=2)
    r.load([MemoryDoc("m1", "pref", "Units", "Prefers kilometres and Celsius", "", (), True)])
    counting.texts.clear()
    for q in ("how far is it in miles", "how far is it in miles", "oven temperature"):
        r.search(q, limit=1)
    assert counting.texts == ["how far is it in miles", "oven temperature"]
    assert not r.answers_at_once("how far is it in miles", 1)  # its vector is kept, but it would rank
    r.search("a third hint", limit=1)  # the table holds two: the oldest goes
    r.search("how far is it in miles", limit=1)
    assert counting.texts[-1] == "how far is it in miles"
    counting.texts.clear()
    r.search("a third hint", limit=1)
    assert counting.texts == []
    r.erase("m1")  # an erasure empties the table (a verify query may have held the memory's text)
    r.search("a third hint", limit=1)
    assert counting.texts == ["a third hint"]
    r.close()


def test_only_a_kept_answer_is_answered_at_once(tmp_path: Path) -> None:
    r = Retriever(str(tmp_path / "idx"), embedder=Counting(default_encoder()))
    r.load([MemoryDoc("m1", "pref", "Units", "Prefers kilometres and Celsius", "", (), True)])
    assert not r.answers_at_once("how far is it in miles", 1)
    r.search("how far is it in miles", limit=1)
    assert r.answers_at_once("how far is it in miles", 1)
    assert not r.answers_at_once("how far is it in miles", 2)  # another limit: another answer
    r.upsert(MemoryDoc("m2", "pref", "Oven", "Bakes at 200 degrees", "", (), True))  # a change drops the answers
    assert not r.answers_at_once("how far is it in miles", 1)
    r.close()


def test_hits_carry_a_readable_similarity_and_unrelated_hints_surface_nothing(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        units = create(store, fields(1, subject="Measurement units",
                                     summary="The user prefers metric units: kilometres, kilograms and Celsius."))
        create(store, fields(2, subject="Deploy schedule", summary="Deploys go out on Tuesdays and Thursdays."))
        create(store, fields(3, subject="Fiscal year", summary="The company's fiscal year starts in April."))
        hits = store.search(SITE, "should distances be given in miles", limit=3)
        assert hits[0][0].memory_id == units.memory_id
        scores = [s for _, s in hits]
        assert all(-1.0 <= s <= 1.0 for s in scores) and scores[0] == max(scores)
        assert [m.memory_id for m in store.surface(SITE, "should distances be given in miles")][:1] == [
            units.memory_id]
        assert store.surface(SITE, "who painted the ceiling of the Sistine Chapel") == []
        # memory_search still ranks whatever is near at all, and its scores say how weak that is.
        weak = store.search(SITE, "what will the temperature be in Oslo tomorrow", limit=3)
        assert store.surface(SITE, "what will the temperature be in Oslo tomorrow") == []
        assert all(s < Tuning().relevance for _, s in weak)


@pytest.mark.parametrize("n", [3])
def test_import_stores_vectors_too(tmp_path: Path, n: int) -> None:
    with LongTermMemory(tmp_path / "a") as src:
        made = [create(src, fields(i)) for i in range(n)]
    with LongTermMemory(tmp_path / "b") as dst:
        assert dst.site(SITE).import_records(made) == (n, 0)
    root = tmp_path / "b"
    assert all("vec" in e.body for e in eventlog.salvage(os.path.join(memories_dir(str(root), SITE), LOG_NAME))[0])


def test_site_indexes_are_released_least_recently_used_first(tmp_path: Path) -> None:
    sites = [f"lru-site-{i:02d}" for i in range(3)]
    with LongTermMemory(tmp_path, index_budget=4) as store:
        for s in sites:
            for i in range(2):
                create(store, fields(i, summary=f"the {s} user likes quokka{i} facts"), site=s)
            store.search(s, "quokka facts", limit=1)
        held = {s: store.site(sites[-1]) is not None and store._sites[s].indexed() for s in sites}
        assert held == {sites[0]: 0, sites[1]: 2, sites[2]: 2}  # 6 > 4: the least recent site's index went
        hits = store.search(sites[0], "quokka facts", limit=2)  # rebuilt on use, from the stored vectors
        assert len(hits) == 2 and store._sites[sites[0]].indexed() == 2
        assert _retriever_of_site(store, sites[0]).recomputed == 0  # the vectors were read back from the log
        store.search(sites[0], "quokka facts", limit=2)  # the next call brings the total back under the budget
        assert [store._sites[s].indexed() for s in sites] == [2, 0, 2]


def _open_fds() -> set[str]:
    """The paths this process's descriptors point to."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_a_store_over_its_budget_lets_go_of_whole_sites(tmp_path: Path) -> None:
    """Past the budget a site's records, index and descriptors all go; its next use reads them back, unchanged."""
    sites = [f"many-site-{i:02d}" for i in range(5)]
    made: dict[str, list[str]] = {}
    with LongTermMemory(tmp_path, index_budget=4) as store:
        for s in sites:
            made[s] = [create(store, fields(i, summary=f"the {s} user likes wombat{i} facts"), site=s).memory_id
                       for i in range(2)]
            store.search(s, "wombat facts", limit=2)
            # Every site but the one in use fits the budget; the one in use is never released.
            assert sum(x.indexed() for x in store._sites.values()) - store._sites[s].indexed() <= 4
        released = [s for s in sites if store._sites[s].indexed() == 0]
        assert released == sites[:3]
        held_paths = _open_fds()
        for s in released:
            site = store._sites[s]
            assert site.state == {} and site._retriever is None and site.log.fd is None and site._lock_fd is None
            assert not any(p.startswith(site._site_path + os.sep) for p in held_paths), s
        hits = store.search(sites[0], "wombat facts", limit=2)  # read again from the log, index rebuilt
        assert sorted(m.memory_id for m, _ in hits) == sorted(made[sites[0]])
        assert _retriever_of_site(store, sites[0]).recomputed == 0
        assert store.get(sites[1], made[sites[1]][1]).memory_id == made[sites[1]][1]


class Gated:
    """The shipped encoder, but an encode of ``gate_text`` waits until ``release`` is set."""

    def __init__(self, inner: Encoder, gate_text: str) -> None:
        import threading

        self.inner = inner
        self.dim = inner.dim
        self.model_id = inner.model_id
        self.gate_text = gate_text
        self.entered = threading.Event()
        self.release = threading.Event()

    def embed_one(self, text: str) -> Any:
        if text == self.gate_text:
            self.entered.set()
            assert self.release.wait(60), "never released"
        return self.inner.embed_one(text)

    def embed(self, texts: Sequence[str]) -> Any:
        return np.stack([self.embed_one(t) for t in texts]) if texts else self.inner.embed(texts)


def test_a_search_encodes_its_query_without_holding_the_site(tmp_path: Path) -> None:
    """While one search's query is being encoded, other calls on the same site go on (and the search then
    ranks with that vector: the same answer as without the wait)."""
    import threading

    slow = "which animal facts does the user enjoy"
    gated = Gated(default_encoder(), slow)
    with LongTermMemory(tmp_path, retriever_factory=lambda d: Retriever(d, embedder=gated)) as store:
        m = create(store, fields(1, summary="the user likes quokka facts"))
        create(store, fields(2, summary="deploys go out on Tuesdays"))
        expected = [x.memory_id for x, _ in store.search(SITE, slow + " please", limit=2)]
        found: list[list[str]] = []
        t = threading.Thread(target=lambda: found.append([x.memory_id for x, _ in store.search(SITE, slow, limit=2)]))
        t.start()
        assert gated.entered.wait(60)
        # The site's mutex is free: a read, a search of another hint and a verify all complete meanwhile.
        assert store.get(SITE, m.memory_id).memory_id == m.memory_id
        assert store.search(SITE, "quokka", limit=1)[0][0].memory_id == m.memory_id
        store.verify(SITE, "create", fields(3, summary="the user likes quokka pictures"))
        assert not found
        gated.release.set()
        t.join(60)
        assert found and found[0][0] == m.memory_id and found[0][0] == expected[0]
