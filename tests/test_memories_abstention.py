"""The auto-surface shows nothing when nothing stored is relevant, and still finds what is.

The first test goes through the store's public calls (``surface`` is what
``memory_context`` shows) with a few memories of the labelled set; the second
holds the labelled set's figures above floors a little under what the shipped
tuning reaches, so a change that loses abstention or the surface's recall shows.
"""

from __future__ import annotations

from pathlib import Path

from memories_support import SITE, create

from bench.ltm_eval import memories
from bench.ltm_eval.evaluate import abstention_figures
from convmem.logstore.memories import LongTermMemory

KEPT = ("h01", "p17", "b02", "v05", "c03", "c15", "p01", "p09", "h02", "f08", "k18", "k04", "b04", "p18")

#: Hints that name what the memories name (Sam, Atlas, Greenleaf, the guitar, flights) and ask what none of them
#: holds; the last two share the memory's words and topic, and only the word asked about is missing.
NEAR = ("which laptop model does Sam use", "what is Sam's blood type", "what is the maximum upload size on Atlas",
        "how many push-ups can Sam do", "how many employees does Greenleaf have",
        "what tuning does Sam use on the guitar", "which seat did Sam have on the last Eurostar")


def test_surface_abstains_on_near_and_far_hints_and_finds_paraphrases(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        ids = {}
        for d in memories():
            if d.memory_id in KEPT:
                m = create(store, {"category": d.category, "subject": d.subject, "summary": d.summary,
                                   "details": d.details, "tags": list(d.tags)})
                ids[m.memory_id] = d.memory_id
        for hint in (*NEAR, "how do black holes evaporate"):
            assert store.surface(SITE, hint) == [], hint
        shown = {h: [ids[m.memory_id] for m in store.surface(SITE, h)]
                 for h in ("should distances be given in miles or the other system",
                           "when can I book a call with them next week")}
        assert shown["should distances be given in miles or the other system"][:1] == ["p01"], shown
        assert "p09" in shown["when can I book a call with them next week"], shown
        assert [ids[m.memory_id] for m in store.surface(SITE, "Fujifilm X-T4")] == ["b02"]  # every word held
        assert [ids[m.memory_id] for m in store.surface(SITE, "Sam's guitar practice")][:1] == ["b04"]
        assert [ids[m.memory_id] for m in store.surface(SITE, "on the plane to Berlin, where do they want to be "
                                                              "placed")][:1] == ["p18"]
        # Search still ranks, each hit with its readable score (the cosine similarity).
        hits = store.search(SITE, NEAR[0], limit=3)
        assert hits and all(-1.0 <= score <= 1.0 for _, score in hits)


def test_labelled_set_abstention_and_surface_recall_hold_their_floors() -> None:
    figs = abstention_figures()
    test, every = figs["test"], figs["all"]
    assert test["abstention"] >= 0.75 and every["abstention"] >= 0.8, figs
    assert test["abstention_far"] >= 0.95 and test["abstention_near"] >= 0.5, figs
    assert test["surface_recall2"] >= 0.76 and every["surface_recall2"] >= 0.81, figs
    assert every["surface_para_recall2"] >= 0.6, figs
