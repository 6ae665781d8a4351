"""The semantic half of memory retrieval: cosine similarity of static word embeddings.

The model is WordLlama's 256-dimension ``l2_supercat`` embedding table, which
ships inside the ``wordllama`` wheel (MIT licence, weights included) with its
tokenizer. Loading never touches the network: the package's own loader is
asked for files it already holds, downloads disabled. (Version 0.4.0.post1
looks for the tokenizer under ``tokenizer/`` while the wheel ships it under
``tokenizers/``; the wheel's directory passed as the cache directory is
where that second lookup finds it.) One model is loaded per process, on first
use, and shared by every site's retriever.

A text's vector is the mean of its tokens' vectors, normalised to unit
length, so a dot product is the cosine similarity. Vectors of the memories sit
in one float32 matrix, a row per memory; a query costs one tokenisation, one
mean and one matrix-vector product.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors, one row per text."""

    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def embed_one(self, text: str) -> Vectors:
        """The vector of one text (a query): what ``embed([text])[0]`` gives, up to float rounding."""
        ...


def _import_wordllama() -> Any:
    """Import wordllama without the root-logger set-up its modules do on import.

    wordllama 0.4 calls ``logging.basicConfig(level=INFO)`` when imported: in
    an application that had not configured logging yet, every library's INFO
    records (HTTP clients' request lines among them) would start going to
    stderr. A library must not change its host's logging, so the root logger's
    handlers and level are put back as they were.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return wordllama


class WordLlamaEmbedder:
    """WordLlama's packaged 256-dimension model, loaded from the installed wheel only."""

    dim = 256

    def __init__(self) -> None:
        wordllama = _import_wordllama()
        shipped = Path(wordllama.__file__).parent
        self._model: Any = wordllama.WordLlama.load(
            config="l2_supercat", dim=self.dim, cache_dir=shipped, disable_download=True
        )
        # One model serves every site's retriever; the library does not promise thread safety.
        self._lock = threading.Lock()

    def embed_one(self, text: str) -> Vectors:
        """One text's vector by a shorter path than :meth:`embed`, for queries.

        The library's batch path pads, masks, clips and pools through a dozen
        array operations, which cost more than the arithmetic for one short
        text (0.3 against 0.1 ms on a busy machine). This sums the token
        vectors and normalises: the same vector up to float rounding. Memories
        are always embedded by :meth:`embed`, so a stored vector never depends
        on which path made it.
        """
        model = self._model
        with self._lock:
            ids = model.tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            return np.zeros(self.dim, dtype=np.float32)
        table = model.embedding
        picked = np.minimum(np.asarray(ids, dtype=np.intp), len(table) - 1)
        vec: Vectors = np.add.reduce(table[picked], axis=0, dtype=np.float32)
        norm = float(np.sqrt(vec @ vec))
        out: Vectors = vec / max(norm, 1e-12)
        return out

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vecs = np.asarray(self._model.embed(list(texts), norm=False), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        np.maximum(norms, 1e-12, out=norms)
        out: Vectors = vecs / norms
        return out


_default: WordLlamaEmbedder | None = None
_default_lock = threading.Lock()


def default_embedder() -> WordLlamaEmbedder:
    """The process-wide model, loaded on first call (about a second) and reused after."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WordLlamaEmbedder()
        return _default


class SemanticIndex:
    """Unit vectors addressed by integer keys, ranked by dot product with a query vector."""

    def __init__(self, dim: int) -> None:
        self._dim = dim
        self._m: Vectors = np.zeros((64, dim), dtype=np.float32)
        self._used = np.zeros(64, dtype=bool)  # the row holds a memory
        self._active = np.zeros(64, dtype=bool)  # ... and that memory is active
        self._row_key = np.zeros(64, dtype=np.int64)
        self._key_row: dict[int, int] = {}
        self._free: list[int] = []
        self._n = 0  # rows [0, _n) have been handed out at some point

    def put_many(self, keys: Sequence[int], vecs: Vectors, active: Sequence[bool]) -> None:
        for key, vec, a in zip(keys, vecs, active, strict=True):
            self.put(key, vec, a)

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

    def _grow(self) -> int:
        if self._n == len(self._m):
            cap = len(self._m) * 2
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
