"""``convmem stats``: per site, conversations, items, bytes on disk, and the largest conversations.

The largest conversations are shown with how close they are to the
100,000-item limit. Exit status: 0; 8 operational error.
"""

from __future__ import annotations

import argparse
import json
import sys

from logstore import MAX_CONVERSATION_ITEMS
from logstore.maintenance import MaintenanceError, SiteStats, stats
from tools.common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail, human_bytes, plural


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "stats",
        help="sizes of sites and their largest conversations",
        description="Per site: conversations, items, bytes on disk and the largest "
        "conversations with their fill of the 100,000-item limit.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="a data directory, or a postgresql:// URI")
    p.add_argument("--pg-schema", default="convmem", help="schema when DATA_DIR is PostgreSQL")
    p.add_argument("--site", metavar="S", help="only this site")
    p.add_argument("--top", type=int, default=10, metavar="N", help="how many of the largest to show (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def format_site(s: SiteStats) -> str:
    lines = [
        f"site {s.site}: {plural(s.conversations, 'conversation')}, {plural(s.items, 'item')}, "
        f"{human_bytes(s.bytes_on_disk)} on disk"
    ]
    if s.largest:
        lines.append(f"  largest conversations (limit {MAX_CONVERSATION_ITEMS} items):")
        width = max(len(c.conversation_id) for c in s.largest)
        for c in s.largest:
            lines.append(
                f"    {c.conversation_id:<{width}}  {c.items:>7} items  {c.fill * 100:6.2f}% of limit  "
                f"{human_bytes(c.bytes):>10}"
            )
    for c in s.damaged:
        lines.append(f"  damaged: {c.conversation_id}: {c.error} (run `convmem fsck`)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if str(args.data_dir).startswith(("postgresql://", "postgres://")):
        from tools.pg_stats import run as run_pg

        return run_pg(args)
    try:
        result = stats(args.data_dir, args.site, top=args.top)
    except (MaintenanceError, OSError) as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    if args.json:
        doc = [
            {
                "site": s.site,
                "conversations": s.conversations,
                "items": s.items,
                "bytes_on_disk": s.bytes_on_disk,
                "largest": [
                    {"conversation_id": c.conversation_id, "items": c.items, "bytes": c.bytes, "fill": c.fill}
                    for c in s.largest
                ],
                "damaged": [{"conversation_id": c.conversation_id, "error": c.error} for c in s.damaged],
            }
            for s in result
        ]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        for s in result:
            sys.stdout.write(format_site(s) + "\n")
    return EXIT_CLEAN
