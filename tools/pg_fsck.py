"""``convmem fsck postgresql://...``: check the long-term memories a PostgreSQL store keeps.

The memory rows are checked as :mod:`convmem.logstore.postgres.memcheck`
describes; ``--repair`` repairs the sites' change counters only. The
conversations are not read here: their rows are written by one SQL function
that keeps their seqs gapless, and PostgreSQL checks its own pages
(``amcheck``, checksums). Exit status as for a data directory: 0 clean, 1 all
problems repaired, 4 problems left, 8 operational error.
"""

from __future__ import annotations

import argparse
import json
import sys

import psycopg

from convmem.logstore import StoreError
from convmem.logstore.postgres import PgStore
from convmem.logstore.postgres.memcheck import check_memories

from . import memories
from .common import EXIT_OPERATIONAL, fail


def run(args: argparse.Namespace) -> int:
    if args.conversation:
        return fail("--conversation checks a data directory only: in PostgreSQL fsck checks long-term memories")
    try:
        store = PgStore(args.data_dir, schema=args.pg_schema, pool_max=2)
        with store:
            report = check_memories(store, args.site, repair=args.repair or args.truncate_at_corruption)
    except (StoreError, psycopg.Error, OSError) as exc:
        return fail(f"checking the memories in PostgreSQL failed: {exc}", EXIT_OPERATIONAL)
    if args.json:
        doc: dict[str, object] = {"schema": args.pg_schema}
        status = memories.report_check(report, doc)
        sys.stdout.write(json.dumps({**doc, "exit_status": status}, indent=2) + "\n")
        return status
    sys.stdout.write(f"PostgreSQL schema {args.pg_schema}: long-term memories checked (conversations are not)\n")
    return memories.report_check(report, None)
