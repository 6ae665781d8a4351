"""Workload ``memory``: long-term memory retrieval, its quality on the labelled set and its speed at 10,000 memories.

Quality: recall@1, @2 and @5 of the auto-surface (the top of
:meth:`Retriever.search`) for BM25 alone, embeddings alone and their fusion,
over every query of ``bench/ltm_eval``, its paraphrase third and the rest;
the fusion rows also give the dev and test halves apart (the shipped tuning
was chosen on the dev half only).

Speed: a site of 10,000 synthetic memories built from the labelled set's
vocabulary. Per-call latency of ``search`` with ``limit=10`` (what
``memory_search`` asks by default) and ``limit=4`` (the ``memory_context``
lookup that recall_memory and append_memory add: two shown, two spare in
case of a duplicate dedupe key), upsert and erase; in a fresh process, the
model's cold load, the open (``load`` of all 10,000) and the process's peak
RSS. Over MCP: ``recall_memory`` with and without ``memory_context``,
interleaved; every timed hint is one not used before in the run (the
labelled queries, each once; the warm-up uses the labelled memories' own
texts), so no cache of a repeated hint could make the figure.

Quality at scale: the labelled queries against the labelled memories mixed
into the 10,000 synthetic ones (whose words are the labelled set's own, so
they compete lexically), dev and test halves apart: the figure the fusion
depth and the common-word cut were chosen on (dev half only).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from convmem.logstore.memories.retrieval import MemoryDoc, Retriever

from . import mcpserver
from .context import Ctx
from .ltm_eval import memories, queries
from .ltm_eval.evaluate import at_scale, evaluate
from .util import CONVMEM, Row, engine_sync_disabled, paired_median_diff_ci

SITE_SIZE = 10_000


CONV = "ltm-bench-conversation"


def steps(ctx: Ctx) -> int:
    return 4


def synthetic_docs(n: int, seed: int = 11) -> list[MemoryDoc]:
    """``n`` memories of words drawn from the labelled set: its vocabulary, word frequencies and field lengths.

    Each field samples words from the same field of the whole labelled set
    (so frequent words stay frequent); 5% of the memories are soft-deleted.
    """
    rnd = random.Random(seed)
    base = memories()
    pools = {
        "subject": " ".join(d.subject for d in base).split(),
        "summary": " ".join(d.summary for d in base).split(),
        "details": " ".join(d.details for d in base).split(),
    }
    cats = sorted({d.category for d in base}) + [f"cat{i}" for i in range(20)]
    tags = sorted({t for d in base for t in d.tags})

    def words(field: str, lo: int, hi: int) -> str:
        return " ".join(rnd.choices(pools[field], k=rnd.randint(lo, hi)))

    return [
        MemoryDoc(
            memory_id=f"mem_{i:06d}",
            category=rnd.choice(cats),
            subject=words("subject", 1, 5)[:200],
            summary=words("summary", 5, 25)[:500],
            details=words("details", 5, 40)[:2000] if rnd.random() < 0.4 else "",
            tags=tuple(rnd.sample(tags, rnd.randint(0, 3))),
            active=rnd.random() > 0.05,
        )
        for i in range(n)
    ]


def _pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _child_open(n: int) -> dict[str, float]:
    """Cold figures measured in a fresh interpreter: model load, open of ``n`` memories, peak RSS."""
    code = f"""
import json, resource, sys, tempfile, time
t0 = time.perf_counter()
from convmem.logstore.memories._semantic import default_embedder
default_embedder()
t1 = time.perf_counter()
from bench.memory import synthetic_docs
from convmem.logstore.memories.retrieval import Retriever
docs = synthetic_docs({n})
with tempfile.TemporaryDirectory() as d:
    t2 = time.perf_counter()
    r = Retriever(d)
    r.load(docs)
    t3 = time.perf_counter()
    r.search("deploy on friday", limit=2)
    r.close()
