"""What a read in one process sees after another process changed the conversation's files.

A read trusts the state this process keeps of a conversation only while the
files say nothing changed: the active segment is still linked, its size is
the one last seen, and the bytes at the committed end are still zero (a read
of the tail checks them in the same ``pread`` as its records). These tests
change the files from a real second process (appends into preallocated space,
appends that roll the segment, a repair that cuts the log and publishes the
cut segment under the same name) and check that every read in the first
process (``read``, ``read_raw``, ``try_read_raw``; tails, and ranges that end
before the tail or start at it) returns what is on disk now. The last tests
check the same of raw reads that reuse a kept split of a batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from logstore_helpers import data_size, segment_files

from convmem.logstore import Corrupted, FileStore, InvalidConversationId, Range, Tail, frame, maintenance, reader
from convmem.logstore.frame import SEGMENT_HEADER_SIZE
from convmem.logstore.segment import iter_records

SITE = "fresh-site"
CONV = "conv-fresh-1"
OPTS = {"segment_bytes": 4096, "index_interval": 512}

CHILD = textwrap.dedent(
    """
    import json, sys
    from convmem.logstore import FileStore
    root, conv, first, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    with FileStore(root, segment_bytes=4096, index_interval=512) as store:
        n = first
        for _ in range(batches):
            rng = store.append("fresh-site", conv, [{"n": n + i, "t": "x" * size} for i in range(2)])
            assert rng.first == n, (rng, n)
            n += 2
    """
)


def _append_elsewhere(root: Path, first: int, batches: int, size: int = 20, conv: str = CONV) -> list[dict]:
    """Append ``batches`` 2-item batches from another process; the payloads it wrote."""
    subprocess.run([sys.executable, "-c", CHILD, str(root), conv, str(first), str(batches), str(size)], check=True,
                   timeout=120)
    return [{"n": first + i, "t": "x" * size} for i in range(2 * batches)]


def _payloads(items: list) -> list[dict]:
    return [i.payload if isinstance(i.payload, dict) else msgspec.json.decode(i.payload) for i in items]


def _all_reads_see(store: FileStore, expected: list[dict]) -> None:
    """Every read path returns ``expected`` (the whole conversation) as it is on disk now."""
    n = len(expected)
    assert _payloads(store.read(SITE, CONV, Tail(3))) == expected[-3:]
    assert _payloads(store.read_raw(SITE, CONV, Tail(3))) == expected[-3:]
    got = store.try_read_raw(SITE, CONV, Tail(3), 1 << 20)
    assert got is None or _payloads(got) == expected[-3:]
    assert [i.seq for i in store.read(SITE, CONV, Tail(n + 5))] == list(range(n))
    assert _payloads(store.read(SITE, CONV, Range(0, n + 5))) == expected
    mid = max(n - 4, 0)
    assert _payloads(store.read(SITE, CONV, Range(mid, 2))) == expected[mid : mid + 2]  # ends before the tail
    assert store.read(SITE, CONV, Range(n, 5)) == []


@pytest.mark.parametrize("first_read", ["tail", "range-at-the-end", "range-before-the-end", "raw", "try-raw"])
def test_a_read_sees_another_process_append_into_preallocated_space(tmp_path: Path, first_read: str) -> None:
    with FileStore(str(tmp_path), **OPTS) as store:
        mine = [{"n": i, "t": "y"} for i in range(3)]
        store.append(SITE, CONV, mine)
        _all_reads_see(store, mine)
        (seg,) = segment_files(str(tmp_path))
        size = os.path.getsize(seg)
        theirs = _append_elsewhere(tmp_path, 3, 1)
        # The other process wrote into the preallocated space: the file's size did not change,
        # only the bytes at the committed end this process knows of.
        assert os.path.getsize(seg) == size
        assert data_size(seg) > 100
        expected = mine + theirs
        # The first read after the append is each kind in turn: each must notice it on its own.
        if first_read == "tail":
            assert _payloads(store.read(SITE, CONV, Tail(2))) == theirs
        elif first_read == "range-at-the-end":
            assert _payloads(store.read(SITE, CONV, Range(3, 10))) == theirs
        elif first_read == "range-before-the-end":
            assert _payloads(store.read(SITE, CONV, Range(0, 4))) == expected[:4]
        elif first_read == "raw":
            assert _payloads(store.read_raw(SITE, CONV, Tail(2))) == theirs
        else:
            got = store.try_read_raw(SITE, CONV, Tail(2), 1 << 20)
            assert got is not None and _payloads(got) == theirs
        _all_reads_see(store, expected)
        # And this process appends after them, where they ended.
        assert store.append(SITE, CONV, [{"n": 5}]).first == 5
        _all_reads_see(store, [*expected, {"n": 5}])


def test_a_read_sees_another_process_roll_the_segment(tmp_path: Path) -> None:
    with FileStore(str(tmp_path), **OPTS) as store:
        mine = [{"n": 0, "t": "y"}, {"n": 1, "t": "y"}]
        store.append(SITE, CONV, mine)
        assert _payloads(store.read(SITE, CONV, Tail(2))) == mine
        theirs = _append_elsewhere(tmp_path, 2, 20, size=200)  # about 8 KB: the 4 KiB segments roll
        assert len(segment_files(str(tmp_path))) >= 3
        assert _payloads(store.read(SITE, CONV, Tail(3))) == theirs[-3:]
        _all_reads_see(store, mine + theirs)
        n = len(mine + theirs)
        # Appends in turn from both processes, each read here seeing the other's last.
        for round_ in range(3):
            more = _append_elsewhere(tmp_path, n, 3, size=300)
            assert _payloads(store.read(SITE, CONV, Tail(6))) == more
            assert store.append(SITE, CONV, [{"n": n + 6, "r": round_}]).first == n + 6
            n += 7
        assert [i.seq for i in store.read(SITE, CONV, Tail(n + 1))] == list(range(n))


def test_a_read_after_a_repair_replaced_the_active_segment_reads_the_new_file(tmp_path: Path) -> None:
    """fsck --truncate-at-corruption publishes the cut segment under the same name: the old file is unlinked.

    The reader still holds the old file open. Had it kept reading it, it would
    report the cut record as damaged, and never see what is appended to the
    new file.
    """
    with FileStore(str(tmp_path), **OPTS) as store:
        kept = [{"n": i, "t": "k"} for i in range(4)]
        store.append(SITE, CONV, kept[:2])
        store.append(SITE, CONV, kept[2:])
        store.append(SITE, CONV, [{"n": 4, "t": "lost"}])
        assert [i.seq for i in store.read(SITE, CONV, Tail(10))] == [0, 1, 2, 3, 4]
        (seg,) = segment_files(str(tmp_path))
        inode = os.stat(seg).st_ino
        end = data_size(seg)
        with open(seg, "r+b") as f:  # a flipped byte in the last record's body
            f.seek(end - 20)
            b = f.read(1)
            f.seek(end - 20)
            f.write(bytes([b[0] ^ 0x55]))
        report = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(
                """
                import json, sys
                from convmem.logstore import maintenance
                r = maintenance.check(sys.argv[1], truncate_at_corruption=True)
                print(json.dumps([p.kind for p in r.problems]))
                """
            ), str(tmp_path)],
            check=True, capture_output=True, text=True, timeout=120,
        )
        assert json.loads(report.stdout), "the repair found nothing to cut"
        assert os.stat(seg).st_ino != inode  # a new file under the same name; the old one is unlinked
        _all_reads_see(store, kept)
        theirs = _append_elsewhere(tmp_path, 4, 1)
        _all_reads_see(store, kept + theirs)
        assert store.append(SITE, CONV, [{"n": 6}]).first == 6
    assert not maintenance.check(str(tmp_path)).problems


def test_malformed_names_are_refused_while_conversations_are_open(tmp_path: Path) -> None:
    """An open conversation's names skip validation on a read only when they equal its key (valid names)."""
    with FileStore(str(tmp_path), **OPTS) as store:
        store.append(SITE, CONV, [{"n": 0}])
        assert len(store.read(SITE, CONV, Tail(1))) == 1
        for site, conv in ((SITE, "conv fresh"), (SITE, "short"), ("bad site", CONV), (SITE, "x" * 65)):
            with pytest.raises(InvalidConversationId):
                store.read(site, conv, Tail(1))
            with pytest.raises(InvalidConversationId):
                store.read_raw(site, conv, Tail(1))
        with pytest.raises(TypeError):
            store.read(SITE, CONV.encode(), Tail(1))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.read(SITE, CONV, 5)  # type: ignore[arg-type]


