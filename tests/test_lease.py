"""Locks kept between appends (logstore/lease.py) against other processes: real processes, real files.

A process that appended keeps the conversation's lock, the site manifest's
lock and the site lock as leases while busy; every test here has another
process (or a tool) need one of them while it is held, and checks that it
gets it and that the holder's cache never outlives what that process did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, ListSelector, Range, fileio, lease
from convmem.logstore.maintenance import forget_conversation

SITE = "site-lease"
CONV = "conv-leased"

#: A child process holding a store open, driven by JSON lines on stdin; answers one JSON line each.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from convmem.logstore import FileStore, ListSelector, Range
    store = FileStore(sys.argv[1], lock_timeout=30)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd[0]
        if op == "append":
            out = []
            for i in range(cmd[2]):
                r = store.append("site-lease", cmd[1], [{"by": sys.argv[2], "i": i}])
                out.append([r.first, r.last])
        elif op == "busy":  # append without a pause for cmd[2] seconds; report every range
            out, until = [], time.monotonic() + cmd[2]
            while time.monotonic() < until:
                r = store.append("site-lease", cmd[1], [{"by": sys.argv[2]}])
                out.append([r.first, r.last])
        elif op == "busy-forever":  # append without a pause, printing each range as it is acknowledged
            print(json.dumps("started"), flush=True)
            while True:
                r = store.append("site-lease", cmd[1], [{"by": sys.argv[2]}])
                print(json.dumps([r.first, r.last]), flush=True)
        elif op == "read":
            out = []
            while True:
                page = store.read("site-lease", cmd[1], Range(len(out), 1000))
                if not page:
                    break
                out += [[i.seq, i.payload] for i in page]
        elif op == "list":
            page = store.list_conversations("site-lease", ListSelector(None, 100))
            out = [s.conversation_id for s in page.summaries]
        else:
            break
        print(json.dumps(out), flush=True)
    store.close()
    """
)


