"""Workload 4: list the first page and a deep page of a site's conversations.

Sites of 1,000, 10,000 and 100,000 conversations (one small item each) are
built once; a page is 50 summaries; the deep page starts 90% of the way in.
Only convmem and SQLite list: the floor has no listing.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import Ctx
from .util import Row, interleaved, rate

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
            if i % 2000 == 0:
                ctx.progress.step(f"list: building site of {n:,} conversations ({i:,})")


def run(ctx: Ctx) -> list[Row]:
    rows = []
    for n in ctx.sizes.site_sizes:
        ctx.progress.step(f"list: building site of {n:,} conversations")
        build(ctx, n)
        ctx.progress.step(f"list: built {n:,}", advance=1)
        site = site_name(n)
        for where, rank in (("first page", 0), ("deep page", int(n * DEEP))):
            fns: dict[str, Callable[[], float]] = {}
            for b in (ctx.convmem, ctx.sqlite):
                cursor = b.cursor_at(site, rank)
                assert len(b.list_page(site, cursor, PAGE)[0]) == PAGE
                fns[b.name] = (lambda b=b, cursor=cursor, site=site:
                               rate(lambda: b.list_page(site, cursor, PAGE), ctx.sizes.list_calls))
            rows.append(Row("list", f"list {where} at {n:,} conversations", "pages/s",
                            samples=interleaved(ctx.sizes.rounds, fns), extra={"conversations": n, "rank": rank}))
        ctx.progress.step(f"list at {n:,}", advance=1)
    return rows