# Raw reads reuse the split of a batch whose header and body bytes they just read, and verified,
# are those of a split kept earlier (reader._SplitCache): every change on disk must still show.


def _record_at_end(seg: str, count: int) -> tuple[int, frame.RecordHeader, bytes, int]:
    """``(offset, header, body, salt)`` of the last record of ``seg`` holding ``count`` items."""
    fd = os.open(seg, os.O_RDONLY)
    try:
        salt = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0)).salt  # type: ignore[union-attr]
        found = [(o, h, bytes(b)) for o, h, b in iter_records(fd, SEGMENT_HEADER_SIZE, data_size(seg), salt)
                 if h.count == count]
    finally:
        os.close(fd)
    return (*found[-1], salt)


def test_a_raw_read_notices_a_record_rewritten_after_its_split_was_kept(tmp_path: Path) -> None:
    with FileStore(str(tmp_path), **OPTS) as store:
        store.append(SITE, CONV, [{"n": 0}])
        store.append(SITE, CONV, [{"k": "aaaa"}, {"k": "bbbb"}])  # seqs 1-2
        for _ in range(2):
            assert _payloads(store.read_raw(SITE, CONV, Tail(2))) == [{"k": "aaaa"}, {"k": "bbbb"}]
        (seg,) = segment_files(str(tmp_path))
        offset, h, body, salt = _record_at_end(seg, 2)
        assert any(key == (seg, offset) for key in reader._SPLITS._entries)
        with open(seg, "r+b") as f:
            # The same seqs and length, a valid checksum, another body: written by hand, as a forger would.
            f.seek(offset)
            f.write(frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us,
                                        body.replace(b"bbbb", b"cccc")))
        assert _payloads(store.read_raw(SITE, CONV, Tail(2))) == [{"k": "aaaa"}, {"k": "cccc"}]
        with open(seg, "r+b") as f:
            f.seek(offset)
            f.write(frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us,
                                        body.replace(b'{"k":"bbbb"}', b'["k","bbbb"]')))
        with pytest.raises(Corrupted) as info:
            store.read_raw(SITE, CONV, Tail(2))
        assert info.value.offset == offset
        with open(seg, "r+b") as f:  # bit rot: one flipped bit in the body, the checksum left as it was
            f.seek(offset)
            f.write(frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us, body))
            f.seek(offset + frame.RECORD_HEADER_SIZE + 3)
            b = f.read(1)
            f.seek(offset + frame.RECORD_HEADER_SIZE + 3)
            f.write(bytes([b[0] ^ 0x01]))
        for read in (store.read_raw, store.read):
            with pytest.raises(Corrupted) as info:
                read(SITE, CONV, Tail(2))
            assert info.value.offset == offset


