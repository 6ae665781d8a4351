"""Workloads 2 and 3: recall the last 50 items, and replay a whole conversation.

Conversations of 1,000, 10,000 and 100,000 items of about 1 KiB each are
built once in every backend, in 10-item batches (an agent's turn: the
append workload's headline batch), then:

* recall: ``Tail(50)`` calls per second at each length; and, in a full run,
  at 100,000 items built from 250-item batches, convmem's worst case (a
  record is the unit of reading, so the tail's whole record is decoded);
* replay: the 100,000-item conversation read start to end in pages of 1,000,
  as items per second.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import SITE, Ctx
from .util import Row, interleaved, payloads, rate, seconds

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
            items = [dict(p, n=start + i) for i, p in enumerate(chunk[start % 1000 : start % 1000 + batch])]
            b.append(SITE, conv_name(length, batch), items)


def build(ctx: Ctx) -> None:
    """Create the read conversations in every backend (once per run)."""
    if getattr(ctx, "_reads_built", False):
        return
    with ctx.setup_mode():
        for length in ctx.sizes.conv_lengths:
            ctx.progress.step(f"reads: building a {length:,}-item conversation")
            _build_one(ctx, length, SETUP_BATCH)
        if not ctx.quick:
            _build_one(ctx, max(ctx.sizes.conv_lengths), WIDE_BATCH)
    ctx._reads_built = True  # type: ignore[attr-defined]


def _recall_fn(ctx: Ctx, b: object, conv: str) -> Callable[[], float]:
    assert len(b.tail(SITE, conv, RECALL_COUNT)) == RECALL_COUNT  # type: ignore[attr-defined]
    return lambda: rate(lambda: b.tail(SITE, conv, RECALL_COUNT), ctx.sizes.recall_calls)  # type: ignore[attr-defined]


def _recalls(ctx: Ctx, cases: list[tuple[int, int]]) -> list[Row]:
    """Recall rows for ``(length, batch)`` cases, every case and backend measured in every round.

    Interleaving the lengths (not only the backends) makes the growth ratio
    between 1,000 and 100,000 items a paired, per-round figure too.
    """
    fns: dict[str, Callable[[], float]] = {}
    for length, batch in cases:
        for b in ctx.backends():
            fns[f"{b.name}|{length}|{batch}"] = _recall_fn(ctx, b, conv_name(length, batch))
    samples = interleaved(ctx.sizes.rounds, fns)
    rows = []
    for length, batch in cases:
        wide = "" if batch == SETUP_BATCH else f" ({batch}-item batches)"
        per = {b.name: samples[f"{b.name}|{length}|{batch}"] for b in ctx.backends()}
        rows.append(Row("recall", f"recall last {RECALL_COUNT} at {length:,} items{wide}", "calls/s",
                        samples=per, extra={"length": length, "batch": batch}))
    return rows


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("reads: building conversations")
    build(ctx)
    ctx.progress.step("reads: built", advance=1)
    length = max(ctx.sizes.conv_lengths)
    cases = [(n, SETUP_BATCH) for n in ctx.sizes.conv_lengths] + ([] if ctx.quick else [(length, WIDE_BATCH)])
    ctx.progress.step(f"recall last {RECALL_COUNT} at {', '.join(f'{n:,}' for n, _ in cases)} items")
    rows = _recalls(ctx, cases)
    ctx.progress.step("recall", advance=1)
    ctx.progress.step(f"replay {length:,} items in pages of {REPLAY_PAGE}")
    conv = conv_name(length)
    fns = {b.name: (lambda b=b: length / seconds(lambda: _replay(b, conv, length))) for b in ctx.backends()}
    rows.append(Row("replay", f"replay {length:,} items, pages of {REPLAY_PAGE:,}", "items/s",
                    samples=interleaved(ctx.sizes.replay_rounds, fns), extra={"length": length}))
    ctx.progress.step("replay", advance=1)
    return rows


def _replay(b: object, conv: str, expected: int) -> None:
    start = 0
    while True:
        page = b.range(SITE, conv, start, REPLAY_PAGE)  # type: ignore[attr-defined]
        start += len(page)
        if len(page) < REPLAY_PAGE:
            break
    assert start == expected, (start, expected)
