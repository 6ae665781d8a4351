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
import re
from typing import TYPE_CHECKING

from .common import add_target_options, command, exit_8_on_usage_error, fail, run_on_target

if TYPE_CHECKING:
    from convmem.logstore.postgres import PgStore


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
    add_target_options(p)
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def run(args: argparse.Namespace) -> int:
    m = _RANGE.fullmatch(args.seqs)
    if m is None:
        return fail(f"--seqs {args.seqs!r}: give A-B (two seqs, A <= B) or one seq")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        return fail(f"--seqs {args.seqs}: the first seq is after the last")
    site, conv = args.site, args.conversation
    where = f"{site}/{conv} seqs {first}-{last}"

    def on_postgres(store: PgStore) -> str:
        return f"redacted {where}: {store.redact_items(site, conv, first, last)} items"

    def on_data_dir(data_dir: str) -> str:
        from convmem.logstore.maintenance import redact_items

        done = redact_items(data_dir, site, conv, first, last, lock_timeout=args.lock_timeout)
        return (
            f"redacted {where}: {done.segments} segment files rewritten, "
            f"{done.quarantined} quarantined copies removed"
        )

    return run_on_target(args, f"redact {site}/{conv}", on_postgres, on_data_dir)
