"""``convmem fsck`` tells the truth: what ``--repair`` says it repaired is gone on the next run,
states the engine resolves by itself are notes (exit 0), and acknowledged items that are
gone are called lost, with their seqs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, ListSelector, frame, index, layout, manifest, manifestcodec
from convmem.logstore.conversation import Tip
from tests.tools_support import REPO, SITE, cli, conv_dir, flip_byte, fsck, kinds, populate, read_all, record_offsets
from tests.tools_support import segments as segs_of

CID = "conv-0001"


def site_dir(root: Path) -> Path:
    return Path(layout.site_dir(str(root), SITE))


def _manifest(root: Path) -> manifest.SiteManifest:
    return manifest.SiteManifest(
        str(site_dir(root)), probe=lambda _c, _w, _s: None, walk=lambda: iter(()), lock_timeout=5
    )


# ------------------------------------------------------------------ damage of each kind


def torn_unacknowledged(root: Path) -> None:
    last = segs_of(root, CID)[-1]
    header = frame.decode_segment_header(last.read_bytes()[: frame.SEGMENT_HEADER_SIZE])
    assert header is not None
    record = frame.encode_record(header.salt, frame.KIND_BATCH, 80, 1, 1, b'[{"a":1}]')
    with open(last, "ab") as f:
        f.write(record[: len(record) // 2])


def torn_acknowledged(root: Path) -> None:
    last = segs_of(root, CID)[-1]
    offset, size, _kind = record_offsets(last)[-1]
    os.truncate(last, offset + size // 2)  # the last committed record loses its second half


def index_missing(root: Path) -> None:
    segs_of(root, CID)[0].with_suffix(".idx").unlink()


def index_stale(root: Path) -> None:
    a, b = segs_of(root, CID)[0], segs_of(root, "conv-0002")[0]
    a.with_suffix(".idx").write_bytes(b.with_suffix(".idx").read_bytes())


def index_mismatch(root: Path) -> None:
    idx = segs_of(root, CID)[0].with_suffix(".idx")
    raw = bytearray(idx.read_bytes())
    assert len(raw) >= 40
    raw[36:40] = (int.from_bytes(raw[36:40], "little") + 3).to_bytes(4, "little")
    idx.write_bytes(bytes(raw))


def index_short(root: Path) -> None:
    idx = segs_of(root, CID)[0].with_suffix(".idx")
    os.truncate(idx, 32 + 8)  # one entry left of many: well-formed, but it stops short


def orphan_index(root: Path) -> None:
    seg = segs_of(root, CID)[0]
    (seg.parent / layout.index_name(999_999)).write_bytes(seg.with_suffix(".idx").read_bytes())


def manifest_missing(root: Path) -> None:
    for p in site_dir(root).glob("manifest-*"):
        p.unlink()


def manifest_damaged(root: Path) -> None:
    [snap] = site_dir(root).glob("manifest-*.snap")
    flip_byte(snap, snap.stat().st_size - 1)


def manifest_incomplete(root: Path) -> None:
    m = _manifest(root)
    try:
        m._flock()
        epoch = max(manifestcodec.epoch_files(str(site_dir(root))))
        m._write_epoch(epoch + 1, [], False)
        m._current_epoch_locked()
        m._funlock()
    finally:
        m.close()


def manifest_stale(root: Path) -> None:
    saved = {p.name: p.read_bytes() for p in site_dir(root).glob("manifest-*")}
    with FileStore(root, segment_bytes=4096) as store:
        store.append(SITE, CID, [{"later": 1}])
    for p in site_dir(root).glob("manifest-*"):
        p.unlink()
    for name, content in saved.items():
        (site_dir(root) / name).write_bytes(content)


def intent_unresolved(root: Path) -> None:
    # What a writer killed between logging its intent and writing its batch leaves.
    m = _manifest(root)
    try:
        m.intent(CID, Tip(1, 2, len(read_all(root, CID)) + 1), new=False)
    finally:
        m.close()


def corrupt_record(root: Path) -> None:
    seg = segs_of(root, CID)[0]
    offset, _size, _kind = record_offsets(seg)[2]
    flip_byte(seg, offset + 40)


def _last_record(root: Path) -> tuple[Path, int, int]:
    last = segs_of(root, CID)[-1]
    offset, size, _kind = record_offsets(last)[-1]
    return last, offset, size


def _rewrite_last(root: Path, first_seq: int, count: int, body: bytes) -> None:
    """Replace the last record by one that checksums but breaks a rule."""
    last, offset, _size = _last_record(root)
    header = frame.decode_segment_header(last.read_bytes()[: frame.SEGMENT_HEADER_SIZE])
    assert header is not None
    stamp = frame.decode_record_header(last.read_bytes(), offset).recorded_at_us
    os.truncate(last, offset)
    with open(last, "ab") as f:
        f.write(frame.encode_record(header.salt, frame.KIND_BATCH, first_seq, count, stamp, body))


def seq_mismatch(root: Path) -> None:
    last, offset, _size = _last_record(root)
    first = frame.decode_record_header(last.read_bytes(), offset).first_seq
    _rewrite_last(root, first + 5, 1, b'[{"x":1}]')


def bad_batch(root: Path) -> None:
    last, offset, _size = _last_record(root)
    first = frame.decode_record_header(last.read_bytes(), offset).first_seq
    _rewrite_last(root, first, 2, b'[{"x":1},2]')


def bad_segment_header(root: Path) -> None:
    flip_byte(segs_of(root, CID)[-1], 3)


def acknowledged_lost(root: Path) -> None:
    last, offset, _size = _last_record(root)
    os.truncate(last, offset)


SCENARIOS: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "torn-tail": (torn_unacknowledged, ()),
    "torn-acknowledged": (torn_acknowledged, ()),
    "index-missing": (index_missing, ()),
    "index-stale": (index_stale, ()),
    "index-mismatch": (index_mismatch, ()),
    "index-short": (index_short, ()),
    "orphan-index": (orphan_index, ()),
    "manifest-missing": (manifest_missing, ()),
    "manifest-damaged": (manifest_damaged, ()),
    "manifest-incomplete": (manifest_incomplete, ()),
    "manifest-stale": (manifest_stale, ()),
    "intent-unresolved": (intent_unresolved, ()),
    "corrupt-record": (corrupt_record, ("--truncate-at-corruption",)),
    "seq-mismatch": (seq_mismatch, ("--truncate-at-corruption",)),
    "bad-batch": (bad_batch, ("--truncate-at-corruption",)),
    "bad-segment-header": (bad_segment_header, ("--truncate-at-corruption",)),
    "acknowledged-lost": (acknowledged_lost, ()),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "data"
    # Segments big enough that the first one has dozens of index entries (for index-short).
    populate(root, conversations=3, batches=40, segment_bytes=256 * 1024)
    with FileStore(root, segment_bytes=256 * 1024) as store:
        for i in range(200):
            store.append(SITE, CID, [{"more": i, "text": "x" * 500}])
        store.append(SITE, CID, [{"more": "last"}])
    # The tests that cut the last record expect no index entry to point at it.
    last = segs_of(root, CID)[-1]
    base = layout.parse_segment_name(last.name)
    header = frame.decode_segment_header(last.read_bytes()[: frame.SEGMENT_HEADER_SIZE])
    assert base is not None and header is not None
    entries = index.load(str(last.with_suffix(".idx")), base, header.salt, last.stat().st_size)
    assert entries is not None and record_offsets(last)[-1][0] not in entries.offsets
    return root


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    subprocess.run(["cp", "-a", str(pristine), str(root)], check=True)
    return root


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_repair_then_check_is_clean(name: str, pristine: Path, tmp_path: Path) -> None:
    """Every kind --repair says it repaired is gone for the next plain fsck, which exits 0."""
    root = copy_of(pristine, tmp_path)
    assert fsck(root)[0] == 0
    damage, extra = SCENARIOS[name]
    damage(root)
    status, before = fsck(root)
    assert before["problems"], f"{name}: the damage was not noticed"
    status, repaired = fsck(root, "--repair", *extra)
    claimed = {p["kind"] for p in repaired["problems"] if p["repaired"]}
    left = [p for p in repaired["problems"] if not p["repaired"] and not p["resolves_itself"]]
    assert status == (4 if left else 1 if claimed else 0), repaired["problems"]
    status, after = fsck(root)
    assert status == 0, (name, repaired["problems"], after["problems"])
    assert after["problems"] == [], after["problems"]
    # The engine agrees: every conversation reads, and the listing matches the logs.
    with FileStore(root) as store:
        for s in store.list_conversations(SITE, _all()).summaries:
            items = read_all(root, s.conversation_id)
            assert items and items[-1].recorded_at == s.last_appended_at, s


def _all() -> ListSelector:
    return ListSelector(None, 100)


def test_acknowledged_items_lost_from_a_torn_tail_are_named_with_their_seqs(pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    last = segs_of(root, CID)[-1]
    offset, _size, _kind = record_offsets(last)[-1]
    first = frame.decode_record_header(last.read_bytes(), offset).first_seq
    items_before = len(read_all(root, CID))
    torn_acknowledged(root)

    status, report = fsck(root)
    assert status == 4
    assert kinds(report) == ["acknowledged-lost", "torn-tail"]
    lost = next(p for p in report["problems"] if p["kind"] == "acknowledged-lost")
    assert lost["lost_seqs"] == [first, items_before - 1]
    assert f"acknowledged seqs {first}..{items_before - 1} are gone" in lost["detail"]
    torn = next(p for p in report["problems"] if p["kind"] == "torn-tail")
    assert not torn["resolves_itself"] and "never acknowledged" not in torn["detail"]
    assert "acknowledged items were lost" in torn["detail"]

    status, report = fsck(root, "--repair")
    assert status == 4  # the loss is not something fsck can repair
    lost = next(p for p in report["problems"] if p["kind"] == "acknowledged-lost")
    assert not lost["repaired"] and "rewrote the manifest" in lost["action"]
    torn = next(p for p in report["problems"] if p["kind"] == "torn-tail")
    assert torn["repaired"] and "quarantine" in torn["action"]
    assert list((root / "quarantine").iterdir()), "the torn segment's original bytes are kept"
    assert fsck(root)[0] == 0
    items = read_all(root, CID)
    assert len(items) == first
    with FileStore(root) as store:
        listed = {s.conversation_id: s for s in store.list_conversations(SITE, _all()).summaries}
    assert listed[CID].last_appended_at == items[-1].recorded_at


def test_log_shorter_than_the_listing_is_loss_not_unacknowledged(pristine: Path, tmp_path: Path) -> None:
    """A whole record gone (not torn) from the end: the listing's commit says it was acknowledged."""
    root = copy_of(pristine, tmp_path)
    last = segs_of(root, CID)[-1]
    offset, _size, _kind = record_offsets(last)[-1]
    first = frame.decode_record_header(last.read_bytes(), offset).first_seq
    end = len(read_all(root, CID))
    os.truncate(last, offset)
    status, report = fsck(root)
    assert status == 4 and kinds(report) == ["acknowledged-lost"]
    assert report["problems"][0]["lost_seqs"] == [first, end - 1]
    assert "never acknowledged" not in str(report)


