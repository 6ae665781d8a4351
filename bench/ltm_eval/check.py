"""Check that every paraphrase query shares no content word with its targets.

``python -m bench.ltm_eval.check`` prints each violation and exits 1 if any.
Two words are "shared" when, after removing stop words, they have the same
Porter stem (as SQLite FTS5's ``porter`` tokenizer computes it), or one is a
prefix of the other (4 letters or more), or they begin with the same six
letters: stricter than the index itself, so that "diet" and "dietary" count
as one word too.
"""

from __future__ import annotations

import sqlite3
import sys

from convmem.logstore.memories._lexical import STOP_WORDS, query_terms

from . import Query, memories, queries


class _Stemmer:
    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61 remove_diacritics 2')")
        self.db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")

    def stems(self, word: str) -> str:
        self.db.execute("DELETE FROM t")
        self.db.execute("INSERT INTO t(x) VALUES (?)", (word,))
        return str(self.db.execute("SELECT term FROM v").fetchone()[0])


def _related(a: str, b: str, stem: _Stemmer) -> bool:
    if a == b or stem.stems(a) == stem.stems(b):
        return True
    short, long_ = sorted((a, b), key=len)
    if len(short) >= 4 and long_.startswith(short):
        return True
    return len(a) >= 6 and len(b) >= 6 and a[:6] == b[:6]


def content_words(text: str) -> set[str]:
    return {w for w in query_terms(text) if w not in STOP_WORDS and not w.isdigit()}


def violations(qs: list[Query] | None = None) -> list[str]:
    docs = {d.memory_id: d for d in memories()}
    stem = _Stemmer()
    out = []
    for q in qs if qs is not None else queries():
        if q.kind != "para":
            continue
        qw = content_words(q.text)
        for t in q.targets:
            d = docs[t]
            dw = content_words(" ".join([d.subject, d.summary, d.details, *d.tags]))
            shared = sorted({f"{a}~{b}" for a in qw for b in dw if _related(a, b, stem)})
            if shared:
                out.append(f"{q.qid} -> {t}: {', '.join(shared)}")
    return out


def main() -> int:
    v = violations()
    for line in v:
        print(line)
    qs = queries()
    para = sum(q.kind == "para" for q in qs)
    print(f"{len(memories())} memories, {len(qs)} queries, {para} paraphrases ({para / len(qs):.0%}); "
          f"{len(v)} violation(s)")
    return 1 if v else 0


if __name__ == "__main__":
    sys.exit(main())
