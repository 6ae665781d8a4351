"""int8 dynamic-quantization variants of the exported MiniLM, and each one's cosine to fp32 on the 266 eval queries.

Run by setup.sh after export_minilm.py. Only ``model_int8_pc.onnx`` (per-channel) is a configuration of the
tables (``minilm-int8pc``); the MatMul-only variants were tried and printed here only.
"""

from __future__ import annotations

from typing import Any

from bench.ltm_eval.models.paths import MODELS

VARIANTS: dict[str, dict[str, Any] | None] = {
    "model_int8.onnx": None,  # made by export_minilm.py: the defaults
    "model_int8_pc.onnx": {"per_channel": True},
    "model_int8_mm.onnx": {"op_types_to_quantize": ["MatMul"]},
    "model_int8_mm_pc.onnx": {"op_types_to_quantize": ["MatMul"], "per_channel": True},
    "model_int8_pre_mm_pc.onnx": {"op_types_to_quantize": ["MatMul"], "per_channel": True, "_pre": True},
}


def main() -> None:
    import numpy as np
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from bench.ltm_eval import queries
    from bench.ltm_eval.models.embedders import OnnxBert, minilm_tok

    d = MODELS / "minilm"
    src, pre = d / "model.onnx", d / "model_pre.onnx"
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    for name, variant in VARIANTS.items():
        if variant is None:
            continue
        kw = dict(variant)
        inp = pre if kw.pop("_pre", False) else src
        quantize_dynamic(str(inp), str(d / name), weight_type=QuantType.QInt8, **kw)
    texts = [q.text for q in queries()]
    ref = OnnxBert(src, minilm_tok(), cache=False)
    r = np.stack([ref.embed_one(t) for t in texts])
    for name in VARIANTS:
        e = OnnxBert(d / name, minilm_tok(), cache=False)
        c = (r * np.stack([e.embed_one(t) for t in texts])).sum(1)
        print(f"{name:<28} cos to fp32: mean {c.mean():.4f} min {c.min():.4f}")


if __name__ == "__main__":
    main()
