"""Several processes on one data directory: dedupe races, single-use tokens, SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from memories_support import SITE, create, delete, fields, files_holding

from convmem.logstore.memories import LongTermMemory, VerifyRequired
from convmem.logstore.memories.eventlog import salvage
from convmem.logstore.memories.site import LOG_NAME, memories_dir

REPO = Path(__file__).resolve().parent.parent

RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from convmem.logstore.memories import DuplicateMemory, LongTermMemory
    root, name, rounds, go, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    store = LongTermMemory(root, lock_timeout=30)
    while not os.path.exists(go):
        time.sleep(0.001)
    with open(out, "w") as log:
        for r in range(rounds):
            raw = {"category": "race", "subject": f"race {r} by {name}", "summary": f"written by {name}",
                   "dedupe_key": f"race-{r}"}
            _, token, _ = store.verify("memsite-01", "create", raw)
            try:
                m = store.upsert("memsite-01", raw, token)
                log.write(json.dumps(["won", r, m.memory_id]) + "\\n")
            except DuplicateMemory as exc:
                log.write(json.dumps(["dup", r, exc.existing_id]) + "\\n")
            log.flush()
    store.close()
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_two_processes_racing_on_one_dedupe_key_exactly_one_wins(tmp_path: Path) -> None:
    root = tmp_path / "data"
    LongTermMemory(root).close()
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    go = tmp_path / "go"
    rounds = 25
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(root), name, str(rounds), str(go), str(tmp_path / f"{name}.log")],
            env=_env(),
        )
        for name in ("alpha", "bravo")
    ]
    time.sleep(0.5)
    go.write_text("")
    for p in procs:
        assert p.wait(timeout=240) == 0
    outcomes = {
        name: [json.loads(x) for x in (tmp_path / f"{name}.log").read_text().splitlines()]
        for name in ("alpha", "bravo")
    }
    with LongTermMemory(root) as store:
        stored = {m.fields.dedupe_key: m.memory_id for m in store.all(SITE)}
        assert len(store.all(SITE)) == rounds
    for r in range(rounds):
        a, b = outcomes["alpha"][r], outcomes["bravo"][r]
        assert sorted([a[0], b[0]]) == ["dup", "won"], (r, a, b)
        winner = a if a[0] == "won" else b
        loser = b if winner is a else a
        assert loser[2] == winner[2] == stored[f"race-{r}"]


USER = textwrap.dedent(
    """
    import os, sys, time
    from convmem.logstore.memories import LongTermMemory, VerifyRequired
    root, token, go, subject = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    store = LongTermMemory(root, lock_timeout=30)
    raw = {"category": "shared", "subject": subject, "summary": "one token, two processes"}
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        print("ok", store.upsert("memsite-01", raw, token).memory_id)
    except VerifyRequired as exc:
        print("refused", exc)
    store.close()
    """
)


def test_a_token_is_used_once_across_processes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    raw = {"category": "shared", "subject": "token race", "summary": "one token, two processes"}
    with LongTermMemory(root) as store:
        _, token, _ = store.verify(SITE, "create", raw)
    script = tmp_path / "user.py"
    script.write_text(USER)
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(root), token, str(go), "token race"],
            env=_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(0.5)
    go.write_text("")
    outs = sorted(p.communicate(timeout=120)[0].split()[0] for p in procs)
    assert outs == ["ok", "refused"]
    with LongTermMemory(root) as store:
        assert len(store.all(SITE)) == 1
        try:
            store.upsert(SITE, raw, token)
            raise AssertionError("a used token was accepted after a restart")
        except VerifyRequired:
            pass


WRITER = textwrap.dedent(
    """
    import sys
    from convmem.logstore.memories import LongTermMemory
    root, run = sys.argv[1], sys.argv[2]
    store = LongTermMemory(root, lock_timeout=30)
    i = 0
    while True:
        raw = {"category": "crash", "subject": f"crash subject {i}", "summary": "x" * (i % 400 + 1),
               "details": "d" * (i * 37 % 2000), "dedupe_key": f"crash-{run}-{i}"}
        _, token, _ = store.verify("memsite-01", "create", raw)
        m = store.upsert("memsite-01", raw, token)
        print(m.memory_id, flush=True)
        i += 1
    """
)


def test_sigkill_mid_write_keeps_every_acknowledged_memory(tmp_path: Path) -> None:
    root = tmp_path / "data"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    seed = int.from_bytes(os.urandom(2), "little")
    print(f"seed={seed}")
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root), str(round_)], env=_env(), stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        acked = []
        want = 5 + (seed + round_ * 7) % 20
        while len(acked) < want:
            line = proc.stdout.readline()
            assert line, "writer died"
            acked.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        acked += [x.strip() for x in proc.stdout.read().splitlines() if x.strip()]
        with LongTermMemory(root) as store:
            have = {m.memory_id for m in store.all(SITE)}
            assert set(acked) <= have
            # The store takes writes again (a torn tail, if any, is cut by this writer).
            raw = fields(100 + round_)
            _, token, _ = store.verify(SITE, "create", raw)
            store.upsert(SITE, raw, token)
    _events, damaged, torn = salvage(os.path.join(memories_dir(str(root), SITE), LOG_NAME))
    assert damaged == [] and torn is None


def test_an_erasure_by_one_store_is_seen_by_another_and_never_written_back(tmp_path: Path) -> None:
    # Two stores on one directory hold separate descriptors and flocks, as two processes do.
    a, b = LongTermMemory(tmp_path), LongTermMemory(tmp_path)
    try:
        keep = fields(1)
        _, token, _ = a.verify(SITE, "create", keep)
        a.upsert(SITE, keep, token)
        secret = fields(2, summary="cross-process-erasure-quail")
        _, token, _ = a.verify(SITE, "create", secret)
        victim = a.upsert(SITE, secret, token)
        assert next(m.memory_id for m, _ in b.search(SITE, "quail")) == victim.memory_id
        _, token, _ = b.verify(SITE, "delete", None, victim.memory_id, force=True)
        assert b.delete(SITE, victim.memory_id, token, force=True) is None
        assert victim.memory_id not in [m.memory_id for m, _ in a.search(SITE, "quail", include_deleted=True)]
        later = fields(3)
        _, token, _ = a.verify(SITE, "create", later)
        a.upsert(SITE, later, token)
        a.site(SITE).flush_access()
        assert {m.memory_id for m in b.all(SITE)} == {m.memory_id for m in a.all(SITE)}
    finally:
        a.close()
        b.close()
    assert files_holding(tmp_path, [b"cross-process-erasure-quail"]) == []


ERASER = textwrap.dedent(
    """
    import sys
    from convmem.logstore.memories import LongTermMemory
    root, mid = sys.argv[1], sys.argv[2]
    store = LongTermMemory(root)
    _, token, _ = store.verify("memsite-01", "delete", None, mid, force=True)
    store.delete("memsite-01", mid, token, force=True)
    print("returned")
    """
)


@pytest.mark.parametrize("point", ["memory-rewrite-written", "memory-rewrite-renamed"])
def test_crash_during_erasure(tmp_path: Path, point: str) -> None:
    root = tmp_path / "data"
    secret = fields(5, summary="crash-during-erasure-ibis")
    with LongTermMemory(root) as store:
        keep = [create(store, fields(i)).memory_id for i in range(3)]
        victim = create(store, secret).memory_id
    script = tmp_path / "eraser.py"
    script.write_text(ERASER)
    done = subprocess.run(
        [sys.executable, str(script), str(root), victim],
        env={**_env(), "CONVMEM_CRASH_AT": point},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 86 and "returned" not in done.stdout, done.stderr
    with LongTermMemory(root) as store:
        ids = {m.memory_id for m in store.all(SITE)}
        assert set(keep) <= ids  # every other memory survives either way
        if point == "memory-rewrite-renamed":
            assert victim not in ids
        else:  # not acknowledged: the memory is still there; erase it again
            assert victim in ids
            delete(store, victim, force=True)
        create(store, fields(9))  # the next writer also removes any stale temp file
    assert files_holding(root, [b"crash-during-erasure-ibis"]) == []
