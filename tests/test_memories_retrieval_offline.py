"""The sentence encoder of long-term memory loads and works with the network unreachable.

The check runs in a fresh interpreter whose sockets refuse every connection
and name lookup; where the kernel allows it (root, or user namespaces) it also
runs in a new network namespace, which has no interface but loopback. A model
that tried to download anything fails there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import socket

def refuse(*a, **k):
    raise OSError("network disabled by the test")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

import numpy as np
from convmem.logstore.memories.encoder import DIM, MODEL_DIR, default_encoder
from convmem.logstore.memories.retrieval import MemoryDoc, Retriever

e = default_encoder()
v = e.embed(["metric units kilometres celsius", "distance miles temperature fahrenheit", "sourdough bread oven"])
assert v.shape == (3, DIM) and v.dtype == np.float32, (v.shape, v.dtype)
assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
assert v[0] @ v[1] > v[0] @ v[2], (v[0] @ v[1], v[0] @ v[2])
for name in ("LICENSE", "NOTICE", "README.md", "tokenizer.json"):  # shipped with the model
    assert (MODEL_DIR / name).is_file(), name

import tempfile
with tempfile.TemporaryDirectory() as d:
    r = Retriever(d)
    r.load([MemoryDoc("m1", "pref", "Measurement units", "Prefers kilometres and Celsius", "", (), True),
            MemoryDoc("m2", "hobby", "Bread", "Bakes sourdough on Sundays", "", (), True)])
    hits = r.search("should distances be given in miles", limit=1)
    assert [h.memory_id for h in hits] == ["m1"], hits
    r.close()
print("offline-ok")
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # Proxies pointing nowhere: a client that honours them fails too.
    env["HTTP_PROXY"] = env["HTTPS_PROXY"] = env["http_proxy"] = env["https_proxy"] = "http://127.0.0.1:9"
    return env


def test_model_loads_and_ranks_with_sockets_refused() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], env=_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "offline-ok" in out.stdout


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="no permission to create a network namespace here")
def test_model_loads_in_a_namespace_without_network() -> None:
    out = subprocess.run(["unshare", "-n", sys.executable, "-c", CHILD], env=_env(), capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "offline-ok" in out.stdout