def test_a_raw_read_after_a_cut_and_a_new_append_at_the_same_offset_returns_the_new_batch(tmp_path: Path) -> None:
    with FileStore(str(tmp_path), **OPTS) as store:
        store.append(SITE, CONV, [{"n": 0}])
        store.append(SITE, CONV, [{"n": 1, "t": "old"}, {"n": 2, "t": "old"}])
        assert _payloads(store.read_raw(SITE, CONV, Tail(2)))[0]["t"] == "old"
        (seg,) = segment_files(str(tmp_path))
        offset, _h, _body, _salt = _record_at_end(seg, 2)
        with open(seg, "r+b") as f:  # damage, then a repair that cuts the log at it
            f.seek(offset + frame.RECORD_HEADER_SIZE + 5)
            f.write(b"#")
        subprocess.run([sys.executable, "-c", "import sys; from convmem.logstore import maintenance; "
                        "maintenance.check(sys.argv[1], truncate_at_corruption=True)", str(tmp_path)],
                       check=True, timeout=120)
        assert [i.seq for i in store.read_raw(SITE, CONV, Tail(5))] == [0]
        theirs = _append_elsewhere(tmp_path, 1, 1)  # the same seqs, at the same offset, other bytes
        assert _record_at_end(seg, 2)[0] == offset
        assert _payloads(store.read_raw(SITE, CONV, Tail(2))) == theirs
        assert _payloads(store.read(SITE, CONV, Tail(2))) == theirs


def test_a_read_sees_another_process_append_into_an_active_segment_that_held_no_record(tmp_path: Path) -> None:
    """A writer killed just after rolling leaves a new active segment with no record in it.

    A tail read here then ends in the sealed segment before it; the check
    that nobody appended into the active one's preallocated space must still
    be made.
    """
    env = {**os.environ, "CONVMEM_CRASH_AT": "segment-roll-created"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), CONV, "0", "40", "200"], env=env,
                          timeout=120, check=False)
    assert done.returncode != 0  # killed at the crash point, after some appends
    with FileStore(str(tmp_path), **OPTS) as store:
        before = store.read(SITE, CONV, Tail(4))
        n = before[-1].seq + 1
        segs = segment_files(str(tmp_path))
        assert os.path.basename(segs[-1]) == f"{n:020d}.seg" and data_size(segs[-1]) == SEGMENT_HEADER_SIZE
        theirs = _append_elsewhere(tmp_path, n, 1)
        assert _payloads(store.read(SITE, CONV, Tail(2))) == theirs
        assert _payloads(store.read_raw(SITE, CONV, Tail(3)))[1:] == theirs
        assert [i.seq for i in store.read(SITE, CONV, Tail(n + 2))] == list(range(n + 2))
