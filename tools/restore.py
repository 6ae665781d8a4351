"""``convmem import``: load a ``convmem export`` file into an empty site, or restore one conversation.

Every item keeps its conversation, seq and ``recorded_at``; consecutive items
of one conversation that share a ``recorded_at`` are written as one batch
(framed and synced as an append is). Within the file each conversation's
seqs must start at 0 and be gapless.

Without ``--conversation`` the site must hold no conversation yet. With
``--conversation ID`` only that conversation's lines are read (the input may
be a whole site's export) and the site may hold others:

* a conversation with no log is restored whole;
* an intact one is never overwritten: the items it holds must equal the
  input's first items (seq, ``recorded_at`` and payload bytes), and only the
  input's items after them are appended (a log that lost its newest items
  gets them back; one that holds everything is left as it is);
* a damaged one is refused, unless ``--replace-damaged``: its segments are
  then moved to ``DATA/quarantine/`` and it is restored whole from the input.

Exit status: 0 imported; 1 the input is invalid, does not fit, or differs
from the intact conversation (the line is named; items before it were
imported); 8 operational error (the site is not empty, the conversation is
damaged, a file cannot be read).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgspec

from convmem.logstore import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_ITEM_BYTES, Corrupted, StoreError
from convmem.logstore.maintenance import (
    ACKNOWLEDGED_LOST,
    INDEX_MISMATCH,
    INDEX_MISSING,
    INDEX_SHORT,
    INDEX_STALE,
    ORPHAN_INDEX,
    STRAY_FILE,
    MaintenanceError,
    Restorer,
    check,
    format_timestamp,
    iter_conversation_items,
    locate_conversation,
    parse_timestamp,
    set_aside_conversation,
    site_has_data,
)

from . import memories
from .common import EXIT_CLEAN, EXIT_OPERATIONAL, command, exit_8_on_usage_error, fail

EXIT_BAD_INPUT = 1

#: Problems that leave every item of a conversation readable: it counts as intact.
_HARMLESS = frozenset({INDEX_MISSING, INDEX_STALE, INDEX_MISMATCH, INDEX_SHORT, ORPHAN_INDEX, STRAY_FILE})


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


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "import",
        help="load an export file into an empty site, or restore one conversation",
        description="Load a JSON Lines export into an empty site, preserving seqs and recorded_at; "
        "with --conversation, restore only that conversation into a site that may hold others.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="a data directory (with --memories also postgresql://...)")
    p.add_argument("--pg-schema", default="convmem", help="the PostgreSQL schema, when DATA_DIR is postgresql://...")
    p.add_argument("--site", metavar="S", required=True)
    p.add_argument("--input", metavar="FILE", help="read this file instead of stdin")
    p.add_argument(
        "--conversation",
        metavar="ID",
        help="restore only this conversation (never overwriting an intact one: "
        "its items must match the input's first ones; the rest are appended)",
    )
    p.add_argument(
        "--replace-damaged",
        action="store_true",
        help="with --conversation: if the conversation is damaged, move its log to DATA_DIR/quarantine/ "
        "and restore it whole from the input",
    )
    p.add_argument("--memories", action="store_true", help="the input is a `convmem export --memories` document")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


@dataclass(frozen=True)
class _Item:
    line: int
    conversation_id: str
    seq: int
    recorded_at_us: int
    payload: bytes


#: Longest line an export can hold: the largest item plus its conversation id, seq and timestamp,
#: with room to spare. A longer line is refused after reading this much of it, never whole.
MAX_LINE_BYTES = MAX_ITEM_BYTES + 4096


def bounded_lines(stream: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for each line; raises BadInput on a line over ``limit`` bytes.

    Memory stays bounded by ``limit`` whatever the input: a line is read at
    most ``limit + 1`` bytes at a time, and an over-long one is refused
    before the rest of it is read.
    """
    n = 0
    while True:
        raw = stream.readline(limit + 1)
        if not raw:
            return
        n += 1
        if len(raw) > limit:
            raise BadInput(n, f"the line is longer than {limit} bytes, more than any exported item can take")
        yield n, raw


def items(lines: BinaryIO, only: str | None = None) -> Iterator[_Item]:
    """The input's items (of conversation ``only``, when given), validated, in input order."""
    for n, raw in bounded_lines(lines):
        if not raw.strip():
            continue
        try:
            item = _decode_line(raw)
            if only is not None and item.conversation_id != only:
                continue
            stamp = parse_timestamp(item.recorded_at)
            _decode_payload(item.payload)  # an object, or the line is refused
        except (msgspec.DecodeError, ValueError) as exc:
            raise BadInput(n, str(exc)) from None
        yield _Item(n, item.conversation_id, item.seq, stamp, bytes(item.payload))


_Batch = tuple[str, int, int, list[dict[str, Any]]]  # conversation, first seq, recorded_at_us, payloads


