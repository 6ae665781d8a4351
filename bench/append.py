"""Workload ``append``: durable appends of 1, 10 and 100 items of about 1 KiB each, op by op.

Each backend appends to a conversation of its own, created before the
clock starts (a run longer than one conversation can hold moves on to a second
one, also created beforehand, so every timed append is an ordinary one); the
pre-zeroed floor reserves (zero-fills and syncs) the space the run will use
beforehand. The backends take turns batch by batch, and
every batch's wall time is kept: p50, p99, p99.9 and throughput per backend.
Besides the peers the table has three labelled rows: ``sqlite-text-schema``
(the text-keyed schema this bench used before), ``sqlite-normal``
(``synchronous=NORMAL``: a commit is not on stable storage when it returns;
a reference, never a target) and ``floor-extending`` (a file that grows on
every sync, so each ``fdatasync`` also commits the file system's journal).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from convmem.logstore import MAX_CONVERSATION_ITEMS

from .context import SITE, Ctx
from .floor_peer import Floor
from .util import Row, interleaved_ops, payloads


def steps(ctx: Ctx) -> int:
    return len(ctx.sizes.append_batches)


def _append(b: Any, convs: list[str], per_conv: int, items: list[dict[str, Any]]) -> Callable[[], None]:
    """One timed append: the first ``per_conv`` go to ``convs[0]``, the next ones to ``convs[1]``, ..."""
    count = itertools.count()
    return lambda: b.append(SITE, convs[next(count) // per_conv], items)


def run(ctx: Ctx) -> list[Row]:
    rows = []
    n = ctx.sizes.ops
    for batch in ctx.sizes.append_batches:
        items = payloads(batch, ctx.sizes.item_bytes)
        label = f"append {batch}-item batches"
        ctx.progress.step(label)
        # Timed appends one conversation takes after its untimed first batch, within the item limit.
        per_conv = MAX_CONVERSATION_ITEMS // batch - 1
        convs = [f"append-{batch:04d}-{k}" for k in range(-(-n // per_conv))]
        fns: dict[str, Callable[[], None]] = {}
        for b in ctx.append_backends():
            for conv in convs:
                b.append(SITE, conv, items)  # creation is not what is timed
                if isinstance(b, Floor):
                    b.reserve(SITE, conv, (min(n, per_conv) + 1) * batch * (ctx.sizes.item_bytes + 64))
            fns[b.name] = _append(b, convs, per_conv, items)
        samples = interleaved_ops(n, fns, progress=ctx.progress, label=label)
        rows.append(Row("append", f"{label}, one conversation", "ms/batch", higher_better=False, per_op=True,
                        samples=samples, extra={"batch": batch}))
        ctx.progress.step(label, advance=1)
    return rows
