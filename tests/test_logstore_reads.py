"""The read paths: ``read``, ``read_raw`` and ``try_read_raw`` agree, and a bad batch body is Corrupted.

A batch whose checksum verifies but whose body is not a JSON array of the
header's count of objects (a writer's bug, or bytes forged with a valid
checksum) is reported as Corrupted with its offset by every read that
returns any of its items, however few.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import msgspec
import pytest
from logstore_helpers import segment_files

from convmem.logstore import Corrupted, FileStore, InvalidConversationId, Range, Tail, background, frame, lease, reader
from convmem.logstore.frame import SEGMENT_HEADER_SIZE
from convmem.logstore.segment import BadRecord, iter_records

SITE = "reads-site"
OPTS = {"segment_bytes": 4096, "index_interval": 512}


def _same(store: FileStore, conv: str, selector: Tail | Range) -> None:
    items = store.read(SITE, conv, selector)
    raw = store.read_raw(SITE, conv, selector)
    assert [(i.seq, i.recorded_at, i.payload) for i in items] == [
        (r.seq, r.recorded_at, msgspec.json.decode(r.payload)) for r in raw
    ]
    assert msgspec.json.encode(items) == msgspec.json.encode(raw)


@pytest.mark.parametrize("seed", [5, 6])
def test_read_raw_returns_what_read_returns(tmp_path: Path, seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    with FileStore(str(tmp_path), **OPTS) as store:
        n = 0
        for _ in range(40):
            k = rng.randint(1, 9)
            store.append(SITE, "conv-reads-1", [{"n": n + i, "t": 'é"\\\n' * rng.randint(0, 30)} for i in range(k)])
            n += k
        assert len(segment_files(str(tmp_path))) > 2
        for _ in range(60):
            if rng.random() < 0.5:
                _same(store, "conv-reads-1", Tail(rng.randint(0, n + 5)))
            else:
                _same(store, "conv-reads-1", Range(rng.randint(0, n + 5), rng.randint(0, 60)))
        assert store.read_raw(SITE, "conv-unknown-1", Tail(5)) == []


def test_try_read_raw_answers_only_without_waiting(tmp_path: Path) -> None:
    with FileStore(str(tmp_path), **OPTS) as store:
        for i in range(60):
            store.append(SITE, "conv-reads-2", [{"n": i, "t": "x" * 100}])
        fresh = FileStore(str(tmp_path), **OPTS)
        try:
            assert fresh.try_read_raw(SITE, "conv-reads-2", Tail(3), 1 << 20) is None  # not open yet: may need I/O
            assert [i.seq for i in fresh.read_raw(SITE, "conv-reads-2", Tail(3))] == [57, 58, 59]
            got = fresh.try_read_raw(SITE, "conv-reads-2", Tail(3), 1 << 20)
            assert got is not None and got == fresh.read_raw(SITE, "conv-reads-2", Tail(3))
            assert fresh.try_read_raw(SITE, "conv-reads-2", Tail(3), 10) is None  # more bytes than allowed
            assert fresh.try_read_raw(SITE, "conv-reads-2", Range(0, 3), 1 << 20) is None  # a sealed segment
            assert fresh.try_read_raw(SITE, "conv-reads-2", Range(500, 3), 1 << 20) == []
            conv = fresh._convs[(SITE, "conv-reads-2")]
            held, release = threading.Event(), threading.Event()

            def hold() -> None:
                with conv.mutex:
                    held.set()
                    release.wait(10)

            t = threading.Thread(target=hold)
            t.start()
            held.wait(10)
            try:
                assert fresh.try_read_raw(SITE, "conv-reads-2", Tail(3), 1 << 20) is None  # a writer holds it
            finally:
                release.set()
                t.join()
            # Another process's append makes the cached tail stale; once refreshed it is served again.
            store.append(SITE, "conv-reads-2", [{"n": 60}])
            # (That store's extend-ahead job, and its lease of the lock while the conversation is busy, hold
            # the file lock for a moment: try_read_raw then answers None, as it must. Once both are over the
            # fast path is open again.)
            assert background.wait(10)
            assert lease.reaper.wait_let_go(10)
            got = fresh.try_read_raw(SITE, "conv-reads-2", Tail(1), 1 << 20)
            assert got is not None and [i.seq for i in got] == [60]
        finally:
            fresh.close()


ORIGINAL = [{"k": "aaaa"}, {"k": "bbbb"}, {"k": "cccc"}]


def _forge(body: bytes) -> bytes:
    """``body`` padded inside its last string to the original batch's length."""
    size = len(msgspec.json.encode(ORIGINAL))
    assert len(body) <= size
    cut = body.rindex(b'"')
    return body[:cut] + b"z" * (size - len(body)) + body[cut:]


