"""Integer dot products of every row of a uint8 matrix with one int8 vector: onnxruntime's MLAS kernel.

The semantic index (:mod:`._semantic`) keeps each memory's vector as int8 (a
scale per row) beside its half-precision copy, and ranks by these products
first. The sums are of integers, exact: a row's product is the same wherever
the row sits, however many rows there are and whatever runs beside it (unlike a
float kernel's, whose order of additions may depend on all three). numpy has no
fast int8 kernel (its integer ``einsum`` is slower than its float32 one over
four times the bytes); MLAS's reads 3.8 MB at 10,000 rows where the float32
product read 15 MB.

The model is one ``MatMulInteger`` node (A: uint8 rows, zero point 128, so
``A - 128`` are the int8 values; B: int8 column), built once with the ``onnx``
package and kept here as its 136 bytes::

    helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "zp"], ["y"])], "rowdot",
        [vi("A", UINT8, ["n", "d"]), vi("B", INT8, ["d", 1])], [vi("y", INT32, ["n", 1])],
        initializer=[helper.make_tensor("zp", UINT8, [], [128])]),
        opset_imports=[helper.make_opsetid("", 13)], producer_name="convmem")  # ir_version 7
"""

from __future__ import annotations

import base64
import threading
from typing import Any

import numpy as np
import numpy.typing as npt

_MODEL = base64.b64decode(
    "CAcSB2NvbnZtZW06dQocCgFBCgFCCgJ6cBIBeSINTWF0TXVsSW50ZWdlchIGcm93ZG90KgoQAioCgAFCAnpwWhUKAUESEAoOCAISCgoDEgFu"
    "CgMSAWRaFAoBQhIPCg0IAxIJCgMSAWQKAggBYhQKAXkSDwoNCAYSCQoDEgFuCgIIAUIECgAQDQ=="
)

#: What the uint8 rows hold: the int8 value plus this (MatMulInteger's zero point of A).
ZERO_POINT = 128

_session: Any = None
_lock = threading.Lock()


def _get() -> Any:
    global _session
    with _lock:
        if _session is None:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1  # like the encoder: one thread per call, the calls share the cores
            opts.inter_op_num_threads = 1
            _session = ort.InferenceSession(_MODEL, opts, providers=["CPUExecutionProvider"])
        return _session


def row_dots(rows: npt.NDArray[np.uint8], vec: npt.NDArray[np.int8]) -> npt.NDArray[np.int32]:
    """``(rows - 128) @ vec`` for C-contiguous ``rows`` (n, d) and ``vec`` (d,), exactly, as int32 (n,)."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int32)
    out: npt.NDArray[np.int32] = _get().run(None, {"A": rows, "B": vec.reshape(-1, 1)})[0][:, 0]
    return out
