"""The labelled evaluation set of long-term memory keeps the properties the benchmark relies on."""

from __future__ import annotations

from bench.ltm_eval import Query, memories, queries
from bench.ltm_eval.check import violations


def test_sizes_and_paraphrase_share() -> None:
    qs = queries()
    assert len(memories()) >= 300
    assert len(qs) >= 150
    assert sum(q.kind == "para" for q in qs) * 3 >= len(qs)
    assert {q.dev for q in qs} == {True, False}


def test_paraphrases_share_no_content_word_with_their_targets() -> None:
    assert violations() == []


def test_the_check_catches_shared_words_and_stems() -> None:
    # "deploying" shares a stem with o01's "deploys"; "dietary" a prefix with p17's "diet".
    bad = [Query("q901", "para", ("o01",), "deploying the app"), Query("q902", "para", ("p17",), "dietary needs")]
    found = violations(bad)
    assert len(found) == 2, found
    assert violations([Query("q903", "para", ("p01",), "should distances be given in miles")]) == []
