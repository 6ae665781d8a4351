"""Workload 4: list the first page and a deep page of a site's conversations.

Sites of 1,000, 10,000 and 100,000 conversations (one small item each) are
built once; a page is 50 summaries; the deep page starts 90% of the way in.
Only convmem, SQLite and PostgreSQL list: the floor has no listing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .context import Ctx
from .util import Row, interleaved_ops

PAGE = 50
DEEP = 0.9


def site_name(n: int) -> str:
    return f"list-site-{n:07d}"


def steps(ctx: Ctx) -> int:
    return 2 * len(ctx.sizes.site_sizes)


def build(ctx: Ctx, n: int) -> None:
    """Create a site of ``n`` conversations in convmem and SQLite."""
    item = [{"role": "user", "text": "hello"}]
    with ctx.setup_mode():
        for i in range(n):
            conv = f"conv-{i:08d}"
            ctx.convmem.append(site_name(n), conv, item)
            ctx.sqlite.append(site_name(n), conv, item)
            if ctx.postgres is not None:
                ctx.postgres.append(site_name(n), conv, item)
            if i % 2000 == 0:
                ctx.progress.note(f"{i:,} of {n:,} conversations")


def _listers(ctx: Ctx) -> list[Any]:
    return [ctx.convmem, ctx.sqlite] + ([ctx.postgres] if ctx.postgres is not None else [])


def run(ctx: Ctx) -> list[Row]:
    for n in ctx.sizes.site_sizes:
        ctx.progress.step(f"list: building site of {n:,} conversations")
        build(ctx, n)
        ctx.progress.step(f"list: built {n:,}", advance=1)
    # Every site size, page depth and backend takes turns op by op, so the
    # growth from the smallest to the largest site is a paired figure.
    ctx.progress.step("list: first and deep pages")
    fns: dict[str, Callable[[], float]] = {}
    cases = [(n, where, rank) for n in ctx.sizes.site_sizes
             for where, rank in (("first", 0), ("deep", min(int(n * DEEP), n - PAGE)))]
    for n, where, rank in cases:
        site = site_name(n)
        for b in _listers(ctx):
            cursor = b.cursor_at(site, rank)
            assert len(b.list_page(site, cursor, PAGE)[0]) == PAGE
            fns[f"{b.name}|{n}|{where}"] = functools.partial(b.list_page, site, cursor, PAGE)
    samples = interleaved_ops(ctx.sizes.ops, fns, progress=ctx.progress, label="list pages")
    rows = []
    for n, where, rank in cases:
        per = {b.name: samples[f"{b.name}|{n}|{where}"] for b in _listers(ctx)}
        rows.append(Row("list", f"list {where} page at {n:,} conversations", "ms/page",
                        higher_better=False, per_op=True, samples=per,
                        extra={"conversations": n, "rank": rank}))
    ctx.progress.step("list", advance=len(ctx.sizes.site_sizes))
    return rows
