"""The printed table, the headline ratios (with bootstrap intervals) and the performance targets they are held to."""

from __future__ import annotations

import math
from typing import Any

from .util import (
    CONVMEM,
    FLOOR,
    LMDB,
    SQLITE,
    SQLITE_GROUP,
    Row,
    median_ci,
    paired_median_diff_ci,
    percentile_ratio_ci,
)

#: Every headline ratio, in the order the JSON and the printout give them. Each ``_vs_`` is
#: convmem's speed over the other's (above 1: convmem faster), p50 unless the name says otherwise.
RATIO_KEYS = (
    "append1_vs_sqlite", "append10_vs_sqlite", "append100_vs_sqlite", "append10_vs_floor", "append10_vs_lmdb",
    "append10_p99_over_p50", "new_conversation_vs_append", "new_conversation_vs_sqlite", "recall_vs_sqlite",
    "recall_wide_vs_sqlite", "recall_growth_100k_vs_1k", "replay_vs_sqlite", "writers16_vs_sqlite",
    "writers16_vs_floor", "writers16_vs_sqlite_group", "same_conversation4_vs_1",
    "list_growth_100k_vs_1k", "open_100k_ms", "mcp_recall_vs_noop_tool", "replay_rss_vs_payload",
    "mcp_ping_vs_bare_app", "mcp_recall50_minus_ping_ms", "mcp_append1_minus_engine_ms", "mcp_recall_calls_per_s_8",
)

#: The long-term memory workload's headline figures (``--only memory``), kept apart from ``ratios``.
MEMORY_KEYS = ("ltm_fusion_recall2", "ltm_fusion_recall2_test", "ltm_para_recall2", "ltm_para_recall5_gain",
               "ltm_rest_recall5_gain", "ltm_abstention", "ltm_search_p50_ms", "ltm_context_p50_ms",
               "ltm_context_added_ms", "ltm_context_repeat_added_ms", "ltm_open_s", "ltm_mib_per_10k",
               "ltm_search_inflight_vs_alone", "ltm_many_sites_held_vs_budget", "ltm_many_sites_rss_growth_mib")

Interval = tuple[float, float, float]


def _fmt(v: float | int | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, int):
        return f"{v:,}"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _ci(r: Interval | None) -> str:
    return "-" if r is None else f"{r[0]:.2f}x [{r[1]:.2f}, {r[2]:.2f}]"


def table(rows: list[Row]) -> str:
    """One line per workload and backend: p50/p99/p99.9 per operation, throughput, convmem's speed over it."""
    head = ("workload", "backend", "value", "p50 ms", "p99 ms", "p99.9 ms", "ops/s", "n", "convmem vs it [95% CI]")
    body: list[tuple[str, ...]] = []
    for r in rows:
        name = r.name + (f"  [{r.note}]" if r.note else "")
        if not r.samples:
            body.append((name, "-", "-", "-", "-", "-", "-", "-", "-"))
        for b in r.samples:
            st = r.stats(b)
            value = "-" if r.per_op else f"{_fmt(r.value(b))} {r.unit}"
            body.append((name, b, value, _fmt(st["p50_ms"]), _fmt(st["p99_ms"]), _fmt(st["p999_ms"]),
                         _fmt(st["throughput"]), _fmt(st.get("ops")),
                         "" if b == CONVMEM else _ci(r.ratio_ci(b))))
            name = ""
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


def _conv(row: Row | None) -> list[float]:
    return row.samples.get(CONVMEM, []) if row else []


def _growth(small: Row | None, large: Row | None) -> Interval | None:
    """convmem's p50 time at the larger size over its p50 time at the smaller one."""
    a, b = _conv(large), _conv(small)
    return percentile_ratio_ci(a, b) if a and b else None


def _per_round(num: Row | None, dens: list[Row | None], backends: list[str]) -> Interval | None:
    """Median over rounds of convmem's figure in ``num`` over the best of ``backends`` in ``dens``, same round."""
    if num is None or not num.samples.get(CONVMEM):
        return None
    pairs = []
    for i, x in enumerate(num.samples[CONVMEM]):
        ys = [d.samples[b][i] for d in dens if d is not None for b in backends if len(d.samples.get(b, [])) > i]
        if ys and max(ys) > 0:
            pairs.append(x / max(ys))
    return median_ci(pairs) if pairs else None


