"""The in-flight search figure, measured in a process of its own started the way ``convmem serve`` starts.

``python -m bench.memory_inflight DATA_DIR [--quick]`` (run by :mod:`bench.memory`): SQLite's heap statistics
are turned off first, as the server turns them off at start-up
(:func:`~logstore.memories.sqlite_statistics.turn_off_sqlite_statistics`), before anything opens SQLite; then
``memory_search`` on the site in ``DATA_DIR``, alone and ``IN_FLIGHT`` calls at once in alternating rounds
(:func:`~bench.ltm_eval.concurrency.interleaved`). Prints one JSON object: the latencies, the CPU per call, the
cores used, how many encodes overlapped at most, and the statistics' outcome.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from typing import Any

#: Searches in flight for the concurrency figure.
IN_FLIGHT = 8


class _Overlap:
    """The shipped encoder, counting how many of its encodes ran at once at most (what the locks allowed)."""

    def __init__(self) -> None:
        from convmem.logstore.memories.encoder import default_encoder

        self.inner = default_encoder()
        self.dim = self.inner.dim
        self.model_id = self.inner.model_id
        self._lock = threading.Lock()
        self.now = self.most = 0

    def embed_one(self, text: str) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return self.inner.embed_one(text)
        finally:
            with self._lock:
                self.now -= 1

    def embed(self, texts: Sequence[str]) -> Any:
        return self.inner.embed(texts)


def measure(data_dir: str, site: str, quick: bool) -> dict[str, Any]:
    """The figure's raw material; call in a fresh process (after the statistics' start-up step)."""
    from convmem.logstore.memories import LongTermMemory  # type: ignore[attr-defined,unused-ignore]
    from convmem.logstore.memories.retrieval import Retriever

    from .ltm_eval import queries
    from .ltm_eval.concurrency import interleaved

    texts = list(dict.fromkeys(q.text for q in queries()))
    rounds, per_thread = (3, 10) if quick else (8, 10)
    overlap = _Overlap()
    ltm = LongTermMemory(data_dir, retriever_factory=lambda d: Retriever(d, answers_kept=0, query_vectors_kept=0,
                                                                         embedder=overlap))
    try:
        for t in texts[:30]:  # warm up: the open, the encoder's arena
            ltm.search(site, t, limit=10)
        overlap.most = 0
        res = interleaved(lambda i: ltm.search(site, texts[i % len(texts)], limit=10), IN_FLIGHT,
                          rounds, per_thread)
    finally:
        ltm.close()
    return {"alone": res.alone, "together": res.together, "ratio": res.ratio, "summary": res.summary(IN_FLIGHT),
            "rounds": rounds, "wall_together": res.wall_together, "cpu_alone": res.cpu_alone,
            "cpu_together": res.cpu_together, "cores": list(res.cores), "encodes_at_once": overlap.most}


def main(argv: Sequence[str] | None = None) -> int:
    from convmem.logstore.memories.sqlite_statistics import turn_off_sqlite_statistics

    outcome = turn_off_sqlite_statistics()  # first, as convmem serve does: nothing of SQLite's is open yet
    ap = argparse.ArgumentParser(prog="python -m bench.memory_inflight")
    ap.add_argument("data_dir")
    ap.add_argument("--site", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    out = measure(a.data_dir, a.site, a.quick)
    out.update(statistics_off=outcome.off, statistics_detail=outcome.detail)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
