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
from collections.abc import Mapping
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
