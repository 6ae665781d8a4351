"""``convmem export``: write a site's (or one conversation's) items as JSON Lines.

One item per line: ``{"conversation_id":...,"seq":...,"recorded_at":...,"payload":{...}}``.
The payload is written exactly as stored. A whole site streams in constant
memory. With ``--output`` the file appears only once the export is complete.
Exit status: 0 done; 4 damaged data stopped the export (the offset is
printed; run ``convmem fsck``); 8 operational error.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from typing import BinaryIO

from convmem.logstore import Corrupted, StoreError
from convmem.logstore.maintenance import MaintenanceError, export_items, format_timestamp, site_has_data

from . import memories
from .common import (
    EXIT_CLEAN,
    EXIT_OPERATIONAL,
    EXIT_PROBLEMS_LEFT,
    command,
    exit_8_on_usage_error,
    fail,
    registered_sites,
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "export",
        help="export conversations as JSON Lines",
        description="Write a site's conversations as JSON Lines, one item per line.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="a data directory (with --memories also postgresql://...)")
    p.add_argument("--pg-schema", default="convmem", help="the PostgreSQL schema, when DATA_DIR is postgresql://...")
    p.add_argument("--site", metavar="S", required=True)
    p.add_argument("--conversation", metavar="ID", help="export only this conversation")
    p.add_argument("--output", metavar="FILE", help="write here instead of stdout")
    p.add_argument("--memories", action="store_true", help="export the site's long-term memories as one JSON document")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def write_items(out: BinaryIO, data_dir: str, site: str, conversation: str | None) -> int:
    """Stream the items as JSON Lines into ``out``; return how many were written.

    A site that was added (``convmem site add``) but holds no conversation yet
    has no directory: it exports nothing (a named conversation in it does not exist).
    """
    if not site_has_data(data_dir, site) and site in registered_sites(data_dir):
        if conversation is not None:
            raise MaintenanceError(f"conversation {conversation!r} does not exist in site {site!r}")
        return 0
    n = 0
    for item in export_items(data_dir, site, conversation):
        out.write(
            b'{"conversation_id":'
            + json.dumps(item.conversation_id).encode()
            + b',"seq":%d,"recorded_at":"' % item.seq
            + format_timestamp(item.recorded_at_us).encode()
            + b'","payload":'
            + item.payload
            + b"}\n"
        )
        n += 1
    return n


def create_temp_beside(path: str) -> tuple[str, int]:
    """A new, private (0600) temporary file next to ``path``: ``(name, descriptor)``.

    The name is random and the file is created exclusively (``O_EXCL``, no
    link followed), so nobody can have planted a file or a link there first.
    """
    while True:
        tmp = f"{path}.tmp.{secrets.token_hex(8)}"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue


def run(args: argparse.Namespace) -> int:
    if args.memories:
        return memories.export(args)
    tmp: str | None = None
    try:
        if not args.output:
            n = write_items(sys.stdout.buffer, args.data_dir, args.site, args.conversation)
            sys.stdout.buffer.flush()
        else:
            tmp, fd = create_temp_beside(args.output)
            with open(fd, "wb") as f:
                n = write_items(f, args.data_dir, args.site, args.conversation)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, args.output)
            tmp = None
    except BrokenPipeError:
        raise  # the reader went away (`| head`): command() ends quietly
    except Corrupted as exc:
        return fail(f"export stopped: {exc} (run `convmem fsck`)", EXIT_PROBLEMS_LEFT)
    except (MaintenanceError, StoreError, OSError) as exc:
        return fail(f"export failed: {exc}", EXIT_OPERATIONAL)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    sys.stderr.write(f"exported {n} items\n")
    return EXIT_CLEAN