def batches(stream: Iterable[_Item]) -> Iterator[tuple[int, _Batch]]:
    """Group items into batches; yields ``(line number of the batch's first item, batch)``."""
    cur: _Batch | None = None
    cur_line = 0
    size = 0
    for it in stream:
        plen = len(it.payload)
        payload = _decode_payload(it.payload)
        if (
            cur is not None
            and cur[0] == it.conversation_id
            and cur[2] == it.recorded_at_us
            and cur[1] + len(cur[3]) == it.seq
            and len(cur[3]) < MAX_BATCH_ITEMS
            and size + plen <= MAX_BATCH_BYTES
        ):
            cur[3].append(payload)
            size += plen
            continue
        if cur is not None:
            yield cur_line, cur
        cur, cur_line, size = (it.conversation_id, it.seq, it.recorded_at_us, [payload]), it.line, plen
    if cur is not None:
        yield cur_line, cur


def _restore(restorer: Restorer, site: str, stream: Iterable[_Item]) -> int:
    total = 0
    for line, (conv, first, stamp, payloads) in batches(stream):
        try:
            restorer.restore_batch(site, conv, first, stamp, payloads)
        except StoreError as exc:
            raise BadInput(line, str(exc)) from exc
        total += len(payloads)
    return total


def import_file(lines: BinaryIO, data_dir: str, site: str) -> int:
    """Import every line into ``site`` (which must be empty); return the number of items."""
    with Restorer(data_dir) as restorer:
        if not restorer.site_is_empty(site):
            raise MaintenanceError(
                f"site {site!r} already holds conversations; import needs an empty site "
                "(or --conversation ID to restore one conversation)"
            )
        return _restore(restorer, site, items(lines))


@dataclass(frozen=True)
class ConversationImport:
    """What :func:`import_conversation` did."""

    kept: int  # items the conversation already held (equal to the input's)
    imported: int  # items appended from the input
    set_aside: str | None  # the quarantine folder a damaged log was moved to


def conversation_damage(data_dir: str, site: str, conversation: str) -> list[str]:
    """Why the conversation's log is damaged (fsck's problems, as text); [] when every item reads."""
    report = check(data_dir, site=site, conversation=conversation)
    return [
        f"{p.kind} at byte {p.offset} of {p.file}"
        for p in report.unrepaired
        if p.conversation_id == conversation and p.kind not in _HARMLESS and p.kind != ACKNOWLEDGED_LOST
    ]


def import_conversation(
    lines: BinaryIO, data_dir: str, site: str, conversation: str, *, replace_damaged: bool = False
) -> ConversationImport:
    """Restore one conversation from an export (see the module's description)."""
    has_log = site_has_data(data_dir, site) and any(
        name.endswith(".seg") for name, _ in locate_conversation(data_dir, site, conversation).files
    )
    qdir: str | None = None
    if has_log:
        damage = conversation_damage(data_dir, site, conversation)
        if damage and not replace_damaged:
            raise MaintenanceError(
                f"conversation {conversation!r} is damaged ({'; '.join(damage[:3])}); pass --replace-damaged "
                "to move its log to quarantine/ and restore it whole from the input"
            )
        if damage:
            qdir = set_aside_conversation(data_dir, site, conversation)
            has_log = False
    source = items(lines, conversation)
    kept = 0
    if has_log:
        try:
            for held in iter_conversation_items(data_dir, site, conversation):
                given = next(source, None)
                if given is None:
                    break  # the input ends first: nothing to add
                if (given.seq, given.recorded_at_us, given.payload) != (held.seq, held.recorded_at_us, held.payload):
                    raise BadInput(
                        given.line,
                        f"the conversation already holds seq {held.seq} (recorded_at "
                        f"{format_timestamp(held.recorded_at_us)}) and it differs from the input's "
                        f"seq {given.seq}; import never overwrites an intact conversation",
                    )
                kept += 1
        except Corrupted as exc:
            raise MaintenanceError(f"conversation {conversation!r} could not be read: {exc}") from exc
    with Restorer(data_dir) as restorer:
        imported = _restore(restorer, site, source)
    if kept == 0 and imported == 0 and qdir is None:
        raise BadInput(0, f"the input holds no items of conversation {conversation!r}")
    return ConversationImport(kept, imported, qdir)


def run(args: argparse.Namespace) -> int:
    if args.memories:
        return memories.restore(args)
    if args.replace_damaged and not args.conversation:
        return fail("--replace-damaged needs --conversation", EXIT_OPERATIONAL)
    try:
        with open(args.input, "rb") if args.input else _stdin() as f:
            if args.conversation:
                done = import_conversation(
                    f, args.data_dir, args.site, args.conversation, replace_damaged=args.replace_damaged
                )
            else:
                n = import_file(f, args.data_dir, args.site)
    except BadInput as exc:
        return fail(f"import stopped at {exc}", EXIT_BAD_INPUT)
    except (MaintenanceError, StoreError, OSError) as exc:
        return fail(f"import failed: {exc}", EXIT_OPERATIONAL)
    if not args.conversation:
        sys.stderr.write(f"imported {n} items\n")
        return EXIT_CLEAN
    if done.set_aside is not None:
        sys.stderr.write(f"moved the damaged log of {args.conversation!r} to {done.set_aside}\n")
    if done.kept:
        sys.stderr.write(f"kept {done.kept} items the conversation already held (equal to the input's)\n")
    sys.stderr.write(f"imported {done.imported} items into conversation {args.conversation!r}\n")
    return EXIT_CLEAN


class _stdin:
    """``sys.stdin.buffer`` as a context manager that does not close it."""

    def __enter__(self) -> BinaryIO:
        return sys.stdin.buffer

    def __exit__(self, *exc: object) -> None:
        return None
