"""Damage stays contained: one damaged record never takes an intact record with it.

Real logs are written, one byte of one record is flipped on disk, and the log
is read record by record in this process, in a fresh process (a restart) and
in another process while this one holds the conversation open. Every intact
record must read exactly as written; every read that covers the damaged
record must get ``Corrupted`` naming the file, the record's byte offset and
its seqs; appends go on unless the damaged record is the one they follow; and
no read rewrites the index or the manifest around the damage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from convmem.logstore import Corrupted, FileStore, ListSelector, Range, StoreError, Tail, frame
from convmem.logstore.maintenance import scan_segment
from tests.logstore_helpers import data_size, segment_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = "site-damage"
CONV = "conv-damage"
OPTS: dict[str, Any] = {"segment_bytes": 2048, "index_interval": 256}


@dataclass(frozen=True)
class Rec:
    """One record of the log as written: where it is and the seqs it holds."""

    path: str
    offset: int
    size: int
    kind: str
    first: int
    count: int
    seg_index: int
    last_in_segment: bool  # the last batch of its segment


def write_log(root: Path, rng: random.Random, batches: int, opts: dict[str, Any] = OPTS) -> list[Any]:
    """Append ``batches`` random batches; return every item as read back (the truth)."""
    store = FileStore(root, **opts)
    try:
        for b in range(batches):
            n = rng.randint(1, 6)
            store.append(
                SITE, CONV, [{"b": b, "i": i, "pad": "x" * rng.randint(0, 150), "f": 1.0, "t": True} for i in range(n)]
            )
        return read_everything(store)
    finally:
        store.close()


def read_everything(store: FileStore) -> list[Any]:
    out: list[Any] = []
    while True:
        page = store.read(SITE, CONV, Range(len(out), 1000))
        out.extend(page)
        if len(page) < 1000:
            return out


def records(root: Path) -> list[Rec]:
    out: list[Rec] = []
    segs = segment_files(str(root))
    for i, seg in enumerate(segs):
        _info, recs = scan_segment(seg)
        batches = [r for r in recs if r.kind == "batch"]
        for r in batches:
            assert r.first_seq is not None and r.count is not None
            out.append(Rec(seg, r.offset, r.size, r.kind, r.first_seq, r.count, i, r is batches[-1]))
    return out


def flip(path: str, offset: int, mask: int = 0x41) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def derived_digest(root: Path) -> dict[str, str]:
    """Digest of every index and manifest file: derived data that reads must not rewrite."""
    out = {}
    for dirpath, _d, files in os.walk(root):
        for f in files:
            if f.endswith((".idx", ".snap", ".log")):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(dirpath, f), root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def expect_contained(store: FileStore, truth: list[Any], recs: list[Rec], bad: Rec, tail_damaged: bool) -> None:
    """Every intact record reads exactly; every read covering ``bad`` reports it."""
    for r in recs:
        if r is bad:
            continue
        got = store.read(SITE, CONV, Range(r.first, r.count))
        assert got == truth[r.first : r.first + r.count], f"intact record at {r.path}:{r.offset} read wrong"
    # Reads that cover the damaged record, from before it, into it, and across it.
    for start, limit in ((bad.first, 1), (bad.first, bad.count), (max(0, bad.first - 3), 5), (0, 1000)):
        if start + limit <= bad.first:
            continue
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Range(start, limit))
        exc = info.value
        assert (os.path.realpath(exc.file), exc.offset) == (os.path.realpath(bad.path), bad.offset)
        assert exc.first_seq == bad.first
        if tail_damaged:
            assert exc.last_seq in (None, bad.first + bad.count - 1)
        else:
            assert exc.last_seq == bad.first + bad.count - 1
    if tail_damaged:
        with pytest.raises(Corrupted):
            store.read(SITE, CONV, Tail(1))
    else:
        # A tail of only the items after the damaged record (a tail of 3 covered it when fewer followed).
        after = min(3, len(truth) - (bad.first + bad.count))
        assert after > 0 and store.read(SITE, CONV, Tail(after)) == truth[-after:]


def expect_append(store: FileStore, truth: list[Any], tail_damaged: bool, bad: Rec) -> None:
    if tail_damaged:
        with pytest.raises(Corrupted) as info:
            store.append(SITE, CONV, [{"after": "damage"}])
        assert info.value.offset == bad.offset
        return
    r = store.append(SITE, CONV, [{"after": "damage"}])
    assert r.first == len(truth)
    got = store.read(SITE, CONV, Tail(1))
    assert [(i.seq, i.payload) for i in got] == [(len(truth), {"after": "damage"})]
    truth.append(got[0])


def run_child(root: Path, code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (another process); it prints one JSON object."""
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("CONVMEM_CRASH_AT", None)
    res = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


