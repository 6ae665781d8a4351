"""``convmem backup DATA_DIR DEST``: a consistent copy of a live data directory, writers keep running.

Each conversation in DEST is a prefix of whole batches it held at some moment
during the backup; credentials (``auth/``) and quarantined segments come
along, and so does each site's long-term memory store (copied under its own
lock) with the verify-token secret; indexes and manifests are rebuilt in the
copy, which is then checked as ``convmem fsck`` would (memories included).
DEST is created (it must not exist) and appears only when the copy is complete.
To restore, stop the server and serve from
DEST (or move it into place).

Exit status: 0 the copy is clean; 4 the copy holds damage that was already in
the source (listed; run ``convmem fsck`` on the source); 8 operational error.
"""

from __future__ import annotations

import argparse
import sys

from convmem.logstore import StoreError
from convmem.logstore.maintenance import MaintenanceError, backup
from convmem.logstore.memories.backup import MEMORY_BACKUP
from convmem.logstore.memories.check import check as memory_check

from .common import (
    EXIT_CLEAN,
    EXIT_OPERATIONAL,
    EXIT_PROBLEMS_LEFT,
    command,
    exit_8_on_usage_error,
    fail,
    human_bytes,
    plural,
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "backup",
        help="copy a live data directory consistently",
        description="Copy the data directory DATA_DIR, while the server keeps serving it, to the new "
        "directory DEST. Every conversation is copied as whole batches; the copy is verified.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("dest", metavar="DEST", help="a directory that does not exist yet")
    p.add_argument(
        "--lock-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long to wait for a conversation an append holds (default 30)",
    )
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def run(args: argparse.Namespace) -> int:
    try:
        report = backup(args.data_dir, args.dest, lock_timeout=args.lock_timeout, extras=(MEMORY_BACKUP,))
    except (MaintenanceError, StoreError, OSError) as exc:
        return fail(f"backup failed: {exc}", EXIT_OPERATIONAL)
    sys.stderr.write(
        f"backed up {plural(report.sites, 'site')}, {plural(report.conversations, 'conversation')} "
        f"({plural(report.segments, 'segment')}, {human_bytes(report.bytes_copied)}) to {report.dest}\n"
    )
    left: list[tuple[str, str, int | None, str]] = [
        (p.kind, p.file, p.offset, p.detail) for p in report.check.unrepaired
    ]
    try:
        memory_report = memory_check(report.dest, lock_timeout=args.lock_timeout)
    except (StoreError, OSError) as exc:
        return fail(f"checking the copy's memories failed: {exc}", EXIT_OPERATIONAL)
    left += [(p.kind, p.file, p.offset, p.detail) for p in memory_report.unrepaired]
    if left:
        for kind, file, offset, detail in left:
            where = f" at byte {offset}" if offset is not None else ""
            sys.stderr.write(f"  {kind}: {file}{where}: {detail}\n")
        return fail(
            f"the copy holds {plural(len(left), 'problem')} found in the source's data; "
            "run `convmem fsck` on the source",
            EXIT_PROBLEMS_LEFT,
        )
    return EXIT_CLEAN
