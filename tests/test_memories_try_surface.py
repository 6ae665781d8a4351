"""``try_surface``: the lookup memory_context runs on the event loop answers as ``surface`` does, or declines.

It answers only from a kept answer, and never from a stale view: when another
process (here, a second store on the same data directory) wrote, when the
index is not built yet, when the hint would have to be ranked, or when an
access-time flush is due, it returns None and the caller takes the ordinary
path (a worker thread).
"""

from __future__ import annotations

import os
from pathlib import Path

from memories_support import SITE, create, delete, fields

from convmem.logstore import fileio
from convmem.logstore.memories import LongTermMemory, Memory, access
from convmem.logstore.memories.site import LOCK_NAME, memories_dir


def _ids(ms: list[Memory] | None) -> list[str] | None:
    return None if ms is None else [m.memory_id for m in ms]


def test_declines_before_the_index_is_built(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as writer:
        create(writer, fields(1, summary="deploys go out from the release branch"))
    with LongTermMemory(tmp_path) as store:
        assert store.try_surface(SITE, "how do deploys go out") is None  # nothing opened in this process yet
        first = store.surface(SITE, "how do deploys go out")  # builds the index
        assert _ids(store.try_surface(SITE, "how do deploys go out")) == _ids(first)


def test_answers_like_surface_and_touches(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        made = [create(store, fields(i, summary=f"deploys go out from the release branch {i}")) for i in range(4)]
        create(store, fields(9, subject="Units", summary="the user wants metric units"))
        expected = store.surface(SITE, "which units does the user want")
        got = store.try_surface(SITE, "which units does the user want")
        assert got is not None and _ids(got) == _ids(expected) and len(got) >= 1
        assert got[0].last_accessed_us >= expected[0].last_accessed_us
        assert store.get(SITE, got[0].memory_id).last_accessed_us >= got[0].last_accessed_us
        # A hint never seen needs the encoder (milliseconds): declined here, for a worker thread; once it has been
        # encoded there, the same hint is answered at once.
        assert store.try_surface(SITE, "how do deploys go out") is None
        store.surface(SITE, "how do deploys go out")
        deploys = store.try_surface(SITE, "how do deploys go out")
        assert deploys is not None and 1 <= len(deploys) <= 2
        assert {m.memory_id for m in deploys} <= {m.memory_id for m in made}


def test_declines_after_another_process_wrote_then_sees_the_write(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store, LongTermMemory(tmp_path) as other:
        create(store, fields(1, summary="deploys go out from the release branch"))
        assert store.surface(SITE, "release branch deploys") != []
        m = create(other, fields(2, subject="Pager", summary="the pager rotation changes on mondays"))
        assert store.try_surface(SITE, "pager rotation mondays") is None  # its view is stale
        assert _ids(store.surface(SITE, "pager rotation mondays"))[:1] == [m.memory_id]  # type: ignore[index]
        assert _ids(store.try_surface(SITE, "pager rotation mondays"))[:1] == [m.memory_id]  # type: ignore[index]
        delete(other, m.memory_id)
        assert store.try_surface(SITE, "pager rotation mondays") is None
        assert m.memory_id not in (_ids(store.surface(SITE, "pager rotation mondays")) or [])


def test_answers_beside_a_writer_holding_the_lock_and_declines_once_it_wrote(tmp_path: Path) -> None:
    """The lookup never waits: a writer of another process that holds the lock has not written yet, so the log is
    as this process read it and the kept answer stands; once the write lands, the view is stale."""
    with LongTermMemory(tmp_path) as store, LongTermMemory(tmp_path) as other:
        create(store, fields(1, summary="deploys go out from the release branch"))
        expected = _ids(store.surface(SITE, "release branch deploys"))
        assert expected
        fd = fileio.open_create(str(Path(memories_dir(str(tmp_path), SITE)) / LOCK_NAME))
        try:
            assert fileio.try_lock(fd, True)
            assert _ids(store.try_surface(SITE, "release branch deploys")) == expected
        finally:
            fileio.unlock(fd)
            os.close(fd)
        create(other, fields(2, summary="deploys go out on tuesdays from the release branch"))
        assert store.try_surface(SITE, "release branch deploys") is None
        assert store.surface(SITE, "release branch deploys") != []
        assert store.try_surface(SITE, "release branch deploys") is not None


def test_declines_a_hint_it_would_have_to_rank(tmp_path: Path) -> None:
    """Only a kept answer is given on the event loop: a hint whose vector is kept but whose answer is not (a write
    dropped the answers) would rank, milliseconds of CPU, and goes to a worker thread."""
    with LongTermMemory(tmp_path) as store:
        create(store, fields(1, summary="deploys go out from the release branch"))
        assert store.surface(SITE, "release branch deploys") != []
        assert store.try_surface(SITE, "release branch deploys") is not None
        create(store, fields(2, subject="Units", summary="the user wants metric units"))  # drops the kept answers
        assert store.try_surface(SITE, "release branch deploys") is None
        assert store.surface(SITE, "release branch deploys") != []
        assert store.try_surface(SITE, "release branch deploys") is not None


def test_declines_when_access_times_are_due_to_be_written(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        create(store, fields(1, summary="deploys go out from the release branch"))
        assert store.surface(SITE, "release branch deploys") != []
        s = store.site(SITE)
        s._flushed_at -= access.FLUSH_INTERVAL_S + 1  # as if the last write of access.json was long ago
        assert store.try_surface(SITE, "release branch deploys") is None
        assert store.surface(SITE, "release branch deploys") != []  # the ordinary path writes the file
        assert (Path(memories_dir(str(tmp_path), SITE)) / access.ACCESS_FILE).exists()
        assert store.try_surface(SITE, "release branch deploys") is not None
