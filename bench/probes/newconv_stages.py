"""Where a first append's time goes, stage by stage: ``python -m bench.probes.newconv_stages [-n N]``.

One store, one site: N first appends of 10 items of about 1 KiB (each to a new
conversation, claiming a pool entry), each followed by an ordinary append of
the same batch to one existing conversation, the background jobs waited for
after each call and not timed (as ``python -m bench`` does). The engine's
functions of the path below (:data:`STAGES`) are wrapped in this process so
that each call adds its wall time to its stage; the p50 over the calls of
each kind of append is printed per stage, beside the whole append's. The
stages nest (``_conversation`` holds the symbolic-link check and the object's
``__init__``, ``claim`` the renames), so they do not add up. The time is taken
on the appending thread, in situ: a stage costs more here than in a loop of
its own (caches and branch history are cold after each append's sync), which
is what a first append pays. A stage the engine no longer has is reported as
missing, not timed.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.util import payloads
from convmem.logstore import FileStore, background, convcreate, convpool, convstate, fileio, filestore, links, writer
from convmem.logstore.preallocation import wait_for_extensions

#: (owner, attribute, label): the functions timed, outermost first.
STAGES: list[tuple[Any, str, str]] = [
    (filestore.FileStore, "append", "FileStore.append (the whole call)"),
    (filestore.FileStore, "_conversation", "  the conversation's object (_conversation)"),
    (links, "refuse_symlinks", "    its symbolic-link check"),
    (convstate.ConversationState, "__init__", "    its __init__"),
    (writer.Writer, "_take_exclusive", "  locks and tail (_take_exclusive)"),
    (convpool.SitePool, "claim", "    the pool claim"),
    (fileio, "rename_noreplace", "      renameat2 calls (spares and the entry)"),
    (writer.Writer, "_commit_group", "  intent, write, sync, commit (_commit_group)"),
    (convcreate.ConversationCreation, "_create_first_segment", "    the first segment"),
    (fileio, "pwrite_synced", "      pwritev2(RWF_DSYNC): the durable write"),
    (convpool.SitePool, "refill_if_due", "  the refill's hand-over"),
    (background, "run", "    background.run"),
]


def _wrap(owner: Any, name: str, spent: list[int]) -> bool:
    """Make ``owner.name`` add its calls' wall time (ns) to ``spent[0]``; False when there is no such function."""
    f = getattr(owner, name, None)
    if f is None:
        return False
    clock = time.perf_counter_ns

    @functools.wraps(f)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return f(*args, **kwargs)
        finally:
            spent[0] += clock() - t0

    setattr(owner, name, timed)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.probes.newconv_stages", description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=400, help="first appends (and as many ordinary ones; default 400)")
    p.add_argument("--dir", help="directory to work in (default: a temporary one on the working disk)")
    args = p.parse_args(argv)
    spent = {label: [0] for _, _, label in STAGES}
    found = {label: _wrap(owner, name, spent[label]) for owner, name, label in STAGES}
    samples: dict[str, dict[str, list[int]]] = {"first": {k: [] for k in spent}, "next": {k: [] for k in spent}}
    items = payloads(10, 1024)
    base = tempfile.mkdtemp(prefix="newconv-stages-", dir=args.dir or os.getcwd())
    try:
        store = FileStore(base)
        store.append("site-one", "existing-conversation", items)
        wait_for_extensions()
        calls: dict[str, Callable[[int], Any]] = {
            "first": lambda i: store.append("site-one", f"conversation-{i:07d}", items),
            "next": lambda i: store.append("site-one", "existing-conversation", items),
        }
        for i in range(args.n):
            for kind, call in calls.items():
                for s in spent.values():
                    s[0] = 0
                call(i)
                for label, s in spent.items():
                    samples[kind][label].append(s[0])
                wait_for_extensions()
        store.close()
        background.wait(10)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'stage (p50 over the calls, µs)':<58} {'first':>8} {'ordinary':>9}")
    for _, _, label in STAGES:
        if not found[label]:
            print(f"{label:<58} {'missing':>8}")
            continue
        first, nxt = (statistics.median(samples[k][label]) / 1e3 for k in ("first", "next"))
        print(f"{label:<58} {first:8.1f} {nxt:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
