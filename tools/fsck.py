"""``convmem fsck``: verify a data directory, report every problem, repair what is safe.

Exit status as ``e2fsck``: 0 clean; 1 problems found and all repaired; 4
problems left; 8 operational error (bad arguments, unreadable directory).
A state that a crash leaves and the engine resolves by itself (a torn tail
never acknowledged, an intent whose writer died before its commit) is printed
as a NOTE saying what the engine will do; it does not count as a problem.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from convmem.logstore import StoreError
from convmem.logstore.maintenance import (
    BAD_BATCH,
    CORRUPT_RECORD,
    CheckReport,
    MaintenanceError,
    Problem,
    SalvagedRecord,
    SalvageRefused,
    check,
    check_access,
    salvage,
)

from . import memories
from .common import (
    EXIT_CLEAN,
    EXIT_OPERATIONAL,
    EXIT_PROBLEMS_LEFT,
    EXIT_REPAIRED,
    command,
    exit_8_on_usage_error,
    fail,
    plural,
)
from .progress import ProgressBar


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "fsck",
        help="check (and repair) a data directory",
        description="Read every record of every segment and check framing, checksums, seqs, batches, "
        "recorded_at order, indexes, manifests and stray files. Safe on a live data directory. "
        "Exit status: 0 clean, 1 all problems repaired, 4 problems left, 8 operational error.",
    )
    p.add_argument(
        "data_dir", metavar="DATA_DIR", help="a data directory, or a postgresql:// URI (checks its long-term memories)"
    )
    p.add_argument("--pg-schema", default="convmem", help="schema when DATA_DIR is PostgreSQL")
    p.add_argument("--site", metavar="S", help="check only this site")
    p.add_argument("--conversation", metavar="ID", help="check only this conversation")
    p.add_argument(
        "--repair",
        action="store_true",
        help="truncate torn tails, rebuild indexes and manifests, and replace each damaged record by a loss "
        "record that keeps its seqs (the original bytes go to DATA_DIR/quarantine/); every intact record is kept",
    )
    p.add_argument(
        "--truncate-at-corruption",
        action="store_true",
        help="also drop each damaged log from its first damaged record on, after copying the segments "
        "into DATA_DIR/quarantine/ (implies --repair; loses the reported seqs)",
    )
    p.add_argument("--json", action="store_true", help="print one machine-readable report on stdout")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="print every note in full, including the commits running writers still owe (summarised otherwise)",
    )
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
    """0 clean (notes only), 1 everything found was repaired, 4 problems left."""
    if report.unrepaired:
        return EXIT_PROBLEMS_LEFT
    return EXIT_REPAIRED if any(p.repaired for p in report.problems) else EXIT_CLEAN


def salvage_damaged(data_dir: str, report: CheckReport, lock_timeout: float) -> None:
    """``--repair`` of damaged records: replace each by a loss record keeping its seqs, and say so in the report."""
    convs = sorted(
        {
            (p.site, p.conversation_id)
            for p in report.unrepaired
            if p.kind in (CORRUPT_RECORD, BAD_BATCH) and p.site and p.conversation_id
        }
    )
    for site, cid in convs:
        mine = [p for p in report.unrepaired if (p.site, p.conversation_id) == (site, cid)]
        try:
            res = salvage(data_dir, site, cid, lock_timeout=lock_timeout)
        except (MaintenanceError, StoreError, OSError) as exc:
            for p in mine:
                if p.kind in (CORRUPT_RECORD, BAD_BATCH):
                    p.action = f"replacing the damaged record failed: {exc}"
            continue
        done: dict[tuple[str, int | None], SalvagedRecord] = {(r.file, r.offset): r for r in res.salvaged}
        refused: dict[tuple[str, int | None], SalvageRefused] = {(r.file, r.offset): r for r in res.refused}
        for p in mine:
            r = done.get((p.file, p.offset))
            if r is not None:
                p.repaired = True
                lost = f"seqs {r.first_seq}..{r.last_seq} now read as lost" if r.last_seq >= r.first_seq else "no seqs"
                p.action = (
                    f"replaced by a loss record ({lost}; every other record kept); "
                    f"the original segment is in {r.quarantine}"
                )
            elif (p.file, p.offset) in refused:
                p.action = f"not replaced: {refused[(p.file, p.offset)].why}"


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
    state = "REPAIRED" if p.repaired else "NOTE" if p.resolves_itself else "LEFT"
    return f"{p.kind}: {where + ': ' if where else ''}{p.file}{at}\n    {p.detail}\n    {state}: {p.action}"


def summarise_owed(owed: list[Problem]) -> str:
    """One note per site for the commits writers still owe, instead of three lines per conversation.

    A writer logs a batch's commit in the listing with its next intent or at
    close, so on a live directory every conversation a running (or idle)
    writer wrote last shows an intent without its commit while its batch is
    in the log. Nothing is wrong: the engine settles them at the next listing.
    """
    by_site: dict[str, list[str]] = {}
    for p in owed:
        by_site.setdefault(p.site or "?", []).append(p.conversation_id or "?")
    out = []
    for site, convs in sorted(by_site.items()):
        shown = ", ".join(sorted(convs)[:3]) + (", ..." if len(convs) > 3 else "")
        out.append(
            f"intent-unresolved: site {site}: {plural(len(convs), 'conversation')} ({shown}) with the commit of "
            "its last batch still owed by a writer (the batch is in the log)\n"
            "    NOTE: none needed: a running writer logs these commits with its next intent or at close, and "
            "the engine settles them at the site's next listing (--verbose lists each)\n"
        )
    return "".join(out)


def run(args: argparse.Namespace) -> int:
    if str(args.data_dir).startswith(("postgresql://", "postgres://")):
        from .pg_fsck import run as run_pg

        return run_pg(args)
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
        if args.repair and not args.truncate_at_corruption:
            salvage_damaged(args.data_dir, report, args.lock_timeout)
    except MaintenanceError as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    except OSError as exc:
        return fail(f"cannot read {args.data_dir}: {exc}", EXIT_OPERATIONAL)
    finally:
        bar.close()
    elapsed = time.monotonic() - started
    access = check_access(args.data_dir)  # loose modes are warnings; symlinks are refused by the store
    status = exit_status(report)
    if any(a.kind == "SYMLINK" for a in access):
        status = max(status, EXIT_PROBLEMS_LEFT)
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
            "access": [{"kind": a.kind, "path": a.path, "mode": f"{a.mode:04o}"} for a in access],
            **memory_doc,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return status
    owed = [] if args.verbose else [p for p in report.problems if p.owed_commit and not p.repaired]
    summarised = {id(p) for p in owed}
    for p in report.problems:
        if id(p) not in summarised:
            sys.stdout.write(format_problem(p) + "\n")
    sys.stdout.write(summarise_owed(owed))
    for a in access:
        sys.stdout.write(f"{'SYMLINK' if a.kind == 'SYMLINK' else 'WARNING'}: {a.describe()}\n")
    rate = report.bytes_scanned / elapsed / 2**20 if elapsed > 0 else 0.0
    left = len(report.unrepaired)
    notes = len(report.notes)
    found = len(report.problems) - notes
    sys.stdout.write(
        f"{args.data_dir}: {plural(report.sites, 'site')}, {plural(report.conversations, 'conversation')}, "
        f"{plural(report.segments, 'segment')}, {plural(report.records, 'record')}, "
        f"{report.bytes_scanned} bytes in {elapsed:.2f} s ({rate:.1f} MiB/s); "
        f"{plural(found, 'problem')}, {found - left} repaired, {left} left"
        + (f"; {plural(notes, 'note')} (resolved by the engine itself)" if notes else "")
        + "\n"
    )
    return memories.fsck(args, status, None)
