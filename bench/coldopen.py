"""Workload 6: cold open, in a fresh process with the files evicted from the page cache.

The files are evicted with ``posix_fadvise(DONTNEED)`` (no privileges needed,
unlike ``drop_caches``), then a new interpreter imports everything untimed and
times opening the store plus the first read: ``Tail(50)`` of the
100,000-item conversation, and the first listing page of the largest site.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from . import listing, reads
from .context import SITE, Ctx
from .util import Row, drop_file_cache, files_under, interleaved

CHILD = "bench.coldchild"


def steps(ctx: Ctx) -> int:
    return 2


def _child(args: dict[str, Any]) -> float:
    """Run one timed open in a fresh interpreter; milliseconds."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-m", CHILD, json.dumps(args)], capture_output=True, text=True,
                         env=env, check=True, timeout=600)
    return float(json.loads(res.stdout.strip().splitlines()[-1])["ms"])


def _convmem_files(ctx: Ctx, site: str, conv: str | None) -> list[str]:
    from convmem.logstore import layout

    if conv is not None:
        return [*files_under(layout.conversation_dir(ctx.convmem_dir, site, conv)),
                *[p for p in files_under(layout.site_dir(ctx.convmem_dir, site)) if "manifest" in p]]
    return [p for p in files_under(layout.site_dir(ctx.convmem_dir, site)) if "manifest" in p]


def _timed(ctx: Ctx, backend: str, files: list[str], args: dict[str, Any]) -> float:
    drop_file_cache(files)
    return _child({"backend": backend, **args})


def _timed_rows(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Each round is one timed open: the ms samples are also the latencies (in seconds)."""
    return {"samples": samples, "latencies": {k: [v / 1000 for v in vs] for k, vs in samples.items()}}


def run(ctx: Ctx) -> list[Row]:
    rows = []
    reads.build(ctx)
    length = max(ctx.sizes.conv_lengths)
    conv = reads.conv_name(length)
    ctx.progress.step(f"cold open of a {length:,}-item conversation")
    ctx.sqlite.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    sq_files = [ctx.sqlite_path, ctx.sqlite_path + "-wal", ctx.sqlite_path + "-shm"]
    common: dict[str, Any] = {"site": SITE, "conv": conv}
    fns = {
        "convmem": lambda: _timed(ctx, "convmem", _convmem_files(ctx, SITE, conv), {"path": ctx.convmem_dir, **common}),
        "sqlite": lambda: _timed(ctx, "sqlite", sq_files, {"path": ctx.sqlite_path, **common}),
        "floor": lambda: _timed(ctx, "floor", [ctx.floor.path(SITE, conv)],
                                {"path": ctx.floor.path(SITE, conv), "bytes": 50 * (ctx.sizes.item_bytes + 1),
                                 "end": ctx.floor.end(SITE, conv)}),
    }
    rows.append(Row("open", f"cold open + recall 50, {length:,}-item conversation", "ms", higher_better=False,
                    **_timed_rows(interleaved(ctx.sizes.cold_rounds, fns)),
                    extra={"what": "conversation", "length": length},
                    note="floor: one pread of the last 50 items"))
    ctx.progress.step("cold open (conversation)", advance=1)

    n = max(ctx.sizes.site_sizes)
    site = listing.site_name(n)
    ctx.progress.step(f"cold open of a site of {n:,} conversations")
    if not os.path.isdir(os.path.join(ctx.convmem_dir, "sites")) or not ctx.convmem.list_page(site, None, 1)[0]:
        listing.build(ctx, n)
    ctx.sqlite.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    common = {"site": site, "conv": None}
    fns = {
        "convmem": lambda: _timed(ctx, "convmem", _convmem_files(ctx, site, None), {"path": ctx.convmem_dir, **common}),
        "sqlite": lambda: _timed(ctx, "sqlite", sq_files, {"path": ctx.sqlite_path, **common}),
    }
    rows.append(Row("open", f"cold open + first list page, site of {n:,} conversations", "ms", higher_better=False,
                    **_timed_rows(interleaved(ctx.sizes.cold_rounds, fns)), extra={"what": "site", "conversations": n}))
    ctx.progress.step("cold open (site)", advance=1)
    return rows
