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
from typing import TYPE_CHECKING

from .common import add_target_options, command, exit_8_on_usage_error, run_on_target

if TYPE_CHECKING:
    from convmem.logstore.postgres import PgStore




def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "forget",
        help="erase one conversation and every copy of its items",
        description="Erase one conversation of a site: its listing entry, its log, its derived files and any "
        "quarantined copies. Durable when the command returns; irreversible.",
    )
    p.add_argument("site", metavar="SITE")
    p.add_argument("conversation", metavar="CONVERSATION_ID")
    add_target_options(p)
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def run(args: argparse.Namespace) -> int:
    site, conv = args.site, args.conversation

    def on_postgres(store: PgStore) -> str:
        return f"forgot {site}/{conv}: {store.forget_conversation(site, conv)} items"

    def on_data_dir(data_dir: str) -> str:
        from convmem.logstore.maintenance import forget_conversation

        done = forget_conversation(data_dir, site, conv, lock_timeout=args.lock_timeout)
        return f"forgot {site}/{conv}: {done.segments} segment files, {done.quarantined} quarantined copies"

    return run_on_target(args, f"forget {site}/{conv}", on_postgres, on_data_dir)
