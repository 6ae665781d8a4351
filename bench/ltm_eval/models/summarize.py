"""Print the recall and latency tables from a directory of result files.

Usage: ``python3 bench/ltm_eval/models/summarize.py [DIR]``: any Python 3.11+, standard library only (it
imports nothing of the repository; ``-m bench.ltm_eval.models.summarize`` works too, but importing the
package needs what bench.ltm_eval imports).
DIR defaults to ``$CONVMEM_MODELS_DIR/results``; result files are kept outside the tree.
Recall rows come from results.jsonl, results_wide.jsonl, results_doctext.jsonl (then any other
results*.jsonl); latency rows from latency.jsonl, latency2.jsonl, ... (one file per round).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: as in paths.py, which is not imported so that this file runs on its own
RESULTS = Path(os.environ.get("CONVMEM_MODELS_DIR") or "/tmp/convmem-models") / "results"
RESULT_FILES = ("results.jsonl", "results_wide.jsonl", "results_doctext.jsonl")


def _intkeys(o: Any) -> Any:
    """JSON turns the k of recall@k into strings: back to ints."""
    if isinstance(o, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): _intkeys(v) for k, v in o.items()}
    return o


def load(p: Path) -> list[dict[str, Any]]:
    return [_intkeys(json.loads(line)) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def result_files(d: Path) -> list[Path]:
    rest = sorted(p for p in d.glob("results*.jsonl") if p.name not in RESULT_FILES)
    return [d / n for n in RESULT_FILES] + rest


def latency_files(d: Path) -> list[Path]:
    def round_no(p: Path) -> int:
        m = re.fullmatch(r"latency(\d*)\.jsonl", p.name)
        return int(m.group(1) or 1) if m else 0

    return sorted((p for p in d.glob("latency*.jsonl") if round_no(p)), key=round_no)


def f3(x: float) -> str:
    return f"{x:.3f}"


def trio(m: dict[str, dict[int, float]], k: int = 2) -> str:
    return "/".join(f3(m[g][k]) for g in ("all", "paraphrase", "rest"))


def recall_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["== recall (shipped Tuning; fused = the project's Retriever with this embedder)",
           f"{'model':<34} {'text':<6} {'R@1 e':>6} {'R@2 e all/para/rest':>20} {'R@5 e':>6}  {'R@1 f':>6} "
           f"{'R@2 fused all/para/rest':>24} {'R@5 f':>6} {'dev/test f R@2':>15}  dev-tuned(gate,sem): test/all/para"]
    for r in rows:
        s = r["shipped_tuning"]
        e, fu = s["embeddings"]["all"], s["fusion"]
        txt = ("raw" if r["raw"] else "terms") + (
            "" if r.get("doctext") in (None, "fields", "embedding_text") else ":" + r["doctext"])
        dt = r.get("dev_tuned")
        dts = ""
        if dt:
            dts = (f"({dt['lexical_gate']},{dt['semantic']}){' wide' if dt.get('wide') else ''}: "
                   f"{f3(dt['test_r2'])}/{f3(dt['all_r2'])}" + (f"/{f3(dt['para_r2'])}" if "para_r2" in dt else ""))
        out.append(f"{r['model']:<34} {txt:<6} {f3(e['all'][1]):>6} {trio(e):>20} {f3(e['all'][5]):>6}  "
                   f"{f3(fu['all']['all'][1]):>6} {trio(fu['all']):>24} {f3(fu['all']['all'][5]):>6} "
                   f"{f3(fu['dev']['all'][2]) + '/' + f3(fu['test']['all'][2]):>15}  {dts}")
    return out


def halves_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["== embeddings alone R@2 by half (dev/test)"]
    for r in rows:
        e = r["shipped_tuning"]["embeddings"]
        out.append(f"{r['model']:<22} {'raw' if r['raw'] else 'terms':<6} "
                   f"dev {f3(e['dev']['all'][2])} (para {f3(e['dev']['paraphrase'][2])})  "
                   f"test {f3(e['test']['all'][2])} (para {f3(e['test']['paraphrase'][2])})")
    return out


def latency_rounds(rounds: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    out = ["== latency (ms, single thread, 266 queries x 3 after warm-up); one line per round"]
    for name, rows in rounds:
        for d in rows:
            fp = ""
            if "encode_terms_fastpath" in d:
                fp = (f" fastpath terms {d['encode_terms_fastpath']['p50']}/{d['encode_terms_fastpath']['p95']}"
                      f" raw {d['encode_raw_fastpath']['p50']}/{d['encode_raw_fastpath']['p95']}")
            et, er = d["encode_terms"], d["encode_raw"]
            out.append(f"{name:<15} {d['model']:<22} terms p50/p95 {et['p50']}/{et['p95']}"
                       f"  raw {er['p50']}/{er['p95']}  search p50 {d['search_limit4']['p50']}"
                       f"  RSS after load {d['rss_after_load_mb']} MB (+{d['rss_delta_mb']})"
                       f" load1m {d.get('loadavg_1m_at_end', '?')}{fp}")
    return out


def _span(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def latency_ranges(rounds: list[tuple[str, list[dict[str, Any]]]]) -> list[str]:
    """Per model, the range (min-max) over every round that measured it."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for _, rows in rounds:
        for d in rows:
            by_model.setdefault(d["model"], []).append(d)
    out = ["== latency ranges over rounds (ms, single thread; min-max of each round's p50 and p95)",
           f"{'model':<24} {'n':>2} {'encode terms p50':>16} {'p95':>13} {'encode raw p50':>15} {'p95':>13} "
           f"{'search p50':>12} {'RSS delta MB':>13}"]
    for model, ds in by_model.items():
        def col(key: str, q: str, ds: list[dict[str, Any]] = ds) -> str:
            return _span([d[key][q] for d in ds])

        out.append(f"{model:<24} {len(ds):>2} {col('encode_terms', 'p50'):>16} {col('encode_terms', 'p95'):>13} "
                   f"{col('encode_raw', 'p50'):>15} {col('encode_raw', 'p95'):>13} {col('search_limit4', 'p50'):>12} "
                   f"{_span([d['rss_delta_mb'] for d in ds]):>13}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="summarize.py", description=__doc__)
    ap.add_argument("dir", nargs="?", type=Path, default=RESULTS, help="directory of results*.jsonl, latency*.jsonl")
    a = ap.parse_args(argv)
    rows = [r for p in result_files(a.dir) for r in load(p)]
    rounds = [(p.name, load(p)) for p in latency_files(a.dir)]
    lines = [*recall_table(rows), "", *halves_table(load(a.dir / "results.jsonl")),
             "", *latency_rounds(rounds), "", *latency_ranges(rounds)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