# ------------------------------------------------------------------ a real SIGKILLed writer

_CHILD = r"""
import os, signal, sys
from convmem.logstore import FileStore
root, conv, mode = sys.argv[1], sys.argv[2], sys.argv[3]
store = FileStore(root, segment_bytes=8192)
for i in range(5):
    store.append("site-alpha", conv, [{"warm": i}])
armed = False
def killing(real):
    def call(*args):
        if armed:
            os.kill(os.getpid(), signal.SIGKILL)  # a real SIGKILL, at this exact step
        return real(*args)
    return call
# The batch's record is written with pwrite and synced with fdatasync, or both in one pwritev
# with RWF_DSYNC (logstore.fileio.pwrite_synced); the manifest's intent (logged before) with write.
def written_then_killing(real):
    def call(fd, buffers, offset, flags=0):
        if armed:
            os.pwrite(fd, b"".join(buffers), offset)  # the record written, not synced
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, buffers, offset, flags)
    return call
if mode == "write":
    os.pwrite = killing(os.pwrite)
    os.pwritev = killing(os.pwritev)
elif mode == "fdatasync":
    os.fdatasync = killing(os.fdatasync)
    os.pwritev = written_then_killing(os.pwritev)
if mode == "loop":
    print("ready", flush=True)
    i = 0
    while True:
        store.append("site-alpha", conv, [{"i": i, "t": "y" * (i % 700)}])
        i += 1
armed = True
store.append("site-alpha", conv, [{"never": "acknowledged"}])
print("the append returned", flush=True)
"""