def ratios(rows: list[Row]) -> tuple[dict[str, Interval | None], dict[str, str]]:
    """Every key of :data:`RATIO_KEYS` as (value, low, high), None when its workload did not run; and sizes used."""
    out: dict[str, Interval | None] = dict.fromkeys(RATIO_KEYS)
    where: dict[str, str] = {}
    for batch in (1, 10, 100):
        app = _find(rows, "append", batch=batch)
        out[f"append{batch}_vs_sqlite"] = app.ratio_ci(SQLITE) if app else None
    app = _find(rows, "append", batch=10)
    if app:
        out["append10_vs_floor"] = app.ratio_ci(FLOOR)
        out["append10_vs_lmdb"] = app.ratio_ci(LMDB)
        if app.samples.get(CONVMEM):
            out["append10_p99_over_p50"] = percentile_ratio_ci(app.samples[CONVMEM], app.samples[CONVMEM], 99, 50)
    first, nxt = _find(rows, "newconv", what="first"), _find(rows, "newconv", what="next")
    if _conv(first) and _conv(nxt):
        out["new_conversation_vs_append"] = percentile_ratio_ci(_conv(first), _conv(nxt))
    out["new_conversation_vs_sqlite"] = first.ratio_ci(SQLITE) if first else None
    recall = [r for r in rows if r.group == "recall" and r.extra.get("batch") == 10]
    if recall:
        lengths = sorted(r.extra["length"] for r in recall)
        small, large = _find(rows, "recall", length=lengths[0], batch=10), _find(rows, "recall", length=lengths[-1],
                                                                                   batch=10)
        out["recall_vs_sqlite"] = large.ratio_ci(SQLITE) if large else None
        out["recall_growth_100k_vs_1k"] = _growth(small, large)
        where["recall"] = f"{lengths[0]:,} -> {lengths[-1]:,} items"
    wide = next((r for r in rows if r.group == "recall" and r.extra.get("batch", 10) != 10), None)
    out["recall_wide_vs_sqlite"] = wide.ratio_ci(SQLITE) if wide else None
    rep = _find(rows, "replay")
    out["replay_vs_sqlite"] = rep.ratio_ci(SQLITE) if rep else None
    w16 = _find(rows, "concurrency", how="threads", writers=16, distinct=True)
    out["writers16_vs_sqlite"] = _per_round(w16, [w16], [SQLITE, SQLITE_GROUP])
    out["writers16_vs_floor"] = _per_round(w16, [w16], [FLOOR])
    out["writers16_vs_sqlite_group"] = _per_round(w16, [w16], [SQLITE_GROUP])
    same4 = _find(rows, "concurrency", how="threads", writers=4, distinct=False)
    one = _find(rows, "concurrency", how="threads", writers=1, distinct=True)
    out["same_conversation4_vs_1"] = _per_round(same4, [one], [CONVMEM])
    sites = sorted({r.extra["conversations"] for r in rows if r.group == "list"})
    if sites:
        growths = []
        for deep in (False, True):
            s = next((r for r in rows if r.group == "list" and r.extra.get("conversations") == sites[0]
                      and bool(r.extra.get("rank")) == deep), None)
            lg = next((r for r in rows if r.group == "list" and r.extra.get("conversations") == sites[-1]
                       and bool(r.extra.get("rank")) == deep), None)
            g = _growth(s, lg)
            if g is not None:
                growths.append(g)
        # The worse of the first page and the deep page.
        out["list_growth_100k_vs_1k"] = max(growths, default=None)
        where["list"] = f"{sites[0]:,} -> {sites[-1]:,} conversations"
    cold = _find(rows, "open", what="conversation")
    if cold and cold.samples.get(CONVMEM):
        out["open_100k_ms"] = median_ci(cold.samples[CONVMEM])
        where["open"] = f"{cold.extra.get('length', 0):,} items"
    recall_mcp, noop = _find(rows, "mcp", tool="recall_memory"), _find(rows, "mcp", tool="bench_noop")
    if _conv(recall_mcp) and _conv(noop):
        out["mcp_recall_vs_noop_tool"] = percentile_ratio_ci(_conv(noop), _conv(recall_mcp))
    _mcp_layer(rows, out)
    rss = _find(rows, "rss")
    if rss and "rss_vs_payload" in rss.extra:
        lo, hi = rss.extra["rss_vs_payload_ci"]
        out["replay_rss_vs_payload"] = (rss.extra["rss_vs_payload"], lo, hi)
        where["rss"] = f"{rss.extra['items']:,} items of 256 KiB"
    return out, where


