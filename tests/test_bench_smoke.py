"""The bench still runs: ``python -m bench --smoke --json`` produces every headline ratio.

A broken workload, a renamed ratio or a peer that no longer opens fails
here rather than in the next full run. The figures themselves are
meaningless at these sizes and are not checked (speed is the bench's job,
not the test suite's); only that every ratio key is there with a finite
positive value, with a bootstrap interval, and that every sample was kept.
PostgreSQL is left out (its own tests cover it); the long-term memory and
fsck workloads produce no headline ratio.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import RATIO_KEYS

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = "append,session,reads,list,concurrency,open,mcp,rss"
#: Seconds the run may take: about 40 alone on a loaded 2-core machine.
WAIT = 300


@pytest.mark.timeout(WAIT + 60)
def test_smoke_run_produces_every_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    cmd = [sys.executable, "-m", "bench", "--smoke", "--no-postgres", "--only", WORKLOADS, "--json", str(out),
           "--workdir", str(tmp_path / "work")]
    # Its own session, so that on a timeout the servers and writers it started go with it.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"bench --smoke still running after {WAIT} s; its progress:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    doc = json.loads(out.read_text())
    assert list(doc["ratios"]) == list(RATIO_KEYS)
    for key, value in doc["ratios"].items():
        assert value is not None and math.isfinite(value), (key, value)
        # A difference of two p50s (``..._minus_..._ms``) may come out below zero in a run this small (the
        # engine's own append taking longer than the one under MCP, by the disk's noise); a ratio may not.
        assert "_minus_" in key or value > 0, (key, value)
        lo, hi = doc["ratio_intervals"][key]
        assert lo <= hi, (key, lo, hi)
    assert doc["failures"] == {} and doc["missing_ratios"] == []
    # docs/performance-figures.md is generated from such a file, never edited by hand.
    page = [subprocess.run([sys.executable, "-m", "bench.report", str(out)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120) for _ in range(2)]
    assert page[0].returncode == 0, page[0].stderr
    assert page[0].stdout == page[1].stdout  # deterministic: the same run gives the same page
    assert page[0].stdout.startswith("# Performance figures\n")
    for key in RATIO_KEYS:
        assert f"(`{key}`)" in page[0].stdout, key
    env_rec = doc["environment"]
    assert {"loadavg_start", "loadavg_end", "cpu_steal_share", "noisy"} <= set(env_rec)
    append10 = next(r for r in doc["results"] if r["group"] == "append" and r["extra"]["batch"] == 10)
    for backend in ("convmem", "sqlite", "lmdb", "floor", "floor-extending"):
        assert len(append10["samples"][backend]) == doc_ops(doc), backend
        assert set(append10["stats"][backend]) >= {"p50_ms", "p99_ms", "p999_ms", "throughput"}


def doc_ops(doc: dict[str, object]) -> int:
    from bench.context import Sizes

    assert doc["mode"] == "smoke"
    return Sizes.smoke().ops
