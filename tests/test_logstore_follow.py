"""Following a conversation on the file engine: wait_for_items wakes for appends, without polling.

Woken by an append of another process (inotify on the conversation's
directory), by this process's writer (the wake-up after each group), and for
a conversation that did not exist when the wait began. Reads are counted: a
wait re-reads only when something changed, so an idle wait reads once.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from convmem.logstore import FileStore, RawMemoryItem, ReadSelector

SITE = "follow"
CONV = "conv-follow-01"

_APPEND_LATER = """
import sys, time
from convmem.logstore import FileStore
time.sleep(float(sys.argv[2]))
with FileStore(sys.argv[1]) as store:
    store.append("follow", sys.argv[3], [{"from": "another process"}])
"""


class CountingStore(FileStore):
    """A FileStore that counts its raw reads (the probes of a wait)."""

    reads = 0

    def read_raw(self, site: str, conversation_id: str, selector: ReadSelector) -> list[RawMemoryItem]:
        self.reads += 1
        return super().read_raw(site, conversation_id, selector)


def _append_from_another_process(root: Path, conv: str, delay: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _APPEND_LATER, str(root), str(delay), conv])


def test_an_append_by_another_process_wakes_the_wait(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    try:
        store.append(SITE, CONV, [{"n": 0}])
        proc = _append_from_another_process(tmp_path, CONV, 0.5)
        try:
            assert store.wait_for_items(SITE, CONV, 1, 60.0)
        finally:
            assert proc.wait(60) == 0
        # Re-read only on events (the write, the index, a new segment), never in a loop.
        assert store.reads < 20, store.reads
    finally:
        store.close()


def test_a_conversation_created_during_the_wait(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    try:
        store.append(SITE, "conv-other-01", [{"n": 0}])  # the site exists, the conversation not yet
        proc = _append_from_another_process(tmp_path, "conv-follow-new", 0.5)
        try:
            assert store.wait_for_items(SITE, "conv-follow-new", 0, 60.0)
        finally:
            assert proc.wait(60) == 0
    finally:
        store.close()


def test_this_process_s_writer_wakes_the_wait(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    try:
        store.append(SITE, CONV, [{"n": 0}])

        def later() -> None:
            time.sleep(0.3)
            store.append(SITE, CONV, [{"n": 1}])

        t = threading.Thread(target=later)
        t.start()
        assert store.wait_for_items(SITE, CONV, 1, 60.0)
        t.join()
    finally:
        store.close()


def test_an_idle_wait_reads_once_and_times_out(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    try:
        store.append(SITE, CONV, [{"n": 0}])
        store.reads = 0
        assert not store.wait_for_items(SITE, CONV, 1, 2.0)
        # The first probe, and at most a couple after events of the engine's own (derived files it
        # writes, background jobs of the append); a polling wait would read every few milliseconds.
        assert store.reads <= 3, store.reads
        assert store.wait_for_items(SITE, CONV, 0, 0.5)  # already there: no wait
    finally:
        store.close()