def _mcp_layer(rows: list[Row], out: dict[str, Interval | None]) -> None:
    """The MCP layer's figures: the MCP layer against the bare app, ``ping`` and the engine, all from one run."""
    ping, bare = _conv(_find(rows, "mcp", tool="ping")), _conv(_find(rows, "mcp", tool="bare_app"))
    recall = _conv(_find(rows, "mcp", tool="recall_memory"))
    append1 = _conv(_find(rows, "mcp", tool="append_memory_1"))
    engine = _conv(_find(rows, "mcp", tool="engine_append_1"))
    if ping and bare:
        out["mcp_ping_vs_bare_app"] = percentile_ratio_ci(ping, bare)
    if recall and ping and len(recall) == len(ping):
        out["mcp_recall50_minus_ping_ms"] = _ms(paired_median_diff_ci(recall, ping))
    if append1 and engine and len(append1) == len(engine):
        out["mcp_append1_minus_engine_ms"] = _ms(paired_median_diff_ci(append1, engine))
    rate = _find(rows, "mcp", tool="recall_memory_concurrent")
    if rate and rate.samples.get(CONVMEM):
        value = rate.samples[CONVMEM][0]
        out["mcp_recall_calls_per_s_8"] = (value, value, value)


def _ms(v: Interval) -> Interval:
    return (v[0] * 1000, v[1] * 1000, v[2] * 1000)


def memory_figures(rows: list[Row]) -> dict[str, float | None]:
    """The long-term memory workload's headline figures."""
    out: dict[str, float | None] = {}
    for key in MEMORY_KEYS:
        row = _find(rows, "memory", headline=key)
        out[key] = row.extra.get("value") if row else None
    return out


def memory_intervals(rows: list[Row]) -> dict[str, list[float] | None]:
    """The bootstrap 95% interval of each long-term memory headline figure that has one."""
    out: dict[str, list[float] | None] = {}
    for key in MEMORY_KEYS:
        row = _find(rows, "memory", headline=key)
        out[key] = row.extra.get("ci") if row else None
    return out


#: A comparison that holds a figure to nothing: printed and kept for reference (``met`` is None).
REFERENCE = "ref"

