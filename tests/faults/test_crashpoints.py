"""Fault 8: named crash points.

``CONVMEM_CRASH_AT=NAME[:N]`` (inert unless set) makes the engine exit with
status 86 the N-th time it reaches a point: mid-record write, before and
after the data sync, between a file's creation and its directory's sync,
after a directory creation, during a segment roll (sealed / next created),
after the manifest intent and commit, after a manifest compaction,
inside an extend-ahead job (zeros written, not synced, on its thread), right
after a first append claimed a pre-created directory of the site's pool
(renamed into place, nothing written), once its segment (header, identity
record and batch) is written and not synced, once it is synced (the rename
not), after its acknowledgement before the rename's directories are synced,
and while the pool is refilled. Each
is crashed at, for several N, and then checked as in the SIGKILL test: every
acknowledged item is there, seqs are gapless, no partial batch, every
conversation with an acknowledged item is listed, and appends (by this
process and by a fresh writer process) continue where they left off.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, Range, fileio
from convmem.logstore.maintenance import check
from tests.mcp_helpers import convmem_cmd

from ._common import SITE, STATS, Ack, make_batch, read_acks, soak, subprocess_env, verify, writer_cmd

POINTS = [
    "record-mid-write",
    "before-data-sync",
    "after-data-sync",
    "after-file-create",
    "after-dir-create",
    "segment-roll-sealed",
    "segment-roll-created",
    "manifest-intent",
    "manifest-commit",
    "manifest-compact",
    "extend-ahead-written",
    "pool-claimed",
    "pool-claim-written",
    "pool-claim-synced",
    "pool-claim-settling",
    "pool-entry-built",
]
HITS = list(range(1, 120)) if soak() else [1, 2, 3, 5, 9, 17]
CONVS = [f"cp-conv-{i:04d}" for i in range(5)]
#: A first append's claim points are reached once per new conversation: their workload writes to more of
#: them, so every N of ``HITS`` is reached.
CLAIM_CONVS = [f"cp-conv-{i:04d}" for i in range(max(HITS) + 3)]


def _convs(point: str) -> list[str]:
    return CLAIM_CONVS if point.startswith("pool-claim") else CONVS
OPTS = {"segment_bytes": 1024, "index_interval": 256}


def _run_writer(
    root: Path, acks: Path, wid: str, seed: int, crash: str | None, batches: int, convs: list[str]
) -> int:
    env = subprocess_env(CONVMEM_CRASH_AT=crash) if crash else subprocess_env()
    proc = subprocess.run(
        writer_cmd(
            *("--data-dir", str(root), "--id", wid, "--convs", ",".join(convs), "--acks", str(acks)),
            *("--batches", str(batches), "--seed", str(seed), "--segment-bytes", "1024", "--index-interval", "256"),
            *("--compact-bytes", "1", "--max-pad", "200"),
            # The in-place creation's points are reached only without the pool.
            "--conversation-pool" if crash is None or crash.startswith("pool-") else "--no-conversation-pool",
        ),
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode in (0, fileio.CRASH_EXIT_STATUS), proc.stderr.decode(errors="replace")[-2000:]
    return proc.returncode


@pytest.mark.parametrize("point", POINTS)
def test_crash_point(tmp_path: Path, point: str) -> None:
    crashed = 0
    convs = _convs(point)
    for n in HITS:
        root = tmp_path / f"{point}-{n}" / "data"
        acks = root.parent / "acks.jsonl"
        rc = _run_writer(root, acks, "c", n, f"{point}:{n}", 300, convs)
        if rc != fileio.CRASH_EXIT_STATUS:
            STATS["crash points not reached"] += 1
            continue  # the point is reached fewer than n times in this workload
        crashed += 1
        STATS["crash points"] += 1
        acked = read_acks(str(acks))
        store = FileStore(root, **OPTS)  # type: ignore[arg-type]
        try:
            logs = verify(store, SITE, acked, convs)
            for conv in convs:
                r = store.append(SITE, conv, make_batch("v", n, 2, 3))
                assert r.first == len(logs[conv]), f"{point}:{n}: {conv} continued at {r.first}, not {len(logs[conv])}"
                acked.append(Ack(conv, r.first, r.last, "v", n, 2, 3))
        finally:
            store.close()
        # A fresh writer process carries on too, then everything is checked once more.
        rc = _run_writer(root, acks, "d", n + 1000, None, 40, convs)
        assert rc == 0
        acked += [a for a in read_acks(str(acks)) if a.w == "d"]
        store = FileStore(root, **OPTS)  # type: ignore[arg-type]
        try:
            verify(store, SITE, acked, convs)
        finally:
            store.close()
    assert crashed, f"the workload never reached crash point {point}"


# Maintenance: forget and redact, crashed at each of their points (and at the engine's own syncs).
ERASE_CONV, ERASE_KEPT, ERASE_SECRET = "cp-erase-0001", "cp-erase-keep", "cp-erase-secret-91f"
ERASE_POINTS = [
    ("redact", "redact-new-synced"),
    ("redact", "redact-renamed"),
    ("redact", "redact-replaced"),
    ("forget", "forget-unlisted"),
    ("forget", "forget-removed"),
]
REDACT_LO, REDACT_HI = 6, 41


def _erase_fill(root: Path) -> list[Any]:
    with FileStore(root, **OPTS) as store:  # type: ignore[arg-type]
        for i in range(30):  # several segments; batches of two
            store.append(
                SITE,
                ERASE_CONV,
                [
                    {"n": 2 * i, "s": ERASE_SECRET if REDACT_LO <= 2 * i <= REDACT_HI else "-"},
                    {"n": 2 * i + 1, "pad": "p" * 40},
                ],
            )
        store.append(SITE, ERASE_KEPT, [{"kept": True}])
        return store.read(SITE, ERASE_CONV, Range(0, 100))


def _erase_tool(root: Path, tool: str, crash: str | None) -> int:
    args = ["--seqs", f"{REDACT_LO}-{REDACT_HI}"] if tool == "redact" else []
    env = subprocess_env(CONVMEM_CRASH_AT=crash) if crash else subprocess_env()
    proc = subprocess.run(
        convmem_cmd(tool, SITE, ERASE_CONV, *args, "--data-dir", str(root)), env=env, capture_output=True, timeout=60
    )
    assert proc.returncode in (0, fileio.CRASH_EXIT_STATUS), proc.stderr.decode(errors="replace")[-2000:]
    return proc.returncode


def _erase_state_ok(root: Path, tool: str, before: list[Any], done: bool) -> None:
    """Items outside the range intact; inside, each batch wholly before or after (after only once ``done``)."""
    with FileStore(root, **OPTS) as store:  # type: ignore[arg-type]
        now = store.read(SITE, ERASE_CONV, Range(0, 100))
        assert [i.payload for i in store.read(SITE, ERASE_KEPT, Range(0, 10))] == [{"kept": True}]
        if tool == "forget":  # a prefix of the log, never a hole; nothing once it returned
            assert now == before[: len(now)] and (not done or now == [])
            return
        assert [i.seq for i in now] == list(range(len(before)))
        for b, a in zip(before, now, strict=True):
            assert a.recorded_at == b.recorded_at
            if not REDACT_LO <= b.seq <= REDACT_HI:
                assert a.payload == b.payload, b.seq
            else:
                assert a.payload in (b.payload, {"redacted": True}), b.seq
                assert not done or a.payload == {"redacted": True}, b.seq
        for lo in range(0, len(now), 2):  # one record: redacted as a whole
            pair = [now[s].payload == before[s].payload for s in (lo, lo + 1) if REDACT_LO <= s <= REDACT_HI]
            assert len(set(pair)) <= 1, lo
    report = check(str(root))
    assert not report.problems, [(p.kind, p.detail) for p in report.problems]


@pytest.mark.parametrize(("tool", "point"), ERASE_POINTS)
def test_erasure_crash_point(tmp_path: Path, tool: str, point: str) -> None:
    crashed = 0
    for n in (1, 2, 3):
        root = tmp_path / f"{point}-{n}" / "data"
        before = _erase_fill(root)
        if _erase_tool(root, tool, f"{point}:{n}") != fileio.CRASH_EXIT_STATUS:
            continue  # fewer segments rewritten than n
        crashed += 1
        STATS["crash points"] += 1
        _erase_state_ok(root, tool, before, done=False)
        assert _erase_tool(root, tool, None) == 0  # run again: it finishes the job
        _erase_state_ok(root, tool, before, done=True)
        hits = [str(p) for p in root.rglob("*") if p.is_file() and ERASE_SECRET.encode() in p.read_bytes()]
        assert hits == []
    assert crashed, f"{tool} never reached crash point {point}"