def _child(root: Path, conv: str, mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), conv, mode], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )


def _only_notes(report: dict[str, Any]) -> None:
    for p in report["problems"]:
        assert p["resolves_itself"], p
        assert p["kind"] in ("torn-tail", "intent-unresolved", "index-missing"), p


@pytest.mark.parametrize("point", ["write", "fdatasync"])
def test_writer_killed_mid_append_leaves_only_notes(tmp_path: Path, point: str) -> None:
    """SIGKILL after the intent is logged: before the batch is written, or before it is synced."""
    root = tmp_path / "data"
    populate(root, conversations=2, batches=5)
    child = _child(root, CID, point)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, out
    assert "returned" not in out

    status, report = fsck(root)
    assert status == 0, report["problems"]
    assert "intent-unresolved" in kinds(report)
    _only_notes(report)
    note = next(p for p in report["problems"] if p["kind"] == "intent-unresolved")
    assert "next listing" in note["action"]
    # Killed before the record was written, it is not in the log; killed before its sync, the
    # page cache (which a SIGKILL does not lose) holds it whole.
    wrote = "its batch is in the log" if point == "fdatasync" else "its batch is not in the log"
    assert wrote in note["detail"], note

    status, report = fsck(root, "--repair")
    if point == "fdatasync":
        # The state a running writer that still owes the batch's commit leaves too: left alone.
        assert status == 0 and set(kinds(report)) == {"intent-unresolved"}, report["problems"]
        assert "--repair leaves it" in report["problems"][0]["action"]
        return
    assert status == 1 and all(p["repaired"] for p in report["problems"]), report["problems"]
    status, report = fsck(root)
    assert status == 0 and report["problems"] == []


