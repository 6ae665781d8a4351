"""The semantic half of memory retrieval: cosine similarity of sentence vectors.

Vectors come from an :class:`Embedder`, by default the shipped sentence
encoder (:mod:`.encoder`). A query costs one encode (or a cache hit, see
:class:`.retrieval.Retriever`) and one pass over the memories' vectors, read
as int8 (see :class:`SemanticIndex`), with the exact similarity computed
again for the few rows a search looks at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ._rowdot import ZERO_POINT, row_dots

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors, one row per text.

    ``model_id`` names the model in stored vectors: two embedders with the
    same id must give the same vector for the same text.

    An embedder may also have ``embed_query(text, words)``, giving
    ``embed_one(text)`` and a unit vector per word of ``words`` read in
    ``text`` (see ``Encoder.embed_query``); the retriever then uses the word
    vectors in its relevance rule (``Tuning``'s coverage), and judges by the
    words held alone without it.
    """

    dim: int
    model_id: str

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def embed_one(self, text: str) -> Vectors:
        """The vector of one text: what ``embed([text])[0]`` gives, up to float rounding."""
        ...


#: Added to every bound of :class:`Scores`: covers float32 rounding, of the exact products (at most about
#: 2.3e-5 for 384 terms of unit vectors) and of the approximate ones and their bounds (far less).
BOUND_SLACK = 1e-4


#: Rows quantised at a time (see ``SemanticIndex._set_rows``).
_BLOCK = 512


