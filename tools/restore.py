"""``convmem import``: load a ``convmem export`` file into an empty site.

Every item keeps its conversation, seq and ``recorded_at``; consecutive items
of one conversation that share a ``recorded_at`` are written as one batch
(framed and synced as an append is). The site must hold no conversation yet;
within the file each conversation's seqs must start at 0 and be gapless.
Exit status: 0 imported; 1 the input is invalid or does not fit (the line is
named; items before it were imported); 8 operational error (the site is not
empty, a file cannot be read).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

import msgspec

from logstore import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, StoreError
from logstore.maintenance import MaintenanceError, Restorer, parse_timestamp
from tools import memories
from tools.common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail

EXIT_BAD_INPUT = 1


class _Line(msgspec.Struct):
    conversation_id: str
    seq: int
    recorded_at: str
    payload: msgspec.Raw


_decode_line = msgspec.json.Decoder(type=_Line).decode
_decode_payload = msgspec.json.Decoder(type=dict[str, Any]).decode


class BadInput(Exception):
    """A line of the input that cannot be imported."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(f"line {line}: {why}")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "import",
        help="load an export file into an empty site",
        description="Load a JSON Lines export into an empty site, preserving seqs and recorded_at.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--site", metavar="S", required=True)
    p.add_argument("--input", metavar="FILE", help="read this file instead of stdin")
    p.add_argument("--memories", action="store_true", help="the input is a `convmem export --memories` document")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


_Batch = tuple[str, int, int, list[dict[str, Any]]]  # conversation, first seq, recorded_at_us, payloads


def batches(lines: BinaryIO) -> Iterator[tuple[int, _Batch]]:
    """Group the export's lines into batches; yields ``(line number of the batch's first item, batch)``."""
    cur: _Batch | None = None
    cur_line = 0
    size = 0
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            item = _decode_line(raw)
            stamp = parse_timestamp(item.recorded_at)
            payload = _decode_payload(item.payload)
        except (msgspec.DecodeError, ValueError) as exc:
            raise BadInput(n, str(exc)) from None
        plen = len(item.payload)
        if (
            cur is not None
            and cur[0] == item.conversation_id
            and cur[2] == stamp
            and cur[1] + len(cur[3]) == item.seq
            and len(cur[3]) < MAX_BATCH_ITEMS
            and size + plen <= MAX_BATCH_BYTES
        ):
            cur[3].append(payload)
            size += plen
            continue
        if cur is not None:
            yield cur_line, cur
        cur, cur_line, size = (item.conversation_id, item.seq, stamp, [payload]), n, plen
    if cur is not None:
        yield cur_line, cur


def import_file(lines: BinaryIO, data_dir: str, site: str) -> int:
    """Import every line into ``site`` (which must be empty); return the number of items."""
    with Restorer(data_dir) as restorer:
        if not restorer.site_is_empty(site):
            raise MaintenanceError(f"site {site!r} already holds conversations; import needs an empty site")
        total = 0
        for line, (conv, first, stamp, payloads) in batches(lines):
            try:
                restorer.restore_batch(site, conv, first, stamp, payloads)
            except StoreError as exc:
                raise BadInput(line, str(exc)) from exc
            total += len(payloads)
        return total


def run(args: argparse.Namespace) -> int:
    if args.memories:
        return memories.restore(args)
    try:
        if args.input:
            with open(args.input, "rb") as f:
                n = import_file(f, args.data_dir, args.site)
        else:
            n = import_file(sys.stdin.buffer, args.data_dir, args.site)
    except BadInput as exc:
        return fail(f"import stopped at {exc}", EXIT_BAD_INPUT)
    except (MaintenanceError, StoreError, OSError) as exc:
        return fail(f"import failed: {exc}", EXIT_OPERATIONAL)
    sys.stderr.write(f"imported {n} items\n")
    return EXIT_CLEAN
