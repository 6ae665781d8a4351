"""Workload 1: durable appends of 1, 10 and 100 items of about 1 KiB each.

One conversation, and 64 conversations in round robin. The figure is
acknowledged batches per second.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import SITE, Ctx
from .util import Row, interleaved, payloads, rate

MODES = {"one": 1, "rr64": 64}


def steps(ctx: Ctx) -> int:
    return len(ctx.sizes.append_batches) * len(MODES)


def run(ctx: Ctx) -> list[Row]:
    rows = []
    for batch, number in ctx.sizes.append_batches.items():
        items = payloads(batch, ctx.sizes.item_bytes)
        for mode, nconv in MODES.items():
            ctx.progress.step(f"append batch={batch} {mode}")
            convs = [f"app-{batch}-{mode}-{i:03d}" for i in range(nconv)]
            fns: dict[str, Callable[[], float]] = {}
            for b in ctx.backends():
                for c in convs:  # create every conversation first: creation is not what is timed
                    b.append(SITE, c, items)
                fns[b.name] = _round(b.append, convs, items, number)
            samples = interleaved(ctx.sizes.append_rounds, fns)
            label = "1 conversation" if nconv == 1 else f"{nconv} conversations round robin"
            rows.append(Row("append", f"append {batch}-item batches, {label}", "batches/s", samples=samples,
                            extra={"batch": batch, "conversations": nconv}))
            ctx.progress.step(f"append batch={batch} {mode}", advance=1)
    return rows


def _round(append: Callable[..., None], convs: list[str], items: list[dict], number: int) -> Callable[[], float]:
    state = {"i": 0}

    def call() -> None:
        i = state["i"]
        state["i"] = i + 1
        append(SITE, convs[i % len(convs)], items)

    return lambda: rate(call, number)
