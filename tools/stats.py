"""``convmem stats``: per site, conversations, items, bytes on disk, and the largest conversations.

The largest conversations are shown with how close they are to the
100,000-item limit. Exit status: 0; 8 operational error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from convmem.logstore import MAX_CONVERSATION_ITEMS, SiteQuota, Usage, site_usage
from convmem.logstore.maintenance import MaintenanceError, SiteStats, site_has_data, stats
from convmem.options import add_quota_options

from . import memories
from .common import (
    EXIT_CLEAN,
    EXIT_OPERATIONAL,
    command,
    exit_8_on_usage_error,
    fail,
    human_bytes,
    plural,
    registered_sites,
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    add_quota_options(p)
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def format_quota(usage: Usage, quota: SiteQuota) -> str:
    """One line: the site's usage as the quota counts it, against the quota when one is set."""
    parts = [
        f"{human_bytes(usage.bytes)} on disk",
        f"{usage.files} files and directories",
        plural(usage.conversations, "conversation"),
    ]
    if quota.max_bytes is not None:
        parts[0] += f" of {human_bytes(quota.max_bytes)} ({usage.bytes / quota.max_bytes * 100:.1f}%)"
    if quota.max_files is not None:
        parts[1] += f" of {quota.max_files} ({usage.files / quota.max_files * 100:.1f}%)"
    if quota.max_conversations is not None:
        parts[2] += f" of {quota.max_conversations} ({usage.conversations / quota.max_conversations * 100:.1f}%)"
    label = "quota usage" if quota.active else "quota usage (no quota set)"
    return f"  {label}: {', '.join(parts)}"


def format_site(s: SiteStats, usage: Usage | None = None, quota: SiteQuota | None = None) -> str:
    lines = [
        f"site {s.site}: {plural(s.conversations, 'conversation')}, {plural(s.items, 'item')}, "
        f"{human_bytes(s.bytes_on_disk)} on disk"
    ]
    if usage is not None:
        lines.append(format_quota(usage, quota or SiteQuota()))
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


def site_stats(data_dir: str, site: str | None, top: int) -> list[SiteStats]:
    """The engine's figures, plus an empty entry for each added site nothing was written to yet."""
    registered = registered_sites(data_dir)
    if site is not None and site in registered and not site_has_data(data_dir, site):
        return [SiteStats(site, 0, 0, 0, [], [])]
    try:
        result = stats(data_dir, site, top=top)
    except MaintenanceError:
        if site is None and registered and not os.path.exists(os.path.join(data_dir, "logstore.json")):
            result = []  # sites were added, the server never opened the store yet
        else:
            raise
    if site is None:
        have = {s.site for s in result}
        result += [SiteStats(s, 0, 0, 0, [], []) for s in registered if s not in have]
        result.sort(key=lambda s: s.site)
    return result


def run(args: argparse.Namespace) -> int:
    if str(args.data_dir).startswith(("postgresql://", "postgres://")):
        from .pg_stats import run as run_pg

        return run_pg(args)
    try:
        result = site_stats(args.data_dir, args.site, args.top)
    except (MaintenanceError, OSError) as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    quota = SiteQuota.from_options(args.quota_bytes, args.quota_files, args.quota_conversations)
    usages = {s.site: site_usage(args.data_dir, s.site) for s in result}
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
                "quota_usage": {
                    "bytes": usages[s.site].bytes,
                    "files": usages[s.site].files,
                    "conversations": usages[s.site].conversations,
                },
                "quota": {
                    "max_bytes": quota.max_bytes,
                    "max_files": quota.max_files,
                    "max_conversations": quota.max_conversations,
                },
            }
            for s in result
        ]
        memories.stats_json(args.data_dir, args.site, doc)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        for s in result:
            sys.stdout.write(format_site(s, usages[s.site], quota) + "\n")
        for line in memories.stats_lines(args.data_dir, args.site):
            sys.stdout.write(line + "\n")
    return EXIT_CLEAN
