"""Zero-filled space ahead of the records (logstore.zerofill): sized to the write rate, bounded, given back at close."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.logstore import FileStore, Range, layout, preallocation, zerofill
from convmem.logstore.preallocation import wait_for_extensions
from tests.logstore_helpers import data_size, segment_files

SITE = "site-zero"
FIRST = 4096


def _count(store: FileStore, conv: str) -> int:
    """Items the conversation holds, read in pages; each item's ``n`` checked against its place in its batch."""
    seen = 0
    while page := store.read(SITE, conv, Range(seen, 1000)):
        assert [it.payload["n"] for it in page] == [(seen + i) % 10 for i in range(len(page))]
        seen += len(page)
    return seen


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4 << 20), st.floats(0.0, 10.0)), min_size=1, max_size=40),
       st.integers(FIRST, 64 << 20))
def test_a_chunk_is_whole_blocks_bounded_and_grows_at_most_twofold(steps: list[tuple[int, float]], limit: int) -> None:
    """Whatever the writes and their timing: every chunk is whole blocks, at least one, at most CHUNK_MAX,
    at most twice the last; the site's chunks stay within its limit, but for one block each beyond it."""
    budget = zerofill.SiteBudget(limit)
    paces = [zerofill.Pace(f"c{i}", FIRST, 40, 0.0, budget) for i in range(3)]
    end, now = 40, 0.0
    for k, (wrote, later) in enumerate(steps):
        end += wrote
        now += later
        pace = paces[k % len(paces)]
        before = pace.chunk
        chunk = pace.measure(end, now, FIRST)
        assert chunk % zerofill.BLOCK == 0
        assert FIRST <= chunk <= max(zerofill.CHUNK_MAX, FIRST)
        assert chunk <= 2 * before
        assert budget.held() <= limit + FIRST * len(paces)
    for p in paces:
        p.release()
    assert budget.held() == 0


def test_the_chunk_follows_the_write_rate() -> None:
    """Busy: the chunk grows to about half a second of writes (at most CHUNK_MAX); slow: it falls back at once."""
    budget = zerofill.SiteBudget()
    pace = zerofill.Pace("c", FIRST, 40, 0.0, budget)
    end, now = 40, 0.0
    for _ in range(12):  # 4 MiB/s
        end += 256 * 1024
        now += 1 / 16
        pace.measure(end, now, FIRST)
    assert pace.chunk == zerofill.CHUNK_MAX
    end += 100
    now += 60.0  # then a minute of one small batch
    assert pace.measure(end, now, FIRST) == FIRST
    pace.release()


def test_a_busy_conversations_zeros_go_back_at_close(tmp_path: Path) -> None:
    """A conversation written fast grows chunks a job writes; closing the store cuts its segment to whole blocks
    after the data end, and every batch reads back and the next append goes on at the next seq."""
    root = tmp_path / "d"
    store = FileStore(root)
    items = [{"text": "x" * 1000, "n": i} for i in range(10)]
    for _ in range(200):
        store.append(SITE, "conversation-busy", items)
    wait_for_extensions()
    seg = segment_files(str(root))[-1]
    end = data_size(seg)
    assert os.path.getsize(seg) > zerofill.blocks(end) + zerofill.AHEAD_MIN_CHUNK // 2, "no zeros were kept ahead"
    store.close()
    assert os.path.getsize(seg) == zerofill.blocks(end)
    assert data_size(seg) == end
    store = FileStore(root)
    try:
        assert _count(store, "conversation-busy") == 2000
        assert store.append(SITE, "conversation-busy", items).first == 2000
    finally:
        store.close()


def test_zeros_written_into_by_another_writer_are_kept(tmp_path: Path) -> None:
    """The cut at close is skipped when another writer (as another process) appended after this one's last look."""
    root = tmp_path / "d"
    items = [{"text": "x" * 1000, "n": i} for i in range(10)]
    jobs: list[object] = []
    a = FileStore(root)
    b = FileStore(root)
    try:
        for _ in range(100):
            a.append(SITE, "conversation-shared", items)
        wait_for_extensions()
        b.append(SITE, "conversation-shared", items)  # into a's zeros: the data end moves on
        real = preallocation.run_extension
        preallocation.run_extension = jobs.append  # type: ignore[assignment]
        try:
            a.close()
        finally:
            preallocation.run_extension = real
        seg = segment_files(str(root))[-1]
        size = os.path.getsize(seg)
        assert len(jobs) == 1, "closing a conversation with zeros ahead hands over one cut"
        jobs[0]()  # type: ignore[operator]
        assert os.path.getsize(seg) == size, "the cut removed zeros past another writer's record"
        assert _count(b, "conversation-shared") == 1010
    finally:
        b.close()
    lock = os.path.join(layout.conversation_dir(str(root), SITE, "conversation-shared"), layout.LOCK_FILE)
    assert os.path.exists(lock)
