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
texts), so no cache of a repeated hint could make the figure. Beside it, the
server's CPU time per call (all its threads) and the client's, with and
without the hint; and in process, the same lookup one call at a time after a
pause, as a server runs it between requests: a lookup run back to back finds
the model and the vector matrix still in the caches and costs about a third
less CPU than one after 5 ms of anything else (sleep or other work).

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
from dataclasses import dataclass, field

from convmem.logstore.memories.retrieval import MemoryDoc, Retriever

from . import mcpserver
from .context import Ctx
from .ltm_eval import memories, no_answer, queries
from .ltm_eval.evaluate import abstention_figures, at_scale, docs_only, evaluate, shared_embedder
from .memory_inflight import IN_FLIGHT
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


def _site_with_vectors(data_dir: str, docs: Sequence[MemoryDoc], site: str = mcpserver.SITE) -> None:
    """A data directory whose site holds ``docs`` as create events with their stored vectors, as writes leave it.

    Written directly (one log rewrite) rather than through 10,000 verify+upsert calls; the vectors come from
    the run's shared encoder, so the texts are encoded once per run.
    """
    from convmem.logstore.memories import (
        LongTermMemory,  # type: ignore[attr-defined,unused-ignore]
        eventlog,
        vectors,
    )
    from convmem.logstore.memories.retrieval import embedding_text
    from convmem.logstore.memories.site import LOG_NAME, memories_dir
    from convmem.logstore.timefmt import format_us

    LongTermMemory(data_dir).close()
    emb = shared_embedder()
    vecs = emb.embed([embedding_text(d) for d in docs])
    at = 1_700_000_000_000_000
    events = []
    for i, (d, v) in enumerate(zip(docs, vecs, strict=True)):
        ts = format_us(at + i)
        mid = "mem_" + f"{i:026d}"
        record = {"id": mid, "category": d.category, "subject": d.subject, "summary": d.summary,
                  "details": d.details, "tags": list(d.tags), "source_uris": [], "dedupe_key": None,
                  "status": "active", "created_at": ts, "updated_at": ts, "deleted_at": None, "version": 1}
        body = {"op": "create", "id": mid, "at": at + i, "record": record,
                "vec": vectors.pack(v, emb.model_id, embedding_text(d))}
        events.append((at + i, body))
    path = os.path.join(memories_dir(data_dir, site), LOG_NAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    eventlog.rewrite_file(path, events)


def _child_open(data_dir: str) -> dict[str, float]:
    """Cold figures in a fresh interpreter: encoder load, the first search of the site (its open), RSS."""
    code = f"""
import json, resource, time
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
t0 = time.perf_counter()
from convmem.logstore.memories.encoder import default_encoder
default_encoder()
t1 = time.perf_counter()
from convmem.logstore.memories import LongTermMemory
ltm = LongTermMemory({data_dir!r})
default_encoder().embed_one("warm the encoder's arena")
r0 = rss()
c2, t2 = time.process_time(), time.perf_counter()
ltm.search({mcpserver.SITE!r}, "deploy on friday", limit=2)
c3, t3 = time.process_time(), time.perf_counter()
r1 = rss()
import ctypes, gc
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the open freed but the allocator kept goes back to the system
r2 = rss()
site = ltm.site({mcpserver.SITE!r})
print(json.dumps({{"model_s": t1 - t0, "open_s": t3 - t2, "open_cpu_s": c3 - c2, "index_mib": r1 - r0,
                  "kept_mib": r2 - r0,
                  "memories": len(site.state), "recomputed": site._retriever.recomputed,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
ltm.close()
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _inflight_row(ctx: Ctx, data_dir: str) -> Row:
    """memory_search's p50 with ``IN_FLIGHT`` calls in flight (threads, as a server's workers run them) over
    its p50 alone, on the 10,000-memory site, in alternating blocks (``interleaved``: both see the same load);
    every call encodes its query and ranks (no cached answer). Measured in a fresh process that starts as
    ``convmem serve`` does (:mod:`bench.memory_inflight`: SQLite's heap statistics turned off first)."""
    cmd = [sys.executable, "-m", "bench.memory_inflight", data_dir, "--site", mcpserver.SITE]
    out = subprocess.run(cmd + (["--quick"] if ctx.quick else []), check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    p_alone, p_together = statistics.median(r["alone"]), statistics.median(r["together"])
    stats = "SQLite heap statistics off" if r["statistics_off"] else f"({r['statistics_detail']})"
    return Row("memory", f"memory_search p50 with {IN_FLIGHT} calls in flight vs alone ({SITE_SIZE:,} memories, "
               f"{os.cpu_count()} cores)", "ratio", higher_better=False, samples={CONVMEM: [r["ratio"]]},
               note=f"{r['summary']}; {len(r['together'])} calls in flight, {len(r['alone'])} alone, "
                    f"in {r['rounds']} alternating rounds; at most {r['encodes_at_once']} encodes at once; {stats}",
               extra={"headline": "ltm_search_inflight_vs_alone", "value": r["ratio"],
                      "inflight_ms": p_together, "alone_ms": p_alone, "in_flight": IN_FLIGHT,
                      "calls_per_s": len(r["together"]) / r["wall_together"], "encodes_at_once": r["encodes_at_once"],
                      "cpu_alone_ms": r["cpu_alone"], "cpu_inflight_ms": r["cpu_together"],
                      "cores_alone": r["cores"][0], "cores_inflight": r["cores"][1],
                      "sqlite_statistics_off": r["statistics_off"]})


#: The many-sites figure: sites, memories each, the store's budget (memories held over all sites), rounds.
MANY_SITES, MANY_SITE_SIZE, MANY_BUDGET, MANY_ROUNDS = 12, 2_500, 10_000, 3


def _many_sites_rows(ctx: Ctx) -> list[Row]:
    """A store with more sites than its budget holds, each searched in turn, round after round, in a fresh
    process: the memories it holds (at most the budget plus the site in use) and its RSS, which must stop
    growing once the budget is reached."""
    docs = synthetic_docs(SITE_SIZE)
    data_dir = os.path.join(ctx.workdir, "ltm-many-sites")
    sites = [f"many-{i:02d}" for i in range(MANY_SITES)]
    for i, site in enumerate(sites):
        lo = (i * MANY_SITE_SIZE) % SITE_SIZE
        _site_with_vectors(data_dir, docs[lo:lo + MANY_SITE_SIZE], site)
    code = f"""
import json, statistics, time
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.encoder import default_encoder
default_encoder().embed_one("warm the encoder's arena")
ltm = LongTermMemory({data_dir!r}, index_budget={MANY_BUDGET})
sites = {sites!r}
base = rss()
worst, rss_at, reopen = 0.0, [], []
for rnd in range({MANY_ROUNDS}):
    for s in sites:
        t0 = time.perf_counter()
        ltm.search(s, "deploy on friday", limit=2)
        if rnd:
            reopen.append(time.perf_counter() - t0)
        held = sum(site.indexed() for site in ltm._sites.values())
        worst = max(worst, (held - ltm._sites[s].indexed()) / {MANY_BUDGET})
    rss_at.append(rss() - base)
fds = len(__import__('os').listdir('/proc/self/fd'))
print(json.dumps({{"worst": worst, "rss": rss_at, "reopen_s": statistics.median(reopen), "fds": fds}}))
ltm.close()
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    growth = res["rss"][-1] - res["rss"][0]
    what = f"{MANY_SITES} sites of {MANY_SITE_SIZE:,} memories, budget {MANY_BUDGET:,}, {MANY_ROUNDS} rounds"
    return [Row("memory", f"many sites: memories held beyond the site in use, most over the budget ({what})",
                "ratio", higher_better=False, samples={CONVMEM: [res["worst"]]},
                note=f"a released site's next search (read and rebuild) p50 {res['reopen_s'] * 1000:.0f} ms; "
                     f"{res['fds']} descriptors open at the end",
                extra={"headline": "ltm_many_sites_held_vs_budget", "value": res["worst"],
                       "reopen_s": res["reopen_s"], "fds": res["fds"]}),
            Row("memory", f"many sites: RSS growth from the end of round 1 to the end of round {MANY_ROUNDS} ({what})",
                "MiB", higher_better=False, samples={CONVMEM: [growth]},
                note="RSS above the store's start after each round: " + ", ".join(f"{x:.0f}" for x in res["rss"]),
                extra={"headline": "ltm_many_sites_rss_growth_mib", "value": growth, "rss_mib": res["rss"]})]


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
    ab = abstention_figures()
    for half, figs in ab.items():
        rows.append(Row("memory", f"abstention: no-answer hints that surface nothing, {half} half"
                        if half != "all" else "abstention: no-answer hints that surface nothing, all",
                        "share", samples={CONVMEM: [figs["abstention"]]},
                        note=f"near topic {figs['abstention_near']:.3f}, unrelated {figs['abstention_far']:.3f}; "
                             f"auto-surface recall@2 {figs['surface_recall2']:.3f} (search {figs['recall2']:.3f}), "
                             f"paraphrases {figs['surface_para_recall2']:.3f}",
                        extra={"half": half, **figs, "hints": sum(1 for h in no_answer()
                                                                 if half == "all" or h.dev == (half == "dev"))}))
    heads = [("ltm_fusion_recall2", res["fusion"]["all"][2], "fused recall@2, all queries"),
             ("ltm_fusion_recall2_test", test[2], "fused recall@2, test half"),
             ("ltm_para_recall2", res["fusion"]["paraphrase"][2], "fused recall@2, paraphrases"),
             ("ltm_abstention", ab["all"]["abstention"], "abstention, all no-answer hints"),
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
        # Every call ranks and encodes its query: no answer or query vector of an earlier call is reused
        # (the memories' vectors are the run's, encoded once).
        r = Retriever(d, answers_kept=0, query_vectors_kept=0, embedder=docs_only())
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
        rows.append(_paused_lookup_row(r, texts, 300 if ctx.quick else 1000))
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


#: The pause before each call of the paused lookup figure: what a server's worker sees between requests.
PAUSE_S = 0.005


def _paused_lookup_row(r: Retriever, texts: Sequence[str], calls: int) -> Row:
    """The memory_context lookup (a search of 4) one call at a time, each after a pause of :data:`PAUSE_S`.

    Back to back, a lookup finds the encoder's weights and the 15 MB vector matrix still in the
    caches; a server runs it between requests, after other work or none, and pays for reading them
    again. This is the in-process figure to set beside the MCP one.
    """
    ms, cpu = [], []
    for i in range(calls):
        time.sleep(PAUSE_S)
        c0, t0 = time.thread_time(), time.perf_counter()
        r.search(texts[i % len(texts)], limit=4)
        ms.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
    p50 = statistics.median(ms)
    return Row("memory", f"memory_context lookup after a {PAUSE_S * 1000:.0f} ms pause at {SITE_SIZE:,} memories, p50",
               "ms", higher_better=False, samples={CONVMEM: [p50]},
               note=f"p95 {_pct(ms, 0.95):.2f} ms; CPU time p50 {statistics.median(cpu):.2f} ms; {calls} calls, "
                    "each after a sleep (as a server's worker runs it between requests)",
               extra={"value": p50, "p95": _pct(ms, 0.95),
                      "calls": calls, "cpu_p50": statistics.median(cpu)})


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


@dataclass
class _Calls:
    """Per-call milliseconds of one kind of call: wall time, the server's CPU time (every thread), the client's."""

    wall: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)

    def cpu_note(self) -> str:
        return (f"server CPU {statistics.median(self.server_cpu):.2f} ms, "
                f"client CPU {statistics.median(self.client_cpu):.2f} ms")


async def _context_calls(url: str, pid: int, warm: list[str], texts: list[str]) -> tuple[_Calls, _Calls, _Calls]:
    """Interleaved per-call figures of recall_memory: without, with a new ``memory_context``, with it again.

    ``warm`` are the warm-up hints, ``texts`` the timed ones; no hint may appear twice. Each round is three
    calls: without a hint, with the next new hint, and with that same hint once more (what an agent working
    on one task does; the server may answer it from its table of recent answers). The server's CPU time
    (``pid``'s threads, read between calls) and the client's (this process) are taken around each call.
    """
    from .mcp_profile import cpu_seconds

    if len(set(warm + texts)) != len(warm) + len(texts):
        raise ValueError("every hint of the run must be new")
    plain, with_ctx, again = _Calls(), _Calls(), _Calls()
    async with mcpserver.client(url) as c:
        base = {"conversation_id": CONV, "count": 50}
        for hint in warm:  # warm up both paths
            await c.call_tool("recall_memory", base)
            await c.call_tool("recall_memory", {**base, "memory_context": hint})
        for hint in texts:
            for ctx_text, out in ((None, plain), (hint, with_ctx), (hint, again)):
                args = base if ctx_text is None else {**base, "memory_context": ctx_text}
                s0 = cpu_seconds(pid)
                c0, t0 = time.process_time(), time.perf_counter()
                r = await c.call_tool("recall_memory", args)
                t1, c1 = time.perf_counter(), time.process_time()
                out.wall.append((t1 - t0) * 1000)
                out.client_cpu.append((c1 - c0) * 1000)
                out.server_cpu.append((cpu_seconds(pid) - s0) * 1000)
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
        plain, with_ctx, again = anyio.run(_context_calls, server.url, server.pid, warm,
                                           texts[:100] if ctx.quick else texts)
    finally:
        server.stop()
    p0, p1, p2 = (statistics.median(c.wall) for c in (plain, with_ctx, again))
    added, lo, hi = paired_median_diff_ci(with_ctx.wall, plain.wall)
    cpu = {k: {"server": statistics.median(c.server_cpu), "client": statistics.median(c.client_cpu)}
           for k, c in (("without", plain), ("with", with_ctx), ("again", again))}
    return [Row("memory", f"{name} ({made:,} memories)", "ratio", higher_better=False,
                samples={CONVMEM: [p1 / p0]},
                note=f"{p1:.2f} ms with, {p0:.2f} ms without: +{added:.2f} ms [95% {lo:+.2f}, {hi:+.2f}]; "
                     f"{len(with_ctx.wall)} hints, each new; per call p50, with: {with_ctx.cpu_note()}; "
                     f"without: {plain.cpu_note()}",
                extra={"headline": "ltm_context_added_ms", "value": added, "ci": [lo, hi], "with_ms": p1,
                       "without_ms": p0, "memories": made, "cpu_ms": cpu}),
            Row("memory", f"MCP recall_memory with a repeated memory_context vs without, p50 ({made:,} memories)",
                "ratio", higher_better=False, samples={CONVMEM: [p2 / p0]},
                note=f"{p2:.2f} ms with, {p0:.2f} ms without: +{p2 - p0:.2f} ms; from the recent-answers table; "
                     f"per call p50: {again.cpu_note()}",
                extra={"headline": "ltm_context_repeat_added_ms", "value": p2 - p0, "with_ms": p2,
                       "without_ms": p0, "memories": made})]


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("memory: recall on the labelled set")
    rows = _recall_rows()
    rows.extend(_scale_rows())
    ctx.progress.step("memory: cold open of 10,000 memories", advance=1)
    site_dir = os.path.join(ctx.workdir, "ltm-open-data")
    _site_with_vectors(site_dir, synthetic_docs(SITE_SIZE))
    cold = _child_open(site_dir)
    rows.append(Row("memory", "sentence encoder cold load (imports and sha256 check included)", "s",
                    higher_better=False, samples={CONVMEM: [cold["model_s"]]}))
    rows.append(Row("memory", f"open of a {SITE_SIZE:,}-memory site (first search: log read, index built from "
                    "stored vectors)", "s", higher_better=False, samples={CONVMEM: [cold["open_s"]]},
                    note=f"CPU time {cold['open_cpu_s']:.2f} s; "
                         f"index +{cold['index_mib']:.0f} MiB RSS beyond the model; {cold['recomputed']:.0f} "
                         f"vectors recomputed; process peak RSS {cold['rss_mib']:.0f} MiB",
                    extra={"headline": "ltm_open_s", "value": cold["open_s"], "rss_mib": cold["rss_mib"],
                           "index_mib": cold["index_mib"], "recomputed": cold["recomputed"],
                           "cpu_s": cold["open_cpu_s"]}))
    per_10k = cold["index_mib"] * 10_000 / cold["memories"]
    rows.append(Row("memory", f"memory of a {SITE_SIZE:,}-memory site beyond the model (RSS after its open, "
                    "per 10,000 memories)", "MiB", higher_better=False, samples={CONVMEM: [per_10k]},
                    note=f"{cold['kept_mib']:.1f} MiB once the allocator returned what the open freed "
                         f"(malloc_trim); records, BM25 table, vector matrix",
                    extra={"headline": "ltm_mib_per_10k", "value": per_10k, "kept_mib": cold["kept_mib"],
                           "memories": cold["memories"]}))
    ctx.progress.step("memory: 8 searches in flight; many sites under the budget", advance=0)
    rows.append(_inflight_row(ctx, site_dir))
    rows.extend(_many_sites_rows(ctx))
    ctx.progress.step("memory: latency at 10,000 memories", advance=1)
    rows.extend(_latency_rows(ctx))
    ctx.progress.step("memory: recall_memory with and without memory_context over MCP", advance=1)
    rows.extend(_mcp_context_rows(ctx))
    ctx.progress.step("memory", advance=1)
    return rows