class SemanticIndex:
    """Unit vectors addressed by integer keys, ranked by dot product with a query vector.

    Invariant: every vector put is representable in half precision (the
    retriever rounds them so, ``vectors.rounded``), so each row is kept
    as half floats (its exact value) and as int8 with a scale (``q_r``,
    ``s_r = max|v_r| / 127``), with two norms per row: of the quantisation's
    error ``||v_r - s_r q_r||`` and of ``s_r q_r``. A query's similarities
    (:meth:`scores`) are first approximated from the int8 rows, an exact
    integer product (``._rowdot``: 3.8 MB read at 10,000 rows, not the 15 MB
    of float32), each with a bound on its error; the exact similarity (float32
    ``einsum`` of the row, as the index computed it for every row before) is
    computed only for the rows the bounds cannot rule out. So every
    similarity a search reads, and every ranking, is what the float32 product
    gives, bit for bit.
    """

    def __init__(self, dim: int, capacity: int = 64) -> None:
        self._dim = dim
        self._staged: Vectors | None = None
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        capacity = max(capacity, 16)
        self._m: npt.NDArray[np.float16] = np.zeros((capacity, self._dim), dtype=np.float16)
        self._q: npt.NDArray[np.uint8] = np.full((capacity, self._dim), ZERO_POINT, dtype=np.uint8)
        self._scale: Vectors = np.zeros(capacity, dtype=np.float32)  # s_r
        self._err: Vectors = np.zeros(capacity, dtype=np.float32)  # ||v_r - s_r q_r||, rounded up
        self._qnorm: Vectors = np.zeros(capacity, dtype=np.float32)  # ||s_r q_r||, rounded up
        self._used = np.zeros(capacity, dtype=bool)  # the row holds a memory
        self._active = np.zeros(capacity, dtype=bool)  # ... and that memory is active
        self._row_key = np.zeros(capacity, dtype=np.int64)
        self._key_row: dict[int, int] = {}
        self._free: list[int] = []
        self._n = 0  # rows [0, _n) have been handed out at some point

    def _set_rows(self, start: int, vecs: Vectors) -> None:
        """Store ``vecs`` (float32, half-precision values) as rows ``start`` on: both forms and the norms."""
        for at in range(0, len(vecs), _BLOCK):  # blocks: the float64 temporaries stay small at an open
            self._set_block(start + at, np.asarray(vecs[at:at + _BLOCK], dtype=np.float32))

    def _set_block(self, start: int, v: Vectors) -> None:
        end = start + len(v)
        top = np.abs(v).max(axis=1) if v.size else np.zeros(len(v), dtype=np.float32)
        scale = (top / 127.0).astype(np.float32)
        safe = np.where(scale > 0, scale, np.float32(1.0))
        q = np.clip(np.rint(v / safe[:, None]), -127, 127).astype(np.int8)
        approx = q.astype(np.float64) * scale[:, None].astype(np.float64)
        err = np.sqrt(((v.astype(np.float64) - approx) ** 2).sum(axis=1))
        qn = np.sqrt((approx ** 2).sum(axis=1))
        self._m[start:end] = v
        self._q[start:end] = (q.astype(np.int16) + ZERO_POINT).astype(np.uint8)
        self._scale[start:end] = scale
        self._err[start:end] = (err * (1 + 1e-6)).astype(np.float32)
        self._qnorm[start:end] = (qn * (1 + 1e-6)).astype(np.float32)

    def put_many(self, keys: Sequence[int], vecs: Vectors, active: Sequence[bool]) -> None:
        """Add rows; into an empty index, from the matrix of :meth:`matrix_for`, at once."""
        if vecs is self._staged and self._n == 0:
            n = len(keys)
            self._staged = None
            self._set_rows(0, vecs[:n])
            self._used[:n] = True
            self._active[:n] = np.asarray(active, dtype=bool)
            self._row_key[:n] = np.asarray(keys, dtype=np.int64)
            self._key_row = {k: i for i, k in enumerate(keys)}
            self._n = n
            return
        for key, vec, a in zip(keys, vecs, active, strict=True):
            self.put(key, vec, a)

    def matrix_for(self, n: int) -> Vectors:
        """A float32 matrix of at least ``n`` rows for the empty index, for a caller to fill before
        :meth:`put_many` (which stores it in the index's own form and drops it)."""
        assert self._n == 0
        if len(self._m) < n:
            self._alloc(n)
        self._staged = np.zeros((max(n, 1), self._dim), dtype=np.float32)
        return self._staged

    def put(self, key: int, vec: Vectors, active: bool) -> None:
        row = self._key_row.get(key)
        if row is None:
            row = self._free.pop() if self._free else self._grow()
            self._key_row[key] = row
        self._set_rows(row, np.asarray(vec, dtype=np.float32).reshape(1, -1))
        self._used[row] = True
        self._active[row] = active
        self._row_key[row] = key

    def remove(self, key: int) -> None:
        row = self._key_row.pop(key, None)
        if row is not None:
            self._m[row] = 0.0  # what _set_rows stores for a zero vector, without computing it
            self._q[row] = ZERO_POINT
            self._scale[row] = self._err[row] = self._qnorm[row] = 0.0
            self._used[row] = False
            self._active[row] = False
            self._free.append(row)

    def scores(self, qvec: Vectors) -> Scores:
        """The similarity of every row to ``qvec`` (rows never used or freed included): approximate with a
        bound for every row, after one pass over the int8 rows; exact for the rows asked (:class:`Scores`).

        The exact similarity is the float32 ``einsum`` of the row with ``qvec``, which computes each row's
        dot product by the same loop whatever the row's position, so a rebuilt index, whose rows sit
        elsewhere, gives equal texts equal scores. (BLAS's matrix-vector product sums a row in an order that
        depends on where it sits, and its threads made it slower than this under load.)
        """
        return Scores(self, np.asarray(qvec, dtype=np.float32))

    def rank(self, sims: Scores, min_sim: float, want: int, active_only: bool) -> list[tuple[float, int]]:
        """``(similarity, key)`` of the ``want`` most similar rows (more on a tie), each at least ``min_sim``.

        ``sims`` comes from :meth:`scores`. Only rows of active memories when ``active_only``. Ordered by
        row; similarities are rounded to 1e-6 so that equal texts tie exactly. Exactly the rows, and the
        similarities, that ranking the exact similarities of every row would give: the ``want``-th best
        lower bound ``L`` is at most the ``want``-th best similarity, so a row whose upper bound falls
        below ``L`` (and below ``min_sim``), less the tie tolerance, can be neither among the best nor tied
        with them; the exact similarity is computed for the others alone.
        """
        n = min(self._n, len(sims.approx))
        if n == 0 or want <= 0:
            return []
        if active_only:
            eligible = self._active[:n]
        elif self._free:
            eligible = self._used[:n]
        else:
            eligible = np.ones(n, dtype=bool)
        approx, bound = sims.approx[:n], sims.bound[:n]
        count = int(eligible.sum())
        floor = min_sim - BOUND_SLACK
        if want < n and count >= want:
            low = np.where(eligible, approx - bound, np.float32(-np.inf))
            floor = max(min_sim, float(np.partition(low, n - want)[n - want])) - BOUND_SLACK
        rows = np.flatnonzero(eligible & (approx + bound >= floor))
        exact = sims.exact(rows)
        if want < n and count >= want and len(exact) >= want:
            # The want-th best similarity. Fewer candidates than ``want`` means some of the best lie below
            # ``min_sim`` (their upper bounds do), and then so does the cut: ``min_sim`` decides alone.
            cut = float(np.round(np.partition(exact, len(exact) - want)[len(exact) - want], 6))
            pick = exact >= max(min_sim, cut) - 1e-6
        else:
            pick = exact >= min_sim - 1e-6
        rows, exact = rows[pick], exact[pick]
        rounded = np.round(exact, 6)
        ok = rounded >= min_sim
        return list(zip(rounded[ok].tolist(), self._row_key[rows[ok]].tolist(), strict=True))

    def similarity(self, sims: Scores, keys: Sequence[int]) -> list[float]:
        """The exact similarity in ``sims`` (from :meth:`scores`) of each of ``keys``, rounded like :meth:`rank`.

        -inf for a key that has no row.
        """
        rows = [self._key_row.get(k, -1) for k in keys]
        present = np.asarray([r for r in rows if 0 <= r < len(sims.approx)], dtype=np.int64)
        picked = iter(np.round(sims.exact(present), 6).tolist() if len(present) else [])
        return [next(picked) if 0 <= r < len(sims.approx) else float("-inf") for r in rows]

    def vectors(self, keys: Sequence[int]) -> Vectors:
        """The vector of each of ``keys``, one row each (zeros for a key that has no row)."""
        out: Vectors = np.zeros((len(keys), self._dim), dtype=np.float32)
        for i, k in enumerate(keys):
            row = self._key_row.get(k)
            if row is not None:
                out[i] = self._m[row]
        return out

    def _grow(self) -> int:
        if self._n == len(self._m):
            old, n = self, self._n
            cap = len(self._m) + max(64, len(self._m) // 4)  # +25%: a 10,000-row index wastes little
            m, q, scale, err, qn = old._m, old._q, old._scale, old._err, old._qnorm
            used, act, rk = old._used, old._active, old._row_key
            key_row, free = self._key_row, self._free
            self._alloc(cap)
            self._key_row, self._free = key_row, free
            for mine, theirs in ((self._m, m), (self._q, q), (self._scale, scale), (self._err, err),
                                 (self._qnorm, qn), (self._used, used), (self._active, act), (self._row_key, rk)):
                mine[:n] = theirs[:n]
            self._n = n
        self._n += 1
        return self._n - 1


class Scores:
    """A query's similarities to the rows of a :class:`SemanticIndex`, as it was when they were asked.

    ``approx[r]`` is ``s_r * s_q * (q_r . q_q)`` (the int8 rows' and the int8 query's exact integer
    product, scaled) and ``bound[r]`` bounds ``|exact[r] - approx[r]|``:
    ``v.x - s_r s_q (q_r . q_x) = (v - s_r q_r) . x + s_r q_r . (x - s_q q_x)``, so by Cauchy-Schwarz
    ``||v_r - s_r q_r|| ||x|| + ||s_r q_r|| ||x - s_q q_x||``, plus :data:`BOUND_SLACK`. :meth:`exact` gives
    the float32 similarity of the rows asked, computed once each.
    """

    def __init__(self, index: SemanticIndex, qvec: Vectors) -> None:
        n = index._n
        # The arrays as they are now: a write that replaces them (a growth) leaves these as they were.
        self._m, self._q = index._m, index._q
        self._qvec = qvec
        top = float(np.abs(qvec).max()) if qvec.size else 0.0
        s_q = top / 127.0 if top > 0 else 1.0
        qq = np.clip(np.rint(qvec / np.float32(s_q)), -127, 127).astype(np.int8)
        x = qvec.astype(np.float64)
        miss = float(np.sqrt(((x - qq.astype(np.float64) * s_q) ** 2).sum()))
        norm = float(np.sqrt((x * x).sum()))
        dots = row_dots(self._q[:n], qq)
        # float32 throughout: each product below rounds by at most a few 1e-8 of a similarity (BOUND_SLACK).
        approx: Vectors = dots.astype(np.float32)
        approx *= index._scale[:n]
        approx *= np.float32(s_q)
        bound: Vectors = index._err[:n] * np.float32(norm * (1 + 1e-6))
        bound += index._qnorm[:n] * np.float32(miss * (1 + 1e-6))
        bound += np.float32(BOUND_SLACK)
        self.approx, self.bound = approx, bound
        self._exact: Vectors = np.full(n, np.nan, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.approx)

    def exact(self, rows: npt.NDArray[np.int64]) -> Vectors:
        """The float32 similarity of each of ``rows`` (row indexes below ``len(self)``)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        todo = rows[np.isnan(self._exact[rows])]
        if len(todo):
            block = self._m[todo].astype(np.float32)
            self._exact[todo] = np.einsum("ij,j->i", block, self._qvec)
        out: Vectors = self._exact[rows]
        return out
