"""``convmem fsck``: verify a data directory, report every problem, repair what is safe.

Exit status as ``e2fsck``: 0 clean; 1 problems found and all repaired; 4
problems left; 8 operational error (bad arguments, unreadable directory).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from logstore.maintenance import CheckReport, MaintenanceError, Problem, check
from tools import memories
from tools.common import (
    EXIT_CLEAN,
    EXIT_OPERATIONAL,
    EXIT_PROBLEMS_LEFT,
    EXIT_REPAIRED,
    command,
    exit_8_on_usage_error,
    fail,
    plural,
)
from tools.progress import ProgressBar


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "fsck",
        help="check (and repair) a data directory",
        description="Read every record of every segment and check framing, checksums, seqs, batches, "
        "recorded_at order, indexes, manifests and stray files. Safe on a live data directory. "
        "Exit status: 0 clean, 1 all problems repaired, 4 problems left, 8 operational error.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--site", metavar="S", help="check only this site")
    p.add_argument("--conversation", metavar="ID", help="check only this conversation")
    p.add_argument(
        "--repair",
        action="store_true",
        help="truncate torn tails, rebuild indexes and manifests; never deletes acknowledged data",
    )
    p.add_argument(
        "--truncate-at-corruption",
        action="store_true",
        help="also drop each damaged log from its first damaged record on, after copying the segments "
        "into DATA_DIR/quarantine/ (implies --repair; loses the reported seqs)",
    )
    p.add_argument("--json", action="store_true", help="print one machine-readable report on stdout")
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a busy conversation (default 30)",
    )
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def exit_status(report: CheckReport) -> int:
    """0 clean, 1 everything found was repaired, 4 problems left."""
    if not report.problems:
        return EXIT_CLEAN
    return EXIT_PROBLEMS_LEFT if report.unrepaired else EXIT_REPAIRED


def format_problem(p: Problem) -> str:
    """Two lines: where and what, then what was or can be done."""
    where = " ".join(
        part
        for part in (
            f"site {p.site}" if p.site else "",
            f"conversation {p.conversation_id}" if p.conversation_id else "",
        )
        if part
    )
    at = f" at byte {p.offset}" if p.offset is not None else ""
    state = "REPAIRED" if p.repaired else "LEFT"
    return f"{p.kind}: {where + ': ' if where else ''}{p.file}{at}\n    {p.detail}\n    {state}: {p.action}"


def run(args: argparse.Namespace) -> int:
    bar = ProgressBar(sys.stderr)
    started = time.monotonic()
    try:
        report = check(
            args.data_dir,
            site=args.site,
            conversation=args.conversation,
            repair=args.repair,
            truncate_at_corruption=args.truncate_at_corruption,
            progress=bar if bar.enabled and not args.json else None,
            lock_timeout=args.lock_timeout,
        )
    except MaintenanceError as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    except OSError as exc:
        return fail(f"cannot read {args.data_dir}: {exc}", EXIT_OPERATIONAL)
    finally:
        bar.close()
    elapsed = time.monotonic() - started
    status = exit_status(report)
    memory_doc: dict[str, object] = {}
    if args.json:
        status = memories.fsck(args, status, memory_doc)
        doc = {
            "data_dir": args.data_dir,
            "exit_status": status,
            "sites": report.sites,
            "conversations": report.conversations,
            "segments": report.segments,
            "records": report.records,
            "bytes": report.bytes_scanned,
            "seconds": round(elapsed, 3),
            "problems": [p.to_dict() for p in report.problems],
            **memory_doc,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return status
    for p in report.problems:
        sys.stdout.write(format_problem(p) + "\n")
    rate = report.bytes_scanned / elapsed / 2**20 if elapsed > 0 else 0.0
    left = len(report.unrepaired)
    sys.stdout.write(
        f"{args.data_dir}: {plural(report.sites, 'site')}, {plural(report.conversations, 'conversation')}, "
        f"{plural(report.segments, 'segment')}, {plural(report.records, 'record')}, "
        f"{report.bytes_scanned} bytes in {elapsed:.2f} s ({rate:.1f} MiB/s); "
        f"{plural(len(report.problems), 'problem')}, {len(report.problems) - left} repaired, {left} left\n"
    )
    return memories.fsck(args, status, None)
