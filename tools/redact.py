"""``convmem redact SITE CONVERSATION --seqs A-B``: replace items A..B by tombstones, erasing their payloads.

Each item of the range keeps its seq and ``recorded_at`` and reads as
``{"redacted":true}`` from then on. On a data directory (``--data-dir``, or
``CONVMEM_DATA_DIR``) the segments holding the range are rewritten, their
indexes rebuilt and the conversation's quarantined copies removed (see
``logstore.maintenance.redact_items``); afterwards no file under the data
directory holds the payloads. On PostgreSQL (``--data-dir postgresql://...``)
the rows are updated in one transaction; the old row versions stay in the
database until its next vacuum. Exit status: 0 done; 8 bad range or
operational error (nothing changed).
"""

from __future__ import annotations

import argparse
import os
import re

from convmem.logstore import StoreError
from convmem.logstore.maintenance import MaintenanceError
from convmem.logstore.redaction import RedactionError

from .common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail

_RANGE = re.compile(r"(\d{1,19})(?:-(\d{1,19}))?")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "redact",
        help="replace a seq range of one conversation by tombstones, erasing the payloads",
        description="Replace the payloads of items A..B (inclusive) of one conversation by tombstones that keep "
        "their seqs and recorded_at. Durable when the command returns; irreversible.",
    )
    p.add_argument("site", metavar="SITE")
    p.add_argument("conversation", metavar="CONVERSATION_ID")
    p.add_argument("--seqs", required=True, metavar="A-B", help="the seqs to redact, inclusive (A alone for one)")
    p.add_argument(
        "--data-dir",
        default=os.environ.get("CONVMEM_DATA_DIR"),
        help="the data directory, or a postgresql:// URI (default: $CONVMEM_DATA_DIR)",
    )
    p.add_argument("--lock-timeout", type=float, default=30.0, help="seconds to wait for the conversation")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def run(args: argparse.Namespace) -> int:
    if not args.data_dir:
        return fail("give --data-dir (or set CONVMEM_DATA_DIR)")
    m = _RANGE.fullmatch(args.seqs)
    if m is None:
        return fail(f"--seqs {args.seqs!r}: give A-B (two seqs, A <= B) or one seq")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        return fail(f"--seqs {args.seqs}: the first seq is after the last")
    where = f"{args.site}/{args.conversation}"
    try:
        if args.data_dir.startswith(("postgresql://", "postgres://")):
            from convmem.logstore.postgres import PgStore

            store = PgStore(args.data_dir, pool_min=1, pool_max=1)
            try:
                n = store.redact_items(args.site, args.conversation, first, last)
            finally:
                store.close()
            print(f"redacted {where} seqs {first}-{last}: {n} items")
            return EXIT_CLEAN
        if not os.path.isdir(args.data_dir):
            return fail(f"{args.data_dir} is not a directory")
        from convmem.logstore.maintenance import redact_items

        done = redact_items(
            args.data_dir, args.site, args.conversation, first, last, lock_timeout=args.lock_timeout
        )
    except (StoreError, MaintenanceError, RedactionError, OSError) as exc:
        return fail(f"cannot redact {where}: {exc}", EXIT_OPERATIONAL)
    print(
        f"redacted {where} seqs {first}-{last}: {done.segments} segment files rewritten, "
        f"{done.quarantined} quarantined copies removed"
    )
    return EXIT_CLEAN
