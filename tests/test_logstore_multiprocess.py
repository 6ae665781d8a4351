"""Several processes appending to one data directory at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from logstore import FileStore, ListSelector, Range

SITE = "site-multi"
SHARED = "conv-shared"

WRITER = textwrap.dedent(
    """
    import json, sys
    from logstore import FileStore
    root, name, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = FileStore(root, segment_bytes=2048, index_interval=128, lock_timeout=30)
    with open(out, "w") as log:
        for r in range(rounds):
            conv = "conv-shared" if r % 2 == 0 else f"conv-{name}"
            batch = [{"writer": name, "round": r, "i": i} for i in range(1 + r % 3)]
            rng = store.append("site-multi", conv, batch)
            log.write(json.dumps([conv, rng.first, rng.last, batch]) + "\\n")
            log.flush()
            if r % 5 == 0:
                store.read("site-multi", "conv-shared", __import__("logstore").Tail(10))
                store.list_conversations("site-multi", __import__("logstore").ListSelector(None, 3))
    store.close()
    """
)


def test_concurrent_writer_processes_keep_seqs_gapless(tmp_path: Path) -> None:
    root = tmp_path / "data"
    FileStore(root).close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writers = [f"w{i}aaaaaa" for i in range(4)]
    procs = [
        subprocess.Popen([sys.executable, str(script), str(root), w, "40", str(tmp_path / f"{w}.log")]) for w in writers
    ]
    for p in procs:
        assert p.wait(timeout=240) == 0
    acked: dict[str, dict[int, dict]] = {}
    for w in writers:
        for line in (tmp_path / f"{w}.log").read_text().splitlines():
            conv, first, last, batch = json.loads(line)
            assert last - first + 1 == len(batch)
            for seq, payload in zip(range(first, last + 1), batch, strict=True):
                assert seq not in acked.setdefault(conv, {}), "two batches were given the same seq"
                acked[conv][seq] = payload
    store = FileStore(root, segment_bytes=2048, index_interval=128)
    try:
        for conv, items in acked.items():
            got = store.read(SITE, conv, Range(0, 1000))
            assert [i.seq for i in got] == list(range(len(got)))
            assert len(got) == len(items) == max(items) + 1
            assert {i.seq: i.payload for i in got} == items
            stamps = [i.recorded_at for i in got]
            assert stamps == sorted(stamps)
        listed = store.list_conversations(SITE, ListSelector(None, 100)).summaries
        assert {s.conversation_id for s in listed} == set(acked)
        assert SHARED in acked
    finally:
        store.close()
