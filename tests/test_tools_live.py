"""fsck on a live data directory: a writer process appends (rolling segments) while fsck runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.tools_support import REPO, SITE, fsck, read_all

WRITER = """
import json, os, sys
from convmem.logstore import FileStore
root, stop, site = sys.argv[1], sys.argv[2], sys.argv[3]
acked = {}
with FileStore(root, segment_bytes=4096, lock_timeout=30) as store:
    n = 0
    while not os.path.exists(stop) or n < 50:
        cid = f"live-{n % 4:04d}"
        r = store.append(site, cid, [{"n": n, "pad": "x" * (n % 300)}] * (1 + n % 3))
        acked[cid] = r.last + 1
        n += 1
print(json.dumps(acked))
"""


def test_fsck_while_appends_go_on(tmp_path: Path) -> None:
    root, stop = tmp_path / "data", tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(stop), SITE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while not (root / "sites").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        runs = []
        end = time.monotonic() + 5
        while time.monotonic() < end:
            for args in ((), ("--repair",)):
                status, report = fsck(root, *args)
                runs.append(status)
                assert status == 0, report["problems"]
        assert len(runs) >= 4
    finally:
        stop.touch()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err.decode()
    acked = json.loads(out)
    assert sum(acked.values()) > 200, acked  # the writer really was busy while fsck ran
    assert fsck(root)[0] == 0
    for cid, n in acked.items():
        items = read_all(root, cid)
        assert [i.seq for i in items] == list(range(n))