def test_writer_killed_at_random_moments(tmp_path: Path) -> None:
    """A writer SIGKILLed at random points: fsck never reports an error, only notes."""
    seed = int(os.environ.get("CONVMEM_FSCK_KILL_SEED", random.randrange(2**32)))
    print(f"seed {seed} (rerun with CONVMEM_FSCK_KILL_SEED={seed})")
    rng = random.Random(seed)
    root = tmp_path / "data"
    populate(root, conversations=1, batches=2)
    for round_ in range(4):
        child = _child(root, f"killed-{round_ % 2}", "loop")
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        status, report = fsck(root)
        assert status == 0, f"seed {seed} round {round_}: {report['problems']}"
        _only_notes(report)
    status, report = fsck(root, "--repair")
    assert status in (0, 1), f"seed {seed}: {report['problems']}"
    assert fsck(root)[0] == 0, f"seed {seed}"


def test_human_output_of_a_note(tmp_path: Path) -> None:
    root = tmp_path / "data"
    populate(root, conversations=1, batches=2)
    intent_unresolved_conv(root)
    proc = cli("fsck", str(root))
    text = proc.stdout.decode()
    assert proc.returncode == 0
    assert "intent-unresolved" in text and "NOTE: none needed" in text
    assert "0 problems, 0 repaired, 0 left; 1 note (resolved by the engine itself)" in text


