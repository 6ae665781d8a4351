"""Workloads ``newconv`` and ``session``: what every agent session does first.

* ``newconv``: the first append (10 items) to a conversation that does not
  exist yet, against an ordinary append of the same batch to an existing one,
  the two interleaved op by op in every backend.
* ``session``: a new conversation, then 20 appends of 1 to 3 items with a
  recall of the last 50 after every fifth append (25 operations); every
  backend runs the same sessions, operation by operation in turn.

The floors are left out: a file per new conversation says nothing about
what an engine must make durable to create one.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

from .context import SITE, Ctx
from .util import Row, interleaved_ops, payloads

BATCH = 10
SESSION_APPENDS = 20
RECALL_EVERY = 5
RECALL_COUNT = 50


def steps(ctx: Ctx) -> int:
    return 2


def _peers(ctx: Ctx) -> list[Any]:
    return [b for b in ctx.backends() if b is not ctx.floor]


def _newconv(ctx: Ctx) -> list[Row]:
    items = payloads(BATCH, ctx.sizes.item_bytes)
    label = f"first append of {BATCH} items to a new conversation"
    ctx.progress.step(label)
    n = ctx.sizes.ops
    fns: dict[str, Callable[[], None]] = {}
    counter = {"i": 0}

    def first(b: Any) -> Callable[[], None]:
        return lambda: b.append(SITE, f"new-{counter['i']:07d}", items)

    for b in _peers(ctx):
        b.append(SITE, "newconv-existing", items)
        fns[f"{b.name}|first"] = first(b)
        fns[f"{b.name}|next"] = functools.partial(b.append, SITE, "newconv-existing", items)

    samples = interleaved_ops(n, fns, before=lambda i: counter.__setitem__("i", i), progress=ctx.progress,
                              label=label)
    rows = []
    for what, name in (("first", label), ("next", f"append of {BATCH} items to an existing conversation (paired)")):
        rows.append(Row("newconv", name, "ms/batch", higher_better=False, per_op=True,
                        samples={b.name: samples[f"{b.name}|{what}"] for b in _peers(ctx)}, extra={"what": what}))
    ctx.progress.step(label, advance=1)
    return rows


def _session(ctx: Ctx) -> list[Row]:
    label = (f"session mix: new conversation, {SESSION_APPENDS} appends of 1-3 items, "
             f"recall {RECALL_COUNT} every {RECALL_EVERY}")
    ctx.progress.step(label)
    rnd = random.Random(5)
    plan: list[tuple[str, int]] = []  # (op, items)
    for _s in range(ctx.sizes.sessions):
        for k in range(SESSION_APPENDS):
            plan.append(("append", rnd.randint(1, 3)))
            if (k + 1) % RECALL_EVERY == 0:
                plan.append(("recall", 0))
        plan.append(("end", 0))
    ops = [p for p in plan if p[0] != "end"]
    chunk = payloads(3, ctx.sizes.item_bytes)
    state = {"session": 0, "op": 0}
    bounds = []
    s = 0
    for p in plan:
        if p[0] == "end":
            s += 1
        else:
            bounds.append(s)

    def before(i: int) -> None:
        state["session"], state["op"] = bounds[i], i

    def step(b: Any) -> Callable[[], None]:
        def call() -> None:
            what, count = ops[state["op"]]
            conv = f"session-{state['session']:05d}"
            if what == "append":
                b.append(SITE, conv, chunk[:count])
            else:
                b.tail(SITE, conv, RECALL_COUNT)
        return call

    samples = interleaved_ops(len(ops), {b.name: step(b) for b in _peers(ctx)}, before=before,
                              progress=ctx.progress, label=label)
    ctx.progress.step(label, advance=1)
    return [Row("session", label, "ms/op", higher_better=False, per_op=True, samples=samples,
                extra={"sessions": ctx.sizes.sessions, "ops_per_session": len(ops) // max(ctx.sizes.sessions, 1)})]


def run(ctx: Ctx) -> list[Row]:
    return [*_newconv(ctx), *_session(ctx)]
