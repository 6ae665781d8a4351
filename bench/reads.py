"""Workloads 2 and 3: recall the last 50 items, and replay a whole conversation.

Conversations of 1,000, 10,000 and 100,000 items of about 1 KiB each are
built once in every backend, in 10-item batches (an agent's turn: the
append workload's headline batch), then:

* recall: ``Tail(50)`` at each length; and at the longest length built from
  250-item batches, so the 50 items recalled lie inside one batch: convmem's
  worst case when a record is the unit of reading;
* replay: the longest conversation read in pages of 1,000 (every page once
  per round, the backends taking turns page by page).

Every call is timed on its own, the backends (and the lengths) taking turns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .context import SITE, Ctx
from .util import Row, interleaved_ops, payloads

SETUP_BATCH = 10
WIDE_BATCH = 250
RECALL_COUNT = 50
REPLAY_PAGE = 1000


def conv_name(length: int, batch: int = SETUP_BATCH) -> str:
    return f"read-{length:07d}" if batch == SETUP_BATCH else f"read-{length:07d}-b{batch}"


def steps(ctx: Ctx) -> int:
    return 3


def _build_one(ctx: Ctx, length: int, batch: int) -> None:
    chunk = payloads(1000, ctx.sizes.item_bytes)
    for b in ctx.backends():
        for start in range(0, length, batch):
            k = start % 1000
            items = [dict(p, n=start + i) for i, p in enumerate(chunk[k : k + min(batch, length - start)])]
            b.append(SITE, conv_name(length, batch), items)
            if start % 20_000 == 0:
                ctx.progress.note(f"{b.name}: {start:,} of {length:,} items")


def build(ctx: Ctx) -> None:
    """Create the read conversations in every backend (once per run)."""
    if getattr(ctx, "_reads_built", False):
        return
    with ctx.setup_mode():
        for length in ctx.sizes.conv_lengths:
            ctx.progress.step(f"reads: building a {length:,}-item conversation")
            _build_one(ctx, length, SETUP_BATCH)
        ctx.progress.step(f"reads: building a {max(ctx.sizes.conv_lengths):,}-item conversation of "
                          f"{WIDE_BATCH}-item batches")
        _build_one(ctx, max(ctx.sizes.conv_lengths), WIDE_BATCH)
    ctx._reads_built = True  # type: ignore[attr-defined]


def _recalls(ctx: Ctx, cases: list[tuple[int, int]]) -> list[Row]:
    """Recall rows for ``(length, batch)`` cases, every case and backend taking turns op by op.

    Interleaving the lengths (not only the backends) makes the growth ratio
    between the shortest and the longest conversation a paired figure too.
    """
    fns: dict[str, Callable[[], object]] = {}
    for length, batch in cases:
        conv = conv_name(length, batch)
        for b in ctx.backends():
            assert len(b.tail(SITE, conv, RECALL_COUNT)) == RECALL_COUNT, (b.name, conv)
            fns[f"{b.name}|{length}|{batch}"] = functools.partial(b.tail, SITE, conv, RECALL_COUNT)
    samples = interleaved_ops(ctx.sizes.ops, fns, progress=ctx.progress, label="recall")
    rows = []
    for length, batch in cases:
        wide = "" if batch == SETUP_BATCH else f", the tail inside one {batch}-item batch"
        per = {b.name: samples[f"{b.name}|{length}|{batch}"] for b in ctx.backends()}
        rows.append(Row("recall", f"recall last {RECALL_COUNT} at {length:,} items{wide}", "ms/call",
                        higher_better=False, per_op=True, samples=per, extra={"length": length, "batch": batch}))
    return rows


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("reads: building conversations")
    build(ctx)
    ctx.progress.step("reads: built", advance=1)
    length = max(ctx.sizes.conv_lengths)
    cases = [(n, SETUP_BATCH) for n in ctx.sizes.conv_lengths] + [(length, WIDE_BATCH)]
    ctx.progress.step(f"recall last {RECALL_COUNT} at {', '.join(f'{n:,}' for n, _ in cases)} items")
    rows = _recalls(ctx, cases)
    ctx.progress.step("recall", advance=1)
    label = f"replay {length:,} items in pages of {REPLAY_PAGE}"
    ctx.progress.step(label)
    conv = conv_name(length)
    for b in ctx.backends():
        _replay(b, conv, length)
    pages = -(-length // REPLAY_PAGE)
    page = {"i": 0}
    def replay_page(b: Any) -> object:
        return b.range(SITE, conv, page["i"], REPLAY_PAGE)

    fns: dict[str, Callable[[], object]] = {b.name: functools.partial(replay_page, b) for b in ctx.backends()}
    samples = interleaved_ops(max(ctx.sizes.replay_rounds * pages, ctx.sizes.ops), fns,
                              before=lambda i: page.__setitem__("i", (i % pages) * REPLAY_PAGE),
                              progress=ctx.progress, label=label)
    rows.append(Row("replay", f"replay of a {length:,}-item conversation, one page of {REPLAY_PAGE:,}",
                    "ms/page", higher_better=False, per_op=True, samples=samples,
                    extra={"length": length, "page": REPLAY_PAGE}))
    ctx.progress.step("replay", advance=1)
    return rows


def _replay(b: object, conv: str, expected: int) -> None:
    """Read the whole conversation once, checking every backend returns every item."""
    start = 0
    while True:
        page = b.range(SITE, conv, start, REPLAY_PAGE)  # type: ignore[attr-defined]
        start += len(page)
        if len(page) < REPLAY_PAGE:
            break
    assert start == expected, (start, expected)
