"""The semantic half of memory retrieval: cosine similarity of sentence vectors.

Vectors come from an :class:`Embedder`, by default the shipped sentence
encoder (:mod:`.encoder`). They sit in one float32 matrix, a row per memory;
a query costs one encode (or a cache hit, see :class:`.retrieval.Retriever`)
and one matrix-vector product.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

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


class SemanticIndex:
    """Unit vectors addressed by integer keys, ranked by dot product with a query vector."""

    def __init__(self, dim: int, capacity: int = 64) -> None:
        self._dim = dim
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        capacity = max(capacity, 16)
        self._m: Vectors = np.zeros((capacity, self._dim), dtype=np.float32)
        self._used = np.zeros(capacity, dtype=bool)  # the row holds a memory
        self._active = np.zeros(capacity, dtype=bool)  # ... and that memory is active
        self._row_key = np.zeros(capacity, dtype=np.int64)
        self._key_row: dict[int, int] = {}
        self._free: list[int] = []
        self._n = 0  # rows [0, _n) have been handed out at some point

    def put_many(self, keys: Sequence[int], vecs: Vectors, active: Sequence[bool]) -> None:
        """Add rows; into an empty index whose matrix ``vecs`` already is (see :meth:`matrix_for`), no copy."""
        if vecs is self._m and self._n == 0:
            n = len(keys)
            self._used[:n] = True
            self._active[:n] = np.asarray(active, dtype=bool)
            self._row_key[:n] = np.asarray(keys, dtype=np.int64)
            self._key_row = {k: i for i, k in enumerate(keys)}
            self._n = n
            return
        for key, vec, a in zip(keys, vecs, active, strict=True):
            self.put(key, vec, a)

    def matrix_for(self, n: int) -> Vectors:
        """The empty index's own matrix, at least ``n`` rows, for a caller to fill before :meth:`put_many`."""
        assert self._n == 0
        if len(self._m) < n:
            self._alloc(n)
        return self._m

    def put(self, key: int, vec: Vectors, active: bool) -> None:
        row = self._key_row.get(key)
        if row is None:
            row = self._free.pop() if self._free else self._grow()
            self._key_row[key] = row
        self._m[row] = vec
        self._used[row] = True
        self._active[row] = active
        self._row_key[row] = key

    def remove(self, key: int) -> None:
        row = self._key_row.pop(key, None)
        if row is not None:
            self._m[row] = 0.0
            self._used[row] = False
            self._active[row] = False
            self._free.append(row)

    def scores(self, qvec: Vectors) -> Vectors:
        """The similarity of every row to ``qvec`` (rows never used or freed included), one pass over the matrix.

        ``einsum`` computes each row's dot product by the same loop whatever
        the row's position, so a rebuilt index, whose rows sit elsewhere,
        gives equal texts equal scores. BLAS's matrix-vector product is faster
        on an idle machine but sums a row in an order that depends on where it
        sits, and its threads made it slower than this under load (measured:
        wall p50 of a whole lookup 3.5-6.3 ms against 1.9-2.3 ms).
        """
        out: Vectors = np.einsum("ij,j->i", self._m[: self._n], qvec)
        return out

    def rank(self, sims: Vectors, min_sim: float, want: int, active_only: bool) -> list[tuple[float, int]]:
        """``(similarity, key)`` of the ``want`` most similar rows (more on a tie), each at least ``min_sim``.

        ``sims`` comes from :meth:`scores` (this method does not change it).
        Only rows of active memories when ``active_only``. Unordered;
        similarities are rounded to 1e-6 so that equal texts tie exactly.
        """
        n = self._n
        if n == 0 or want <= 0:
            return []
        if active_only:
            sims = np.where(self._active[:n], sims, np.float32(-np.inf))
        elif self._free:
            sims = np.where(self._used[:n], sims, np.float32(-np.inf))
        if want < n:
            rows = np.argpartition(sims, n - want)[n - want:]
            cut = float(np.round(sims[rows].min(), 6))
            rows = np.flatnonzero(sims >= max(min_sim, cut) - 1e-6)
        else:
            rows = np.flatnonzero(sims >= min_sim - 1e-6)
        rounded = np.round(sims[rows], 6)
        ok = rounded >= min_sim
        return list(zip(rounded[ok].tolist(), self._row_key[rows[ok]].tolist(), strict=True))

    def similarity(self, sims: Vectors, keys: Sequence[int]) -> list[float]:
        """The similarity in ``sims`` (from :meth:`scores`) of each of ``keys``, rounded like :meth:`rank`.

        -inf for a key that has no row.
        """
        rows = [self._key_row.get(k, -1) for k in keys]
        present = [r for r in rows if r >= 0]
        picked = iter(np.round(sims[present], 6).tolist() if present else [])
        return [next(picked) if r >= 0 else float("-inf") for r in rows]

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
            cap = len(self._m) + max(64, len(self._m) // 4)  # +25%: a 10,000-row index wastes little
            m = np.zeros((cap, self._dim), dtype=np.float32)
            m[: self._n] = self._m[: self._n]
            used = np.zeros(cap, dtype=bool)
            used[: self._n] = self._used[: self._n]
            act = np.zeros(cap, dtype=bool)
            act[: self._n] = self._active[: self._n]
            self._active = act
            rk = np.zeros(cap, dtype=np.int64)
            rk[: self._n] = self._row_key[: self._n]
            self._m, self._used, self._row_key = m, used, rk
        self._n += 1
        return self._n - 1