print(json.dumps({{"model_s": t1 - t0, "open_s": t3 - t2,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _recall_rows() -> list[Row]:
    qs = queries()
    res = evaluate(qs=qs)
    dev = evaluate(qs=[q for q in qs if q.dev])["fusion"]["all"]
    test = evaluate(qs=[q for q in qs if not q.dev])["fusion"]["all"]
    sizes = {"all": len(qs), "paraphrase": sum(q.kind == "para" for q in qs)}
    sizes["rest"] = sizes["all"] - sizes["paraphrase"]
    rows = []
    for mode, by_group in res.items():
        for group, by_k in by_group.items():
            note = f"R@1 {by_k[1]:.3f}, R@5 {by_k[5]:.3f}"
            if mode == "fusion" and group == "all":
                note += f"; R@2 dev half {dev[2]:.3f}, test half {test[2]:.3f}"
            rows.append(Row("memory", f"recall@2, {mode}, {group} queries ({sizes[group]})", "share",
                            samples={CONVMEM: [by_k[2]]}, note=note,
                            extra={"mode": mode, "queries": group, "recall": {str(k): v for k, v in by_k.items()}}))
    gain_para = res["fusion"]["paraphrase"][5] - res["bm25"]["paraphrase"][5]
    gain_rest = res["fusion"]["rest"][5] - res["bm25"]["rest"][5]
    rows[-1].extra["headline"] = None
    heads = [("ltm_fusion_recall2", res["fusion"]["all"][2], "fused recall@2, all queries"),
             ("ltm_para_recall5_gain", gain_para, "fusion minus BM25, recall@5, paraphrases"),
             ("ltm_rest_recall5_gain", gain_rest, "fusion minus BM25, recall@5, other queries")]
    for key, value, name in heads:
        rows.append(Row("memory", name, "share", samples={CONVMEM: [value]}, extra={"headline": key, "value": value}))
    return rows


def _scale_rows() -> list[Row]:
    """Fused recall of the labelled queries with the labelled memories among 10,000 synthetic ones."""
    res = at_scale(synthetic_docs(SITE_SIZE))
    return [Row("memory", f"recall@2, fusion, {half} queries among {SITE_SIZE:,} synthetic memories", "share",
                samples={CONVMEM: [by_k[2]]}, note=f"R@1 {by_k[1]:.3f}, R@5 {by_k[5]:.3f}",
                extra={"mode": "fusion", "queries": half, "distractors": SITE_SIZE,
                       "recall": {str(k): v for k, v in by_k.items()}})
            for half, by_k in res.items()]


def _latency_rows(ctx: Ctx) -> list[Row]:
    docs = synthetic_docs(SITE_SIZE)
    texts = [q.text for q in queries()]
    calls = 600 if ctx.quick else 3000
    rows = []
    with tempfile.TemporaryDirectory(prefix="ltm-bench-", dir=ctx.workdir) as d:
        r = Retriever(d, answers_kept=0)  # every call ranks: no answer of an earlier call is reused
        r.load(docs)
        for t in texts[:50]:  # warm up
            r.search(t, limit=10)
        # memory_context asks for its top 2 plus 2 spare (a duplicate dedupe_key is skipped): a search of 4.
        for limit, what, key in ((10, "search (memory_search default)", "ltm_search_p50_ms"),
                                 (4, "memory_context lookup (search, top 4 for 2 shown)", "ltm_context_p50_ms")):
            ms, cpu = [], []
            for i in range(calls):
                c0, t0 = time.process_time(), time.perf_counter()
                r.search(texts[i % len(texts)], limit=limit)
                ms.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
            p50 = statistics.median(ms)
            # Wall time is the figure; CPU time shows how much of it is waiting for a core on a shared machine.
            rows.append(Row("memory", f"{what} at {SITE_SIZE:,} memories, p50", "ms", higher_better=False,
                            samples={CONVMEM: [p50]},
                            note=f"p95 {_pct(ms, 0.95):.2f} ms; CPU time p50 {statistics.median(cpu):.2f} ms; "
                                 f"{calls} calls",
                            extra={"headline": key, "value": p50, "p95": _pct(ms, 0.95), "calls": calls,
                                   "cpu_p50": statistics.median(cpu)}))
        rnd = random.Random(5)
        up, er = [], []
        for i in range(200):
            victim = docs[rnd.randrange(len(docs))]
            t0 = time.perf_counter()
            r.upsert(MemoryDoc(victim.memory_id, victim.category, victim.subject, victim.summary + f" v{i}",
                               victim.details, victim.tags, victim.active))
            up.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            r.erase(f"mem_{SITE_SIZE + i:06d}")  # absent: the no-op path is not what we time
            extra = MemoryDoc(f"mem_{SITE_SIZE + i:06d}", "x", "temporary", "a memory to erase", "", (), True)
            r.upsert(extra)
            t0 = time.perf_counter()
            r.erase(extra.memory_id)
            er.append((time.perf_counter() - t0) * 1000)
        r.close()
    for name, ms in (("upsert", up), ("erase", er)):
        rows.append(Row("memory", f"{name} at {SITE_SIZE:,} memories, p50", "ms", higher_better=False,
                        samples={CONVMEM: [statistics.median(ms)]}, note=f"p95 {_pct(ms, 0.95):.2f} ms"))
    return rows


def _fill_site(data_dir: str, n: int) -> int:
    """Create ``n`` memories (the active ones of the synthetic set) and a short conversation, syncs off."""
    from convmem.logstore import open_store
    from convmem.logstore.memories import LongTermMemory  # type: ignore[attr-defined,unused-ignore]

    made = 0
    mcpserver.add_site(data_dir)  # before the data: see add_site
    with engine_sync_disabled():
        store = open_store(data_dir)
        try:
            store.append(mcpserver.SITE, CONV, [{"role": "user", "n": i, "text": f"message {i}"} for i in range(50)])
        finally:
            store.close()
        ltm = LongTermMemory(data_dir)
        try:
            for d in synthetic_docs(n):
                fields = {"category": d.category, "subject": d.subject, "summary": d.summary,
                          "details": d.details, "tags": list(d.tags)}
                _, token, _ = ltm.verify(mcpserver.SITE, "create", fields)
                ltm.upsert(mcpserver.SITE, fields, token)
                made += 1
        finally:
            ltm.close()
    return made


async def _context_calls(url: str, warm: list[str], texts: list[str]) -> tuple[list[float], list[float], list[float]]:
    """Interleaved per-call milliseconds of recall_memory: without, with a new ``memory_context``, with it again.

    ``warm`` are the warm-up hints, ``texts`` the timed ones; no hint may appear twice. Each round is three
    calls: without a hint, with the next new hint, and with that same hint once more (what an agent working
    on one task does; the server may answer it from its table of recent answers).
    """
    if len(set(warm + texts)) != len(warm) + len(texts):
        raise ValueError("every hint of the run must be new")
    plain: list[float] = []
    with_ctx: list[float] = []
    again: list[float] = []
    async with mcpserver.client(url) as c:
        base = {"conversation_id": CONV, "count": 50}
        for hint in warm:  # warm up both paths
            await c.call_tool("recall_memory", base)
            await c.call_tool("recall_memory", {**base, "memory_context": hint})
        for hint in texts:
            for ctx_text, out in ((None, plain), (hint, with_ctx), (hint, again)):
                args = base if ctx_text is None else {**base, "memory_context": ctx_text}
                t0 = time.perf_counter()
                r = await c.call_tool("recall_memory", args)
                out.append((time.perf_counter() - t0) * 1000)
                assert not r.is_error, r
    return plain, with_ctx, again


def _mcp_context_rows(ctx: Ctx) -> list[Row]:
    name = "MCP recall_memory with memory_context vs without, p50"
    try:
        from convmem.logstore.memories import LongTermMemory  # type: ignore[attr-defined,unused-ignore]  # noqa: F401
    except ImportError:
        return [Row("memory", name, "ratio", higher_better=False,
                    note="unavailable: the long-term memory store is not in this tree")]
    why = mcpserver.available()
    if why:
        return [Row("memory", name, "ratio", higher_better=False, note=f"unavailable: {why}")]
    import anyio

    n = 2_000 if ctx.quick else SITE_SIZE
    data_dir = os.path.join(ctx.workdir, "ltm-mcp-data")
    mcpserver.add_site(data_dir)
    made = _fill_site(data_dir, n)
    texts = list(dict.fromkeys(q.text for q in queries()))
    timed = set(texts)
    warm = [h for h in dict.fromkeys(f"{d.subject}: {d.summary}" for d in memories()) if h not in timed][:20]
    server = mcpserver.Server(data_dir)
    try:
        plain, with_ctx, again = anyio.run(_context_calls, server.url, warm, texts[:100] if ctx.quick else texts)
    finally:
        server.stop()
    p0, p1, p2 = statistics.median(plain), statistics.median(with_ctx), statistics.median(again)
    added, lo, hi = paired_median_diff_ci(with_ctx, plain)
    return [Row("memory", f"{name} ({made:,} memories)", "ratio", higher_better=False,
                samples={CONVMEM: [p1 / p0]},
                note=f"{p1:.2f} ms with, {p0:.2f} ms without: +{added:.2f} ms [95% {lo:+.2f}, {hi:+.2f}]; "
                     f"{len(with_ctx)} hints, each new",
                extra={"headline": "ltm_context_added_ms", "value": added, "ci": [lo, hi], "with_ms": p1,
                       "without_ms": p0, "memories": made}),
            Row("memory", f"MCP recall_memory with a repeated memory_context vs without, p50 ({made:,} memories)",
                "ratio", higher_better=False, samples={CONVMEM: [p2 / p0]},
                note=f"{p2:.2f} ms with, {p0:.2f} ms without: +{p2 - p0:.2f} ms; from the recent-answers table",
                extra={"with_ms": p2, "without_ms": p0, "memories": made})]


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("memory: recall on the labelled set")
    rows = _recall_rows()
    rows.extend(_scale_rows())
    ctx.progress.step("memory: cold open of 10,000 memories", advance=1)
    cold = _child_open(SITE_SIZE)
    rows.append(Row("memory", "embedding model cold load (imports included)", "s", higher_better=False,
                    samples={CONVMEM: [cold["model_s"]]}))
    rows.append(Row("memory", f"open of {SITE_SIZE:,} memories (index rebuilt in memory)", "s", higher_better=False,
                    samples={CONVMEM: [cold["open_s"]]}, note=f"process peak RSS {cold['rss_mib']:.0f} MiB",
                    extra={"rss_mib": cold["rss_mib"]}))
    ctx.progress.step("memory: latency at 10,000 memories", advance=1)
    rows.extend(_latency_rows(ctx))
    ctx.progress.step("memory: recall_memory with and without memory_context over MCP", advance=1)
    rows.extend(_mcp_context_rows(ctx))
    ctx.progress.step("memory", advance=1)
    return rows
