"""Fault 9: a power cut, simulated.

A kill leaves the page cache behind, so it can never show a missing sync. Here
every durability-relevant operation of a workload is recorded through the
engine's I/O seam (``logstore.fileio.recorder``, see ``_disk.py``), and the
disk a power cut could leave is rebuilt for cut points after each operation:
under the strict POSIX model (unsynced data dropped, kept, torn or zeroed;
directory entries no directory sync covered rolled back) and under the lenient
ordered model (a prefix of the operations, the write in flight torn).

Every state is opened as after a reboot (a new ``bootid.boot_id``) and must:
open without error; show every acknowledged batch byte for byte and never
part of a batch; list exactly the conversations that hold items, each with
``created_at`` its first item's and ``last_appended_at`` its last item's
``recorded_at``, in listing order; and take a further append at the next
seq. Every other state first gets an append that compacts the manifest
before anything has listed (a writer-only process after the reboot).

Workloads: ordinary appends with segment rolls and the first append of new
conversations; manifest commits owed (carried by intents, logged in a batch,
logged at close); manifest compaction (by the engine and by a rebuild); sparse
index writes (index groups, and indexes rebuilt by a read); ``fsck --repair``
(``logstore.maintenance.check``) of a torn tail, a missing index and a lost
commit; ``fsck --repair``'s salvage of a damaged record into a loss record;
restores (``convmem import``'s ``Restorer``), and the import of one damaged
conversation (its log set aside to ``quarantine/``, then restored from an
export); an online backup (its destination is absent, or complete and clean);
and two writers on one directory. In the damage workloads the damaged seqs
read as ItemsLost or Corrupted, never as data (or as the restored data), and
every other acknowledged item byte for byte. Two more tests keep the harness honest: every file operation of
the engine goes through ``fileio`` (else the simulation would not see it),
and the simulated disk's models hold on a known sequence.

CI explores every cut point with a few variants each (a few hundred distinct
states); ``CONVMEM_SOAK=1`` adds many random variants per cut point.
``CONVMEM_POWERCUT_SEED`` reruns the random parts of a failing run.
"""

from __future__ import annotations

import io
import os
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import (
    Corrupted,
    FileStore,
    ItemsLost,
    Range,
    bootid,
    convpool,
    fileio,
    frame,
    layout,
    manifestcodec,
    manifestrecovery,
    manifestwrite,
    poolclaims,
    preallocation,
    zerofill,
)
from convmem.logstore.activesegment import ActiveSegment
from convmem.logstore.codec import encode_batch
from convmem.logstore.conversation import Conversation
from convmem.logstore.groupcommit import Batch
from convmem.logstore.maintenance import Restorer, backup, check, salvage
from convmem.logstore.memories.backup import MEMORY_BACKUP
from convmem.logstore.segment import data_end, iter_records
from convmem.tools.export import write_items
from convmem.tools.restore import import_conversation

from ._common import SITE, STATS, Ack, check_listing_order, list_all, make_batch, make_payload, read_all, rounds
from ._disk import Image, SimDisk

