"""The sentence encoder of memory retrieval: texts in, unit-length float32 vectors out.

The model is all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0), exported to
ONNX and quantized to int8 per channel by ``bench/ltm_eval/models/ship.sh``;
the file and its tokenizer ship inside convmem (``model/`` beside this module,
with the upstream licence and a README giving every hash and command). Loading
reads those two files only: no network, no cache directory. The model file's
sha256 is checked on load, so a damaged or swapped file fails loudly instead
of ranking by garbage.

A text is tokenized (WordPiece, at most :data:`MAX_TOKENS` tokens, longer
texts truncated), run through the transformer, its token states averaged and
the mean scaled to unit length: the sentence-transformers recipe, so a dot
product of two vectors is their cosine similarity.

``onnxruntime`` releases the GIL while it runs, so encodes in several threads
proceed in parallel; each call uses one intra-op thread by default (on a
2-core machine serving many calls, one thread per call uses the cores better
than two threads fighting for both). ``CONVMEM_ENCODER_THREADS`` overrides it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]

#: The directory of the shipped model.
MODEL_DIR = Path(__file__).parent / "model"
MODEL_FILE = "minilm-l6-v2-int8pc.onnx"
TOKENIZER_FILE = "tokenizer.json"
#: sha256 of :data:`MODEL_FILE` as ship.sh writes it (also in model/README.md).
MODEL_SHA256 = "9bcb2f423beeb5d79afd3bb329b565c3c0b4845fb81c871d5aa4fae6cca1b4eb"
#: Names the model and its quantization in stored vectors: a vector made by another model is stale.
MODEL_ID = "all-MiniLM-L6-v2/onnx-int8-per-channel/" + MODEL_SHA256[:16]
DIM = 384
#: Tokens per text, special tokens included (the model was trained on at most 256 word pieces).
MAX_TOKENS = 256


class EncoderUnavailable(RuntimeError):
    """The shipped model could not be loaded (missing, damaged, or its runtime is absent)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _threads() -> int:
    raw = os.environ.get("CONVMEM_ENCODER_THREADS", "")
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        return 1


class Encoder:
    """all-MiniLM-L6-v2 (int8) through onnxruntime; thread-safe, one instance serves a whole process."""

    dim = DIM
    model_id = MODEL_ID

    def __init__(self, model_dir: Path = MODEL_DIR, *, threads: int | None = None, check_hash: bool = True) -> None:
        model, tok = model_dir / MODEL_FILE, model_dir / TOKENIZER_FILE
        for p in (model, tok):
            if not p.is_file():
                raise EncoderUnavailable(f"the sentence encoder's file {p} is missing; reinstall convmem")
        if check_hash and _sha256(model) != MODEL_SHA256:
            raise EncoderUnavailable(f"{model} does not have the sha256 convmem shipped; reinstall convmem")
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - both are dependencies
            raise EncoderUnavailable(f"the sentence encoder's runtime is not installed: {exc}") from exc
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or _threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        self._session: Any = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        self._needs_types = "token_type_ids" in {i.name for i in self._session.get_inputs()}
        tokenizer = Tokenizer.from_file(str(tok))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()
        self._tokenizer: Any = tokenizer

    def _states(self, text: str) -> tuple[Any, Vectors]:
        """The tokenizer's encoding of ``text`` and the transformer's state of each of its tokens."""
        enc = self._tokenizer.encode(text)
        ids = np.asarray([enc.ids], dtype=np.int64)
        mask = np.ones_like(ids)
        feed = {"input_ids": ids, "attention_mask": mask}
        if self._needs_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden: Vectors = np.asarray(self._session.run(None, feed)[0][0], dtype=np.float32)
        return enc, hidden

    @staticmethod
    def _unit(vec: Vectors) -> Vectors:
        norm = float(np.sqrt(vec @ vec))
        out: Vectors = vec / max(norm, 1e-12)
        return out

    def embed_one(self, text: str) -> Vectors:
        """The unit vector of one text (what ``embed([text])[0]`` gives)."""
        return self._unit(np.asarray(self._states(text)[1].mean(axis=0), dtype=np.float32))

    def embed_query(self, text: str, words: Sequence[str]) -> tuple[Vectors, Vectors]:
        """``embed_one(text)`` and, from the same run, one unit vector per word of ``words``: the mean state of
        the tokens of that word's occurrences in ``text`` (a row of zeros for a word ``text`` does not hold).

        ``words`` are words as the lexical index splits them (:func:`._lexical.words_of`: letters and
        digits, case folded, diacritics removed). A word's state is read in its context ("tuning" of a
        guitar), so it can be compared with a memory's vector to tell whether the memory speaks of it.
        """
        from ._lexical import WORD_PATTERN, words_of

        enc, hidden = self._states(text)
        sentence = self._unit(np.asarray(hidden.mean(axis=0), dtype=np.float32))
        where = {w: i for i, w in enumerate(words)}
        of_word: list[list[int]] = [[] for _ in words]  # the tokens of each word's occurrences
        offsets = enc.offsets
        j = 0
        for m in WORD_PATTERN.finditer(text):
            folded = words_of(m.group())
            i = where.get(folded[0]) if len(folded) == 1 else None
            start, end = m.span()
            while j < len(offsets) and (offsets[j][1] <= offsets[j][0] or offsets[j][0] < start):
                j += 1  # special tokens span nothing; tokens before the word are another's
            while j < len(offsets) and offsets[j][0] < end:
                if i is not None and offsets[j][1] > offsets[j][0]:
                    of_word[i].append(j)
                j += 1
        out: Vectors = np.zeros((len(words), self.dim), dtype=np.float32)
        for i, toks in enumerate(of_word):
            if toks:  # a word with no token stays a row of zeros
                out[i] = self._unit(np.asarray(hidden[toks].sum(axis=0), dtype=np.float32))
        return sentence, out

    def embed(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dim)`` unit vectors, one text at a time (no padding, so a text's vector never
        depends on what it was batched with)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self.embed_one(t)
        return out


_default: Encoder | None = None
_default_lock = threading.Lock()


def default_encoder() -> Encoder:
    """The process-wide encoder, loaded on first call (a few hundred milliseconds) and shared after."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Encoder()
        return _default
