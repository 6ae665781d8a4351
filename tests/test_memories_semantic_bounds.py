"""The semantic index ranks from int8 rows and bounds, yet gives exactly what the float32 product of every row gives.

The reference below is the index as it was: one float32 ``einsum`` of every row with the query, then the
top ``want`` (more on a tie, rounded to 1e-6) at least ``min_sim``. Vectors are clustered (near neighbours,
exact duplicates: ties at the cut) so that the bounds have work to do; rows are removed and added between.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.logstore.memories._rowdot import row_dots
from convmem.logstore.memories._semantic import SemanticIndex

DIM = 384
F32 = npt.NDArray[np.float32]


def _units(rng: np.random.Generator, k: int) -> F32:
    v = rng.standard_normal((k, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    out: F32 = v.astype("<f2").astype(np.float32)  # what the retriever puts: half-precision values
    return out


def _reference_rank(m: F32, eligible: npt.NDArray[np.bool_], keys: list[int], q: F32, min_sim: float,
                    want: int) -> list[tuple[float, int]]:
    n = len(m)
    sims = np.where(eligible, np.einsum("ij,j->i", m, q), np.float32(-np.inf))
    if want < n:
        rows = np.argpartition(sims, n - want)[n - want:]
        cut = float(np.round(sims[rows].min(), 6))
        rows = np.flatnonzero(sims >= max(min_sim, cut) - 1e-6)
    else:
        rows = np.flatnonzero(sims >= min_sim - 1e-6)
    rounded = np.round(sims[rows], 6)
    ok = rounded >= min_sim
    return list(zip(rounded[ok].tolist(), [keys[r] for r in rows[ok]], strict=True))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 1500), spread=st.floats(0.05, 2.0))
def test_rank_and_similarity_equal_the_float32_product(seed: int, n: int, spread: float) -> None:
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    centres = _units(rng, 8)
    m = centres[rng.integers(0, 8, n)] + spread * _units(rng, n)
    m = (m / np.linalg.norm(m, axis=1, keepdims=True)).astype("<f2").astype(np.float32)
    m[: n // 10] = m[0]  # duplicates: exact ties
    active = rng.random(n) > 0.1
    index = SemanticIndex(DIM, capacity=n + 8)
    staged = index.matrix_for(n)
    staged[:n] = m
    keys = list(range(1, n + 1))
    index.put_many(keys, staged, active.tolist())
    rows = {k: (m[k - 1], bool(active[k - 1])) for k in keys}
    for k in rng.integers(1, n + 1, n // 20):  # frees rows, refilled below
        index.remove(int(k))
        rows.pop(int(k), None)
    for k in range(n + 1, n + 1 + n // 10 + 3):  # some into freed rows, the rest grows the index
        v, a = _units(rng, 1)[0], bool(rng.random() > 0.1)
        index.put(k, v, a)
        rows[k] = (v, a)
    order = sorted(rows, key=lambda k: index._key_row[k])  # the reference in the index's row order
    mat = np.stack([rows[k][0] for k in order])
    act = np.asarray([rows[k][1] for k in order])
    for _ in range(5):
        q = centres[rng.integers(0, 8)] + rng.uniform(0.0, 1.5) * _units(rng, 1)[0]
        q = (q / np.linalg.norm(q)).astype(np.float32)
        sims = index.scores(q)
        for want in (1, 4, 30, n):
            for min_sim in (0.1, 0.4, -1.0):
                got = index.rank(sims, min_sim, want, active_only=True)
                assert got == _reference_rank(mat, act, order, q, min_sim, want)
                everyone = np.ones(len(order), dtype=bool)
                assert index.rank(sims, min_sim, want, active_only=False) == _reference_rank(
                    mat, everyone, order, q, min_sim, want)
        asked = [int(k) for k in rng.choice(order, size=min(40, len(order)))] + [10**9]
        want_sims = np.round(np.einsum("ij,j->i", np.stack([rows[k][0] for k in asked[:-1]]), q), 6).tolist()
        assert index.similarity(sims, asked) == [*want_sims, float("-inf")]
        assert np.array_equal(index.vectors(asked[:-1]), np.stack([rows[k][0] for k in asked[:-1]]))


def test_row_dots_are_exact_integer_products() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(-127, 128, (257, DIM)).astype(np.int8)
    b = rng.integers(-127, 128, DIM).astype(np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)
    got = row_dots((a.astype(np.int16) + 128).astype(np.uint8), b)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    # A row's product does not depend on where it sits or how many rows there are.
    assert np.array_equal(row_dots((a[100:101].astype(np.int16) + 128).astype(np.uint8), b), want[100:101])
