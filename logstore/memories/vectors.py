"""A memory's stored vector: how it sits in a create/update event, and the checks before it is trusted.

The vector is computed once, when the memory is written, and stored in the
same event as the record (``"vec"`` beside ``"record"``, see FORMAT.md)::

    {"model": "<encoder's model id>", "text": "<xxh3-64 hex of the encoded text>", "f16": "<base64>"}

``f16`` is the unit vector as little-endian IEEE half floats (768 bytes for
384 dimensions, 1,024 base64 characters). At open a stored vector is used
only if it names the model loaded now, was made from exactly the text the
memory has now, decodes to the right length, is finite and has unit length
within rounding; otherwise it is recomputed (and never trusted). Erasing a
memory removes its events and so its vector.

Vectors are rounded to half precision *before* they enter the index, so a
memory ranks the same whether its vector was just computed or read back.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

Vectors = npt.NDArray[np.float32]

#: How far from 1 a stored vector's length may be (half-precision rounding is far below it).
NORM_TOLERANCE = 0.01


def text_digest(text: str) -> str:
    """The fingerprint of the text a vector was made from."""
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8"))


def rounded(vec: Vectors) -> Vectors:
    """``vec`` as it will be after a store and a load: through half precision and back."""
    out: Vectors = np.asarray(vec, dtype=np.float32).astype("<f2").astype(np.float32)
    return out


def pack(vec: Vectors, model_id: str, text: str) -> dict[str, Any]:
    """The stored form of ``vec``, computed by ``model_id`` from ``text``."""
    raw = np.asarray(vec, dtype=np.float32).astype("<f2").tobytes()
    return {"model": model_id, "text": text_digest(text), "f16": base64.b64encode(raw).decode("ascii")}


def unpack_many(stored: Sequence[object], texts: Sequence[str], model_id: str, dim: int,
                out: Vectors | None = None) -> tuple[Vectors, list[int]]:
    """:func:`unpack` of many at once, into the first rows of ``out`` (default: a new array): the vectors,
    and the indexes of those that must be recomputed (their rows are zero). One decoding pass for all."""
    if out is None:
        out = np.zeros((len(stored), dim), dtype=np.float32)
    out[: len(stored)] = 0.0
    redo: list[int] = []
    good: list[int] = []
    want = 4 * ((2 * dim + 2) // 3)
    for i, (s, text) in enumerate(zip(stored, texts, strict=True)):
        if not isinstance(s, Mapping):
            redo.append(i)
            continue
        data = s.get("f16")
        if not isinstance(data, str) or len(data) != want or s.get("model") != model_id \
                or s.get("text") != text_digest(text):
            redo.append(i)
            continue
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            redo.append(i)
            continue
        if len(raw) != 2 * dim:
            redo.append(i)
            continue
        # Each row is cast into ``out`` at once: no list of decoded rows, no float32 copy beside ``out``
        # (many short-lived blocks of the same size, reused, rather than thousands kept until the end).
        out[i] = np.frombuffer(raw, dtype="<f2")
        good.append(i)
    if good:
        rows = np.asarray(good)
        sub = out[rows] if len(good) != len(stored) else out[: len(stored)]
        with np.errstate(invalid="ignore", over="ignore"):
            norms = np.sqrt(np.einsum("ij,ij->i", sub, sub))
            ok = np.isfinite(norms) & (np.abs(norms - 1.0) <= NORM_TOLERANCE)
        bad = rows[~ok]
        out[bad] = 0.0
        redo.extend(bad.tolist())
        redo.sort()
    return out, redo


def unpack(stored: object, model_id: str, text: str, dim: int) -> Vectors | None:
    """The vector of ``stored`` if it can be trusted for ``text`` under ``model_id``; None when it must be
    recomputed (absent, made by another model or from another text, or damaged)."""
    if not isinstance(stored, Mapping):
        return None
    if stored.get("model") != model_id or stored.get("text") != text_digest(text):
        return None
    data = stored.get("f16")
    if not isinstance(data, str) or len(data) != 4 * ((2 * dim + 2) // 3):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 2 * dim:
        return None
    vec: Vectors = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if not np.isfinite(vec).all():
        return None
    if abs(float(np.sqrt(vec @ vec)) - 1.0) > NORM_TOLERANCE:
        return None
    return vec
