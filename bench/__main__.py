"""``python -m bench``: convmem against the peers a user would pick, and against the floor.

Peers: SQLite tuned as a competent user tunes it and LMDB, both with a sync
per commit; the floor is ``pwrite`` into pre-zeroed space plus ``fdatasync``.
Operations are timed one by one, the backends taking turns op by op; the
table gives p50, p99, p99.9 and throughput per workload and backend, and
convmem's speed over each with a bootstrap 95% interval. ``--json PATH``
writes every sample, the headline ``ratios`` (and their intervals), the
machine and how quiet it was; ``--plot DIR`` draws the latency
distributions and throughput against writers (needs matplotlib: the
``bench`` extra). ``--quick`` runs reduced sizes in a few minutes, ``--smoke``
tiny ones (CI's check that the bench runs); either fails when a headline
ratio could not be produced.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
import traceback
from types import ModuleType
from typing import Any

from . import (
    append,
    coldopen,
    concurrency,
    environment,
    fsck,
    listing,
    mcp_e2e,
    memory,
    reads,
    report,
    rss,
    session,
    sqlite_peer,
    util,
    workers,
)
from .context import Ctx, Sizes
from .util import Progress, Row

WORKLOADS: dict[str, ModuleType] = {
    "append": append,
    "session": session,
    "reads": reads,
    "list": listing,
    "concurrency": concurrency,
    "open": coldopen,
    "fsck": fsck,
    "mcp": mcp_e2e,
    "rss": rss,
    "memory": memory,
    "workers": workers,
}

#: Which workload produces each headline ratio.
RATIO_SOURCE = {
    "append1_vs_sqlite": "append", "append10_vs_sqlite": "append", "append100_vs_sqlite": "append",
    "append10_vs_floor": "append", "append10_vs_lmdb": "append", "append10_p99_over_p50": "append",
    "new_conversation_vs_append": "session", "new_conversation_vs_sqlite": "session", "recall_vs_sqlite": "reads",
    "recall_wide_vs_sqlite": "reads",
    "recall_growth_100k_vs_1k": "reads", "replay_vs_sqlite": "reads", "writers16_vs_sqlite": "concurrency",
    "writers16_vs_floor": "concurrency", "writers16_vs_sqlite_group": "concurrency",
    "same_conversation4_vs_1": "concurrency", "list_growth_100k_vs_1k": "list", "open_100k_ms": "open",
    "mcp_recall_vs_noop_tool": "mcp", "replay_rss_vs_payload": "rss",
    "mcp_ping_vs_bare_app": "mcp", "mcp_recall50_minus_ping_ms": "mcp", "mcp_append1_minus_engine_ms": "mcp",
    "mcp_recall_calls_per_s_8": "mcp",
}
assert set(RATIO_SOURCE) == set(report.RATIO_KEYS)

def _machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kib"] = int(f.readline().split()[1])
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["processor"] = line.split(":", 1)[1].strip()
                    break
    except (OSError, ValueError, IndexError):
        pass
    return info


def _peers() -> dict[str, Any]:
    return {"sqlite": {"pragmas": {**sqlite_peer.PRAGMAS, "synchronous": "FULL"}, "cached_statements": 64,
                       "keys": "INTEGER PRIMARY KEY = conversation id << 32 | seq", "payload": "BLOB (compact JSON)"},
            "lmdb": {"sync": True, "metasync": True, "transaction": "one write transaction per batch"},
            "floor": "pwrite into pre-zeroed, synced space + fdatasync per batch (one pwritev, RWF_DSYNC, if any)",
            "floor-extending": "append (O_APPEND) + fdatasync per batch: the file grows on every sync (RWF_DSYNC too)",
            "sqlite-text-schema": "the text-keyed WITHOUT ROWID schema with JSON text payloads (extra row)",
            "sqlite-normal": "the tuned SQLite with synchronous=NORMAL: not durable per commit (reference only)",
            "sqlite-group": "the tuned SQLite behind one writer thread committing queued batches together"}


def _plot(doc: dict[str, Any], out: str) -> list[str]:
    from . import plot

    return plot.draw(doc, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="reduced sizes: a few minutes")
    size.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every workload and ratio works")
    p.add_argument("--json", metavar="PATH", help="write every sample and figure to this JSON file")
    p.add_argument("--plot", metavar="DIR", help="draw latency distributions and throughput against writers here")
    p.add_argument("--from-json", metavar="PATH", help="with --plot: draw from a saved --json file, run nothing")
    p.add_argument("--only", metavar="NAMES", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    p.add_argument("--workdir", metavar="DIR", help="where to build data (default: a fresh temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory afterwards")
    p.add_argument("--no-postgres", action="store_true", help="leave convmem's PostgreSQL backend out")
    p.add_argument("--durable-setup", action="store_true",
                   help="build the read/list data with every sync on (slow; same bytes on disk)")
    args = p.parse_args(argv)

    if args.from_json:
        if not args.plot:
            p.error("--from-json needs --plot DIR")
        with open(args.from_json) as f:
            doc = json.load(f)
        for path in _plot(doc, args.plot):
            print(path)
        return 0

    names = list(WORKLOADS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s): {', '.join(unknown)}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib: pip install -e '.[bench]'")
    sizes = Sizes.smoke() if args.smoke else Sizes.quick() if args.quick else Sizes()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    base = args.workdir or tempfile.mkdtemp(prefix="convmem-bench-")
    os.makedirs(base, exist_ok=True)
    quiet = environment.Quiet()
    progress = Progress(1)
    ctx = Ctx(base, sizes, args.quick or args.smoke, args.durable_setup, progress, want_postgres=not args.no_postgres)
    progress.total = sum(WORKLOADS[n].steps(ctx) for n in names)
    started = time.monotonic()
    rows: list[Row] = []
    failures: dict[str, str] = {}
    try:
        for name in names:
            try:
                rows.extend(WORKLOADS[name].run(ctx))
            except Exception as exc:  # one broken workload must not lose the others' figures
                failures[name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc(file=sys.stderr)
    finally:
        progress.close()
        ctx.close()
        if not args.keep and not args.workdir:
            shutil.rmtree(base, ignore_errors=True)
    seconds = time.monotonic() - started
    env = quiet.report()
    full, where = report.ratios(rows)
    r = {k: (None if v is None else v[0]) for k, v in full.items()}
    intervals = {k: (None if v is None else [v[1], v[2]]) for k, v in full.items()}
    ts = report.targets(r)
    mem = report.memory_figures(rows) if "memory" in names else {}
    missing = [k for k, v in r.items() if v is None and RATIO_SOURCE[k] in names and RATIO_SOURCE[k] not in failures]
    print(f"convmem bench ({mode}, {seconds:.0f} s; every operation timed, backends interleaved op by op; "
          "'convmem vs it' is convmem's speed over the other's at p50, above 1x = convmem faster)")
    print(report.table(rows))
    print("\nratios (value, bootstrap 95% interval):")
    print(report.targets_text(ts, intervals))
    if mem:
        print("\nlong-term memory:")
        print(report.targets_text(report.targets(mem, report.MEMORY_TARGETS), report.memory_intervals(rows)))
    if where:
        print("\nsizes: " + "; ".join(f"{k}: {v}" for k, v in where.items()))
    steal = env["cpu_steal_share"]
    print(f"\nmachine: load average {env['loadavg_start']} -> {env['loadavg_end']}, "
          f"CPU steal {'unknown' if steal is None else f'{steal:.1%}'}")
    if env["noisy"]:
        print("WARNING: this run was NOISY (" + "; ".join(env["noisy_reasons"]) + "): its figures carry more noise "
              "than their intervals show; rerun on a quiet machine before quoting them.")
    background: dict[str, dict[str, Any]] = {
        k: {"waited_s": round(v[0], 4), "timed_s": round(v[1], 4), "calls": int(v[2]),
            "ran_s": {kind: round(t, 4) for kind, t in util.BACKGROUND_KINDS.get(k, {}).items()}}
        for k, v in util.BACKGROUND.items() if k.split(" / ")[-1].startswith(util.CONVMEM)}
    if background:
        print("\nbackground work waited for between calls (convmem's extend-ahead jobs and pool refills; not in "
              "the latencies above, which are what a caller sees):")
        for k, v in background.items():
            if v["waited_s"] < 10e-6 * v["calls"]:
                continue  # only the check itself (a lock): no job ran
            kinds = ", ".join(f"{kind} {t / v['calls'] * 1e6:.0f} µs" for kind, t in sorted(v["ran_s"].items()))
            print(f"  {k}: {v['waited_s'] / v['calls'] * 1e6:.0f} µs per call on average, "
                  f"{v['waited_s'] / v['timed_s']:.1%} on top of the calls' own time"
                  + (f" (jobs ran per call: {kinds})" if kinds else ""))
    for name, why in failures.items():
        print(f"\nworkload {name} failed: {why}")
    if missing:
        print(f"\nERROR: headline ratio(s) not produced: {', '.join(missing)}", file=sys.stderr)
    doc = {
        "mode": mode,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds)),
        "seconds": round(seconds, 1),
        "machine": _machine(),
        "environment": env,
        "noisy": env["noisy"],
        "durable_setup": args.durable_setup,
        "peers": _peers(),
        "ratios": r,
        "ratio_intervals": intervals,
        "ratio_sizes": where,
        "targets": ts,
        "memory_figures": mem,
        "memory_intervals": report.memory_intervals(rows) if mem else {},
        "results": [row.to_json() for row in rows],
        "failures": failures,
        "missing_ratios": missing,
        "background_waits": background,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if args.plot:
        for path in _plot(doc, args.plot):
            print(f"plot: {path}")
    return 1 if failures or missing else 0


if __name__ == "__main__":
    sys.exit(main())
