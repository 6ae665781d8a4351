"""The encoder's word vectors and the coverage they give the relevance rule.

``Encoder.embed_query`` gives, from one run of the model, the query's vector
and one vector per content word read in its context; the retriever judges
whether a memory speaks of what a hint asks by how close those are to the
memory's vector (``test_memories_abstention.py`` checks what the rule then
surfaces). Properties run on generated texts (hypothesis prints the failing
example and its seed).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.logstore.memories._lexical import query_terms
from convmem.logstore.memories.encoder import default_encoder

WORDS = ("Sam", "guitar", "tuning", "São", "Miguel", "deploy", "Friday", "3.12", "café", "don't", "e-mail",
         "the", "of", "Atlas", "x_y", "naïve", "ÆON", "42")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), st.sampled_from((" ", ", ", "; ", "? ")))
def test_word_vectors_are_unit_for_held_words_and_zero_for_absent_ones(words: list[str], sep: str) -> None:
    enc = default_encoder()
    text = sep.join(words)
    terms = query_terms(text)
    asked = [*terms, "absentword"]
    sentence, vecs = enc.embed_query(text, asked)
    assert vecs.shape == (len(asked), enc.dim)
    assert float(sentence @ enc.embed_one(text)) > 0.9999  # the same run as embed_one
    norms = np.linalg.norm(vecs, axis=1)
    assert np.allclose(norms[:-1], 1.0, atol=1e-4), (text, terms, norms)  # every query term has its tokens
    assert norms[-1] == 0.0


def test_a_word_read_in_context_is_closer_to_a_memory_that_speaks_of_it() -> None:
    enc = default_encoder()
    text = "what tuning does Sam use on the guitar"
    _, vecs = enc.embed_query(text, ["tuning", "guitar"])
    about_guitar = enc.embed_one("Guitar. Sam is learning fingerstyle guitar and practises twenty minutes a day")
    assert float(vecs[1] @ about_guitar) > float(vecs[0] @ about_guitar) + 0.1
