"""Fault 1: writer processes killed with SIGKILL at random moments.

Several writer processes append to their own conversations and to one shared
by all of them, recording every acknowledged range. Each round kills them
(all at once, or one by one) at a random moment, reopens the store in this
process and checks every promise: every acknowledged item is there with its
exact payload and seq, seqs are gapless, no partial batch is visible, every
conversation with an acknowledged item is listed, and appends continue where
they left off. A second test kills ``convmem redact`` and ``convmem forget``
beside a writer process (see its doc).
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, ListSelector

from ._common import (
    SITE,
    STATS,
    Ack,
    check_listing_order,
    check_log,
    fault_rng,
    make_batch,
    read_acks,
    read_all,
    rounds,
    subprocess_env,
    verify,
    writer_cmd,
)

WRITERS = 3
SHARED = "shared-conversation"


def _own(w: int) -> list[str]:
    return [f"w{w}-conv-a", f"w{w}-conv-b"]


def _spawn(data: Path, w: int, round_no: int, seed: int, convs: list[str] | None = None) -> subprocess.Popen[bytes]:
    convs = [*_own(w), SHARED] if convs is None else convs
    return subprocess.Popen(
        writer_cmd(
            "--data-dir",
            str(data),
            "--id",
            f"w{w}",
            "--convs",
            ",".join(convs),
            "--acks",
            str(data.parent / f"acks-w{w}.jsonl"),
            "--start-batch",
            str(round_no * 1_000_000),
            "--seed",
            str(seed),
            "--segment-bytes",
            "4096",
            "--index-interval",
            "512",
            "--compact-bytes",
            "1",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=subprocess_env(),
    )


def _wait_ready(p: subprocess.Popen[bytes]) -> None:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line == b"ready\n", f"writer failed to start (exit {p.poll()})"


class Reader(threading.Thread):
    """Reads every conversation and the listing over and over while the writers run.

    Every read must be structurally sound (gapless, whole batches, right
    payloads), each listing page in order with no conversation twice, and a
    seq once read must always read the same.
    """

    def __init__(self, data: Path, convs: list[str], seen: dict[tuple[str, int], tuple[str, int, int]]) -> None:
        super().__init__(daemon=True)
        self.data = data
        self.convs = convs
        self.seen = seen
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        store = FileStore(self.data, lock_timeout=10.0, segment_bytes=4096, index_interval=512)
        try:
            while True:  # at least one whole pass per round, however soon the kill comes
                for conv in self.convs:
                    items = read_all(store, SITE, conv)
                    check_log(conv, items)  # a read ends at the log's end: after a whole batch
                    for it in items:
                        key = (conv, it.seq)
                        val = (it.payload["w"], it.payload["b"], it.payload["i"])
                        assert self.seen.setdefault(key, val) == val, f"{conv} seq {it.seq} changed: {val}"
                ids: list[str] = []
                cursor = None
                while True:
                    page = store.list_conversations(SITE, ListSelector(cursor=cursor, limit=3))
                    check_listing_order(page.summaries)
                    ids += [s.conversation_id for s in page.summaries]
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                assert len(ids) == len(set(ids)), f"a listing walked during appends repeats: {ids}"
                if self.stop.is_set():
                    break
        except BaseException as exc:
            self.error = exc
        finally:
            store.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=120)
        if self.error is not None:
            raise self.error


def _reap(procs: list[subprocess.Popen[bytes]], reader: Reader) -> None:
    """Wait for the killed writers (each must have died of the SIGKILL), then stop the reader."""
    for p in procs:
        p.wait()
        assert p.stdout is not None
        p.stdout.close()
        assert p.returncode == -signal.SIGKILL, f"writer exited by itself with {p.returncode}"
    reader.finish()
    STATS["crash rounds"] += 1


def _check_seen(logs: dict[str, list[Any]], seen: dict[tuple[str, int], tuple[str, int, int]]) -> None:
    """Whatever a reader saw while the writers ran was whole and verified, so it survives a SIGKILL."""
    for (conv, seq), (w, b, i) in seen.items():
        it = logs[conv][seq] if seq < len(logs[conv]) else None
        assert it is not None and (it.payload["w"], it.payload["b"], it.payload["i"]) == (w, b, i), (
            f"{conv} seq {seq} was read as {w}/{b}/{i} before the crash, now {it}"
        )


#: Rounds run against one data directory; a soak run starts a fresh one after this many
#: (so a conversation never reaches its item limit and each round costs the same).
ROUNDS_PER_DIR = 30


def test_sigkill_writers(tmp_path: Path) -> None:
    n_rounds = rounds(24, 2000)
    rng = fault_rng("test_sigkill_writers")
    for start in range(0, n_rounds, ROUNDS_PER_DIR):
        stop = min(start + ROUNDS_PER_DIR, n_rounds)
        _rounds_on_one_dir(tmp_path / f"run-{start}", range(start + 1, stop + 1), rng)


def _rounds_on_one_dir(base: Path, round_nos: range, rng: random.Random) -> None:
    base.mkdir()
    data = base / "data"
    all_convs = [SHARED] + [c for w in range(WRITERS) for c in _own(w)]
    verifier_acks: list[Ack] = []
    seen: dict[tuple[str, int], tuple[str, int, int]] = {}
    for round_no in round_nos:
        procs = [_spawn(data, w, round_no, rng.randrange(1 << 30)) for w in range(WRITERS)]
        for p in procs:
            _wait_ready(p)
        reader = Reader(data, all_convs, seen)
        reader.start()
        if rng.random() < 0.5:
            time.sleep(rng.uniform(0.0, 0.5))
            for p in procs:
                p.send_signal(signal.SIGKILL)
        else:
            for p in procs:
                time.sleep(rng.uniform(0.0, 0.25))
                p.send_signal(signal.SIGKILL)
        _reap(procs, reader)

        acks = [a for w in range(WRITERS) for a in read_acks(str(base / f"acks-w{w}.jsonl"))]
        acks += verifier_acks
        store = FileStore(data, lock_timeout=10.0, segment_bytes=4096, index_interval=512)
        try:
            logs = verify(store, SITE, acks, all_convs)
            _check_seen(logs, seen)
            # Appends continue where they left off: the next seq is the end of the log.
            for conv in all_convs:
                batch = make_batch("v", round_no, 2, 10)
                r = store.append(SITE, conv, batch)
                end = len(logs[conv])
                assert r.first == end, f"{conv}: append after the crash got seq {r.first}, the log ends at {end}"
                verifier_acks.append(Ack(conv, r.first, r.last, "v", round_no, 2, 10))
        finally:
            store.close()

    store = FileStore(data, segment_bytes=4096, index_interval=512)
    try:
        acks = [a for w in range(WRITERS) for a in read_acks(str(base / f"acks-w{w}.jsonl"))] + verifier_acks
        verify(store, SITE, acks, all_convs)
        assert len(acks) > len(round_nos) * len(all_convs), "the writers acknowledged nothing: the test tested nothing"
    finally:
        store.close()


def test_sigkill_first_appends(tmp_path: Path) -> None:
    """Writers killed while most of their appends are first appends to new conversations.

    A first append claims a pool entry and is acknowledged once its segment (the
    conversation's identity record in it) is synced; the rename into place is
    synced later. A kill can fall anywhere in that (between the claim and the data,
    between the acknowledgement and the directory syncs, inside the pool's
    refill): every acknowledged batch of every new conversation must be read by
    another process at once (the reader thread, during the round) and after the
    kill, and the conversation listed.
    """
    n_rounds = rounds(6, 400)
    rng = fault_rng("test_sigkill_first_appends")
    per_dir = 10  # rounds on one data directory (each round makes 3 x 30 conversations)
    first_appends = 0
    for start in range(0, n_rounds, per_dir):
        base = tmp_path / f"run-{start}"
        base.mkdir()
        data = base / "data"
        seen: dict[tuple[str, int], tuple[str, int, int]] = {}
        made: list[str] = []
        for round_no in range(start + 1, min(start + per_dir, n_rounds) + 1):
            fresh = {w: [f"r{round_no:04d}-w{w}-new-{k:02d}" for k in range(30)] for w in range(WRITERS)}
            procs = [_spawn(data, w, round_no, rng.randrange(1 << 30), fresh[w]) for w in range(WRITERS)]
            for p in procs:
                _wait_ready(p)
            convs = [c for w in range(WRITERS) for c in fresh[w]]
            made += convs
            reader = Reader(data, convs, seen)
            reader.start()
            time.sleep(rng.uniform(0.05, 0.6))
            for p in procs:
                p.send_signal(signal.SIGKILL)
            _reap(procs, reader)
            acks = [a for w in range(WRITERS) for a in read_acks(str(base / f"acks-w{w}.jsonl"))]
            first_appends = max(first_appends, sum(1 for a in acks if a.first == 0))
            store = FileStore(data, lock_timeout=10.0, segment_bytes=4096, index_interval=512)
            try:
                logs = verify(store, SITE, acks, made)
                _check_seen(logs, seen)
                conv = convs[round_no % len(convs)]
                r = store.append(SITE, conv, make_batch("v", round_no, 1, 10))
                assert r.first == len(logs[conv]), f"{conv}: append after the crash got seq {r.first}"
            finally:
                store.close()
    assert first_appends > 0, "no first append was acknowledged: the test tested nothing"


def test_sigkill_erasures_beside_a_writer(tmp_path: Path) -> None:
    """``convmem redact`` and ``convmem forget`` SIGKILLed at random moments while a writer process appends.

    Each round fills a fresh data directory (a conversation whose seqs LO-HI are redacted, spanning
    several segments, and one that is forgotten), starts a writer appending to the first and a third,
    starts both tools, and kills each tool at a random moment (it may finish first), then the writer. Then:
    every acknowledged item outside the range is intact and no batch is partial; each redacted record
    is wholly original or wholly tombstones; the forgotten conversation is whole, a prefix of itself or
    empty; fsck finds nothing the engine does not resolve itself. Run again, the tools finish: the
    range is tombstones, the conversation is gone, no file holds a byte of either, fsck is clean.
    """
    from convmem.logstore import maintenance
    from convmem.logstore.maintenance import forget_conversation, redact_items
    from tests.mcp_helpers import convmem_cmd

    from .test_powercut_erasure import GONE_CONV, HI, LO, PLAIN, RED, SETUP, _check_log, _files_holding, _needle

    rng = fault_rng("test_sigkill_erasures_beside_a_writer")
    finished: Counter[str] = Counter()
    for round_no in range(rounds(2, 60)):
        base = tmp_path / f"r{round_no}"
        data = base / "data"
        setup: list[Ack] = []
        with FileStore(data, segment_bytes=1024, index_interval=64) as store:
            for b, (conv, n, pad) in enumerate(SETUP, 1):
                r = store.append(SITE, conv, make_batch("s", b, n, pad))
                setup.append(Ack(conv, r.first, r.last, "s", b, n, pad))
        secrets = [_needle(a, s) for a in setup if a.conv == RED for s in range(a.first, a.last + 1) if LO <= s <= HI]
        gone = [_needle(a, s) for a in setup if a.conv == GONE_CONV for s in range(a.first, a.last + 1)]
        acks = base / "acks.jsonl"
        writer = subprocess.Popen(
            writer_cmd(
                *("--data-dir", str(data), "--id", "w", "--convs", f"{RED},{PLAIN}", "--acks", str(acks)),
                *("--seed", str(rng.randrange(1 << 30)), "--segment-bytes", "1024", "--index-interval", "64"),
                *("--max-items", "3", "--max-pad", "120"),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=subprocess_env(),
        )
        _wait_ready(writer)
        tools = {
            name: subprocess.Popen(
                convmem_cmd(name, SITE, conv, *extra, "--data-dir", str(data)),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=subprocess_env(),
            )
            for name, conv, extra in (("redact", RED, ["--seqs", f"{LO}-{HI}"]), ("forget", GONE_CONV, []))
        }
        # A tool takes about half a second to start and run here: the kills spread over that time,
        # the writer killed with the last of them.
        started = time.monotonic()
        kills = sorted((rng.uniform(0.05, 0.8), name) for name in tools)
        for at, name in kills:
            time.sleep(max(0.0, started + at - time.monotonic()))
            tools[name].send_signal(signal.SIGKILL)
        writer.send_signal(signal.SIGKILL)
        for name, p in tools.items():
            rc = p.wait(30)
            assert rc in (0, -signal.SIGKILL), f"{name} exited with {rc}"
            finished[f"{name} {'finished' if rc == 0 else 'killed'}"] += 1
        writer.wait(30)
        assert writer.stdout is not None
        writer.stdout.close()
        STATS["crash rounds"] += 1

        written = read_acks(str(acks))
        report = maintenance.check(str(data))
        assert not report.unrepaired, [f"{p.kind}: {p.detail}" for p in report.unrepaired]
        with FileStore(data, segment_bytes=1024, index_interval=64) as store:
            logs = {c: read_all(store, SITE, c) for c in (RED, GONE_CONV, PLAIN)}
            state = _check_log(RED, logs[RED], [a for a in setup + written if a.conv == RED], True
                               if tools["redact"].returncode == 0 else None)
            finished[f"range read as {state}"] += 1
            _check_log(PLAIN, logs[PLAIN], [a for a in setup + written if a.conv == PLAIN], None)
            full = [make_batch(a.w, a.b, a.n, a.pad) for a in setup if a.conv == GONE_CONV]
            flat = [p for batch in full for p in batch]
            left = [it.payload for it in logs[GONE_CONV]]
            assert left == flat[: len(left)], f"{GONE_CONV}: not a prefix of its log"
            assert tools["forget"].returncode != 0 or left == []
        # Run again: both finish.
        redact_items(data, SITE, RED, LO, HI)
        forget_conversation(data, SITE, GONE_CONV)
        assert _files_holding(str(data), secrets + gone) == []
        report = maintenance.check(str(data))
        assert not report.unrepaired, [f"{p.kind}: {p.detail}" for p in report.unrepaired]
        with FileStore(data, segment_bytes=1024, index_interval=64) as store:
            red = read_all(store, SITE, RED)
            mine = [a for a in setup + written if a.conv == RED]
            assert _check_log(RED, red, mine, True) == "tombstones"
            assert read_all(store, SITE, GONE_CONV) == []
    print("erasures killed beside a writer: " + ", ".join(f"{v} {k}" for k, v in sorted(finished.items())))
