"""``convmem forget SITE CONVERSATION``: erase one conversation, durably, with every copy of its items.

On a data directory (``--data-dir``, or ``CONVMEM_DATA_DIR``): the listing
entry, the segments, their indexes and any quarantined copies go (see
``logstore.maintenance.forget_conversation``); afterwards no file under the
data directory holds the conversation's items. On PostgreSQL (``--data-dir
postgresql://...``): its rows go in one transaction; the database frees the
dead rows at its next vacuum. A later append starts the conversation afresh
at seq 0. Exit status: 0 done (also when there was nothing to forget); 8
operational error.
"""

from __future__ import annotations

import argparse
import os

from convmem.logstore import StoreError

from .common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "forget",
        help="erase one conversation and every copy of its items",
        description="Erase one conversation of a site: its listing entry, its log, its derived files and any "
        "quarantined copies. Durable when the command returns; irreversible.",
    )
    p.add_argument("site", metavar="SITE")
    p.add_argument("conversation", metavar="CONVERSATION_ID")
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
    try:
        if args.data_dir.startswith(("postgresql://", "postgres://")):
            from convmem.logstore.postgres import PgStore

            store = PgStore(args.data_dir, pool_min=1, pool_max=1)
            try:
                n = store.forget_conversation(args.site, args.conversation)
            finally:
                store.close()
            print(f"forgot {args.site}/{args.conversation}: {n} items")
            return EXIT_CLEAN
        from convmem.logstore.maintenance import forget_conversation

        if not os.path.isdir(args.data_dir):
            return fail(f"{args.data_dir} is not a directory")
        done = forget_conversation(args.data_dir, args.site, args.conversation, lock_timeout=args.lock_timeout)
    except (StoreError, OSError) as exc:
        return fail(f"cannot forget {args.site}/{args.conversation}: {exc}", EXIT_OPERATIONAL)
    print(
        f"forgot {args.site}/{args.conversation}: {done.segments} segment files, "
        f"{done.quarantined} quarantined copies"
    )
    return EXIT_CLEAN