def intent_unresolved_conv(root: Path) -> None:
    m = _manifest(root)
    try:
        m.intent("conv-0000", Tip(1, 2, 5), new=False)  # the log holds seqs 0..3
    finally:
        m.close()


def test_index_short_is_noticed_and_rebuilt(pristine: Path, tmp_path: Path) -> None:
    root = copy_of(pristine, tmp_path)
    idx = segs_of(root, CID)[0].with_suffix(".idx")
    original = idx.read_bytes()
    index_short(root)
    status, report = fsck(root)
    assert status == 4 and kinds(report) == ["index-short"]
    assert "stops short" in report["problems"][0]["detail"]
    assert fsck(root, "--repair")[0] == 1
    assert idx.read_bytes() == original
    # A few entries missing at the end (a killed writer's unwritten group) is normal.
    os.truncate(idx, len(original) - 8 * 5)
    assert fsck(root)[0] == 0
    assert conv_dir(root, CID).exists()


# ------------------------------------------- what a power cut leaves (tests/faults/test_powercut.py)


def _current_log(root: Path) -> tuple[Path, int, list[tuple[int, int]]]:
    """The current activity log, its salt and its records' ``(offset, end)``."""
    path = max(site_dir(root).glob("manifest-*.log"))
    data = path.read_bytes()
    _magic, _epoch, salt, _check = manifestcodec.LOG_HEADER.unpack(data[: manifestcodec.LOG_HEADER.size])
    recs = [(o, e) for o, e, _r in manifestcodec.iter_log_records(data, salt, manifestcodec.LOG_HEADER.size)]
    return path, salt, recs


def _zero(path: Path, start: int, end: int) -> None:
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\0" * (end - start))


def sealed_index_missing(root: Path) -> None:
    segs_of(root, "conv-0000")[0].with_suffix(".idx").unlink()


def sealed_index_truncated(root: Path) -> None:
    os.truncate(segs_of(root, "conv-0000")[0].with_suffix(".idx"), 0)


def sealed_index_header_zeroed(root: Path) -> None:
    _zero(segs_of(root, "conv-0000")[0].with_suffix(".idx"), 0, 32)


def sealed_index_entries_zeroed(root: Path) -> None:
    idx = segs_of(root, "conv-0000")[0].with_suffix(".idx")
    _zero(idx, 32 + 8 * 3, idx.stat().st_size)


def active_index_truncated(root: Path) -> None:
    os.truncate(segs_of(root, "conv-0000")[-1].with_suffix(".idx"), 10)


