"""Several processes appending to one data directory at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from convmem.logstore import FileStore, ListSelector, Range, Timeout
from tests.logstore_helpers import tree_digest

SITE = "site-multi"
SHARED = "conv-shared"

WRITER = textwrap.dedent(
    """
    import json, sys
    from convmem.logstore import FileStore, ListSelector, Tail
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
                store.read("site-multi", "conv-shared", Tail(10))
                store.list_conversations("site-multi", ListSelector(None, 3))
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


def test_threads_share_a_store_with_few_open_conversations(tmp_path: Path) -> None:
    """Many threads, more conversations than open slots: every append lands exactly once."""
    store = FileStore(tmp_path / "data", max_open=3, segment_bytes=1024, index_interval=64)
    convs = [f"conv-thread-{i}" for i in range(8)]
    errors: list[BaseException] = []
    acked: dict[str, list[tuple[int, int]]] = {c: [] for c in convs}
    guard = threading.Lock()

    def work(n: int) -> None:
        try:
            for r in range(30):
                conv = convs[(n + r) % len(convs)]
                rng = store.append(SITE, conv, [{"t": n, "r": r}, {"t": n, "r": r, "second": True}])
                with guard:
                    acked[conv].append((rng.first, rng.last))
                store.read(SITE, convs[r % len(convs)], Range(0, 5))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    try:
        for conv, ranges in acked.items():
            got = store.read(SITE, conv, Range(0, 1000))
            assert [i.seq for i in got] == list(range(2 * len(ranges)))
            for first, last in ranges:
                a, b = got[first].payload, got[last].payload
                assert last == first + 1 and b == {**a, "second": True}
    finally:
        store.close()


def test_lock_held_elsewhere_times_out_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileStore(root, lock_timeout=0.3)
    store.append(SITE, SHARED, [{"before": True}])
    lock_path = next(p for p in root.rglob("lock") if p.parent.name != root.name)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock_path)!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        other = FileStore(root, lock_timeout=0.3)
        before = tree_digest(str(root))
        try:
            other.append(SITE, SHARED, [{"blocked": True}])
            raise AssertionError("append went through a held lock")
        except Timeout as exc:
            assert exc.retryable and exc.code == "Timeout"
        assert tree_digest(str(root)) == before
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)
    assert other.append(SITE, SHARED, [{"after": True}]).first == 1
    assert [i.payload for i in other.read(SITE, SHARED, Range(0, 9))] == [{"before": True}, {"after": True}]
    other.close()
    store.close()