BAD_BODIES = {
    "not JSON": _forge(b'[{"k":"aaaa"},{"k" "bbbb"},{"k":"c"}]'),
    "too few items": _forge(b'[{"k":"aaaa"},{"k":"b"}]'),
    "not an object": _forge(b'[{"k":"aaaa"},"bbbbbbbbbb",{"k":"c"}]'),
    "not UTF-8": _forge(b'[{"k":"aaaa"},{"k":"bbbb"},{"k":"\xff"}]'),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_a_bad_body_with_a_valid_checksum_is_corrupted_for_every_read_of_it(tmp_path: Path, case: str) -> None:
    with FileStore(str(tmp_path)) as store:
        store.append(SITE, "conv-reads-3", [{"k": "before"}])
        store.append(SITE, "conv-reads-3", ORIGINAL)  # seqs 1-3
        store.append(SITE, "conv-reads-3", [{"k": "after"}])
    (seg,) = segment_files(str(tmp_path))
    fd = os.open(seg, os.O_RDWR)
    try:
        salt = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0)).salt  # type: ignore[union-attr]
        records = []
        try:
            for rec in iter_records(fd, SEGMENT_HEADER_SIZE, os.fstat(fd).st_size, salt):
                records.append((rec[0], rec[1]))
        except BadRecord:
            pass  # space past the last record
        offset, h = records[1]
        assert h.count == 3
        os.pwrite(
            fd, frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us, BAD_BODIES[case]), offset
        )
    finally:
        os.close(fd)
    with FileStore(str(tmp_path)) as store:
        assert [i.payload for i in store.read(SITE, "conv-reads-3", Range(0, 1))] == [{"k": "before"}]
        assert [i.payload for i in store.read(SITE, "conv-reads-3", Range(4, 1))] == [{"k": "after"}]
        for selector in (Range(2, 1), Range(1, 3), Tail(3), Tail(4)):
            for read in (store.read, store.read_raw):
                with pytest.raises(Corrupted) as info:
                    read(SITE, "conv-reads-3", selector)
                assert info.value.offset == offset, (case, selector)


def test_a_large_batch_read_in_part_is_kept_split_until_its_record_changes(tmp_path: Path) -> None:
    big = [{"n": i, "t": "é" * 2000} for i in range(40)]  # one ~160 KB batch: kept split once read in part
    with FileStore(str(tmp_path)) as store:
        store.append(SITE, "conv-reads-4", [{"n": -1}])
        store.append(SITE, "conv-reads-4", big)  # seqs 1-40
        for _ in range(3):  # the first read splits and keeps it; the others are served from the split
            assert [i.payload for i in store.read(SITE, "conv-reads-4", Tail(5))] == big[-5:]
            assert [i.payload for i in store.read(SITE, "conv-reads-4", Range(3, 4))] == big[2:6]
            _same(store, "conv-reads-4", Range(10, 7))
            _same(store, "conv-reads-4", Tail(41))
    (seg,) = segment_files(str(tmp_path))
    assert any(path == seg for path, _ in reader._SPLITS._entries)  # the later reads were served split
    fd = os.open(seg, os.O_RDWR)
    try:
        salt = frame.decode_segment_header(os.pread(fd, SEGMENT_HEADER_SIZE, 0)).salt  # type: ignore[union-attr]
        offset, h, body = next(
            (o, h, bytes(b)) for o, h, b in iter_records(fd, SEGMENT_HEADER_SIZE, 1 << 30, salt) if h.count == 40
        )
        forged = body.replace(b'{"n":39', b'["n",39', 1)  # same length, valid checksum, not an object
        os.pwrite(fd, frame.encode_record(salt, h.kind, h.first_seq, h.count, h.recorded_at_us, forged), offset)
    finally:
        os.close(fd)
    # The split of the old record is still cached in this process: the header on disk no longer
    # matches it, so the record is read again, and found bad, by every read that returns part of it.
    with FileStore(str(tmp_path)) as again:
        for selector in (Tail(5), Range(3, 4), Tail(41)):
            for name in ("read", "read_raw"):
                with pytest.raises(Corrupted) as info:
                    getattr(again, name)(SITE, "conv-reads-4", selector)
                assert info.value.offset == offset
        assert [i.payload for i in again.read(SITE, "conv-reads-4", Range(0, 1))] == [{"n": -1}]


@pytest.mark.parametrize("site, conv", [("bad site", "conv-reads-4"), (SITE, "bad conv"), (SITE, "x")])
def test_every_read_checks_the_names_whether_or_not_the_site_is_known(tmp_path: Path, site: str, conv: str) -> None:
    # Reads find a known site's directory and open conversations by name without checking the
    # names again (the tables hold checked names only): a malformed name must still be refused.
    # (A read of an absent site answers nothing before it looks at the conversation id.)
    with FileStore(str(tmp_path), **OPTS) as store:
        for known in (False, True):
            if known:
                store.append(SITE, "conv-reads-4", [{"n": 0}])
                assert store.read(SITE, "conv-reads-4", Tail(1))[0].payload == {"n": 0}
            elif site == SITE:
                assert store.read(site, conv, Tail(1)) == store.read_raw(site, conv, Tail(1)) == []
                continue
            for call in (
                lambda: store.read(site, conv, Tail(1)),
                lambda: store.read_raw(site, conv, Tail(1)),
                lambda: store.try_read_raw(site, conv, Tail(1), 1 << 20),
            ):
                with pytest.raises(InvalidConversationId):
                    call()
