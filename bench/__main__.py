"""``python -m bench``: convmem against SQLite and the floor, in one process and one run.

Prints a table of medians with convmem's speed relative to SQLite and to the
floor, the headline ``ratios`` and the engine's targets; ``--json PATH``
writes every figure (per-round samples included). ``--quick`` runs a reduced
version in under two minutes.
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

from . import append, coldopen, concurrency, fsck, listing, mcp_e2e, memory, reads, rss
from .context import Ctx, Sizes
from .report import ratios, table, targets, targets_text
from .util import Progress, Row

WORKLOADS: dict[str, ModuleType] = {
    "append": append,
    "reads": reads,
    "list": listing,
    "concurrency": concurrency,
    "open": coldopen,
    "fsck": fsck,
    "mcp": mcp_e2e,
    "rss": rss,
    "memory": memory,
}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="reduced sizes: runs in under two minutes")
    p.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    p.add_argument("--only", metavar="NAMES", help=f"comma-separated subset of: {', '.join(WORKLOADS)}")
    p.add_argument("--workdir", metavar="DIR", help="where to build data (default: a fresh temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory afterwards")
    p.add_argument("--durable-setup", action="store_true",
                   help="build the read/list data with every sync on (slow; same bytes on disk)")
    args = p.parse_args(argv)

    names = list(WORKLOADS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s): {', '.join(unknown)}")
    sizes = Sizes.quick() if args.quick else Sizes()
    base = args.workdir or tempfile.mkdtemp(prefix="convmem-bench-")
    os.makedirs(base, exist_ok=True)
    progress = Progress(1)
    ctx = Ctx(base, sizes, args.quick, args.durable_setup, progress)
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
    r = ratios(rows)
    ts = targets(r)
    mode = "quick" if args.quick else "full"
    print(f"convmem bench ({mode}, {time.monotonic() - started:.0f} s; medians of interleaved rounds; "
          "ratios are convmem's speed over the other's, above 1x = convmem faster)")
    print(table(rows))
    print("\nratios:")
    for k, v in r.items():
        print(f"  {k:<26} {'unavailable' if v is None else f'{v:.3f}'}")
    print("\ntargets:")
    print(targets_text(ts))
    for name, why in failures.items():
        print(f"\nworkload {name} failed: {why}")
    if args.json:
        doc = {
            "mode": mode,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - (time.monotonic() - started))),
            "seconds": round(time.monotonic() - started, 1),
            "machine": _machine(),
            "durable_setup": args.durable_setup,
            "ratios": r,
            "targets": ts,
            "results": [row.to_json() for row in rows],
            "failures": failures,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
