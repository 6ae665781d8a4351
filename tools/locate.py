"""``convmem locate``: where a conversation's files are.

Prints the conversation's directory, then each file in it with its size
(segments with the seq they start at). Exit status: 0 found; 1 the
conversation has no files (the directory it would have is printed); 8
operational error (not a data directory, a malformed name).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from convmem.logstore.maintenance import MaintenanceError, locate_conversation

from .common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail, human_bytes

EXIT_NOT_FOUND = 1


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "locate",
        help="print the files holding one conversation",
        description="Print the directory and files that hold one conversation of a site "
        "(for `convmem dump`, backups or a closer look).",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("site", metavar="SITE")
    p.add_argument("conversation", metavar="CONVERSATION_ID")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def _describe(name: str) -> str:
    if name.endswith(".seg") and name[:20].isdigit():
        return f"segment from seq {int(name[:20])}"
    if name.endswith(".idx") and name[:20].isdigit():
        return f"index of segment {name[:20]}.seg"
    if name == "lock":
        return "lock file"
    return ""


def run(args: argparse.Namespace) -> int:
    try:
        found = locate_conversation(args.data_dir, args.site, args.conversation)
    except MaintenanceError as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    if args.json:
        doc = {
            "site": found.site,
            "conversation_id": found.conversation_id,
            "directory": found.directory,
            "exists": found.exists,
            "files": [{"name": n, "path": os.path.join(found.directory, n), "bytes": b} for n, b in found.files],
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(found.directory + "\n")
        for name, size in found.files:
            sys.stdout.write(f"  {name}  {human_bytes(size):>10}  {_describe(name)}\n".rstrip() + "\n")
    if not found.files:
        return fail(
            f"conversation {args.conversation!r} of site {args.site!r} has no files "
            f"(it would live in {found.directory})",
            EXIT_NOT_FOUND,
        )
    return EXIT_CLEAN