OPTS: dict[str, Any] = {"segment_bytes": 1024, "index_interval": 64, "conversation_pool": True}
CONVS = ["pc-conv-0001", "pc-conv-0002", "pc-conv-0003"]
#: Random strict variants per cut point with unsynced data (soak: many more).
RANDOM_VARIANTS = rounds(1, 24)
SEED = int(os.environ.get("CONVMEM_POWERCUT_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)


@pytest.fixture(scope="module", autouse=True)
def _print_seed() -> Iterator[None]:
    print(f"\npower-cut seed {SEED} (rerun with CONVMEM_POWERCUT_SEED={SEED})")
    yield


@pytest.fixture(autouse=True)
def _pool_filled_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool entries are built on the appending thread, so that every recorded operation is in order."""
    monkeypatch.setattr(convpool, "inline_fill", True)


@pytest.fixture
def shm_path(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when there is one: the states are checked, not the disk's speed."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if base is None:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="convmem-powercut-", dir=base) as d:
        yield Path(d)


@dataclass
class Recording:
    """A workload's recorded operations, and when each of its batches was acknowledged."""

    disk: SimDisk
    convs: list[str]
    before: list[Ack]  # acknowledged before recording started (durable in every state)
    acks: list[tuple[int, Ack]] = field(default_factory=list)  # (operations done at acknowledgement, batch)

    def acked_at(self, k: int) -> list[Ack]:
        return self.before + [a for done, a in self.acks if done <= k]


class Writer:
    """Appends (or restores) deterministic batches and notes when each was acknowledged."""

    def __init__(self, rec: Recording | None, store: FileStore, w: str) -> None:
        self.rec = rec
        self.store = store
        self.w = w
        self.b = 0
        self.acked: list[Ack] = []
        #: Run the extend-ahead jobs handed over after each acknowledged batch (else the workload does).
        self.run_jobs = True

    def append(self, conv: str, n: int, pad: int) -> Ack:
        self.b += 1
        r = self.store.append(SITE, conv, make_batch(self.w, self.b, n, pad))
        return self._ack(Ack(conv, r.first, r.last, self.w, self.b, n, pad))

    def append_group(self, conv: str, plan: list[tuple[int, int]]) -> list[Ack]:
        """Queue one batch per ``(n, pad)`` on ``conv``, then let the first lead: one group commit
        (several records, one write, one sync), formed as concurrent threads form it."""
        started = time.monotonic()
        c = self.store._acquire(SITE, conv, started + 5, started)
        try:
            queued = []
            for n, pad in plan:
                self.b += 1
                queued.append((self.b, n, pad, Batch(*encode_batch(make_batch(self.w, self.b, n, pad)))))
            batches = [q[3] for q in queued]
            c._queue.extend(batches)
            while c._queue and c._queue[0] in batches:
                c._lead(started + 5, started)  # more than one group when they do not fit one segment
        finally:
            c.mutex.release()
        out = []
        for b, n, pad, batch in queued:
            assert batch.done and batch.error is None, batch.error
            out.append(self._ack(Ack(conv, batch.result[0], batch.result[1], self.w, b, n, pad)))
        return out

    def _ack(self, ack: Ack) -> Ack:
        if self.rec is not None:
            self.rec.acks.append((len(self.rec.disk.ops), ack))
        self.acked.append(ack)
        if self.run_jobs:
            run_extensions()
        return ack


#: Extend-ahead jobs handed over while a workload is recorded (see :func:`record`).
_JOBS: list[Callable[[], None]] = []


def run_extensions() -> None:
    """Run the extend-ahead jobs handed over so far, in this thread, in order."""
    while _JOBS:
        _JOBS.pop(0)()


def record(
    root: Path,
    convs: list[str],
    setup: Callable[[Writer], None],
    work: Callable[[Writer], None],
    *,
    ahead: bool = True,
) -> Recording:
    """Run ``setup`` plainly, then ``work`` with every operation recorded.

    Extend-ahead jobs (``logstore.preallocation.run_extension``) and the pool's fills
    (which sync a claim's directories, after its acknowledgement) run in the
    workload's thread after each acknowledged batch, so that the operations
    come in a reproducible order and a cut can fall between an acknowledgement
    and those jobs; with ``ahead=False`` extensions never run, and every
    extension is an append's own.
    """
    _JOBS.clear()
    real_run = preallocation.run_extension
    real_fill = convpool.request_fill
    preallocation.run_extension = _JOBS.append if ahead else (lambda job: None)

    def fill_later(pool: convpool.SitePool, fill: Callable[[], None] | None = None) -> None:
        _JOBS.append(pool.fill if fill is None else fill)

    convpool.request_fill = fill_later
    try:
        store = FileStore(root, **OPTS)
        try:
            w = Writer(None, store, "s")
            setup(w)
            before = w.acked
        finally:
            store.close()
        disk = SimDisk(str(root))
        rec = Recording(disk, convs, before)
        fileio.recorder = disk
        try:
            store = FileStore(root, **OPTS)
            try:
                work(Writer(rec, store, "p"))
                run_extensions()
            finally:
                store.close()
        finally:
            fileio.recorder = None
    finally:
        preallocation.run_extension = real_run
        convpool.request_fill = real_fill
        _JOBS.clear()
    assert disk.ops, "the workload performed no recorded operation"
    return rec


# ------------------------------------------------------------------ checks


class StateFailed(AssertionError):
    pass


def check_state(root: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
    """Everything a state must show (see the module doc); raises AssertionError, counts what held in ``held``."""
    booted = bootid.boot_id
    bootid.boot_id = f"restarted-after-power-cut-{nth}"  # a power cut means a new boot
    if nth % 2 == 0:
        # What a power cut leaves, fsck must not call a problem: the engine resolves it by itself.
        report = check(root)
        assert not report.unrepaired, [f"{p.kind}: {p.detail}" for p in report.unrepaired]
        held["fsck clean before opening"] += 1
    store = FileStore(root, **OPTS)
    try:
        if nth % 2:
            # Every other state: first a writer that never lists appends and compacts the
            # manifest, before anything has checked the listing against the logs.
            m = store._manifest(SITE)
            m._compact_bytes, m._writes = 1, 510
            store.append(SITE, rec.convs[(nth + 1) % len(rec.convs)], make_batch("pre", nth, 1, 10))
            held["compacted first"] += 1
        logs = {c: read_all(store, SITE, c) for c in rec.convs}
        held["opened"] += 1
        for conv, items in logs.items():
            _check_whole_batches(conv, items)
        held["batches whole"] += sum(len({(it.payload["w"], it.payload["b"]) for it in v}) for v in logs.values())
        for a in acked:
            items = logs[a.conv]
            for seq in range(a.first, a.last + 1):
                want = make_payload(a.w, a.b, seq - a.first, a.n, a.pad)
                assert seq < len(items), f"{a.conv}: acknowledged seq {seq} (batch {a.w}/{a.b}) is missing"
                assert items[seq].payload == want, f"{a.conv}: acknowledged seq {seq} holds other data"
        held["acknowledged batches intact"] += len(acked)
        _check_listing(store, logs)
        held["listings agree"] += 1
        # Appends continue at the next seq, and the listing follows.
        conv = rec.convs[nth % len(rec.convs)]
        r = store.append(SITE, conv, make_batch("after", nth, 1, 10))
        assert r.first == len(logs[conv]), f"{conv}: the next append got seq {r.first}, expected {len(logs[conv])}"
        logs[conv] = read_all(store, SITE, conv)
        _check_listing(store, logs)
        held["appends continued"] += 1
    finally:
        store.close()
        bootid.boot_id = booted


def _check_whole_batches(conv: str, items: list[Any]) -> None:
    pos = 0
    while pos < len(items):
        it = items[pos]
        assert it.seq == pos, f"{conv}: seq gap at {pos}"
        p = it.payload
        assert p["i"] == 0, f"{conv}: seq {pos} starts inside batch {p['w']}/{p['b']}: partial batch"
        assert pos + p["n"] <= len(items), f"{conv}: batch {p['w']}/{p['b']} at seq {pos} is cut short"
        for i in range(p["n"]):
            item = items[pos + i]
            assert item.payload == make_payload(p["w"], p["b"], i, p["n"], p["p"]), f"{conv}: seq {pos + i} is wrong"
            assert item.recorded_at == it.recorded_at, f"{conv}: batch at seq {pos} has two recorded_at"
        pos += p["n"]


def _check_listing(store: FileStore, logs: dict[str, list[Any]]) -> None:
    listing = list_all(store, SITE)
    check_listing_order(listing)
    ids = [s.conversation_id for s in listing]
    assert len(ids) == len(set(ids)), f"the listing repeats a conversation: {ids}"
    by_id = {s.conversation_id: s for s in listing}
    for conv, items in logs.items():
        if not items:
            assert conv not in by_id, f"the listing names {conv}, which holds nothing"
            continue
        assert conv in by_id, f"{conv} holds {len(items)} items but is not listed"
        s = by_id[conv]
        assert s.created_at == items[0].recorded_at, f"{conv}: created_at {s.created_at} != {items[0].recorded_at}"
        assert s.last_appended_at == items[-1].recorded_at, (
            f"{conv}: last_appended_at {s.last_appended_at}, its last item was recorded at {items[-1].recorded_at}"
        )
    extra = set(by_id) - set(logs)
    assert not extra, f"the listing names conversations never written: {extra}"


# --------------------------------------------------------------- exploring


Checker = Callable[[str, "Recording", list[Ack], int, "Counter[str]"], None]


def explore(
    rec: Recording, scenario: str, scratch: Path, checker: Checker | None = None, random_variants: int | None = None
) -> dict[str, int]:
    """Check the states a power cut after each recorded operation could leave; return counts.

    ``random_variants``: random strict variants per cut point (default :data:`RANDOM_VARIANTS`).
    """
    counts = {"cut points": 0, "strict": 0, "lenient": 0, "duplicates": 0}
    seen: set[tuple[str, int]] = set()
    state_dir = str(scratch / "state")
    n_ops = len(rec.disk.ops)
    checked = 0
    held: Counter[str] = Counter()
    for k, model in rec.disk.states():
        counts["cut points"] += 1
        acked = rec.acked_at(k)
        variants: list[tuple[str, Image]] = [
            ("strict/drop", model.strict("drop")),
            ("strict/keep", model.strict("keep")),
        ]
        if model.pending_data() or model.uncovered:
            for i in range(RANDOM_VARIANTS if random_variants is None else random_variants):
                rng = random.Random(f"{SEED}:{scenario}:{k}:{i}")
                variants.append((f"strict/random#{i}", model.strict("random", rng)))
        tear = rec.disk.ops[k] if k < n_ops else None
        variants.append(("lenient", model.lenient(tear, random.Random(f"{SEED}:{scenario}:{k}:lenient"))))
        for label, image in variants:
            key = (image.digest(), len(acked))
            if key in seen:
                counts["duplicates"] += 1
                continue
            seen.add(key)
            image.write(state_dir)
            try:
                (checker or check_state)(state_dir, rec, acked, checked, held)
            except Exception as exc:
                raise StateFailed(
                    f"{scenario}: power cut {rec.disk.describe(k)} of {n_ops}, {label} model, "
                    f"{len(acked)} batches acknowledged (seed {SEED}): {type(exc).__name__}: {exc}"
                ) from exc
            checked += 1
            counts["strict" if label.startswith("strict") else "lenient"] += 1
    STATS["power-cut states"] += counts["strict"] + counts["lenient"]
    STATS["power-cut strict"] += counts["strict"]
    STATS["power-cut lenient"] += counts["lenient"]
    STATS["power-cut batches checked"] += held["acknowledged batches intact"]
    print(
        f"{scenario}: {n_ops} operations, {counts['cut points']} cut points, "
        f"{counts['strict']} strict + {counts['lenient']} lenient states ({counts['duplicates']} duplicates skipped); "
        "held: " + ", ".join(f"{v} {k}" for k, v in held.items())
    )
    assert held["opened"] == counts["strict"] + counts["lenient"]
    return counts


# --------------------------------------------------------------- workloads


def _nothing(w: Writer) -> None:
    del w


def _appends(w: Writer) -> None:
    # conv 1 alone, then conv 2 and 3 get their first batches mid-way; big pads roll segments.
    plan = [(0, 1, 40), (0, 3, 120), (1, 1, 30), (0, 2, 300), (2, 1, 20), (1, 4, 200), (0, 1, 500), (2, 2, 60)]
    for conv_i, n, pad in plan:
        w.append(CONVS[conv_i], n, pad)


def _some_history(w: Writer) -> None:
    for b in range(9):
        w.append(CONVS[b % 3], 1 + b % 3, 40 + 37 * b)


def _compaction(w: Writer) -> None:
    m = w.store._manifest(SITE)
    w.append(CONVS[0], 2, 50)
    # The engine compacts at every 512th write of the log once the log is big enough: bring
    # that moment to the second append's intent (each append writes one record).
    m._compact_bytes = 1
    m._writes = 510
    w.append(CONVS[1], 1, 30)
    w.append(CONVS[0], 1, 30)
    w.store.rebuild_manifest(SITE)  # what fsck --repair and a damaged manifest use
    w.append(CONVS[2], 1, 30)


def _drop_indexes(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(layout.INDEX_SUFFIX):
                os.unlink(os.path.join(dirpath, name))


def _index_writes(w: Writer) -> None:
    # Reads rebuild the missing indexes of sealed segments; many small appends to one
    # conversation fill a group of index entries.
    for conv in CONVS:
        read_all(w.store, SITE, conv)
    for _ in range(18):
        w.append(CONVS[1], 1, 40)


def test_power_cut_appends(shm_path: Path) -> None:
    rec = record(shm_path / "data", CONVS, _nothing, _appends)
    counts = explore(rec, "appends", shm_path)
    assert counts["strict"] and counts["lenient"]


def _preallocated(w: Writer) -> None:
    # Segments of 1024 bytes start with 256 bytes (header and zeros). Small batches land in
    # zeros already there; a bigger one extends the file by a chunk (the record and zeros in
    # one write); the roll cuts the sealed segment's zeros before the next segment exists.
    plan = [(0, 1, 10), (0, 1, 10), (0, 2, 60), (0, 1, 10), (0, 1, 10), (0, 1, 300), (0, 1, 10), (0, 1, 200)]
    for conv_i, n, pad in plan:
        w.append(CONVS[conv_i], n, pad)


def _segment_ops(rec: Recording) -> tuple[int, int, int]:
    """Writes of one record into space the file has, writes that extend it with zeros, truncations of segments."""
    into = extend = cut = 0
    seg_fds = {op[2] for op in rec.disk.ops if op[0] == "create" and op[1].endswith((".seg", ".seg.tmp"))}
    for op in rec.disk.ops:
        if op[0] == "write" and op[1] in seg_fds and op[2] >= frame.SEGMENT_HEADER_SIZE:
            if op[3].endswith(frame.TRAILER_MAGIC):
                into += 1
            elif op[3].endswith(b"\x00") and frame.TRAILER_MAGIC in op[3]:
                extend += 1
        elif op[0] == "truncate" and op[1] in seg_fds:
            cut += 1
    return into, extend, cut


def test_power_cut_preallocated_space(shm_path: Path) -> None:
    """Cuts inside appends into preallocated zeros, inside extensions by a chunk, and inside a roll's cut."""
    rec = record(shm_path / "data", CONVS, _nothing, _preallocated, ahead=False)
    into, extend, cut = _segment_ops(rec)
    assert into >= 3 and extend >= 2 and cut >= 1, (into, extend, cut)
    explore(rec, "preallocated space", shm_path)


class _PausedJob:
    """An extend-ahead job run on a thread of its own that stops before its first sync until released."""

    def __init__(self, job: Callable[[], None]) -> None:
        self.at_sync = threading.Event()
        self.go = threading.Event()
        self.thread = threading.Thread(target=job, name="pc-extend-ahead")

    def _hook(self, op: str) -> None:
        if threading.current_thread() is self.thread and op == "fdatasync" and not self.at_sync.is_set():
            self.at_sync.set()
            self.go.wait(60)

    def start(self) -> None:
        """Start the job; return once its first step's zeros are written, not synced."""
        _PAUSED.append(self)
        fileio.fault_hook = self._hook
        self.thread.start()
        assert self.at_sync.wait(60), "the extend-ahead job never reached its first sync"

    def finish(self) -> None:
        self.go.set()
        self.thread.join(60)
        fileio.fault_hook = None
        assert not self.thread.is_alive()


#: Jobs paused by a workload: released when it ends, whatever happened.
_PAUSED: list[_PausedJob] = []


def _record_size(w: Writer, n: int, pad: int) -> int:
    return frame.RECORD_OVERHEAD + len(encode_batch(make_batch(w.w, w.b + 1, n, pad))[0])


def _pad_for(w: Writer, size: int) -> int:
    """The smallest pad that makes the writer's next 1-item batch a record of at least ``size`` bytes."""
    pad = 0
    while _record_size(w, 1, pad) < size:
        pad += 1
    return pad


def _active(conv: Conversation) -> ActiveSegment:
    """The conversation's active segment (it has one: the workload appended to it)."""
    assert conv.active is not None, "the conversation holds no open segment"
    return conv.active


def _free_bytes(conv: Conversation) -> int:
    """The preallocated space left in the conversation's active segment."""
    seg = _active(conv)
    return seg.alloc - seg.end


def _wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def _in_thread(fn: Callable[[], Any]) -> threading.Thread:
    t = threading.Thread(target=fn)
    t.start()
    return t


def _extend_ahead(w: Writer) -> None:
    """Extend-ahead jobs beside appends, in the orders a background thread can produce (see the test)."""
    try:
        _extend_ahead_steps(w)
    finally:
        while _PAUSED:
            _PAUSED.pop().finish()


def _extend_ahead_steps(w: Writer) -> None:
    w.run_jobs = False
    assert w.rec is not None
    ops = w.rec.disk.ops

    def live(c: str) -> Any:
        """The store's conversation object for ``c`` now: the first write of this store learns the
        site's incarnation (``site.id``) and closes the objects made before it, so an object is
        only looked at after an append (never kept from before one)."""
        obj = w.store._conversation(SITE, c)
        assert not obj.closed
        return obj

    def until_job(c: str, pad: int, room: int = 0) -> Callable[[], None]:
        """Append to ``c`` until a job is handed over with at least ``room`` bytes still free (others run)."""
        for _ in range(60):
            w.append(c, 1, pad)
            target = live(c)
            if _JOBS and _free_bytes(target) >= room:
                job = _JOBS.pop()
                run_extensions()
                return job
            run_extensions()
        raise AssertionError(f"{c}: no extend-ahead job was handed over")

    # 1. The job's zeros are written, not synced, while an append writes and syncs a record
    #    into the synced space before them (its sync covers the zeros too), and another
    #    conversation is appended to; then appends go on into the space the job synced.
    paused = _PausedJob(until_job(CONVS[0], 0, room=_record_size(w, 1, 10)))
    paused.start()
    w.append(CONVS[0], 1, 10)
    w.append(CONVS[1], 1, 20)
    paused.finish()
    w.append(CONVS[0], 2, 60)
    conv = live(CONVS[0])  # the object the steps below watch (it stays open: max_open is not reached)

    # 2. An append that needs more than the synced space waits for the job's step (or its end).
    paused = _PausedJob(until_job(CONVS[0], 40))
    paused.start()
    seg = _active(conv)
    pad = _pad_for(w, seg.alloc - seg.end + 16)
    assert seg.end + _record_size(w, 1, pad) <= OPTS["segment_bytes"], "the batch was meant to fit the segment"
    seg_ident = w.rec.disk._ident(seg.fd)
    started = len(ops)
    waiting = _in_thread(lambda: w.append(CONVS[0], 1, pad))
    _wait_for("the append is waiting for space", lambda: conv._inflight)
    mark = len(ops)
    paused.finish()
    waiting.join(60)
    assert not [op for op in ops[started:mark] if op[0] == "write" and op[1] == seg_ident], (
        "a record was written while the job held the space past the synced end"
    )
    assert [op for op in ops[mark:] if op[0] == "write" and op[1] == seg_ident and any(op[3])], "the record is missing"

    # 3. A roll waits for the job: the sealed segment is cut after the job's last zeros.
    paused = _PausedJob(until_job(CONVS[0], 20))
    paused.start()
    seg = _active(conv)
    seg_ident = w.rec.disk._ident(seg.fd)
    base = conv._segments[-1]
    pad = _pad_for(w, OPTS["segment_bytes"] - seg.end + 1)
    rolling = _in_thread(lambda: w.append(CONVS[0], 1, pad))
    _wait_for("the rolling append leads", lambda: bool(conv._queue) and conv._queue[0].taken)
    mark = len(ops)
    paused.finish()
    rolling.join(60)
    assert conv._segments[-1] > base, "the append was meant to roll the segment"
    assert not [op for op in ops[:mark] if op[0] == "truncate" and op[1] == seg_ident], "cut before the job ended"
    cut = [k for k, op in enumerate(ops) if op[0] == "truncate" and op[1] == seg_ident]
    zeros = [k for k, op in enumerate(ops) if op[0] in ("write", "sync") and op[1] == seg_ident]
    assert cut and cut[-1] > max(k for k in zeros if ops[k][0] == "write"), "zeros landed in the sealed segment"

    # 4. Another writer (as another process) appends between an append and its job: the job
    #    looks at the tail again before it extends, and appends go on at the right seq.
    other = Writer(w.rec, FileStore(w.store.root, **OPTS), "o")
    other.run_jobs = False
    try:
        job = until_job(CONVS[2], 40)
        other.append(CONVS[2], 2, 30)
        job()
        w.append(CONVS[2], 1, 30)
    finally:
        other.store.close()
    _JOBS.clear()


def test_power_cut_extend_ahead(shm_path: Path) -> None:
    """Extend-ahead jobs run on their own thread beside appends, cut at every point.

    The states: a job's zeros written and not synced (dropped, torn, kept)
    while an append's record lies in the synced space before them, synced or
    not; appends into space a job synced; an append that needed more than the
    synced space, written after the job's step; a roll that waited for a job,
    its sealed segment cut after the zeros; a job that found another writer's
    record at the tail. Every one must show every acknowledged batch, and
    take the next append at the next seq.
    """
    rec = record(shm_path / "data", CONVS, _some_history, _extend_ahead)
    zero_writes = [op for op in rec.disk.ops if op[0] == "write" and op[3] and not any(op[3])]
    assert len(zero_writes) >= 3, "no extend-ahead job wrote zeros"
    explore(rec, "extend-ahead", shm_path)


def _zeros_given_back(w: Writer) -> None:
    """A conversation's chunk is written ahead, then the conversation is closed (as the store's cache evicts
    it) and its zeros are cut back by the job its close handed over; appends go on afterwards."""
    for pad in (40, 10, 10, 60, 10):
        w.append(CONVS[0], 1, pad)  # its extend-ahead jobs run after each acknowledged batch
    conv = w.store._conversation(SITE, CONVS[0])
    seg = _active(conv)
    assert seg.alloc > zerofill.blocks(seg.end, 256), "no zeros ahead to give back"
    with conv.mutex:
        conv.close()
    assert _JOBS, "closing the conversation handed over no cut"
    run_extensions()
    w.append(CONVS[0], 1, 30)
    w.append(CONVS[1], 1, 30)
    w.append(CONVS[0], 2, 200)


def test_power_cut_zeros_given_back(shm_path: Path) -> None:
    """Cuts around the cut at close: the zeros after an idle conversation's data end truncated and synced."""
    rec = record(shm_path / "data", CONVS, _some_history, _zeros_given_back)
    _into, _extend, cut = _segment_ops(rec)
    assert cut >= 1, "no segment was cut"
    explore(rec, "zeros given back", shm_path)


def _groups(w: Writer) -> None:
    w.append(CONVS[0], 1, 10)
    w.append_group(CONVS[0], [(1, 10), (2, 20), (1, 30)])  # into preallocated space
    w.append_group(CONVS[0], [(1, 100), (3, 40)])  # extends the segment
    w.append_group(CONVS[1], [(2, 10), (1, 10)])  # the first append of a conversation, grouped


def test_power_cut_group_commit(shm_path: Path) -> None:
    """Several batches written as separate records in one write and one sync, cut at every point."""
    rec = record(shm_path / "data", CONVS, _nothing, _groups)
    # (Lock files aside: the pool syncs each entry's.)
    locks = {ident for name, ident in rec.disk._names.items() if name.endswith(os.sep + layout.LOCK_FILE)}
    syncs = sum(1 for op in rec.disk.ops if op[0] == "sync" and op[1] not in locks)
    assert len(rec.acks) == 8
    explore(rec, "group commit", shm_path)
    assert syncs < 20, syncs

def _owed_commits(w: Writer) -> None:
    # A batch's commit record is owed (FORMAT.md 5): carried by its conversation's next intent,
    # logged with the next record once more than OWED_MAX are owed, or at close; a listing
    # applies the owed ones in memory. Cuts fall while commits of several conversations are owed.
    w.append(CONVS[0], 1, 20)
    w.append(CONVS[0], 2, 30)  # its intent carries the first batch's commit
    w.append(CONVS[1], 1, 20)
    w.append(CONVS[2], 1, 20)
    assert [s.conversation_id for s in list_all(w.store, SITE)] == [CONVS[2], CONVS[1], CONVS[0]]
    w.append(CONVS[0], 1, 40)
    manifestwrite.OWED_MAX = 2  # the next intent logs every commit owed, ahead of itself
    w.append(CONVS[1], 1, 20)
    w.append(CONVS[1], 1, 20)
    # The store is closed next (by record): the commits still owed are logged then.


def test_power_cut_owed_commits(shm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuts while commits are owed, carried by intents, logged in a batch, and logged at close."""
    monkeypatch.setattr(manifestwrite, "OWED_MAX", manifestwrite.OWED_MAX)  # restored after the workload's change
    rec = record(shm_path / "data", CONVS, _nothing, _owed_commits)
    site_dir = next((shm_path / "data" / "sites").iterdir())
    data = max(site_dir.glob("manifest-*.log")).read_bytes()
    salt = manifestcodec.LOG_HEADER.unpack_from(data)[2]
    start = manifestcodec.LOG_HEADER.size
    recs = [r for _o, _e, r in manifestcodec.iter_log_records(data, salt, start) if r is not None]
    assert any(r[0] == manifestcodec.INTENT and len(r) == 8 for r in recs), recs  # an intent carried a commit
    assert sum(r[0] == manifestcodec.COMMIT for r in recs) >= 3, recs  # logged with a later record, and at close
    explore(rec, "owed commits", shm_path)


NEW_CONVS = ["pc-new-0001", "pc-new-0002", "pc-new-0003", "pc-new-0004"]


def _first_appends(w: Writer) -> None:
    # First appends to new conversations (each a directory, a segment created in place and
    # an intent that is not synced), between appends to existing ones and a listing.
    w.append(NEW_CONVS[0], 2, 40)
    w.append(CONVS[0], 1, 30)
    w.append(NEW_CONVS[1], 1, 600)  # the first record runs past the first sector
    list_all(w.store, SITE)
    w.append(NEW_CONVS[2], 3, 20)
    w.append(NEW_CONVS[0], 1, 50)  # a new conversation's second batch: its intent is not synced either
    w.append(NEW_CONVS[3], 1, 10)


def _log_syncs(rec: Recording) -> int:
    """Syncs of a manifest activity log in the recording."""
    logs = {ident for name, ident in rec.disk._names.items() if name.endswith(".log")}
    return sum(1 for op in rec.disk.ops if op[0] == "sync" and op[1] in logs)


def test_power_cut_first_appends(shm_path: Path) -> None:
    """First appends to new conversations of a site that has others.

    The first batch of a conversation costs its data syncs (and, created in
    place, the directory syncs; claimed from the pool, the rename's are synced
    after the acknowledgement), and no sync of the manifest log: at every cut every acknowledged
    conversation is still listed with its true extent (found by the walk of
    the site's directories at the first listing after the reboot when its
    records were lost), a torn creation reads as an empty conversation, and
    fsck calls nothing a problem.
    """
    rec = record(shm_path / "data", CONVS + NEW_CONVS, _some_history, _first_appends)
    # One sync of the log: the intent of the existing conversation (this process's first in the epoch).
    assert _log_syncs(rec) == 1, "a first append synced the manifest log"
    new_dirs = tuple(layout.encode_name(c) for c in NEW_CONVS)
    pool = os.sep + layout.POOL_DIR + os.sep
    creates = [
        op for op in rec.disk.ops if op[0] == "create" and op[1].endswith(layout.segment_name(0)) and pool not in op[1]
    ]
    claims = [op for op in rec.disk.ops if op[0] == "rename" and pool in op[1] and op[2].endswith(new_dirs)]
    assert len(creates) + len(claims) == len(NEW_CONVS), "each new conversation's segment is made once"
    assert claims, "no first append claimed a pre-created directory from the site's pool"
    renamed = [op for op in rec.disk.ops if op[0] == "rename" and op[2].endswith(".seg")]
    assert not [op for op in renamed if any(d in op[2] for d in new_dirs)], "a first segment was renamed into place"
    explore(rec, "first appends", shm_path)


def test_power_cut_first_appends_new_site(shm_path: Path) -> None:
    """The first appends of a site that does not exist yet (its directory and manifest are created too)."""

    def work(w: Writer) -> None:
        w.append(NEW_CONVS[0], 1, 40)
        w.append(NEW_CONVS[1], 2, 30)
        w.append(NEW_CONVS[0], 1, 20)

    rec = record(shm_path / "data", NEW_CONVS[:2], _nothing, work)
    explore(rec, "first appends of a new site", shm_path)


POOL_CONVS = [f"pc-pool-{i:04d}" for i in range(7)]


def _pool_claims(w: Writer) -> None:
    # More first appends than the pool holds (it is refilled on the way), one bigger than an
    # entry's preallocated space, and a second batch to a claimed conversation.
    for i, conv in enumerate(POOL_CONVS):
        w.append(conv, 1 + i % 2, 900 if i == 3 else 30)
        if i == 1:
            w.append(conv, 1, 20)


#: Claimed entries not moved (with acknowledged data) found after a cut, over the whole exploration.
_UNMOVED: Counter[str] = Counter()


def _check_pool_state(root: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
    """The usual checks, then the pool after the cut: every entry a new conversation claims holds nothing.

    A cut between a claim's acknowledgement and the sync of its rename leaves a
    claimed entry not moved (back in the pool, acknowledged batch and
    identity in it): counted here, before the checks move it into place.
    """
    site_dir = layout.site_dir(root, SITE)
    for u in poolclaims.unmoved(site_dir):
        kind = "acknowledged" if any(a.conv == u.conversation_id for a in acked) else "unacknowledged"
        held[f"{kind} claims found not moved"] += 1
        _UNMOVED[kind] += 1
    check_state(root, rec, acked, nth, held)
    assert not [u for u in poolclaims.unmoved(site_dir) if poolclaims.fate(site_dir, u) != poolclaims.CONFLICT]
    pool_dir = layout.pool_dir(site_dir)
    # Entries that hold data (a claim whose rename was lost) or unfinished ones may be there now.
    before = 0
    for name in os.listdir(pool_dir) if os.path.isdir(pool_dir) else ():
        if name.startswith(poolclaims.SETTLED_FILE):
            continue
        before += 1
        seg = Path(pool_dir, name, layout.segment_name(0))
        if name.startswith(layout.POOL_BUILDING_PREFIX):
            held["unfinished pool entries"] += 1
        elif seg.exists() and any(seg.read_bytes()):
            held["pool entries holding data"] += 1
    store = FileStore(root, **OPTS)
    try:
        for i in range(before + 1):
            conv = f"pc-after-{nth:05d}-{i:03d}"
            r = store.append(SITE, conv, make_batch("fresh", i, 1, 10))
            assert r.first == 0, f"{conv}: a new conversation's first batch got seq {r.first}"
            items = read_all(store, SITE, conv)
            assert [it.payload for it in items] == [make_payload("fresh", i, 0, 1, 10)], f"{conv} holds other data"
        assert {s.conversation_id for s in list_all(store, SITE)} >= set(POOL_CONVS) & {a.conv for a in acked}
    finally:
        store.close()
    for name in os.listdir(pool_dir) if os.path.isdir(pool_dir) else ():
        assert name.startswith((layout.POOL_READY_PREFIX, layout.POOL_BUILDING_PREFIX, poolclaims.SETTLED_FILE)), name
    held["pool entries claimed clean"] += before + 1


def test_power_cut_pool_claims(shm_path: Path) -> None:
    """First appends that claim pre-created directories from the site's pool, and the pool's refills.

    Cuts fall between a claim's rename and the data, between the
    acknowledgement (the segment synced, the identity record in it) and the sync of the
    rename (a claimed entry not moved: back in the pool, holding an
    acknowledged batch, which the next process moves into place), and in the
    middle of building an entry. At every cut the acknowledged batches are
    there, a claimed conversation whose data is not durable reads as empty, and
    every entry a later first append claims holds nothing.
    """
    _UNMOVED.clear()
    rec = record(shm_path / "data", CONVS + POOL_CONVS, _some_history, _pool_claims)
    pool = os.sep + layout.POOL_DIR + os.sep
    claims = [op for op in rec.disk.ops if op[0] == "rename" and pool in op[1] and os.sep + "c" + os.sep in op[2]]
    assert len(claims) >= len(POOL_CONVS) - 1, f"only {len(claims)} first appends claimed a pool entry"
    spares = [op for op in rec.disk.ops if op[0] == "rename" and op[1].endswith(os.sep + layout.SPARE_DIR)]
    assert spares, "no new fan-out directory was a spare renamed into place"
    counts = explore(rec, "pool claims", shm_path, _check_pool_state)
    assert counts["strict"] and counts["lenient"]
    assert _UNMOVED["acknowledged"], "no cut left an acknowledged first batch in a claimed entry not moved"


def test_power_cut_compaction(shm_path: Path) -> None:
    rec = record(shm_path / "data", CONVS, _some_history, _compaction)
    ops = {op[0] for op in rec.disk.ops}
    assert {"rename", "unlink", "dirsync"} <= ops, f"no compaction was recorded: {sorted(ops)}"
    explore(rec, "manifest compaction", shm_path)


def test_power_cut_index_writes(shm_path: Path) -> None:
    root = shm_path / "data"

    def setup(w: Writer) -> None:
        _some_history(w)
        w.store.close()
        _drop_indexes(root)

    rec = record(root, CONVS, setup, _index_writes)
    idx_writes = [op for op in rec.disk.ops if op[0] == "create" and ".idx" in op[1]]
    assert idx_writes, "no index file was written"
    explore(rec, "index writes", shm_path)


def test_power_cut_fsck_repair(shm_path: Path) -> None:
    root = shm_path / "data"

    def setup(w: Writer) -> None:
        _some_history(w)
        w.store.close()
        # A torn tail (never acknowledged) on one conversation, a missing index on
        # another, and a manifest whose activity log lost its last (commit) record.
        segs = sorted(
            p for p in Path(layout.conversation_dir(str(root), SITE, CONVS[0])).iterdir() if p.suffix == ".seg"
        )
        with open(segs[-1], "ab") as f:
            f.write(b"\x17" * 37)
        idx = sorted(
            p for p in Path(layout.conversation_dir(str(root), SITE, CONVS[1])).iterdir() if p.suffix == ".idx"
        )
        idx[0].unlink()
        sdir = Path(layout.site_dir(str(root), SITE))
        log = max(p for p in sdir.iterdir() if p.suffix == ".log")
        salt = manifestcodec.LOG_HEADER.unpack(log.read_bytes()[: manifestcodec.LOG_HEADER.size])[2]
        recs = list(manifestcodec.iter_log_records(log.read_bytes(), salt, manifestcodec.LOG_HEADER.size))
        assert recs[-1][2] is not None and recs[-1][2][0] == manifestcodec.COMMIT
        os.truncate(log, recs[-1][0])

    def work(w: Writer) -> None:
        report = check(str(root), repair=True, lock_timeout=5.0)
        assert any(p.repaired for p in report.problems), report.problems

    rec = record(root, CONVS, setup, work)
    explore(rec, "fsck --repair", shm_path)


def test_power_cut_restore(shm_path: Path) -> None:
    root = shm_path / "data"

    def work(w: Writer) -> None:
        w.store.close()
        with Restorer(str(root), segment_bytes=OPTS["segment_bytes"]) as r:
            stamp = 1_700_000_000_000_000
            for b, (conv, n, pad) in enumerate([(CONVS[0], 2, 300), (CONVS[1], 1, 20), (CONVS[0], 3, 400)], 1):
                first = sum(a.n for a in w.acked if a.conv == conv)
                got = r.restore_batch(SITE, conv, first, stamp + b, make_batch("r", b, n, pad))
                w._ack(Ack(conv, got.first, got.last, "r", b, n, pad))

    rec = record(root, CONVS, _nothing, work)
    explore(rec, "restore", shm_path)


# ------------------------------------------------ repairs of damaged records


def read_tolerant(store: FileStore, conv: str) -> list[Any]:
    """A conversation seq by seq: its item, or "lost" (ItemsLost) or "corrupt" (Corrupted) in its place."""
    out: list[Any] = []
    while True:
        try:
            page = store.read(SITE, conv, Range(len(out), 1))
        except ItemsLost:
            out.append("lost")
            continue
        except Corrupted:
            out.append("corrupt")
            continue
        if not page:
            return out
        out.append(page[0])


def check_damaged_state(
    root: str,
    rec: Recording,
    acked: list[Ack],
    nth: int,
    held: Counter[str],
    damaged: dict[str, range],
    replaced: str | None = None,
) -> None:
    """A state of a repair of damaged records: ``damaged`` seqs read as lost or corrupt, the rest as acknowledged.

    ``replaced`` names a conversation an import sets aside and restores whole: it may also hold any
    prefix of whole acknowledged batches (its damaged seqs restored too), provided its original log is
    then in ``quarantine/``.
    """
    booted = bootid.boot_id
    bootid.boot_id = f"restarted-after-power-cut-{nth}"
    store = FileStore(root, **OPTS)
    try:
        logs = {c: read_tolerant(store, c) for c in rec.convs}
        held["opened"] += 1
        if replaced is not None and len(logs[replaced]) < max(a.last + 1 for a in acked if a.conv == replaced):
            # Being set aside (its log removed newest segment first) or restored: it holds a prefix,
            # and its whole original log is in quarantine/.
            qdir = Path(root, "quarantine")
            assert qdir.is_dir() and any(qdir.rglob("*.seg")), (
                f"{replaced}: holds {len(logs[replaced])} seqs, and its original log is not in quarantine/"
            )
            held["set aside, original quarantined"] += 1
            acked = [a for a in acked if a.conv != replaced or a.last < len(logs[replaced])]
        if replaced is not None and not any(isinstance(it, str) for it in logs[replaced]):
            damaged = {c: r for c, r in damaged.items() if c != replaced}  # restored from the export
        for conv, items in logs.items():
            bad = damaged.get(conv, range(0))
            for seq, it in enumerate(items):
                if isinstance(it, str):
                    assert seq in bad, f"{conv}: seq {seq} reads as {it}, outside the damaged seqs {bad}"
                    held[f"damaged seqs read as {it}"] += 1
                    continue
                assert seq not in bad, f"{conv}: damaged seq {seq} reads as data {it.payload}"
                p = it.payload
                start = seq - p["i"]
                for i in range(p["n"]):  # never part of a batch
                    other = items[start + i] if 0 <= start + i < len(items) else None
                    assert other is not None and not isinstance(other, str), (
                        f"{conv}: seq {seq} is part of batch {p['w']}/{p['b']} whose seq {start + i} is missing"
                    )
                    assert other.payload == make_payload(p["w"], p["b"], i, p["n"], p["p"])
        for a in acked:
            items = logs[a.conv]
            bad = damaged.get(a.conv, range(0))
            for seq in range(a.first, a.last + 1):
                assert seq < len(items), f"{a.conv}: acknowledged seq {seq} (batch {a.w}/{a.b}) is missing"
                if seq in bad:
                    continue
                it = items[seq]
                assert not isinstance(it, str), f"{a.conv}: acknowledged seq {seq} reads as {it}"
                assert it.payload == make_payload(a.w, a.b, seq - a.first, a.n, a.pad), f"{a.conv}: seq {seq} differs"
        held["acknowledged batches intact"] += len(acked)
        listing = {s.conversation_id: s for s in list_all(store, SITE)}
        for conv, items in logs.items():
            if not items:
                assert conv not in listing, f"the listing names {conv}, which holds nothing"
                continue
            assert conv in listing, f"{conv} holds {len(items)} seqs but is not listed"
            if not isinstance(items[-1], str):
                assert listing[conv].last_appended_at == items[-1].recorded_at, f"{conv}: last_appended_at"
        held["listings agree"] += 1
        conv = rec.convs[nth % len(rec.convs)]
        r = store.append(SITE, conv, make_batch("after", nth, 1, 10))
        assert r.first == len(logs[conv]), f"{conv}: the next append got seq {r.first}, expected {len(logs[conv])}"
        held["appends continued"] += 1
    finally:
        store.close()
        bootid.boot_id = booted


def _damage_a_middle_record(root: Path, conv: str) -> range:
    """Flip one byte in the body of a batch record that has an intact record after it; its seqs."""
    cdir = Path(layout.conversation_dir(str(root), SITE, conv))
    for seg in sorted(p for p in cdir.iterdir() if p.suffix == ".seg"):
        fd = os.open(seg, os.O_RDONLY)
        try:
            header = frame.decode_segment_header(os.pread(fd, frame.SEGMENT_HEADER_SIZE, 0))
            assert header is not None
            end = data_end(fd, frame.SEGMENT_HEADER_SIZE, os.fstat(fd).st_size)
            recs = [
                (off, h)
                for off, h, _ in iter_records(fd, frame.SEGMENT_HEADER_SIZE, end, header.salt)
                if h.kind == frame.KIND_BATCH
            ]
        finally:
            os.close(fd)
        if len(recs) >= 2:
            off, h = recs[0]
            with open(seg, "r+b") as f:
                f.seek(off + frame.RECORD_HEADER_SIZE + 3)
                byte = f.read(1)
                f.seek(off + frame.RECORD_HEADER_SIZE + 3)
                f.write(bytes([byte[0] ^ 0x5A]))
            return range(h.first_seq, h.end_seq)
    raise AssertionError(f"{conv}: no segment holds two batch records")


def test_power_cut_salvage(shm_path: Path) -> None:
    """fsck --repair's salvage: a damaged record replaced by a loss record, the original quarantined."""
    root = shm_path / "data"
    damaged: dict[str, range] = {}

    def setup(w: Writer) -> None:
        _some_history(w)
        w.store.close()
        damaged[CONVS[0]] = _damage_a_middle_record(root, CONVS[0])

    def work(w: Writer) -> None:
        w.store.close()
        report = salvage(str(root), SITE, CONVS[0], lock_timeout=5.0)
        assert [(r.first_seq, r.last_seq + 1) for r in report.salvaged] == [
            (damaged[CONVS[0]].start, damaged[CONVS[0]].stop)
        ], report

    rec = record(root, CONVS, setup, work)
    assert any(op[0] == "rename" for op in rec.disk.ops), "salvage renamed nothing"

    def checker(state: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
        check_damaged_state(state, rec, acked, nth, held, damaged)

    explore(rec, "salvage (fsck --repair)", shm_path, checker)


def test_power_cut_truncate_at_corruption(shm_path: Path) -> None:
    """fsck --truncate-at-corruption: the log cut at a damaged record, the cut-off segments quarantined."""
    root = shm_path / "data"
    damaged: dict[str, range] = {}

    def setup(w: Writer) -> None:
        _some_history(w)
        w.store.close()
        damaged[CONVS[0]] = _damage_a_middle_record(root, CONVS[0])

    def work(w: Writer) -> None:
        w.store.close()
        report = check(str(root), SITE, CONVS[0], repair=True, truncate_at_corruption=True, lock_timeout=5.0)
        assert any(p.repaired and p.lost_seqs for p in report.problems), report.problems

    rec = record(root, CONVS, setup, work)

    def checker(state: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
        check_damaged_state(state, rec, acked, nth, held, damaged, replaced=CONVS[0])

    explore(rec, "fsck --truncate-at-corruption", shm_path, checker)


def test_power_cut_import_one(shm_path: Path) -> None:
    """convmem import of one damaged conversation: its log set aside to quarantine/, then restored whole."""
    root = shm_path / "data"
    damaged: dict[str, range] = {}
    export = bytearray()

    def setup(w: Writer) -> None:
        _some_history(w)
        w.store.close()
        buf = io.BytesIO()
        write_items(buf, str(root), SITE, CONVS[0])
        export.extend(buf.getvalue())
        damaged[CONVS[0]] = _damage_a_middle_record(root, CONVS[0])

    def work(w: Writer) -> None:
        w.store.close()
        done = import_conversation(io.BytesIO(bytes(export)), str(root), SITE, CONVS[0], replace_damaged=True)
        assert done.set_aside is not None and done.imported > 0, done

    rec = record(root, CONVS, setup, work)
    assert any(op[0] == "unlink" for op in rec.disk.ops), "the damaged log was not set aside"

    def checker(state: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
        check_damaged_state(state, rec, acked, nth, held, damaged, replaced=CONVS[0])

    explore(rec, "import of one damaged conversation", shm_path, checker)


def test_power_cut_backup(shm_path: Path) -> None:
    """An online backup cut short: DEST is absent (a DEST.partial-* may be left) or a complete, clean copy."""
    top = shm_path / "top"
    root = top / "data"
    store = FileStore(root, **OPTS)
    w = Writer(None, store, "s")
    try:
        _some_history(w)
    finally:
        store.close()
    acked = w.acked
    disk = SimDisk(str(top))
    fileio.recorder = disk
    try:
        backup(str(root), str(top / "copy"), lock_timeout=5.0, extras=(MEMORY_BACKUP,))
    finally:
        fileio.recorder = None
    rec = Recording(disk, CONVS, acked)
    complete = Counter[str]()

    def checker(state: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
        dest = os.path.join(state, "copy")
        left = set(os.listdir(state)) - {"data", "copy"}
        assert all(n.startswith("copy.partial-") for n in left), f"unexpected names beside DEST: {left}"
        held["opened"] += 1
        if not os.path.exists(dest):
            complete["absent"] += 1
            return
        report = check(dest)
        assert not report.problems, f"a published backup has problems: {report.problems}"
        store = FileStore(dest, **OPTS)
        try:
            for a in acked:
                items = read_all(store, SITE, a.conv)
                for seq in range(a.first, a.last + 1):
                    assert items[seq].payload == make_payload(a.w, a.b, seq - a.first, a.n, a.pad)
        finally:
            store.close()
        held["acknowledged batches intact"] += len(acked)
        complete["complete"] += 1

    explore(rec, "backup", shm_path, checker)
    assert complete["complete"] and complete["absent"], complete


# ------------------------------------------------------------ the seam itself

_DURABLE_CALLS = {
    ("os", n)
    for n in (
        "write",
        "pwrite",
        "rename",
        "replace",
        "unlink",
        "remove",
        "truncate",
        "ftruncate",
        "mkdir",
        "makedirs",
        "fsync",
        "fdatasync",
        "rmdir",
        "link",
        "symlink",
    )
} | {("shutil", n) for n in ("copyfile", "copy", "copy2", "move", "rmtree")}


def test_engine_io_goes_through_the_seam() -> None:
    """No module of the engine but fileio writes, syncs, creates, renames or removes files itself.

    Anything that did would be invisible to the power-cut simulation (and to the
    fault hooks): the states above would miss what it leaves.
    """
    import ast

    from convmem import logstore

    pkg = Path(logstore.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "fileio.py":
            continue
        if path.name == "site_credentials.py":
            # The password file under auth/ (moved here from the adapter): not a log the simulation
            # models; its write-temp, fsync, rename and directory fsync are its own (tests/test_auth.py).
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            where = f"{path.relative_to(pkg.parent)}:{node.lineno}"
            if (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and (f.value.id, f.attr) in _DURABLE_CALLS
            ):
                found.append(f"{where} {f.value.id}.{f.attr}")
            elif isinstance(f, ast.Attribute) and f.attr == "open" and "O_CREAT" in ast.unparse(node):
                found.append(f"{where} os.open(O_CREAT)")
            elif (
                isinstance(f, ast.Name)
                and f.id == "open"
                and len(node.args) > 1
                and "r" not in ast.unparse(node.args[1])
            ):
                found.append(f"{where} open() for writing")
    assert not found, "file operations that bypass logstore.fileio: " + ", ".join(found)


def test_simulated_disk_models(shm_path: Path) -> None:
    """The simulator itself: unsynced data and uncovered directory entries are what a cut takes."""
    root = shm_path / "sim"
    (root / "d").mkdir(parents=True)
    (root / "d" / "old").write_bytes(b"old")
    disk = SimDisk(str(root))
    fileio.recorder = disk
    try:
        fd = fileio.open_create(str(root / "d" / "a"))
        fileio.pwrite_all(fd, b"A" * 1000, 0)
        fileio.fdatasync(fd)
        fileio.pwrite_all(fd, b"B" * 1000, 1000)  # never synced
        os.close(fd)
        fileio.fsync_dir(str(root / "d"))
        fileio.rename(str(root / "d" / "old"), str(root / "d" / "new"))  # never covered by a directory sync
    finally:
        fileio.recorder = None
    *_, (k, model) = disk.states()
    assert k == len(disk.ops) == 6

    def files(image: Image) -> dict[str, bytes]:
        return dict(image.files)

    drop = files(model.strict("drop"))
    assert drop == {os.path.join("d", "a"): b"A" * 1000, os.path.join("d", "old"): b"old"}
    keep = files(model.strict("keep"))
    assert keep[os.path.join("d", "a")] == b"A" * 1000 + b"B" * 1000 and os.path.join("d", "new") not in keep
    shapes = set()
    for i in range(64):
        got = files(model.strict("random", random.Random(i)))
        a = got[os.path.join("d", "a")]
        assert a[:1000] == b"A" * 1000 and set(a[1000:]) <= {ord("B"), 0}
        assert (os.path.join("d", "old") in got) != (os.path.join("d", "new") in got), "a rename is atomic"
        shapes.add((len(a), a.count(0) > 0, os.path.join("d", "new") in got))
    assert len(shapes) >= 4, f"random cuts hardly vary: {shapes}"
    lenient = files(model.lenient(None, random.Random(0)))
    assert lenient == {os.path.join("d", "a"): b"A" * 1000 + b"B" * 1000, os.path.join("d", "new"): b"old"}


def test_listing_recovery_runs_only_after_a_reboot(shm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost commit is recovered at the first listing after a reboot; a plain restart checks nothing."""
    root = shm_path / "data"
    store = FileStore(root, **OPTS)
    try:
        store.append(SITE, CONVS[0], make_batch("x", 1, 1, 10))
        store.append(SITE, CONVS[1], make_batch("x", 2, 1, 10))
    finally:
        store.close()  # logs the commits still owed
    store = FileStore(root, **OPTS)
    try:
        store.append(SITE, CONVS[0], make_batch("x", 3, 2, 10))
    finally:
        store.close()
    # What a power cut can leave: the last batch's intent and commit (neither synced) lost.
    sdir = Path(layout.site_dir(str(root), SITE))
    log = max(p for p in sdir.iterdir() if p.suffix == ".log")
    data = log.read_bytes()
    salt = manifestcodec.LOG_HEADER.unpack(data[: manifestcodec.LOG_HEADER.size])[2]
    recs = list(manifestcodec.iter_log_records(data, salt, manifestcodec.LOG_HEADER.size))
    assert recs[-1][2] is not None and recs[-1][2][:2] == [manifestcodec.COMMIT, CONVS[0]]
    assert recs[-2][2] is not None and recs[-2][2][:2] == [manifestcodec.INTENT, CONVS[0]]
    os.truncate(log, recs[-2][0])
    looked: list[str] = []
    real = manifestrecovery._ends_at
    monkeypatch.setattr(manifestrecovery, "_ends_at", lambda d, *a: looked.append(d) or real(d, *a))

    store = FileStore(root, **OPTS)  # same boot: the page cache held everything, nothing is checked
    try:
        by_id = {s.conversation_id: s for s in list_all(store, SITE)}
        assert looked == []
        assert by_id[CONVS[0]].last_appended_at < read_all(store, SITE, CONVS[0])[-1].recorded_at
    finally:
        store.close()
    monkeypatch.setattr(bootid, "boot_id", "a-later-boot")
    store = FileStore(root, **OPTS)
    try:
        listing = list_all(store, SITE)
        assert len(looked) == 2, looked  # both conversations were written before this boot
        logs = {c: read_all(store, SITE, c) for c in CONVS[:2]}
        assert [s.conversation_id for s in listing] == [CONVS[0], CONVS[1]]
        for s in listing:
            assert s.last_appended_at == logs[s.conversation_id][-1].recorded_at
    finally:
        store.close()


def test_power_cut_two_writers(shm_path: Path) -> None:
    """Two stores on one directory (as two processes): each logs its own boot record and synced intents."""
    root = shm_path / "data"

    def work(w: Writer) -> None:
        other = Writer(w.rec, FileStore(root, **OPTS), "o")
        try:
            for i, (conv_i, n, pad) in enumerate([(0, 1, 40), (0, 2, 200), (1, 1, 30), (1, 3, 300), (0, 1, 60)]):
                (w if i % 2 else other).append(CONVS[conv_i], n, pad)
            m = other.store._manifest(SITE)
            m._compact_bytes, m._writes = 1, 510  # the other writer compacts at its next commit
            other.append(CONVS[2], 1, 20)
            w.append(CONVS[0], 1, 20)
        finally:
            other.store.close()

    rec = record(root, CONVS, _some_history, work)
    explore(rec, "two writers", shm_path)


# ------------------------------------------------------------ long-term memories

MEM_SITE = "pc-memsite"
_MEM_START_US = 1_800_000_000_000_000
_MEM_RETENTION_S = 1000.0
#: Random strict variants per cut point of the memory workloads (their states are cheap to check).
MEM_RANDOM_VARIANTS = rounds(6, 64)


class MemClock:
    """A clock for the memory store that the workload moves forward (microseconds, one tick per call)."""

    def __init__(self) -> None:
        self.now = _MEM_START_US

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


def _mem_fields(n: int) -> dict[str, Any]:
    """A memory's fields, every one holding text no other version of any memory holds (``q0007`` style)."""
    return {
        "category": "fact",
        "subject": f"subjq{n:04d} of a memory",
        "summary": f"the summary sumq{n:04d}",
        "details": f"details detq{n:04d} " + "x" * (n * 37 % 400),
        "tags": [f"tagq{n:04d}", "common"],
        "source_uris": [f"https://example.org/uriq{n:04d}"],
        "dedupe_key": f"dedq{n:04d}",
    }


def _mem_needles(n: int) -> list[bytes]:
    return [f"{kind}q{n:04d}".encode() for kind in ("subj", "sum", "det", "tag", "uri", "ded")]


def _mem_retriever(index_dir: str) -> Any:
    from convmem.logstore.memories.retrieval import Retriever

    return Retriever(index_dir, embedder=None)  # BM25 alone: the states are checked, not the ranking


@dataclass
class MemRecording:
    """A memory workload: the store's memories after each acknowledged call, and what each erasure removed."""

    rec: Recording
    #: snapshots[j]: every memory's stored record after the j-th acknowledged call.
    snapshots: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    #: needles[j]: the text of memories erased by the first j calls (none of it may be on disk).
    needles: list[list[bytes]] = field(default_factory=list)


class MemWorkload:
    """Runs memory calls against one store, noting each acknowledgement in the recording."""

    def __init__(self, mrec: MemRecording, store: Any) -> None:
        self.mrec = mrec
        self.store = store
        self.versions: dict[str, list[int]] = {}  # memory id -> the field numbers its versions used
        self.n = 0
        self.erased: list[bytes] = []
        self._ack()

    def _snapshot(self) -> dict[str, dict[str, Any]]:
        from convmem.logstore.memories.state import record_body

        return {m.memory_id: record_body(m) for m in self.store.all(MEM_SITE)}

    def _ack(self) -> None:
        rec = self.mrec.rec
        j = len(self.mrec.snapshots)
        self.mrec.snapshots.append(self._snapshot())
        self.mrec.needles.append(list(self.erased))
        if j:  # an Ack per call, so that explore() can tell the states apart by how many calls returned
            rec.acks.append((len(rec.disk.ops), Ack("memories", 0, 0, "m", j, 0, 0)))

    def create(self) -> str:
        self.n += 1
        raw = _mem_fields(self.n)
        _, token, _ = self.store.verify(MEM_SITE, "create", raw)
        m = self.store.upsert(MEM_SITE, raw, token)
        self.versions[m.memory_id] = [self.n]
        self._ack()
        return str(m.memory_id)

    def update(self, memory_id: str) -> None:
        self.n += 1
        raw = _mem_fields(self.n)
        _, token, _ = self.store.verify(MEM_SITE, "update", raw, memory_id)
        self.store.upsert(MEM_SITE, raw, token, memory_id=memory_id)
        self.versions[memory_id].append(self.n)
        self._ack()

    def delete(self, memory_id: str, force: bool = False) -> None:
        _, token, _ = self.store.verify(MEM_SITE, "delete", None, memory_id, force=force)
        self.store.delete(MEM_SITE, memory_id, token, force)
        if force:
            self._forget(memory_id)
        self._ack()

    def sweep(self, clock: MemClock) -> None:
        """Move the clock past the retention window and run the retention sweep."""
        clock.now += int(_MEM_RETENTION_S * 2 * 1_000_000)
        for memory_id in self.store.purge_expired(MEM_SITE):
            self._forget(memory_id)
        self._ack()

    def _forget(self, memory_id: str) -> None:
        for n in self.versions.pop(memory_id):
            self.erased += _mem_needles(n)


def record_memories(root: Path, work: Callable[[MemWorkload, MemClock], None]) -> MemRecording:
    """A data directory with one conversation, then ``work`` on its memories with every operation recorded."""
    from convmem.logstore.memories import LongTermMemory

    FileStore(root, **OPTS).close()  # the data directory exists (the memory store needs its marker)
    disk = SimDisk(str(root))
    mrec = MemRecording(Recording(disk, [], []))
    clock = MemClock()
    fileio.recorder = disk
    try:
        store = LongTermMemory(root, retention_seconds=_MEM_RETENTION_S, clock=clock, retriever_factory=_mem_retriever)
        try:
            work(MemWorkload(mrec, store), clock)
        finally:
            store.close()
    finally:
        fileio.recorder = None
    assert disk.ops, "the workload performed no recorded operation"
    return mrec


def _files_holding(root: str, needles: list[bytes]) -> list[tuple[str, bytes]]:
    hits = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read()
            hits += [(os.path.relpath(os.path.join(dirpath, name), root), n) for n in needles if n in data]
    return hits


def check_memory_state(mrec: MemRecording, counts: Counter[str]) -> Checker:
    """The checker of a memory workload's states (see :func:`test_power_cut_memory_writes`)."""
    from convmem.logstore.memories import LongTermMemory
    from convmem.logstore.memories import check as mcheck
    from convmem.logstore.memories.state import record_body

    def checker(state: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
        j = len(acked)  # calls that returned before the cut
        # Nothing an erasure that returned removed is anywhere on the disk, in any file.
        leaks = _files_holding(state, mrec.needles[j])
        assert not leaks, f"erased memory content survives the cut: {leaks}"
        # fsck may find a torn tail or an interrupted rewrite's temp file: never damage.
        report = mcheck.check(state)
        kinds = {p.kind for p in report.problems}
        assert kinds <= {"memory-torn-tail", "memory-stray-file"}, [p.to_dict() for p in report.problems]
        if "memory-stray-file" in kinds:
            assert all(
                ".rewrite." in p.file or ".tmp." in p.file for p in report.problems if p.kind != "memory-torn-tail"
            )
        # The store opens (as after a reboot), and holds exactly the state after the last call that
        # returned, or after the call in flight (which may have reached the disk): never part of a call.
        clock = MemClock()
        clock.now = _MEM_START_US + 10 * int(_MEM_RETENTION_S * 1_000_000)
        with LongTermMemory(state, clock=clock, retriever_factory=_mem_retriever) as store:
            got = {m.memory_id: record_body(m) for m in store.all(MEM_SITE)}
            allowed = mrec.snapshots[j : j + 2]
            assert got in allowed, f"the memories match neither the state after call {j} nor after call {j + 1}"
            counts["after the in-flight call" if got != mrec.snapshots[j] else "after the last returned call"] += 1
            held["opened"] += 1
            held["acknowledged memory calls intact"] += j
            # And it takes a further write: a torn tail is cut, the log grows.
            raw = _mem_fields(9999)
            _, token, _ = store.verify(MEM_SITE, "create", raw)
            m = store.upsert(MEM_SITE, raw, token)
            assert {x.memory_id: record_body(x) for x in store.all(MEM_SITE)} == {**got, m.memory_id: record_body(m)}
        after = mcheck.check(state).problems
        assert not after, [p.to_dict() for p in after]

    return checker


def _explore_memories(mrec: MemRecording, scenario: str, scratch: Path) -> dict[str, int]:
    counts: Counter[str] = Counter()
    out = explore(mrec.rec, scenario, scratch, check_memory_state(mrec, counts), MEM_RANDOM_VARIANTS)
    print(f"{scenario}: " + ", ".join(f"{v} states {k}" for k, v in counts.items()))
    return out


def test_power_cut_memory_writes(shm_path: Path) -> None:
    """Memory create, update and soft delete (and the store's first write: its log, the token secret).

    At every cut the memory store opens, holds each acknowledged write exactly
    (fields and version) and no part of a call that did not return, fsck finds
    no damage, and the store takes a further write.
    """
    root = shm_path / "data"

    def work(w: MemWorkload, clock: MemClock) -> None:
        a = w.create()
        b = w.create()
        w.update(a)
        w.delete(b)
        w.update(a)
        w.create()

    _explore_memories(record_memories(root, work), "memory writes", shm_path)


def test_power_cut_memory_erasure(shm_path: Path) -> None:
    """``force: true`` erasure and the retention sweep, between ordinary writes.

    As above, and once an erasure returned, none of the erased memory's
    subject, summary, details, tags, source URIs or dedupe key (of any of its
    versions) is in any byte of any file under the data directory.
    """
    root = shm_path / "data"

    def work(w: MemWorkload, clock: MemClock) -> None:
        a = w.create()
        b = w.create()
        c = w.create()
        w.update(a)
        w.delete(a, force=True)
        w.delete(b)  # soft: kept until the sweep
        w.update(c)
        w.sweep(clock)  # erases b
        d = w.create()
        w.delete(c, force=True)
        w.update(d)

    mrec = record_memories(root, work)
    assert sum(op[0] == "rename" for op in mrec.rec.disk.ops) >= 3, "erasures did not rewrite the log"
    assert mrec.needles[-1], "nothing was erased"
    _explore_memories(mrec, "memory erasure", shm_path)


def test_simulated_disk_hard_links(shm_path: Path) -> None:
    """``fileio.link`` in the simulator: the new name is durable only once its directory is synced."""
    root = shm_path / "sim"
    root.mkdir()
    disk = SimDisk(str(root))
    fileio.recorder = disk
    try:
        fd = fileio.open_create(str(root / "tmp"))
        fileio.pwrite_all(fd, b"secret", 0)
        fileio.fsync(fd)
        os.close(fd)
        fileio.link(str(root / "tmp"), str(root / "key"))
        fileio.unlink(str(root / "tmp"))
        fileio.fsync_dir(str(root))
    finally:
        fileio.recorder = None
    assert [op[0] for op in disk.ops] == ["create", "write", "sync", "link", "unlink", "dirsync"]
    states = {
        k: (dict(m.strict("drop").files), dict(m.lenient(None, random.Random(0)).files)) for k, m in disk.states()
    }
    assert states[4] == ({}, {"key": b"secret", "tmp": b"secret"})  # linked, not yet covered by a sync
    assert states[6] == ({"key": b"secret"}, {"key": b"secret"})
    # Uncovered changes replayed at random: the file is reachable under either name, whole, or under none.
    *_, (_, model) = list(zip(range(6), disk.states(), strict=False))[-1]
    seen = {tuple(sorted(dict(model.strict("random", random.Random(i)).files).items())) for i in range(60)}
    assert seen <= {(), (("key", b"secret"),), (("tmp", b"secret"),), (("key", b"secret"), ("tmp", b"secret"))}
    assert (("key", b"secret"),) in seen