CHILD = """
import json, sys
from convmem.logstore import FileStore, Range, Tail, Corrupted
s = FileStore(sys.argv[1], segment_bytes=2048, index_interval=256)
out = {}
def attempt(name, fn):
    try:
        r = fn()
        out[name] = ["ok", r]
    except Corrupted as e:
        out[name] = ["Corrupted", e.offset, e.first_seq, e.last_seq]
attempt("cover", lambda: len(s.read("site-damage", "conv-damage", Range(FIRST, 1))))
attempt("tail", lambda: [i.seq for i in s.read("site-damage", "conv-damage", Tail(2))])
attempt("append", lambda: s.append("site-damage", "conv-damage", [{"child": 1}]).first)
s.close()
print(json.dumps(out))
"""


def _where(recs: list[Rec], segment: str, position: str) -> Rec:
    segs = sorted({r.seg_index for r in recs})
    seg = {"first-sealed": segs[0], "middle-sealed": segs[len(segs) // 2], "active": segs[-1]}[segment]
    mine = [r for r in recs if r.seg_index == seg]
    return {"first": mine[0], "middle": mine[len(mine) // 2], "last": mine[-1]}[position]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    root = tmp_path_factory.mktemp("damage") / "data"
    truth = write_log(root, random.Random(1234), 70)
    assert len(segment_files(str(root))) >= 4
    return root, truth


@pytest.mark.parametrize("segment", ["first-sealed", "middle-sealed", "active"])
@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("part", ["header", "body"])
def test_one_damaged_record_stays_contained(
    pristine: tuple[Path, list[Any]], tmp_path: Path, segment: str, position: str, part: str
) -> None:
    src, truth0 = pristine
    root = tmp_path / "data"
    shutil.copytree(src, root)
    truth = list(truth0)
    recs = records(root)
    bad = _where(recs, segment, position)
    tail_damaged = bad is recs[-1]
    flip(bad.path, bad.offset + (12 if part == "header" else 40))
    before = derived_digest(root)
    # This process finds the damage.
    store = FileStore(root, **OPTS)
    try:
        expect_contained(store, truth, recs, bad, tail_damaged)
        assert derived_digest(root) == before, "a read rewrote derived data around the damage"
        expect_append(store, truth, tail_damaged, bad)
    finally:
        store.close()
    # After a restart: the same.
    store = FileStore(root, **OPTS)
    try:
        expect_contained(store, truth, recs, bad, tail_damaged)
    finally:
        store.close()
    # Another process: the same again.
    got = run_child(root, CHILD.replace("FIRST", str(bad.first)))
    assert got["cover"][:3] == ["Corrupted", bad.offset, bad.first]
    if tail_damaged:
        assert got["tail"][0] == "Corrupted" and got["append"][0] == "Corrupted"
    else:
        assert got["tail"] == ["ok", [len(truth) - 2, len(truth) - 1]]
        assert got["append"] == ["ok", len(truth)]


def test_damage_found_by_another_process_while_this_one_holds_the_log(
    pristine: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    src, truth0 = pristine
    root = tmp_path / "data"
    shutil.copytree(src, root)
    truth = list(truth0)
    recs = records(root)
    bad = _where(recs, "active", "first")
    assert bad is not recs[-1]
    store = FileStore(root, **OPTS)
    try:
        assert store.read(SITE, CONV, Tail(1)) == truth[-1:]  # the tail is loaded and held
        flip(bad.path, bad.offset + 40)
        got = run_child(root, CHILD.replace("FIRST", str(bad.first)))
        assert got["cover"][:3] == ["Corrupted", bad.offset, bad.first]
        assert got["append"] == ["ok", len(truth)]
        truth.append(store.read(SITE, CONV, Range(len(truth), 1))[0])
        expect_contained(store, truth, recs, bad, False)
        expect_append(store, truth, False, bad)
    finally:
        store.close()


def test_last_record_damaged_while_open_refuses_appends_before_and_after_restart(tmp_path: Path) -> None:
    """The issue's one-record conversation: damage found while open is treated as after a restart."""
    root = tmp_path / "data"
    store = FileStore(root, **OPTS)
    try:
        store.append(SITE, CONV, [{"only": 1}])
        assert len(store.read(SITE, CONV, Tail(1))) == 1
        [seg] = segment_files(str(root))
        flip(seg, frame.SEGMENT_HEADER_SIZE + 40)
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Tail(1))
        assert (info.value.offset, info.value.first_seq) == (frame.SEGMENT_HEADER_SIZE, 0)
        with pytest.raises(Corrupted):
            store.append(SITE, CONV, [{"next": 1}])
        with pytest.raises(Corrupted):
            store.read(SITE, CONV, Tail(1))
    finally:
        store.close()
    store = FileStore(root, **OPTS)
    try:
        with pytest.raises(Corrupted) as info:
            store.append(SITE, CONV, [{"next": 1}])
        assert (info.value.offset, info.value.first_seq) == (frame.SEGMENT_HEADER_SIZE, 0)
    finally:
        store.close()
    assert os.path.getsize(seg) > frame.SEGMENT_HEADER_SIZE, "the damaged record was cut away"


def test_issue_scenario_one_flipped_record_in_a_long_log(tmp_path: Path) -> None:
    """99,000 items in batches of 250; the record holding seqs 49750-49999 is damaged."""
    root = tmp_path / "data"
    store = FileStore(root)
    try:
        for b in range(396):
            store.append(SITE, CONV, [{"s": b * 250 + i} for i in range(250)])
    finally:
        store.close()
    [seg] = segment_files(str(root))
    [rec] = [r for r in scan_segment(seg, payloads=False)[1] if r.first_seq == 49750]
    flip(seg, rec.offset + 100)
    before = derived_digest(root)
    for round_ in range(2):  # this process, then after a restart
        store = FileStore(root)
        try:
            assert store.read(SITE, CONV, Tail(1))[0].seq == 98999 + round_
            with pytest.raises(Corrupted) as info:
                store.read(SITE, CONV, Range(49000, 1000))
            assert (info.value.offset, info.value.first_seq, info.value.last_seq) == (rec.offset, 49750, 49999)
            assert [i.payload["s"] for i in store.read(SITE, CONV, Range(50000, 1000))] == list(range(50000, 51000))
            assert [i.payload["s"] for i in store.read(SITE, CONV, Range(49000, 750))] == list(range(49000, 49750))
            assert store.read(SITE, CONV, Tail(1))[0].seq == 98999 + round_
            if round_ == 0:
                assert derived_digest(root) == before
            assert store.append(SITE, CONV, [{"s": "new"}]).first == 99000 + round_
        finally:
            store.close()
    got = run_child(root, CHILD.replace("FIRST", "49800"))
    assert got["cover"] == ["Corrupted", rec.offset, 49750, 49999]
    assert got["append"] == ["ok", 99002]


def test_roll_cut_short_with_a_damaged_last_record_in_the_sealed_segment(tmp_path: Path) -> None:
    """A writer dies right after creating the next segment; then the sealed segment's last batch rots."""
    root = tmp_path / "data"
    code = (
        "import sys\nfrom convmem.logstore import FileStore\n"
        "s = FileStore(sys.argv[1], segment_bytes=2048, index_interval=256)\n"
        "for b in range(1000):\n"
        "    s.append('site-damage', 'conv-damage', [{'b': b, 'pad': 'y' * 100}])\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO, CONVMEM_CRASH_AT="segment-roll-created")
    res = subprocess.run(
        [sys.executable, "-c", code, str(root)], env=env, capture_output=True, timeout=120, check=False
    )
    assert res.returncode == 86, res.stderr
    segs = segment_files(str(root))
    assert data_size(segs[-1]) == frame.SEGMENT_HEADER_SIZE
    recs = records(root)
    bad = recs[-1]
    assert bad.path == segs[-2]
    flip(bad.path, bad.offset + 45)
    n = bad.first + bad.count
    for round_ in range(2):
        store = FileStore(root, **OPTS)
        try:
            with pytest.raises(Corrupted) as info:
                store.read(SITE, CONV, Tail(1) if round_ == 0 else Range(bad.first, 1))
            assert (info.value.offset, info.value.first_seq, info.value.last_seq) == (
                bad.offset,
                bad.first,
                bad.first + bad.count - 1,
            )
            assert [i.payload["b"] for i in store.read(SITE, CONV, Range(0, bad.first))] == list(range(bad.first))
            r = store.append(SITE, CONV, [{"after": 1}])
            assert r.first == n
            assert [i.seq for i in store.read(SITE, CONV, Tail(1))] == [n]
            n += 1
        finally:
            store.close()


def test_damaged_active_segment_header_leaves_earlier_segments_readable(
    pristine: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    src, truth = pristine
    root = tmp_path / "data"
    shutil.copytree(src, root)
    segs = segment_files(str(root))
    flip(segs[-1], 20)
    base = int(os.path.basename(segs[-1])[:20])
    store = FileStore(root, **OPTS)
    try:
        assert store.read(SITE, CONV, Range(0, base)) == truth[:base]
        with pytest.raises(Corrupted) as info:
            store.read(SITE, CONV, Tail(1))
        assert (info.value.offset, info.value.first_seq) == (0, base)
        with pytest.raises(Corrupted):
            store.append(SITE, CONV, [{"x": 1}])
    finally:
        store.close()


# --------------------------------------------------------------- randomised


@pytest.fixture(scope="module")
def random_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, list[Any], list[Rec]]]:
    """A few random multi-segment logs, built once; examples flip bytes in copies."""
    out = {}
    for seed in range(3):
        root = tmp_path_factory.mktemp(f"rand{seed}") / "data"
        rng = random.Random(seed)
        opts = {"segment_bytes": rng.choice([1024, 2048, 4096]), "index_interval": rng.choice([128, 512])}
        truth = write_log(root, rng, rng.randint(30, 60), opts)
        out[seed] = (root, truth, records(root))
    return out


@settings(
    max_examples=int(os.environ.get("CONVMEM_DAMAGE_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_flip_in_a_random_log(
    random_logs: dict[int, tuple[Path, list[Any], list[Rec]]], tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    seed = data.draw(st.sampled_from(sorted(random_logs)), label="log seed")
    src, truth, recs = random_logs[seed]
    segs = segment_files(str(src))
    seg_i = data.draw(st.integers(0, len(segs) - 1), label="segment")
    offset = data.draw(st.integers(0, os.path.getsize(segs[seg_i]) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="mask")
    print(f"damage seed: log {seed}, segment {seg_i}, offset {offset}, mask {mask:#x}")
    note(f"log {seed}, segment {seg_i}, offset {offset}, mask {mask:#x}")
    root = tmp_path_factory.mktemp("flip") / "data"
    shutil.copytree(src, root)
    path = os.path.join(root, os.path.relpath(segs[seg_i], src))
    flip(path, offset, mask)
    mine = [r for r in recs if r.seg_index == seg_i]
    hit = [r for r in mine if r.offset <= offset < r.offset + r.size]
    bad: Rec | None = None
    if hit and offset < hit[0].offset + hit[0].size - frame.TRAILER_SIZE:
        bad = hit[0]
    store = FileStore(root, **OPTS)
    try:
        if offset < frame.SEGMENT_HEADER_SIZE:
            # A segment header: that segment's seqs are unreadable, every other segment reads.
            base = int(os.path.basename(path)[:20])
            seg_end = int(os.path.basename(segs[seg_i + 1])[:20]) if seg_i + 1 < len(segs) else len(truth)
            for r in recs:
                if r.first + r.count <= base or r.first >= seg_end:
                    assert store.read(SITE, CONV, Range(r.first, r.count)) == truth[r.first : r.first + r.count]
            with pytest.raises(Corrupted) as info:
                store.read(SITE, CONV, Range(base, 1))
            assert (info.value.file, info.value.offset, info.value.first_seq) == (path, 0, base)
            return
        if bad is None:  # a trailer or the seal: nothing readable changes
            assert read_everything(store) == truth
            return
        local = [dataclasses.replace(r, path=os.path.join(root, os.path.relpath(r.path, src))) for r in recs]
        target = next(r for r in local if r.path == path and r.offset == bad.offset)
        expect_contained(store, truth, local, target, target is local[-1])
    except StoreError as exc:
        raise AssertionError(f"damage seed: log {seed}, segment {seg_i}, offset {offset}: {exc!r}") from exc
    finally:
        store.close()


@settings(
    max_examples=int(os.environ.get("CONVMEM_DAMAGE_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_internal_exception_leaves_the_api(
    random_logs: dict[int, tuple[Path, list[Any], list[Rec]]], tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    """Garbage over several bytes of segments and indexes, truncations: only StoreError comes out."""
    seed = data.draw(st.sampled_from(sorted(random_logs)), label="log seed")
    src, truth, _recs = random_logs[seed]
    root = tmp_path_factory.mktemp("garbage") / "data"
    shutil.copytree(src, root)
    files = sorted(os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs if f.endswith((".seg", ".idx")))
    for _ in range(data.draw(st.integers(1, 3), label="damages")):
        path = data.draw(st.sampled_from(files), label="file")
        size = os.path.getsize(path)
        if size == 0:
            continue
        offset = data.draw(st.integers(0, size - 1), label="offset")
        how = data.draw(st.sampled_from(["garbage", "zeros", "truncate"]), label="how")
        n = data.draw(st.integers(1, 64), label="bytes")
        print(f"damage seed: log {seed}, {os.path.relpath(path, root)}, offset {offset}, {how} {n}")
        with open(path, "r+b") as f:
            if how == "truncate":
                f.truncate(offset)
            else:
                f.seek(offset)
                f.write(bytes(n) if how == "zeros" else random.Random(offset * 31 + n).randbytes(n))
    store = FileStore(root, **OPTS)
    try:
        ops: list[Any] = [
            lambda: store.read(SITE, CONV, Tail(1)),
            lambda: store.read(SITE, CONV, Tail(1000)),
            lambda: store.read(SITE, CONV, Range(len(truth) // 2, 50)),
            lambda: store.read(SITE, CONV, Range(0, 1000)),
            lambda: store.append(SITE, CONV, [{"after": "garbage"}]),
            lambda: store.list_conversations(SITE, ListSelector(None, 10)),
            lambda: store.read(SITE, CONV, Tail(5)),
        ]
        appended = False
        for i, op in enumerate(ops):
            try:
                got = op()
            except StoreError:
                continue
            appended = appended or i == 4
            if isinstance(got, list) and not appended:
                # Whatever a read returns is right: damage never reads as other data.
                for item in got:
                    assert item == truth[item.seq], f"seq {item.seq} read wrong after the damage"
    finally:
        store.close()
