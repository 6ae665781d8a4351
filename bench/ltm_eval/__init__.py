"""The labelled evaluation set of long-term-memory retrieval: memories, queries and their expected hits.

``memories.txt``, ``queries.txt`` and ``noanswer.txt`` are plain text (their
headers give the format). Queries of kind ``para`` share no content word with
their targets (``check.py`` verifies it); ``noanswer.txt`` holds hints for
which no memory is relevant (kind ``near``: a neighbouring topic, ``far``:
unrelated), for the abstention figures. Odd-numbered queries and hints form
the dev half used for tuning, even-numbered ones the test half.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from convmem.logstore.memories.retrieval import MemoryDoc

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Query:
    qid: str
    kind: str  # "lex" or "para"; "near" or "far" for a hint that no memory answers
    targets: tuple[str, ...]
    text: str

    @property
    def dev(self) -> bool:
        return int(self.qid[1:]) % 2 == 1


def _rows(name: str, fields: int) -> list[list[str]]:
    out = []
    for n, line in enumerate((HERE / name).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != fields:
            raise ValueError(f"{name}:{n}: {len(parts)} fields, expected {fields}")
        out.append(parts)
    return out


def memories() -> list[MemoryDoc]:
    """The labelled memories, all active."""
    docs = []
    for mid, category, tags, subject, summary, details in _rows("memories.txt", 6):
        docs.append(MemoryDoc(mid, category, subject, summary, details,
                              tuple(t for t in tags.split(",") if t), True))
    ids = [d.memory_id for d in docs]
    if len(set(ids)) != len(ids):
        raise ValueError("memories.txt: duplicate ids")
    return docs


def queries() -> list[Query]:
    """The labelled queries; every target names a memory of :func:`memories`."""
    known = {d.memory_id for d in memories()}
    out = []
    for qid, kind, targets, text in _rows("queries.txt", 4):
        t = tuple(x.strip() for x in targets.split(",") if x.strip())
        if kind not in ("lex", "para") or not t or not set(t) <= known:
            raise ValueError(f"queries.txt: bad query {qid}")
        out.append(Query(qid, kind, t, text))
    if len({q.qid for q in out}) != len(out):
        raise ValueError("queries.txt: duplicate ids")
    return out


def no_answer() -> list[Query]:
    """The hints for which no labelled memory is relevant (no targets)."""
    out = []
    for qid, kind, text in _rows("noanswer.txt", 3):
        if kind not in ("near", "far") or not qid.startswith("n"):
            raise ValueError(f"noanswer.txt: bad hint {qid}")
        out.append(Query(qid, kind, (), text))
    if len({q.qid for q in out}) != len(out):
        raise ValueError("noanswer.txt: duplicate ids")
    return out