#: (key, comparison, threshold, what the target asks); peers = tuned SQLite and LMDB, floor = the pre-zeroed one.
TARGETS = [
    ("append1_vs_sqlite", ">=", 1.3, "1-item appends at least 1.3x the tuned SQLite (p50)"),
    ("append10_vs_sqlite", ">=", 1.3, "10-item appends at least 1.3x the tuned SQLite (p50)"),
    ("append100_vs_sqlite", ">=", 1.2, "100-item appends at least 1.2x the tuned SQLite (p50)"),
    ("append10_vs_floor", ">=", 0.8, "10-item appends at least 0.8x the pre-zeroed floor"),
    ("append10_vs_lmdb", ">=", 1.2, "10-item appends at least 1.2x LMDB"),
    ("append10_p99_over_p50", "<=", 3.0, "10-item appends: p99 at most 3x p50"),
    ("new_conversation_vs_append", "<=", 1.3, "first append to a new conversation at most 1.3x an ordinary one (p50)"),
    ("new_conversation_vs_sqlite", ">=", 1.2, "first append to a new conversation at least 1.2x SQLite's first insert"),
    ("recall_vs_sqlite", ">=", 1.25, "recall of the last 50 at the longest conversation at least 1.25x SQLite"),
    ("recall_wide_vs_sqlite", ">=", 1.0, "recall inside one 250-item batch at least SQLite's speed"),
    ("recall_growth_100k_vs_1k", "<=", 1.2, "recall at 100,000 items at most 1.2x its time at 1,000"),
    ("replay_vs_sqlite", ">=", 1.25, "replay pages at least 1.25x SQLite"),
    ("writers16_vs_sqlite", REFERENCE, 0.0, "16 writer threads over the better SQLite way (per connection, group)"),
    ("writers16_vs_floor", ">=", 0.6, "16 writer threads at least 0.6x the pre-zeroed floor's 16 threads (batches/s)"),
    ("writers16_vs_sqlite_group", ">=", 1.4, "16 writer threads at least 1.4x SQLite behind one group-commit thread"),
    ("same_conversation4_vs_1", ">=", 1.5, "4 writers on one conversation at least 1.5x one writer's batches/s"),
    ("list_growth_100k_vs_1k", "<=", 1.2, "a listing page at 100,000 conversations at most 1.2x at 1,000"),
    ("open_100k_ms", "<", 20.0, "cold open of a 100,000-item conversation under 20 ms"),
    ("mcp_recall_vs_noop_tool", ">=", 0.8, "recall_memory at least 0.8x a no-op tool returning the same bytes"),
    ("replay_rss_vs_payload", "<=", 3.0, "replay: peak RSS above the idle server at most 3x the payload"),
    ("mcp_ping_vs_bare_app", "<=", 1.5, "MCP ping p50 at most 1.5x a bare ASGI app under the same uvicorn"),
    ("mcp_recall50_minus_ping_ms", "<=", 0.5, "MCP recall_memory of 50 items at most 0.5 ms above ping (p50)"),
    ("mcp_append1_minus_engine_ms", "<=", 1.0, "MCP append_memory of 1 item at most 1 ms above the engine's (p50)"),
    ("mcp_recall_calls_per_s_8", ">=", 1000.0, "one server: at least 1,000 recall_memory calls/s from 8 clients"),
]

MEMORY_TARGETS = [  # long-term memory quality and cost
    ("ltm_fusion_recall2", ">=", 0.83, "long-term memory: fused recall@2, all queries"),
    ("ltm_fusion_recall2_test", ">=", 0.78, "long-term memory: fused recall@2, test half"),
    ("ltm_para_recall2", ">=", 0.6, "long-term memory: fused recall@2, paraphrases"),
    ("ltm_para_recall5_gain", ">=", 0.3, "long-term memory: fusion over BM25 alone, recall@5 on paraphrases"),
    ("ltm_rest_recall5_gain", ">=", 0.0, "long-term memory: fusion never worse than BM25 on the other queries"),
    ("ltm_abstention", ">=", 0.8, "long-term memory: no-answer hints that surface nothing"),
    ("ltm_context_added_ms", "<=", 6.0, "long-term memory: memory_context (new hint) adds to recall_memory's p50"),
    ("ltm_context_repeat_added_ms", "<=", 1.0, "long-term memory: memory_context (repeated hint) adds, p50"),
    ("ltm_search_p50_ms", "<=", 10.0, "long-term memory: memory_search p50 at 10,000 memories"),
    ("ltm_open_s", "<=", 1.0, "long-term memory: open of a 10,000-memory site"),
    ("ltm_mib_per_10k", "<=", 40.0, "long-term memory: RSS per 10,000 memories beyond the model"),
    ("ltm_search_inflight_vs_alone", "<=", 4.0, "long-term memory: memory_search p50, 8 in flight vs alone"),
    ("ltm_many_sites_held_vs_budget", "<=", 1.0,
     "long-term memory: many sites: memories held beyond the site in use within the budget"),
]


def targets(r: dict[str, float | None], table: list[tuple[str, str, float, str]] | None = None
            ) -> list[dict[str, Any]]:
    out = []
    for key, op, limit, text in TARGETS if table is None else table:
        v = r.get(key)
        if op == REFERENCE:
            out.append({"key": key, "target": "reference only", "value": v, "met": None, "what": text})
            continue
        met = None if v is None else (v >= limit if op == ">=" else v <= limit if op == "<=" else v < limit)
        out.append({"key": key, "target": f"{op} {limit}", "value": v, "met": met, "what": text})
    return out


