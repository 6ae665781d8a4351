"""The memory Retriever: filters, erasure, reload equivalence and ranking sanity.

These run with whatever rankings the default Retriever uses; the stateful test
checks an incrementally maintained retriever against one rebuilt from a model
of the current memories after every step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from convmem.logstore.memories.retrieval import Hit, MemoryDoc, Retriever


def doc(mid: str, subject: str, summary: str = "", details: str = "", *, category: str = "general",
        tags: tuple[str, ...] = (), active: bool = True) -> MemoryDoc:
    return MemoryDoc(mid, category, subject, summary or subject, details, tags, active)


CORPUS = [
    doc("m_units", "Measurement units", "The user prefers metric units, kilometres and Celsius",
        category="preference", tags=("units", "format")),
    doc("m_deploy", "Release process", "Deploys go out from the release branch after the smoke tests pass",
        category="ops", tags=("deploy",)),
    doc("m_editor", "Editor", "Uses Neovim with the LazyVim distribution", category="preference", tags=("tools",)),
    doc("m_coffee", "Coffee order", "Oat milk flat white, no sugar", category="personal", tags=("food", "format")),
    doc("m_db", "Database", "Production database is PostgreSQL 16 on a managed host",
        details="Backups run nightly at 02:00 UTC", category="ops", tags=("database",)),
]


@pytest.fixture
def retriever(tmp_path: Path) -> Iterator[Retriever]:
    r = Retriever(str(tmp_path / "idx"))
    r.load(CORPUS)
    yield r
    r.close()


def ids(hits: list[Hit]) -> list[str]:
    return [h.memory_id for h in hits]


def test_finds_by_stemmed_word(retriever: Retriever) -> None:
    assert ids(retriever.search("deploying to production", limit=1)) == ["m_deploy"]
    assert ids(retriever.search("Which units should I use?", limit=1)) == ["m_units"]


def test_hits_are_best_first_and_limited(retriever: Retriever) -> None:
    hits = retriever.search("preferences units milk editor database", limit=3)
    assert len(hits) <= 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_subject_weighs_more_than_details(tmp_path: Path) -> None:
    r = Retriever(str(tmp_path / "idx"))
    r.load([
        doc("in_details", "Weekly meeting", "Team sync on Mondays", details="bring the quarterly roadmap"),
        doc("in_subject", "Quarterly roadmap", "Lives in the planning folder"),
    ])
    assert ids(r.search("roadmap", limit=2))[0] == "in_subject"
    r.close()


def test_category_filter(retriever: Retriever) -> None:
    got = ids(retriever.search("units milk editor database deploys", limit=10, category="ops"))
    assert got and set(got) <= {"m_deploy", "m_db"}
    assert retriever.search("units", limit=5, category="no-such-category") == []


def test_tags_filter_needs_every_tag(retriever: Retriever) -> None:
    assert ids(retriever.search("units milk", limit=10, tags=["format"])) in (["m_units", "m_coffee"],
                                                                              ["m_coffee", "m_units"])
    assert ids(retriever.search("units milk", limit=10, tags=["format", "food"])) == ["m_coffee"]
    assert retriever.search("units milk", limit=10, tags=["format", "deploy"]) == []


def test_soft_deleted_hidden_unless_asked(retriever: Retriever) -> None:
    gone = doc("m_units", "Measurement units", "The user prefers metric units, kilometres and Celsius",
               category="preference", tags=("units", "format"), active=False)
    retriever.upsert(gone)
    assert "m_units" not in ids(retriever.search("metric units", limit=5))
    assert ids(retriever.search("metric units", limit=1, include_deleted=True)) == ["m_units"]
    retriever.upsert(doc("m_units", "Measurement units", "metric units again", category="preference"))
    assert ids(retriever.search("metric units", limit=1)) == ["m_units"]


def test_update_replaces_text(retriever: Retriever) -> None:
    before = {h.memory_id: h for h in retriever.search("neovim lazyvim", limit=5)}
    assert before["m_editor"].relevant
    retriever.upsert(doc("m_editor", "Editor", "Switched to Helix", category="preference"))
    # Still an editor, so still near in meaning, but no longer holding the words nor relevant.
    after = {h.memory_id: h for h in retriever.search("neovim lazyvim", limit=5)}
    assert "m_editor" not in after or not after["m_editor"].relevant
    assert ids(retriever.search("helix", limit=1)) == ["m_editor"]


def test_erase_forgets_and_leaves_no_text_on_disk(tmp_path: Path) -> None:
    index_dir = tmp_path / "idx"
    secret = "zanzibarquokka"
    r = Retriever(str(index_dir))
    r.load([*CORPUS, doc("m_secret", f"{secret} subject", f"{secret} summary", f"{secret} details",
                         tags=(f"{secret}tag",))])
    assert ids(r.search(secret, limit=1)) == ["m_secret"]
    r.erase("m_secret")
    assert "m_secret" not in ids(r.search(secret, limit=10, include_deleted=True))
    r.erase("m_secret")  # erasing twice is harmless
    needles = [secret.encode(), secret.encode("utf-16-le"), secret.upper().encode()]
    for root, _dirs, files in os.walk(index_dir):
        for name in files:
            data = (Path(root) / name).read_bytes()
            assert not any(n in data for n in needles), f"{name} still holds erased text"
    r.close()


def test_load_rejects_duplicate_ids(tmp_path: Path) -> None:
    r = Retriever(str(tmp_path / "idx"))
    with pytest.raises(ValueError, match="m1"):
        r.load([doc("m1", "a"), doc("m1", "b")])
    r.close()


def test_bad_limit_and_closed(retriever: Retriever) -> None:
    with pytest.raises(ValueError, match="limit"):
        retriever.search("x", limit=0)
    retriever.close()
    retriever.close()
    with pytest.raises(ValueError, match="closed"):
        retriever.search("units", limit=1)


def test_queries_of_punctuation_or_fts_syntax_are_safe(retriever: Retriever) -> None:
    """Query text is words, never search syntax: no error, no operator, no column filter."""
    # Nothing but punctuation, operators or stop words: nothing is relevant (the semantic half may still rank a
    # weak neighbour of "near" or "b", flagged as not relevant).
    for q in ["", "   ", '"', "NEAR(a b)", "a* AND -b", "!!!", "the and of"]:
        assert [h for h in retriever.search(q, limit=3) if h.relevant] == [], q
    # Syntax around a real word: the word still finds its memory first.
    for q, best in [
        ("units OR", "m_units"),
        ("column:units", "m_units"),
        ('"metric units"', "m_units"),
        ("units)", "m_units"),
        ("subject:editor", "m_editor"),
    ]:
        assert ids(retriever.search(q, limit=3))[:1] == [best], q
    # "NOT" is a word here: the memory that holds "smoke" is not excluded.
    assert ids(retriever.search("deploy* NOT smoke", limit=3))[:1] == ["m_deploy"]


# -- stateful: incremental state == state rebuilt from the model -------------

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "running", "runs", "the", "and"]
CATS = ["a", "b"]
TAGS = ["t1", "t2", "t3"]
MIDS = [f"m{i}" for i in range(8)]

text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
docs = st.builds(
    MemoryDoc,
    memory_id=st.sampled_from(MIDS),
    category=st.sampled_from(CATS),
    subject=text,
    summary=text,
    details=st.one_of(st.just(""), text),
    tags=st.lists(st.sampled_from(TAGS), max_size=3, unique=True).map(tuple),
    active=st.booleans(),
)


class RetrieverVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.tmp = tempfile.mkdtemp(prefix="ltm-retr-")
        self.r = Retriever(os.path.join(self.tmp, "idx"))
        self.r.load([])
        self.model: dict[str, MemoryDoc] = {}

    @rule(d=docs)
    def upsert(self, d: MemoryDoc) -> None:
        self.r.upsert(d)
        self.model[d.memory_id] = d

    @rule(mid=st.sampled_from(MIDS))
    def erase(self, mid: str) -> None:
        self.r.erase(mid)
        self.model.pop(mid, None)

    @rule()
    def reopen(self) -> None:
        self.r.close()
        self.r = Retriever(os.path.join(self.tmp, "idx"))
        self.r.load(list(self.model.values()))

    @rule(q=text, cat=st.one_of(st.none(), st.sampled_from(CATS)),
          tags=st.lists(st.sampled_from(TAGS), max_size=2, unique=True), deleted=st.booleans())
    def search(self, q: str, cat: str | None, tags: list[str], deleted: bool) -> None:
        got = self.r.search(q, limit=20, category=cat, tags=tags, include_deleted=deleted)
        fresh = Retriever(os.path.join(self.tmp, "fresh"))
        fresh.load(list(self.model.values()))
        want = fresh.search(q, limit=20, category=cat, tags=tags, include_deleted=deleted)
        fresh.close()
        assert ids(got) == ids(want)
        assert [h.score for h in got] == pytest.approx([h.score for h in want])
        qwords = set(q.split()) - {"the", "and"} or set(q.split())
        for h in got:
            d = self.model[h.memory_id]
            assert deleted or d.active
            assert cat is None or d.category == cat
            assert set(tags) <= set(d.tags)
        # every memory that holds each content word of the query and passes the filters is found
        for d in self.model.values():
            words = set(f"{d.subject} {d.summary} {d.details}".split())
            if (qwords <= words and (deleted or d.active) and (cat is None or d.category == cat)
                    and set(tags) <= set(d.tags)):
                assert d.memory_id in ids(got)

    @invariant()
    def size(self) -> None:
        assert len(self.r) == len(self.model)

    def teardown(self) -> None:
        import shutil

        self.r.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


RetrieverVsModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRetrieverVsModel = RetrieverVsModel.TestCase


def test_identifiers_and_names_are_found_lexically(retriever: Retriever) -> None:
    retriever.upsert(doc("m_ticket", "Ticket XJ-4471", "Zorblax migration owner is Qwerlin", category="ops"))
    assert ids(retriever.search("XJ-4471", limit=1)) == ["m_ticket"]
    assert ids(retriever.search("who is Qwerlin zorblax", limit=1)) == ["m_ticket"]


def test_lexical_only_retriever(tmp_path: Path) -> None:
    r = Retriever(str(tmp_path / "idx"), embedder=None)
    r.load(CORPUS)
    assert ids(r.search("oat milk", limit=1)) == ["m_coffee"]
    assert r.search("entirely unrelated words", limit=3) == []
    r.close()


def test_a_repeated_search_sees_every_change(retriever: Retriever) -> None:
    """Recent answers are reused only until the memories change: a create, a soft delete, an erase."""
    q = "oat milk coffee"
    first = ids(retriever.search(q, limit=3))
    assert first[0] == "m_coffee"
    assert ids(retriever.search(q, limit=3)) == first
    retriever.upsert(doc("m_latte", "Oat milk coffee", "Oat milk coffee, oat milk latte, coffee with oat milk"))
    assert "m_latte" in ids(retriever.search(q, limit=3))
    retriever.upsert(doc("m_latte", "Oat milk coffee", "Oat milk coffee, oat milk latte", active=False))
    assert "m_latte" not in ids(retriever.search(q, limit=3))
    assert "m_latte" in ids(retriever.search(q, limit=3, include_deleted=True))
    retriever.erase("m_latte")
    assert "m_latte" not in ids(retriever.search(q, limit=3, include_deleted=True))
    assert ids(retriever.search(q, limit=3)) == first


def test_no_answers_kept(tmp_path: Path) -> None:
    r = Retriever(str(tmp_path / "idx"), answers_kept=0)
    r.load(CORPUS)
    assert ids(r.search("oat milk", limit=1)) == ids(r.search("oat milk", limit=1)) == ["m_coffee"]
    r.close()


def test_word_counts_follow_every_change() -> None:
    """The common-word cut counts words as rows come, change and go."""
    from convmem.logstore.memories._lexical import LexicalIndex

    idx = LexicalIndex()
    idx.put_many([(1, "Deploy deploys", "déploy", "", ()), (2, "deploy", "", "", ("Ops",))])
    assert idx._counts(["deploy", "deploys", "ops", "other"]) == [2, 1, 1, 0]
    idx.put(1, "other", "", "", ())
    assert idx._counts(["deploy", "deploys", "other"]) == [1, 0, 1]
    idx.remove(2)
    idx.remove(2)
    assert idx._counts(["deploy", "ops", "other"]) == [0, 0, 1]
    assert idx._df == {"other": 1}
    idx.close()


def test_ranking_past_many_filtered_rows() -> None:
    """When the best rows are all filtered out, the ranking still reaches the ones behind them."""
    from convmem.logstore.memories._lexical import LexicalIndex

    idx = LexicalIndex()
    idx.put_many([(k, "alpha alpha alpha", "", "", ()) for k in range(1, 91)]
                 + [(k, "alpha", "bravo charlie delta echo foxtrot golf", "", ()) for k in range(91, 101)])
    got = idx.rank(["alpha"], limit=5, skip=set(range(1, 91)))
    assert [k for k, _ in got] == [91, 92, 93, 94, 95]
    assert [k for k, _ in idx.rank(["alpha"], limit=3)] == [1, 2, 3]
    idx.close()
