"""onnxruntime's transformer optimizer (fused attention/LayerNorm/GELU) on the exported MiniLM, then int8.

Run by setup.sh after export_minilm.py: writes ``models/minilm/model_opt.onnx``, ``model_opt_int8.onnx``
and ``model_opt_int8_pc.onnx`` (configurations ``minilm-opt*``). Their single-thread latency matched the
unoptimized files' (second latency round), so no table row depends on them.
"""

from __future__ import annotations

from bench.ltm_eval.models.paths import MODELS


def main() -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    d = MODELS / "minilm"
    m = optimizer.optimize_model(str(d / "model.onnx"), model_type="bert", num_heads=12, hidden_size=384,
                                 opt_level=1)
    print(m.get_fused_operator_statistics())
    m.save_model_to_file(str(d / "model_opt.onnx"))
    extra = {"DefaultTensorType": 1}
    quantize_dynamic(str(d / "model_opt.onnx"), str(d / "model_opt_int8.onnx"), weight_type=QuantType.QInt8,
                     extra_options=extra)
    quantize_dynamic(str(d / "model_opt.onnx"), str(d / "model_opt_int8_pc.onnx"), weight_type=QuantType.QInt8,
                     per_channel=True, extra_options=extra)


if __name__ == "__main__":
    main()
