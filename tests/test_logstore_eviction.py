"""The store's cache of open conversations never waits, under its own lock, for one that is busy.

``FileStore`` keeps at most ``max_open`` conversations open and closes the
least recently used when another is opened. Closing one waits for its running
group commit or extend-ahead job; done under the store's lock, that wait would
hold up every other conversation's lookup. A busy conversation is passed over
and closed when a later lookup opens a conversation, once it is idle.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from convmem.logstore import FileStore, Range, fileio, preallocation
from convmem.logstore.preallocation import wait_for_extensions

SITE = "site-evict"


def test_a_lookup_does_not_wait_for_another_conversations_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[Any] = []
    monkeypatch.setattr(preallocation, "run_extension", jobs.append)
    store = FileStore(tmp_path / "d", max_open=1)
    release = threading.Event()
    entered = threading.Event()

    def hold(op: str) -> None:
        if threading.current_thread().name == "held-extension":
            entered.set()
            release.wait(60)

    job: threading.Thread | None = None
    try:
        big = [{"pad": "x" * 8000} for _ in range(4)]
        while not jobs:  # appends until the segment's next chunk is extended ahead by a job
            store.append(SITE, "conversation-busy", big)
        monkeypatch.setattr(fileio, "fault_hook", hold)
        job = threading.Thread(target=jobs.pop(0), name="held-extension")
        job.start()
        assert entered.wait(30), "the extend-ahead job never wrote"

        other = threading.Thread(target=store.append, args=(SITE, "conversation-other", [{"n": 1}]))
        other.start()
        other.join(30)
        assert not other.is_alive(), "opening a second conversation waited for the first one's extension"
        assert store.open_conversations() == 2  # the busy one was passed over, not closed
    finally:
        release.set()
        if job is not None:
            job.join(60)
        monkeypatch.setattr(fileio, "fault_hook", None)
    wait_for_extensions()
    store.append(SITE, "conversation-other", [{"n": 2}])
    store.append(SITE, "conversation-third", [{"n": 3}])  # opening one more closes both others, idle now
    assert store.open_conversations() == 1
    assert [it.payload["n"] for it in store.read(SITE, "conversation-other", Range(0, 10))] == [1, 2]
    assert len(store.read(SITE, "conversation-busy", Range(0, 1000))) > 0
    store.close()
