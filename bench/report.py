"""The printed table, the headline ratios and the targets the engine is built to reach."""

from __future__ import annotations

import math
from typing import Any

from .util import CONVMEM, FLOOR, POSTGRES, SQLITE, Row, median


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(rows: list[Row]) -> str:
    """Medians per backend and convmem's speed relative to the others (above 1x: the local engine faster).

    ``postgres`` is convmem's own PostgreSQL backend on a loopback server.
    """
    head = ("workload", "unit", CONVMEM, SQLITE, FLOOR, POSTGRES, "vs sqlite", "vs floor", "vs postgres")
    body = [
        (r.name + (f"  [{r.note}]" if r.note else ""), r.unit, _fmt(r.value(CONVMEM)), _fmt(r.value(SQLITE)),
         _fmt(r.value(FLOOR)), _fmt(r.value(POSTGRES)), _ratio(r.speed_ratio(SQLITE)), _ratio(r.speed_ratio(FLOOR)),
         _ratio(r.speed_ratio(POSTGRES)))
        for r in rows
    ]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    lines = []
    for j, line in enumerate([head, *body]):
        cells = [str(c).ljust(widths[i]) if i < 2 else str(c).rjust(widths[i]) for i, c in enumerate(line)]
        lines.append("| " + " | ".join(cells) + " |")
        if j == 0:
            lines.append("|" + "|".join("-" * (w + 2) if i < 2 else "-" * (w + 1) + ":" for i, w in enumerate(widths))
                         + "|")
    return "\n".join(lines)


def _find(rows: list[Row], group: str, **extra: Any) -> Row | None:
    for r in rows:
        if r.group == group and all(r.extra.get(k) == v for k, v in extra.items()):
            return r
    return None


def _growth(rows: list[Row], group: str, key: str, small: int, large: int, **extra: Any) -> float | None:
    """convmem's time per call at ``large`` over its time at ``small``: median of per-round pairs."""
    a = _find(rows, group, **{key: small}, **extra)
    b = _find(rows, group, **{key: large}, **extra)
    if a is None or b is None:
        return None
    pairs = [x / y for x, y in zip(a.samples.get(CONVMEM, []), b.samples.get(CONVMEM, []), strict=False) if x and y]
    return median(pairs) if pairs else None


def ratios(rows: list[Row]) -> dict[str, float | None]:
    """The headline figures, named so runs can be compared over time."""
    out: dict[str, float | None] = {}
    app = _find(rows, "append", batch=10, conversations=1)
    out["append_vs_sqlite"] = app.speed_ratio(SQLITE) if app else None
    out["append_vs_floor"] = app.speed_ratio(FLOOR) if app else None
    lengths = sorted(r.extra["length"] for r in rows if r.group == "recall")
    top = lengths[-1] if lengths else None
    rec = _find(rows, "recall", length=top, batch=10) if top else None
    out["recall_vs_sqlite"] = rec.speed_ratio(SQLITE) if rec else None
    out["recall_growth_100k_vs_1k"] = _growth(rows, "recall", "length", 1_000, 100_000, batch=10)
    rep = _find(rows, "replay")
    out["replay_vs_sqlite"] = rep.speed_ratio(SQLITE) if rep else None
    first = _growth(rows, "list", "conversations", 1_000, 100_000, rank=0)
    deep = None  # the deep page's rank differs by size: pair the two rows directly
    small = [r for r in rows if r.group == "list" and r.extra.get("conversations") == 1_000 and r.extra["rank"]]
    large = [r for r in rows if r.group == "list" and r.extra.get("conversations") == 100_000 and r.extra["rank"]]
    if small and large:
        pairs = [x / y for x, y in zip(small[0].samples[CONVMEM], large[0].samples[CONVMEM], strict=False) if x and y]
        deep = median(pairs) if pairs else None
    # The worse of the first page and the deep page.
    out["list_growth_100k_vs_1k"] = max((g for g in (first, deep) if g is not None), default=None)
    cold = _find(rows, "open", what="conversation")
    out["open_100k_ms"] = cold.value(CONVMEM) if cold and cold.extra.get("length") == 100_000 else None
    mcp_r = _find(rows, "mcp", tool="recall_memory")
    out["mcp_recall_vs_noop"] = mcp_r.extra.get("vs_noop") if mcp_r else None
    mem = _find(rows, "rss")
    out["replay_rss_vs_response"] = mem.extra.get("rss_vs_response") if mem else None
    for key in ("ltm_fusion_recall2", "ltm_para_recall5_gain", "ltm_rest_recall5_gain", "ltm_search_p50_ms",
                "ltm_context_p50_ms"):
        row = _find(rows, "memory", headline=key)
        out[key] = row.extra.get("value") if row else None
    return out


#: (ratio key, comparison, threshold, what the issue asks)
TARGETS = [
    ("append_vs_sqlite", ">=", 2.0, "append of 10-item batches at least 2x SQLite"),
    ("append_vs_floor", ">=", 0.8, "append of 10-item batches at least 0.8x the floor"),
    ("recall_vs_sqlite", ">=", 5.0, "recall of the last 50 at 100,000 items at least 5x SQLite"),
    ("recall_growth_100k_vs_1k", "<=", 1.2, "recall at 100,000 items no more than 1.2x its time at 1,000"),
    ("replay_vs_sqlite", ">=", 3.0, "replay at least 3x SQLite's items per second"),
    ("list_growth_100k_vs_1k", "<=", 1.2, "a listing page at 100,000 conversations no more than 1.2x at 1,000"),
    ("open_100k_ms", "<", 20.0, "cold open of a 100,000-item conversation under 20 ms"),
    ("mcp_recall_vs_noop", ">=", 0.8, "recall_memory at least 0.8x the no-op's calls per second"),
    ("replay_rss_vs_response", "<", 4.0, "replay of the largest page: peak RSS under 4x the response"),
    ("ltm_fusion_recall2", ">=", 0.9, "long-term memory: fused recall@2 of auto-surface, all queries"),
    ("ltm_para_recall5_gain", ">=", 0.05, "long-term memory: fusion over BM25 alone, recall@5 on paraphrases"),
    ("ltm_rest_recall5_gain", ">=", 0.0, "long-term memory: fusion never worse than BM25 on the other queries"),
    ("ltm_search_p50_ms", "<=", 5.0, "long-term memory: search p50 at 10,000 memories in a site"),
    ("ltm_context_p50_ms", "<=", 2.0, "long-term memory: a memory_context lookup (top 2) p50 at 10,000 memories"),
]


def targets(r: dict[str, float | None]) -> list[dict[str, Any]]:
    out = []
    for key, op, limit, text in TARGETS:
        v = r.get(key)
        met = None if v is None else (v >= limit if op == ">=" else v <= limit if op == "<=" else v < limit)
        out.append({"key": key, "target": f"{op} {limit}", "value": v, "met": met, "what": text})
    return out


def targets_text(ts: list[dict[str, Any]]) -> str:
    lines = []
    for t in ts:
        mark = "n/a " if t["met"] is None else ("MET " if t["met"] else "MISS")
        val = "unavailable" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"  {mark} {t['key']:<26} {val:>11}  (target {t['target']}: {t['what']})")
    return "\n".join(lines)
