"""Could searches in flight share work? What the two big steps of a search cost alone and done for several at once.

``python -m bench.ltm_eval.sharing [--rows 10000] [--batch 8] [--repeat 20] [--threads 8]``: searches in flight on a
2-core machine can only beat ``in_flight / cores`` times one alone if each costs less than one alone, that is if
the ones in flight at the same moment share work. This measures the two candidates, in one thread, best of
``--repeat`` blocks (least disturbed by other load):

- **The matrix product** (``SemanticIndex.scores``): numpy's ``einsum`` of ``--rows`` unit vectors (384 float32
  dims, 15 MB at 10,000) with one query, against one ``einsum`` with ``--batch`` queries (the matrix read once),
  per query; whether each query's scores come out bitwise equal to its own product (a search's hits must not
  depend on what ran beside it); and numpy's ``matmul`` (BLAS, with its own threads) the same two ways.
- **The encoder** (``Encoder.embed_one``): the labelled queries one run at a time against ``--batch`` per run
  (padded, with an attention mask, each hint's states averaged over its own tokens), per hint, and the largest
  ``1 - cosine`` between a hint's vector made either way.

And what the machine gives: the matrix product alone (numpy releases the GIL for it, so nothing of Python's
serialises it) from one thread and from ``--threads`` at once, calls/s and cores used (CPU time over wall time).
On two idle cores ``--threads`` threads do twice what one does; what they do less is the machine's.

Prints the 1-minute load average before and after: a figure taken above 2 is under load.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from convmem.logstore.memories.encoder import Encoder, default_encoder

from . import queries

Vectors = npt.NDArray[np.float32]


def best_ms(fn: Callable[[], object], repeat: int, calls: int = 10) -> float:
    """The least mean time (ms) of ``calls`` calls of ``fn`` over ``repeat`` blocks, after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) * 1000 / calls)
    return best


def product_figures(rows: int, batch: int, repeat: int, seed: int = 7) -> str:
    """The matrix product alone and batched, per query, and whether batching changes a query's scores."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((rows, 384)).astype(np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    q = rng.standard_normal((batch, 384)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    one = best_ms(lambda: np.einsum("ij,j->i", m, q[0]), repeat)
    many = best_ms(lambda: np.einsum("ij,kj->ki", m, q), repeat) / batch
    alone = np.stack([np.einsum("ij,j->i", m, v) for v in q])
    same = bool(np.array_equal(np.einsum("ij,kj->ki", m, q), alone))
    qt = np.ascontiguousarray(q.T)
    blas_one = best_ms(lambda: m @ q[0], repeat)
    blas_many = best_ms(lambda: m @ qt, repeat) / batch
    blas_diff = float(np.abs((m @ qt).T - alone).max())
    return (f"matrix product, {rows:,} rows: einsum {one:.3f} ms alone, {many:.3f} ms per query in a batch of "
            f"{batch} (scores bitwise equal to alone: {same}); BLAS matmul {blas_one:.3f} ms alone, "
            f"{blas_many:.3f} ms per query batched (largest difference from einsum's {blas_diff:.1e})")


def parallel_figures(rows: int, threads: int, calls: int = 200, seed: int = 7) -> str:
    """The matrix product from one thread and from ``threads`` at once: calls/s and cores used each way."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((rows, 384)).astype(np.float32)
    q = rng.standard_normal(384).astype(np.float32)

    def run(n: int) -> tuple[float, float]:
        def work() -> None:
            for _ in range(calls):
                np.einsum("ij,j->i", m, q)

        ts = [threading.Thread(target=work) for _ in range(n)]
        c0, t0 = time.process_time(), time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        return n * calls / wall, (time.process_time() - c0) / wall

    run(1)  # warm up
    (one, c1), (many, cn) = run(1), run(threads)
    return (f"matrix product from 1 thread {one:.0f} calls/s ({c1:.2f} cores used), from {threads} threads "
            f"{many:.0f} calls/s ({cn:.2f} cores used): {many / one:.2f}x")


def batched_vectors(enc: Encoder, texts: Sequence[str]) -> Vectors:
    """Unit vectors of ``texts`` from one run of the encoder's session: padded, masked, mean over own tokens."""
    tok: Any = enc._tokenizer  # the probe reads the encoder's own tokenizer and session: the same model
    encs = tok.encode_batch(list(texts))
    width = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    feed = {"input_ids": ids, "attention_mask": mask}
    if enc._needs_types:
        feed["token_type_ids"] = np.zeros_like(ids)
    hidden = np.asarray(enc._session.run(None, feed)[0], dtype=np.float32)
    out = np.zeros((len(encs), enc.dim), dtype=np.float32)
    for i, e in enumerate(encs):
        v = hidden[i, : len(e.ids)].mean(axis=0)
        out[i] = v / max(float(np.linalg.norm(v)), 1e-12)
    return out


def encoder_figures(batch: int, repeat: int) -> str:
    """The encoder one hint per run and ``batch`` per run, per hint, and how far batching moves a vector."""
    enc = default_encoder()
    hints = list(dict.fromkeys(q.text for q in queries()))[: 8 * batch]
    groups = [hints[i: i + batch] for i in range(0, len(hints), batch)]

    def each() -> None:
        for h in hints:
            enc.embed_one(h)

    def batched() -> None:
        for g in groups:
            batched_vectors(enc, g)

    one = best_ms(each, max(2, repeat // 4), calls=1) / len(hints)
    many = best_ms(batched, max(2, repeat // 4), calls=1) / len(hints)
    worst = 0.0
    for g in groups:
        alone = np.stack([enc.embed_one(h) for h in g])
        worst = max(worst, float((1.0 - (alone * batched_vectors(enc, g)).sum(axis=1)).max()))
    return (f"encoder, {len(hints)} labelled hints: {one:.3f} ms per hint one per run, {many:.3f} ms per hint "
            f"{batch} per run; largest 1 - cosine between a hint's vectors made the two ways {worst:.1e}")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.sharing", description=__doc__)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args(argv)
    load0 = open("/proc/loadavg").read().split()[0]
    print(product_figures(a.rows, a.batch, a.repeat))
    print(encoder_figures(a.batch, a.repeat))
    print(parallel_figures(a.rows, a.threads))
    load1 = open("/proc/loadavg").read().split()[0]
    print(f"load average {load0} -> {load1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
