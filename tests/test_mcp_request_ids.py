"""Request ids: 16 hex digits, never the same twice, in threads and in a forked child."""

from __future__ import annotations

import os
import re
import threading

from convmem.mcp_adapter.requestlog import _IDS_PER_CALL, new_request_id

HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_ids_from_many_threads_are_all_different() -> None:
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        out.extend(new_request_id() for _ in range(3 * _IDS_PER_CALL))

    threads = [threading.Thread(target=take, args=(out,)) for out in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in taken for i in out]
    assert all(HEX16.match(i) for i in ids)
    assert len(set(ids)) == len(ids) == 12 * _IDS_PER_CALL


def test_a_forked_child_does_not_hand_out_its_parents_ids() -> None:
    new_request_id()  # a batch is under way in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, " ".join(new_request_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split()
    os.waitpid(pid, 0)
    parent = [new_request_id() for _ in range(8)]
    assert len(child) == 8 and all(HEX16.match(i) for i in child)
    assert not set(child) & set(parent)