def log_record_zeroed(root: Path) -> None:
    path, _salt, recs = _current_log(root)
    assert len(recs) > 4
    _zero(path, *recs[len(recs) // 2])  # whole records follow it


def log_tail_torn(root: Path) -> None:
    path, _salt, _recs = _current_log(root)
    with open(path, "ab") as f:
        f.write(b"\0" * 37)


POWER_CUT_STATES: dict[str, tuple[Callable[[Path], None], str]] = {
    "sealed-index-missing": (sealed_index_missing, "index-missing"),
    "sealed-index-truncated": (sealed_index_truncated, "index-stale"),
    "sealed-index-header-zeroed": (sealed_index_header_zeroed, "index-stale"),
    "sealed-index-entries-zeroed": (sealed_index_entries_zeroed, "index-mismatch"),
    "active-index-truncated": (active_index_truncated, "index-stale"),
    "log-record-zeroed": (log_record_zeroed, "manifest-damaged"),
    "log-tail-torn": (log_tail_torn, "manifest-damaged"),
}


@pytest.fixture(scope="module")
def two_segments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sealed") / "data"
    populate(root, conversations=1, batches=300, segment_bytes=32 * 1024)
    assert len(segs_of(root, "conv-0000")) >= 2
    return root


@pytest.mark.parametrize("name", sorted(POWER_CUT_STATES))
def test_power_cut_states_are_notes_the_engine_resolves(name: str, two_segments: Path, tmp_path: Path) -> None:
    """A note is true: exit 0, and after the engine's own next read, append and listing fsck finds nothing."""
    damage, kind = POWER_CUT_STATES[name]
    for repair in (False, True):
        (tmp_path / str(repair)).mkdir()
        root = copy_of(two_segments, tmp_path / str(repair))
        want = read_all(root, "conv-0000")
        damage(root)
        status, report = fsck(root)
        assert status == 0 and kind in kinds(report), report["problems"]
        assert all(p["resolves_itself"] and "none needed" in p["action"] for p in report["problems"]), report
        if repair:
            status, report = fsck(root, "--repair")
            assert status == 1 and all(p["repaired"] for p in report["problems"]), report["problems"]
        else:
            # What the engine does by itself: a read of every segment, an append, a listing.
            assert read_all(root, "conv-0000") == want
            with FileStore(root, segment_bytes=32 * 1024) as store:
                store.append(SITE, "conv-0000", [{"after": name}])
                store.list_conversations(SITE, _all())
        status, report = fsck(root)
        assert status == 0 and report["problems"] == [], (repair, report["problems"])


def test_damage_a_power_cut_cannot_leave_stays_a_problem(two_segments: Path, tmp_path: Path) -> None:
    """A foreign, non-zero index header and an entry pointing inside its segment are not notes."""
    root = copy_of(two_segments, tmp_path)
    a, b = segs_of(root, "conv-0000")[:2]
    a.with_suffix(".idx").write_bytes(b.with_suffix(".idx").read_bytes()[:32])  # another segment's header
    status, report = fsck(root)
    assert status == 4 and kinds(report) == ["index-stale"]
    assert not report["problems"][0]["resolves_itself"]
    assert "the engine ignores it" in report["problems"][0]["action"]
    assert fsck(root, "--repair")[0] == 1 and fsck(root)[0] == 0


LIVE_WRITER = """
import sys
from convmem.logstore import FileStore
store = FileStore(sys.argv[1])
for n in range(5):
    store.append("site-live", f"live-conv-{n}", [{"n": n}])
print("ready", flush=True)
sys.stdin.readline()  # hold the store open, its commits owed, until told to close
store.close()
"""


def test_plain_fsck_of_a_live_directory_summarises_the_commits_writers_owe(tmp_path: Path) -> None:
    """A healthy directory with a writer running: one note for the site, not three lines per conversation."""
    root = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writer = subprocess.Popen(
        [sys.executable, "-c", LIVE_WRITER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        proc = cli("fsck", str(root))
        text = proc.stdout.decode()
        assert proc.returncode == 0, text
        assert text.count("intent-unresolved") == 1, text
        assert "site site-live: 5 conversations (live-conv-0, live-conv-1, live-conv-2, ...)" in text
        assert "0 problems, 0 repaired, 0 left; 5 notes" in text
        verbose = cli("fsck", str(root), "--verbose").stdout.decode()
        assert verbose.count("intent-unresolved") == 5, verbose
        status, report = fsck(root)
        assert status == 0 and all(p["owed_commit"] for p in report["problems"]), report["problems"]
    finally:
        assert writer.stdin is not None
        writer.stdin.write("\n")
        writer.stdin.close()
        writer.wait(timeout=60)
    status, report = fsck(root)
    assert status == 0 and report["problems"] == [], report["problems"]  # the writer logged them at close
