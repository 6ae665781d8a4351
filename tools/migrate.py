"""``convmem migrate SRC DST``: copy every site between a data directory and PostgreSQL.

Either side is a local data directory or a ``postgresql://`` URI (the other
way round works the same). Each item keeps its seq, its ``recorded_at`` and
its exact payload bytes; the sites' password hashes are copied too.

Resumable by construction: the destination's own contents are the progress
record. Each conversation is copied from the first seq the destination does
not hold yet, in batches that are each committed atomically (a PostgreSQL
transaction, or a durable record in the file engine), so an interrupted run
leaves whole batches only and a re-run continues where it stopped.

Verified at the end: for every conversation of every copied site, the number
of items and a CRC-32 over ``seq``, ``recorded_at`` and the payload bytes must
be the same on both sides; any difference is reported and the exit status is
non-zero. A destination holding *more* than the source for a conversation is
refused (it is not a copy of this source).

Long-term memories are carried too, with their ids, versions, timestamps,
status (soft-deleted ones within retention) and stored vectors, resumably and
verified the same way (see :mod:`.migrate_memories`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from convmem.logstore import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, FileStore, StoreError, Tail
from convmem.logstore.maintenance import Restorer, iter_conversation_items, iter_conversations, list_sites
from convmem.logstore.memories import LongTermMemory, LongTermStore
from convmem.logstore.postgres import DEFAULT_SCHEMA, is_dsn  # the rest loads psycopg: imported when used

from .common import EXIT_PROBLEMS_LEFT, fail, plural
from .migrate_memories import migrate_memories

_decoder = msgspec.json.Decoder(type=dict[str, Any])

_EPILOG = """\
Long-term memories (the memory_* tools) are copied too: ids, versions, timestamps, dedupe keys, status
(soft-deleted ones within retention) and the vectors stored with them (never computed again). A memory
DST already holds with the same content is not copied twice; one it holds with other content is a
difference.

