"""Workloads 2 and 3: recall the last 50 items, and replay a whole conversation.

Conversations of 1,000, 10,000 and 100,000 items of about 1 KiB each are
built once (batches of 250) in every backend, then:

* recall: ``Tail(50)`` calls per second at each length;
* replay: the 100,000-item conversation read start to end in pages of 1,000,
  as items per second.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import SITE, Ctx
from .util import Row, interleaved, payloads, rate, seconds

SETUP_BATCH = 250
RECALL_COUNT = 50
REPLAY_PAGE = 1000


def conv_name(length: int) -> str:
    return f"read-{length:07d}"


def steps(ctx: Ctx) -> int:
    return 1 + len(ctx.sizes.conv_lengths) + 1


def build(ctx: Ctx) -> None:
    """Create the read conversations in every backend (once per run)."""
    if getattr(ctx, "_reads_built", False):
        return
    longest = max(ctx.sizes.conv_lengths)
    batches = [payloads(SETUP_BATCH, ctx.sizes.item_bytes, start=s) for s in range(0, longest, SETUP_BATCH)]
    with ctx.setup_mode():
        for length in ctx.sizes.conv_lengths:
            for b in ctx.backends():
                for batch in batches[: length // SETUP_BATCH]:
                    b.append(SITE, conv_name(length), batch)
    ctx._reads_built = True  # type: ignore[attr-defined]


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("reads: building conversations")
    build(ctx)
    ctx.progress.step("reads: built", advance=1)
    rows = []
    for length in ctx.sizes.conv_lengths:
        ctx.progress.step(f"recall last {RECALL_COUNT} at {length:,} items")
        conv = conv_name(length)
        fns: dict[str, Callable[[], float]] = {}
        for b in ctx.backends():
            assert len(b.tail(SITE, conv, RECALL_COUNT)) == RECALL_COUNT
            fns[b.name] = (lambda b=b, conv=conv:
                           rate(lambda: b.tail(SITE, conv, RECALL_COUNT), ctx.sizes.recall_calls))
        rows.append(Row("recall", f"recall last {RECALL_COUNT} at {length:,} items", "calls/s",
                        samples=interleaved(ctx.sizes.rounds, fns), extra={"length": length}))
        ctx.progress.step(f"recall at {length:,}", advance=1)
    length = max(ctx.sizes.conv_lengths)
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