def targets_text(ts: list[dict[str, Any]], intervals: dict[str, list[float] | None] | None = None) -> str:
    lines = []
    for t in ts:
        mark = ("ref " if t["target"] == "reference only" else "n/a ") if t["met"] is None else (
            "MET " if t["met"] else "MISS")
        val = "unavailable" if t["value"] is None else f"{t['value']:.2f}"
        ci = (intervals or {}).get(t["key"])
        ci_s = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        wanted = t["target"] if t["target"] == "reference only" else f"target {t['target']}"
        lines.append(f"  {mark} {t['key']:<26} {val:>11} {ci_s:<14} ({wanted}: {t['what']})")
    return "\n".join(lines)


# -- docs/performance-figures.md, generated from a run's JSON ------------------------------------------------


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _num(v: Any) -> str:
    return _fmt(v) if isinstance(v, (int, float)) or v is None else str(v)


def figures_markdown(doc: dict[str, Any], source: str = "results.json") -> str:
    """The figures of one ``python -m bench --json`` run as Markdown: what ran where, targets, every row.

    Deterministic: it prints what the JSON holds (its stored statistics and
    intervals) and computes nothing, so the same file always gives the same page.
    """
    env = doc.get("environment", {})
    machine = doc.get("machine", {})
    steal = env.get("cpu_steal_share")
    out = [
        "# Performance figures",
        "",
        f"Generated by `python -m bench.report {source}` from one `python -m bench` run; do not edit by hand",
        "(regenerate it, see [performance.md](performance.md)).",
        "",
        f"* run: {doc.get('mode', '?')} mode, started {doc.get('started', '?')}, {doc.get('seconds', '?')} s",
        "* machine: " + ", ".join(f"{k} {v}" for k, v in sorted(machine.items()) if not isinstance(v, (dict, list))),
        f"* load average {env.get('loadavg_start')} -> {env.get('loadavg_end')}, CPU steal "
        + ("unknown" if steal is None else f"{steal:.1%}"),
    ]
    if doc.get("noisy"):
        out.append("* **NOISY run** (" + "; ".join(env.get("noisy_reasons", [])) + "): rerun on a quiet machine "
                   "before quoting these figures")
    out += ["", "## Targets", "", _md_row(["target", "value", "95% interval", "wanted", "met"]),
            "|---|---:|---|---|---|"]
    intervals = {**doc.get("ratio_intervals", {}), **doc.get("memory_intervals", {})}
    memory = targets(doc.get("memory_figures", {}), MEMORY_TARGETS) if doc.get("memory_figures") else []
    for t in [*doc.get("targets", []), *memory]:
        ci = intervals.get(t["key"])
        met = "n/a" if t["met"] is None else ("yes" if t["met"] else "**no**")
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        out.append(_md_row([f"{t['what']} (`{t['key']}`)", value,
                            f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-", t["target"], met]))
    out += ["", "## Every workload", "",
            "p50, p99 and p99.9 per operation; *vs* is convmem's speed over that backend at p50 "
            "(above 1: convmem faster), with its bootstrap 95% interval.", "",
            _md_row(["workload", "backend", "p50 ms", "p99 ms", "p99.9 ms", "ops/s", "n", "convmem vs it"]),
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in doc.get("results", []):
        name = r["name"] + (f" [{r['note']}]" if r.get("note") else "")
        for backend, st in r.get("stats", {}).items():
            vs = r.get("vs", {}).get(backend)
            out.append(_md_row([name, backend, _num(st.get("p50_ms")), _num(st.get("p99_ms")),
                                _num(st.get("p999_ms")), _num(st.get("throughput")), _num(st.get("ops")),
                                "" if backend == CONVMEM else _ci((vs[0], vs[1], vs[2]) if vs else None)]))
            name = ""
    for name, why in doc.get("failures", {}).items():
        out.append(f"\nWorkload `{name}` failed in this run: {why}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report RESULTS.json``: print a run's figures as Markdown (docs/performance-figures.md)."""
    import argparse
    import json
    import os

    p = argparse.ArgumentParser(prog="python -m bench.report", description=main.__doc__)
    p.add_argument("results", metavar="RESULTS.json", help="a file written by python -m bench --json")
    args = p.parse_args(argv)
    with open(args.results) as f:
        doc = json.load(f)
    print(figures_markdown(doc, os.path.basename(args.results)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