exit status:
  0  everything SRC holds was copied and verified
  4  verification found a difference, or a memory conflicts with one DST holds (printed)
  8  could not start, or stopped midway (re-run the same command to continue)
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "migrate",
        help="copy all data between a data directory and PostgreSQL (resumable, verified)",
        description="Copy every site (conversations with their seqs, recorded_at and exact payload bytes, "
        "long-term memories with their vectors, and the site password hashes) from SRC to DST. "
        "SRC and DST are each a data directory or a "
        "postgresql:// URI. Re-running after an interruption continues where it stopped. Ends with a "
        "per-conversation count and checksum comparison, and a per-memory comparison of the long-term "
        "memories.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC")
    p.add_argument("dst", metavar="DST")
    p.add_argument("--src-schema", default=DEFAULT_SCHEMA, help="schema when SRC is PostgreSQL")
    p.add_argument("--dst-schema", default=DEFAULT_SCHEMA, help="schema when DST is PostgreSQL")
    p.add_argument("--site", action="append", help="copy only this site (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.set_defaults(func=run)


# -- the two sides ---------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    seq: int
    recorded_at_us: int
    payload: bytes


class Side:
    """One end of a migration: what it holds, how to read it verbatim and write it back."""

    def sites(self) -> list[str]:
        raise NotImplementedError

    def conversations(self, site: str) -> list[str]:
        raise NotImplementedError

    def count(self, site: str, conv: str) -> int:
        raise NotImplementedError

    def items(self, site: str, conv: str, start: int) -> Iterator[Item]:
        raise NotImplementedError

    def write(self, site: str, conv: str, first: int, stamp: int, parts: list[bytes]) -> None:
        raise NotImplementedError

    def credentials(self) -> Any:
        raise NotImplementedError

    def memories(self) -> LongTermStore:
        """The long-term memory store of this side (closed by :meth:`close`)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class DirSide(Side):
    def __init__(self, path: str) -> None:
        self.path = path
        self.store = FileStore(path)
        self._restorer: Restorer | None = None
        self._memories: LongTermStore | None = None

    def sites(self) -> list[str]:
        return list_sites(self.path)

    def conversations(self, site: str) -> list[str]:
        return [cid for cid, _ in iter_conversations(self.path, site)]

    def count(self, site: str, conv: str) -> int:
        last = self.store.read(site, conv, Tail(1))
        return last[0].seq + 1 if last else 0

    def items(self, site: str, conv: str, start: int) -> Iterator[Item]:
        for it in iter_conversation_items(self.path, site, conv):
            if it.seq >= start:
                yield Item(it.seq, it.recorded_at_us, it.payload)

    def write(self, site: str, conv: str, first: int, stamp: int, parts: list[bytes]) -> None:
        if self._restorer is None:
            self._restorer = Restorer(self.path)
        self._restorer.restore_batch(site, conv, first, stamp, [_decoder.decode(p) for p in parts])

    def credentials(self) -> Any:
        from convmem.logstore.site_credentials import CredentialFile

        return CredentialFile(self.path)

    def memories(self) -> LongTermStore:
        if self._memories is None:
            self._memories = LongTermMemory(self.path)
        return self._memories

    def close(self) -> None:
        if self._memories is not None:
            self._memories.close()
        if self._restorer is not None:
            self._restorer.close()
        self.store.close()


class PgSide(Side):
    def __init__(self, dsn: str, schema: str) -> None:
        from convmem.logstore.postgres import PgStore

        self.store = PgStore(dsn, schema=schema, pool_max=4)
        self._memories: LongTermStore | None = None

    def sites(self) -> list[str]:
        return self.store.sites()

    def conversations(self, site: str) -> list[str]:
        return [cid for cid, _ in self.store.conversation_ids(site)]

    def count(self, site: str, conv: str) -> int:
        return self.store.item_count(site, conv)

    def items(self, site: str, conv: str, start: int) -> Iterator[Item]:
        while True:
            rows = self.store.raw_items(site, conv, start, 1000)
            for seq, stamp, payload in rows:
                yield Item(seq, stamp, payload)
            if len(rows) < 1000:
                return
            start = rows[-1][0] + 1

    def write(self, site: str, conv: str, first: int, stamp: int, parts: list[bytes]) -> None:
        self.store.restore_batch(site, conv, first, stamp, parts)

    def credentials(self) -> Any:
        from convmem.logstore.postgres import PgCredentials

        return PgCredentials(self.store)

    def memories(self) -> LongTermStore:
        if self._memories is None:
            from convmem.logstore.postgres import PgLongTermMemory

            self._memories = PgLongTermMemory(self.store, listen=False)
        return self._memories

    def close(self) -> None:
        if self._memories is not None:
            self._memories.close()
        self.store.close()


def open_side(target: str, schema: str) -> Side:
    return PgSide(target, schema) if is_dsn(target) else DirSide(target)


# -- copying ---------------------------------------------------------------------------------


def _batches(items: Iterator[Item]) -> Iterator[tuple[int, int, list[bytes]]]:
    """Consecutive items with one ``recorded_at``, within the batch limits: (first seq, stamp, payloads)."""
    first = stamp = -1
    parts: list[bytes] = []
    size = 0
    for it in items:
        if parts and (
            it.recorded_at_us != stamp or len(parts) == MAX_BATCH_ITEMS or size + len(it.payload) > MAX_BATCH_BYTES
        ):
            yield first, stamp, parts
            parts, size = [], 0
        if not parts:
            first, stamp = it.seq, it.recorded_at_us
        parts.append(it.payload)
        size += len(it.payload)
    if parts:
        yield first, stamp, parts


def copy_conversation(src: Side, dst: Side, site: str, conv: str) -> int:
    """Copy what ``dst`` lacks of one conversation; the number of items written."""
    have = dst.count(site, conv)
    total = src.count(site, conv)
    if have > total:
        raise MigrationError(f"{site}/{conv}: the destination holds {have} items, the source only {total}")
    written = 0
    for first, stamp, parts in _batches(src.items(site, conv, have)):
        dst.write(site, conv, first, stamp, parts)
        written += len(parts)
    return written


def checksum(side: Side, site: str, conv: str) -> tuple[int, int]:
    from convmem.logstore.postgres import item_crc

    crc = n = 0
    for it in side.items(site, conv, 0):
        crc = item_crc(crc, it.seq, it.recorded_at_us, it.payload)
        n += 1
    return n, crc


def copy_credentials(src: Side, dst: Side, sites: list[str]) -> int:
    """Copy the password hashes of ``sites`` that ``dst`` does not know yet; how many were copied."""
    s_creds, d_creds = src.credentials(), dst.credentials()
    hashes = s_creds.load()
    known = set(d_creds.sites())
    copied = 0
    for site in sites:
        h = hashes.get(site)
        if h is None or site in known:
            continue
        _put_hash(d_creds, site, h)
        copied += 1
    return copied


def _put_hash(creds: Any, site: str, h: Any) -> None:
    from convmem.logstore.postgres import PgCredentials

    if isinstance(creds, PgCredentials):
        creds.put_hash(site, h)
        return
    with creds._locked() as doc:  # the credential file's own writer lock and atomic replace
        if site not in doc["sites"]:
            doc["sites"][site] = h.to_json()


class MigrationError(Exception):
    pass


def run(args: argparse.Namespace) -> int:
    if not is_dsn(args.src) and not is_dsn(args.dst):
        return fail("one of SRC and DST must be a postgresql:// URI (to copy directories, use export/import)")
    try:
        src = open_side(args.src, args.src_schema)
    except (StoreError, OSError) as exc:
        return fail(f"cannot open the source: {exc}")
    try:
        dst = open_side(args.dst, args.dst_schema)
    except (StoreError, OSError) as exc:
        src.close()
        return fail(f"cannot open the destination: {exc}")
    try:
        return _migrate(src, dst, args)
    except (StoreError, OSError, MigrationError) as exc:
        return fail(f"migration stopped (re-run the same command to continue): {exc}")
    finally:
        src.close()
        dst.close()


def _migrate(src: Side, dst: Side, args: argparse.Namespace) -> int:
    sites = src.sites()
    if args.site:
        sites = [s for s in sites if s in set(args.site)]
    cred_sites = sorted(set(src.credentials().sites()) | set(sites))
    if args.site:
        cred_sites = [s for s in cred_sites if s in set(args.site)]
    n_creds = copy_credentials(src, dst, cred_sites)
    convs = items = 0
    for site in sites:
        for conv in src.conversations(site):
            written = copy_conversation(src, dst, site, conv)
            convs += 1
            items += written
            if written and not args.quiet:
                print(f"copied {site}/{conv}: {plural(written, 'item')}", file=sys.stderr)
    # Verification: same conversations, and per conversation the same count and checksum.
    problems = 0
    for site in sites:
        want = set(src.conversations(site))
        got = set(dst.conversations(site))
        for conv in sorted(want - got):
            print(f"MISMATCH {site}/{conv}: missing at the destination", file=sys.stderr)
            problems += 1
        for conv in sorted(want & got):
            a, b = checksum(src, site, conv), checksum(dst, site, conv)
            if a != b:
                print(
                    f"MISMATCH {site}/{conv}: source {a[0]} items crc32 {a[1]:08x}, "
                    f"destination {b[0]} items crc32 {b[1]:08x}",
                    file=sys.stderr,
                )
                problems += 1
    mem = migrate_memories(src.memories(), dst.memories(), args.site, args.quiet)
    for line in mem.problems:
        print(line, file=sys.stderr)
    summary = (
        f"migrated {plural(len(sites), 'site')}, {plural(convs, 'conversation')} "
        f"({plural(items, 'item')} copied in this run, {plural(n_creds, 'site password')}), "
        f"{_memories(mem.memories)} of {plural(mem.sites, 'site')} ({mem.copied} copied in this run); "
    )
    if problems or mem.problems:
        failed = [plural(problems, "conversation")] if problems else []
        failed += [plural(len(mem.problems), "memory difference")] if mem.problems else []
        print(summary + f"verification FAILED for {' and '.join(failed)}", file=sys.stderr)
        return EXIT_PROBLEMS_LEFT
    print(
        summary + "verified: every conversation has the same item count and checksum, and every long-term "
        "memory the same record and stored vector, on both sides"
    )
    return 0


def _memories(n: int) -> str:
    return f"{n} long-term memory" if n == 1 else f"{n} long-term memories"
