"""A throwaway PostgreSQL cluster does not outlive the process that started it, however that process dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import pgcluster

pytestmark = pytest.mark.skipif(pgcluster.pg_bin() is None, reason="needs PostgreSQL server binaries")

ROOT = Path(__file__).resolve().parent.parent

# Starts a cluster with its reaper, prints the postmaster's pid and the cluster's directory, then waits.
_CHILD = """
import sys, time
from tests import pgcluster
base = pgcluster.make_base("convmem-test-reaper-")
cluster = pgcluster.start_cluster(base, "reaped")
pgcluster.reap_on_exit(cluster, base)
print(cluster.pid(), base, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_starter_leaves_no_server_and_no_directory() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
        assert len(line) == 2, f"the child did not start its cluster: {line!r}"
        pid, base = int(line[0]), Path(line[1])
        assert _alive(pid) and base.is_dir()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        deadline = time.monotonic() + 60
        while (_alive(pid) or base.exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"postmaster {pid} still runs after its starter was killed"
        assert not base.exists(), f"{base} is still there after its starter was killed"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
