"""``convmem dump``: print every record of one segment file, verified.

For each record: byte offset, length, checksum verdict, seqs, ``recorded_at``,
batch size and the payloads. Damaged spans are shown with their offset and
why they failed, and the dump resumes at the next valid record. Exit status:
0 every record valid, 4 damage found, 8 the file could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys

from logstore.maintenance import RecordInfo, format_timestamp, scan_segment
from tools.common import EXIT_CLEAN, EXIT_PROBLEMS_LEFT, command, exit_8_on_usage_error, fail


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "dump",
        help="print the records of one segment file",
        description="Print each record of a segment: offset, length, verdict, seqs, "
        "recorded_at, batch size and payloads.",
    )
    p.add_argument("segment", metavar="SEGMENT_FILE")
    p.add_argument("--no-payloads", action="store_true", help="omit the items' payloads")
    p.add_argument("--json", action="store_true", help="one JSON object per record (JSON Lines)")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def _seqs(r: RecordInfo) -> str:
    if r.first_seq is None or r.count is None:
        return "seqs ?"
    if r.count == 0:
        return f"seal at seq {r.first_seq}"
    return f"seqs {r.first_seq}..{r.first_seq + r.count - 1}"


def format_record(r: RecordInfo, payloads: bool) -> str:
    """One header line for the record, then one indented line per payload."""
    stamp = format_timestamp(r.recorded_at_us) if r.recorded_at_us is not None else "?"
    checksum = f"{r.checksum:016x}" if r.checksum is not None else "?"
    head = (
        f"@{r.offset} len={r.size} {r.kind} {r.verdict} checksum={checksum} {_seqs(r)} "
        f"items={r.count if r.count is not None else '?'} recorded_at={stamp}"
    )
    lines = [head]
    if payloads:
        for n, payload in enumerate(r.payloads):
            lines.append(f"    [{(r.first_seq or 0) + n}] {payload.decode('utf-8', 'replace')}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        info, records = scan_segment(args.segment, payloads=not args.no_payloads)
    except OSError as exc:
        return fail(f"cannot read {args.segment}: {exc}")
    bad = sum(1 for r in records if r.verdict != "ok")
    if args.json:
        for r in records:
            doc = {
                "offset": r.offset,
                "length": r.size,
                "kind": r.kind,
                "verdict": r.verdict,
                "checksum": r.checksum,
                "first_seq": r.first_seq,
                "count": r.count,
                "recorded_at": format_timestamp(r.recorded_at_us) if r.recorded_at_us is not None else None,
            }
            if not args.no_payloads:
                doc["payloads"] = [json.loads(p) for p in r.payloads]
            sys.stdout.write(json.dumps(doc) + "\n")
    else:
        header = (
            f"base_seq={info.base_seq} salt={info.salt:016x}"
            if info.header_ok and info.salt is not None
            else "INVALID HEADER"
        )
        sys.stdout.write(f"{info.path}: {info.size} bytes, {header}\n")
        for r in records:
            sys.stdout.write(format_record(r, not args.no_payloads) + "\n")
        sys.stdout.write(f"{len(records)} records, {bad} damaged\n")
    return EXIT_PROBLEMS_LEFT if bad else EXIT_CLEAN
