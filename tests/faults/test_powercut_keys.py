"""Fault 9 for idempotency keys: a power cut never keeps a batch and forgets its key.

The workload appends keyed batches (one of them retried at once, and one
group commit of keyed batches including the same key twice); every state a
power cut after each recorded operation could leave is checked as in
``test_powercut.py`` and then every batch of the workload is retried under
its key: an acknowledged batch gets back exactly its acknowledged range, an
unacknowledged one is appended at most once, and no batch appears twice.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from convmem.logstore import FileStore
from convmem.logstore.codec import encode_batch
from convmem.logstore.groupcommit import Batch

from ._common import SITE, Ack, check_log, make_batch, read_all
from .test_powercut import (  # noqa: F401 - fixtures are used by name
    CONVS,
    OPTS,
    Recording,
    Writer,
    _nothing,
    _pool_filled_inline,
    _print_seed,
    check_state,
    explore,
    record,
    shm_path,
)

#: (conversation index, items, pad) of each batch b = 1, 2, ...; big pads roll segments.
PLAN = [(0, 1, 40), (0, 3, 120), (1, 1, 30), (0, 2, 300), (1, 2, 60), (0, 1, 500)]
#: Batches appended as one group commit after PLAN (conversation 1), the second one twice.
GROUP = [(1, 10), (2, 20)]


def _key(b: int) -> str:
    return f"p-{b}"


def _keyed(w: Writer) -> None:
    for conv_i, n, pad in PLAN:
        w.b += 1
        r = w.store.append(SITE, CONVS[conv_i], make_batch(w.w, w.b, n, pad), idempotency_key=_key(w.b))
        w._ack(Ack(CONVS[conv_i], r.first, r.last, w.w, w.b, n, pad))
        if w.b == 2:  # a retry at once: answered from the key, nothing written
            again = w.store.append(SITE, CONVS[conv_i], make_batch(w.w, w.b, n, pad), idempotency_key=_key(w.b))
            assert (again.first, again.last) == (r.first, r.last)
    started = time.monotonic()
    c = w.store._acquire(SITE, CONVS[1], started + 5, started)
    try:
        batches = []
        for n, pad in GROUP:
            w.b += 1
            batches.append((w.b, n, pad, Batch(*encode_batch(make_batch(w.w, w.b, n, pad)), key=_key(w.b))))
        b, n, pad, _ = batches[-1]
        twin = Batch(*encode_batch(make_batch(w.w, b, n, pad)), key=_key(b))
        c._queue.extend([x[3] for x in batches] + [twin])
        while c._queue:
            c._lead(started + 5, started)
    finally:
        c.mutex.release()
    assert twin.done and twin.error is None and twin.result[:2] == batches[-1][3].result[:2]
    for b, n, pad, batch in batches:
        assert batch.done and batch.error is None, batch.error
        w._ack(Ack(CONVS[1], batch.result[0], batch.result[1], w.w, b, n, pad))


def _check_keyed(root: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
    check_state(root, rec, acked, nth, held)
    by_b = {a.b: a for a in acked if a.w == "p"}
    plan = [(CONVS[c], n, pad) for c, n, pad in PLAN] + [(CONVS[1], n, pad) for n, pad in GROUP]
    store = FileStore(root, **OPTS)
    try:
        for b, (conv, n, pad) in enumerate(plan, 1):
            r = store.append(SITE, conv, make_batch("p", b, n, pad), idempotency_key=_key(b))
            if b in by_b:
                assert (r.first, r.last) == (by_b[b].first, by_b[b].last), f"batch {b}: its retry got {r}"
        for conv in CONVS:
            check_log(conv, read_all(store, SITE, conv))  # every batch once: no duplicate from a retry
    finally:
        store.close()
    held["keyed retries answered"] += 1


def test_power_cut_keyed_appends(shm_path: Path) -> None:  # noqa: F811
    rec = record(shm_path / "data", CONVS, _nothing, _keyed)
    assert len(rec.acks) == len(PLAN) + len(GROUP)
    explore(rec, "keyed appends", shm_path, checker=_check_keyed)
