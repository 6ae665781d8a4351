"""``--plot DIR``: what engineers look at rather than read.

* ``latency-GROUP.png``: for each workload of the group, the distribution of
  single-operation times per backend as an empirical CDF on a log time axis,
  the tail magnified (the y axis is the fraction of operations faster than
  x, drawn on a logit-like scale so p99 and p99.9 are visible), with the
  p50/p99/p99.9 marks;
* ``throughput-vs-writers.png``: acknowledged batches per second against the
  number of writers (threads and processes, distinct conversations), per
  backend, on log-log axes.

Drawn from the JSON document (``--json``), so ``--plot DIR --from-json
PATH`` redraws a saved run. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import os
from typing import Any

COLORS = {"convmem": "#d62728", "sqlite": "#1f77b4", "lmdb": "#2ca02c", "floor": "#7f7f7f",
          "postgres": "#9467bd", "sqlite-group": "#17becf", "sqlite-text-schema": "#aec7e8",
          "sqlite-normal": "#ff9896", "floor-extending": "#c7c7c7"}
DASHED = {"sqlite-text-schema", "sqlite-normal", "floor-extending"}


def _ecdf(ax: Any, name: str, seconds: list[float]) -> None:
    import numpy as np

    ms = np.sort(np.asarray(seconds) * 1000)
    n = len(ms)
    frac = (np.arange(1, n + 1) - 0.5) / n
    ax.plot(ms, frac, label=name, color=COLORS.get(name), linestyle="--" if name in DASHED else "-", linewidth=1.3)


def _latency(doc: dict[str, Any], out: str) -> list[str]:
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in doc["results"]:
        if r.get("per_op") or r.get("latencies"):
            groups.setdefault(r["group"], []).append(r)
    paths = []
    for group, rows in groups.items():
        cols = min(len(rows), 2)
        lines = -(-len(rows) // cols)
        fig, axes = plt.subplots(lines, cols, figsize=(6.5 * cols, 4 * lines), squeeze=False)
        for ax, r in zip(axes.flat, rows, strict=False):
            data = r["samples"] if r.get("per_op") else r.get("latencies", {})
            for name, seconds in data.items():
                if seconds:
                    _ecdf(ax, name, seconds)
            ax.set_xscale("log")
            ax.set_yscale("logit")
            ax.set_ylim(0.005, 0.9995)
            for q in (0.5, 0.99, 0.999):
                ax.axhline(q, color="#dddddd", linewidth=0.8, zorder=0)
            ax.set_yticks([0.01, 0.1, 0.5, 0.9, 0.99, 0.999])
            ax.set_yticklabels(["p1", "p10", "p50", "p90", "p99", "p99.9"])
            ax.set_xlabel("time per operation (ms, log)")
            ax.set_title(r["name"], fontsize=9)
            ax.grid(True, which="both", axis="x", color="#eeeeee")
            ax.legend(fontsize=7, loc="lower right")
        for ax in list(axes.flat)[len(rows):]:
            ax.set_visible(False)
        mode = doc.get("mode", "?")
        noisy = " (NOISY run)" if doc.get("noisy") else ""
        fig.suptitle(f"convmem bench, {group}: latency distribution per backend ({mode} run{noisy})")
        fig.tight_layout()
        path = os.path.join(out, f"latency-{group}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _writers(doc: dict[str, Any], out: str) -> list[str]:
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if r["group"] == "concurrency" and r.get("extra", {}).get("distinct")]
    if not rows:
        return []
    hows = sorted({r["extra"]["how"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(hows), figsize=(6.5 * len(hows), 4.2), squeeze=False)
    for ax, how in zip(axes.flat, hows, strict=True):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in rows:
            if r["extra"]["how"] != how:
                continue
            for name, med in r["median"].items():
                if med:
                    series.setdefault(name, []).append((r["extra"]["writers"], med))
        for name, pts in series.items():
            pts.sort()
            ax.plot([w for w, _ in pts], [v for _, v in pts], marker="o", label=name, color=COLORS.get(name))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"writers ({how}, one conversation each)")
        ax.set_ylabel("acknowledged 10-item batches / s")
        ax.grid(True, which="both", color="#eeeeee")
        ax.legend(fontsize=8)
    fig.suptitle(f"convmem bench: throughput against writers ({doc.get('mode', '?')} run)")
    fig.tight_layout()
    path = os.path.join(out, "throughput-vs-writers.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def draw(doc: dict[str, Any], out: str) -> list[str]:
    """Draw every figure of ``doc`` into directory ``out``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(out, exist_ok=True)
    return _latency(doc, out) + _writers(doc, out)