class Child:
    def __init__(self, tmp: Path, root: Path, name: str) -> None:
        script = tmp / "lease_child.py"
        script.write_text(CHILD)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(root), name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(self, *cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(list(cmd)) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"child exited ({self.proc.poll()})"
        return json.loads(line)

    def ask(self, *cmd: Any) -> Any:
        self.send(*cmd)
        return self.answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            assert self.proc.wait(timeout=60) == 0


def _start(tmp_path: Path, *names: str) -> tuple[Path, list[Child]]:
    """A data directory, and a child process holding a store of it open for each name."""
    root = tmp_path / "d"
    FileStore(root).close()
    return root, [Child(tmp_path, root, name) for name in names]


def _read_all(store: FileStore) -> list[int]:
    seqs: list[int] = []
    while page := store.read(SITE, CONV, Range(len(seqs), 1000)):
        seqs += [i.seq for i in page]
    return seqs


def _seqs(ranges: list[list[int]]) -> list[int]:
    return [s for first, last in ranges for s in range(first, last + 1)]


def test_an_append_keeps_the_lock_while_busy_and_the_reaper_lets_it_go(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "d")
    try:
        store.append(SITE, CONV, [{"n": 0}])
        conv = store._convs[(SITE, CONV)]
        if not lease.SUPPORTED:
            assert not conv._leased
            return
        assert not conv._leased, "a lone append kept its lock"
        n = 1
        while not conv._leased and n < 50:  # back to back: busy, so the lock is kept after an append
            assert store.append(SITE, CONV, [{"n": n}]).first == n
            n += 1
        assert conv._leased, "appends back to back let the lock go each time"
        deadline = time.monotonic() + 30
        while conv._watched and time.monotonic() < deadline:
            time.sleep(0.005)  # (the reaper clears it after letting the lease go)
        assert not conv._leased, "an idle lease was never let go"
        # Let go means free for anyone: a descriptor of our own takes it without waiting.
        fd = os.open(os.path.join(conv.path, "lock"), os.O_RDWR)
        try:
            assert fileio.try_lock(fd, True)
        finally:
            os.close(fd)
    finally:
        store.close()


def test_two_processes_writing_one_conversation_in_turn_see_each_others_appends(tmp_path: Path) -> None:
    root, (a, b) = _start(tmp_path, "a", "b")
    try:
        acked: list[list[int]] = []
        for turn in range(12):
            who = a if turn % 2 == 0 else b
            got = who.ask("append", CONV, 1 + turn % 3)
            assert got[0][0] == len(_seqs(acked)), "an append did not start where the other process's ended"
            acked += got
            # Each process reads every batch so far, its own and the other's.
            assert [s for s, _ in who.ask("read", CONV)] == _seqs(acked)
        assert _seqs(acked) == list(range(len(_seqs(acked))))
        # Both at once, without a pause: every batch gets its own seqs, none is lost.
        a.send("busy", CONV, 1.5)
        b.send("busy", CONV, 1.5)
        got_a, got_b = a.answer(), b.answer()
        assert got_a and got_b, "one process never got the conversation while the other kept appending"
        allseqs = sorted(_seqs(acked) + _seqs(got_a) + _seqs(got_b))
        assert allseqs == list(range(len(allseqs)))
        assert [s for s, _ in a.ask("read", CONV)] == allseqs
    finally:
        a.close()
        b.close()
    with FileStore(root) as again:
        assert _read_all(again) == allseqs


def test_a_listing_in_another_process_gets_a_busy_conversation(tmp_path: Path) -> None:
    root, (writer,) = _start(tmp_path, "w")
    try:
        first = writer.ask("append", CONV, 1)
        writer.send("busy", CONV, 2.0)
        with FileStore(root, lock_timeout=30) as lister:
            # The writer owes its commits (it never closed): each listing probes the conversation,
            # which needs its lock, held by the busy writer as a lease.
            for _ in range(5):
                listed = lister.list_conversations(SITE, ListSelector(None, 10)).summaries
                assert [s.conversation_id for s in listed] == [CONV]
        got = first + writer.answer()
        assert _seqs(got) == list(range(len(_seqs(got))))
    finally:
        writer.close()


def test_forget_while_another_process_holds_the_lease(tmp_path: Path) -> None:
    root, (writer,) = _start(tmp_path, "w")
    try:
        assert len(writer.ask("append", CONV, 5)) == 5  # the lease is held now (for a while)
        gone = forget_conversation(root, SITE, CONV, lock_timeout=30)
        assert gone.segments >= 1
        # The writer's cache of the tail must not outlive the forget: it starts again at seq 0.
        assert writer.ask("append", CONV, 1) == [[0, 0]]
        assert writer.ask("read", CONV) == [[0, {"by": "w", "i": 0}]]
        with FileStore(root) as other:
            assert [i.seq for i in other.read(SITE, CONV, Range(0, 10))] == [0]
    finally:
        writer.close()


def test_a_killed_lease_holder_leaves_nothing_locked(tmp_path: Path) -> None:
    root, (child,) = _start(tmp_path, "k")
    child.send("busy-forever", CONV)
    assert child.answer() == "started"
    acked: list[list[int]] = []
    while len(acked) < 50:
        acked.append(child.answer())
    child.proc.send_signal(signal.SIGKILL)  # mid-append, its leases held
    child.proc.wait(timeout=30)
    assert child.proc.stdout is not None
    for line in child.proc.stdout:
        acked.append(json.loads(line))  # acknowledged before the kill, read after it
    # lock_timeout 2: a lock surviving its holder would time out here instead of being taken.
    with FileStore(root, lock_timeout=2) as store:
        rng = store.append(SITE, CONV, [{"after": "kill"}])
        seqs = _read_all(store)
        assert seqs == list(range(rng.last + 1))
        assert set(_seqs(acked)) <= set(seqs[:-1]), "an acknowledged batch was lost"
        assert [s.conversation_id for s in store.list_conversations(SITE, ListSelector(None, 10)).summaries] == [CONV]


def test_removing_the_site_while_another_process_holds_its_leases(tmp_path: Path) -> None:
    root, (writer,) = _start(tmp_path, "w")
    try:
        assert len(writer.ask("append", CONV, 3)) == 3  # site, manifest and conversation leases held
        with FileStore(root, lock_timeout=5) as remover:
            remover.drop_site(SITE)  # waits for the writer's shared site lock: a Timeout if a lease kept it
            assert remover.list_conversations(SITE, ListSelector(None, 10)).summaries == []
        # The writer's next call notices the new incarnation: nothing of the old one is used.
        assert writer.ask("append", CONV, 1) == [[0, 0]]
        assert writer.ask("list") == [CONV]
        with FileStore(root) as other:
            assert _read_all(other) == [0]
    finally:
        writer.close()


def _lock_is_free(path: Path) -> bool:
    """Whether another open file description could take ``path``'s lock shared now (a reader's lock)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if fileio.try_lock(fd, False):
            fileio.unlock(fd)
            return True
        return False
    finally:
        os.close(fd)


def test_a_lone_append_keeps_no_lease_and_back_to_back_appends_do(tmp_path: Path) -> None:
    """A reader in another process right after a lone append (an agent's turn) never waits for a lease."""
    store = FileStore(str(tmp_path / "data"))
    try:
        store.append(SITE, CONV, [{"n": 0}])
        assert lease.reaper.wait_let_go(5)
        lock = next((tmp_path / "data").rglob("lock"))
        for n in range(1, 6):
            time.sleep(lease.IDLE * 2)  # idle between appends: each one is a lone append
            store.append(SITE, CONV, [{"n": n}])
            assert _lock_is_free(lock), f"lone append {n} kept its lock"
        leased = False
        for n in range(6, 56):  # back to back: busy, so the lock is kept between appends
            store.append(SITE, CONV, [{"n": n}])
            if not _lock_is_free(lock):
                leased = True
                break
        assert leased, "50 appends back to back never kept a lease"
        assert [i.payload["n"] for i in store.read(SITE, CONV, Range(0, 100))] == list(range(n + 1))
    finally:
        store.close()
