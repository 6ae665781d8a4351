"""``convmem dump``: print every record of one segment file, or every entry of an index file, verified.

For a segment (``<base-seq>.seg``), each record: byte offset, length,
checksum verdict, seqs, ``recorded_at``, batch size and the payloads. Damaged
spans are shown with their offset and why they failed, and the dump resumes
at the next valid record. For an index (``<base-seq>.idx``), its header and
each entry (seq, segment offset), each checked against the segment of the
same name beside it. Which it is comes from the file's first bytes.
Exit status: 0 everything valid, 4 damage found, 8 the file could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys

from convmem.logstore.maintenance import IndexInfo, RecordInfo, format_timestamp, scan_index, scan_segment

from .common import EXIT_CLEAN, EXIT_PROBLEMS_LEFT, command, exit_8_on_usage_error, fail


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "dump",
        help="print the records of a segment file (.seg) or the entries of an index file (.idx)",
        description="Print each record of a segment: offset, length, verdict, seqs, "
        "recorded_at, batch size and payloads; or each entry of an index file, checked against its segment. "
        "`convmem locate` prints which files hold a conversation.",
    )
    p.add_argument("segment", metavar="FILE", help="a segment (.seg) or index (.idx) file")
    p.add_argument("--no-payloads", action="store_true", help="omit the items' payloads")
    p.add_argument("--json", action="store_true", help="one JSON object per record (JSON Lines)")
    p.set_defaults(func=command(run))
    exit_8_on_usage_error(p)


def _seqs(r: RecordInfo) -> str:
    if r.first_seq is None or r.count is None:
        return "seqs ?"
    if r.kind == "identity":
        return f"conversation {r.conversation_id}"
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


_INDEX_MAGIC = b"CVMIDX"
_SEGMENT_MAGIC = b"CVMSEG"


def _kind_of(path: str) -> str:
    """``"index"`` or ``"segment"``, from the file's magic (its name when the magic is neither)."""
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_INDEX_MAGIC):
        return "index"
    if head.startswith(_SEGMENT_MAGIC):
        return "segment"
    return "index" if path.endswith(".idx") else "segment"


def dump_index(info: IndexInfo, as_json: bool) -> int:
    bad = [e for e in info.entries if e.verdict not in ("ok", "not checked")]
    damaged = bool(bad) or info.header_problem is not None or info.trailing_bytes > 0
    if as_json:
        doc = {
            "file": info.path,
            "size": info.size,
            "header_problem": info.header_problem,
            "base_seq": info.base_seq,
            "salt": info.salt,
            "segment": info.segment,
            "segment_problem": info.segment_problem,
            "trailing_bytes": info.trailing_bytes,
            "entries": [
                {"position": e.position, "seq": e.seq, "segment_offset": e.segment_offset, "verdict": e.verdict}
                for e in info.entries
            ],
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return EXIT_PROBLEMS_LEFT if damaged else EXIT_CLEAN
    if info.header_problem is not None:
        sys.stdout.write(f"{info.path}: {info.size} bytes, INVALID INDEX HEADER: {info.header_problem}\n")
        sys.stdout.write("convmem dump reads segment (.seg) and index (.idx) files of a conversation directory\n")
        return EXIT_PROBLEMS_LEFT
    sys.stdout.write(f"{info.path}: {info.size} bytes, index of base_seq={info.base_seq} salt={info.salt:016x}\n")
    if info.segment is not None and info.segment_problem is None:
        sys.stdout.write(f"entries checked against {info.segment}\n")
    else:
        sys.stdout.write(f"entries not checked: {info.segment_problem}\n")
    for e in info.entries:
        sys.stdout.write(f"@{e.position} seq {e.seq} -> segment byte {e.segment_offset} {e.verdict}\n")
    if info.trailing_bytes:
        sys.stdout.write(f"{info.trailing_bytes} bytes after the last whole entry (a write cut short)\n")
    sys.stdout.write(f"{len(info.entries)} entries, {len(bad)} wrong\n")
    return EXIT_PROBLEMS_LEFT if damaged else EXIT_CLEAN


def run(args: argparse.Namespace) -> int:
    try:
        if _kind_of(args.segment) == "index":
            return dump_index(scan_index(args.segment), args.json)
        info, records = scan_segment(args.segment, payloads=not args.no_payloads)
    except IsADirectoryError:
        return fail(f"{args.segment} is a directory: dump reads one segment (.seg) or index (.idx) file")
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
            if r.conversation_id is not None:
                doc["conversation_id"] = r.conversation_id
            if not args.no_payloads:
                doc["payloads"] = [json.loads(p) for p in r.payloads]
            sys.stdout.write(json.dumps(doc) + "\n")
    else:
        header = (
            f"base_seq={info.base_seq} salt={info.salt:016x}"
            if info.header_ok and info.salt is not None
            else "INVALID HEADER (convmem dump reads segment (.seg) and index (.idx) files)"
        )
        sys.stdout.write(f"{info.path}: {info.size} bytes, {header}\n")
        if info.header_ok and info.data_end < info.size:
            sys.stdout.write(
                f"records end at byte {info.data_end}; the {info.size - info.data_end} bytes after are "
                "zero-filled space preallocated for appends\n"
            )
        for r in records:
            sys.stdout.write(format_record(r, not args.no_payloads) + "\n")
        sys.stdout.write(f"{len(records)} records, {bad} damaged\n")
    return EXIT_PROBLEMS_LEFT if bad else EXIT_CLEAN
