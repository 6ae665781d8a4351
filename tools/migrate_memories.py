"""The long-term memory part of ``convmem migrate``: copy each site's memories with their vectors, then verify.

A memory is copied as its source store keeps it: id, fields (dedupe_key
included), status (soft-deleted ones too, while within retention), version,
created/updated/deleted times, last access time, and the vector stored with
it, which the destination keeps as it is (it never runs the encoder for a
copied memory). Both ends go through the public
:class:`~convmem.logstore.memories.LongTermStore` calls
:meth:`~convmem.logstore.memories.LongTermStore.export_stored` and
:meth:`~convmem.logstore.memories.LongTermStore.import_stored`.

Resumable: a memory the destination already holds with the same content
counts as present and is not written again, so a re-run after an interruption
adds only what is missing. Verified: afterwards every site's memories are read
back from both sides and compared, record and stored vector, id by id.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from convmem.logstore import StoreError
from convmem.logstore.memories import LongTermStore, StoredMemory
from convmem.logstore.memories.state import record_body


@dataclass
class MemoryCopy:
    """What the copy of the memories did, summed over the sites."""

    sites: int = 0
    memories: int = 0
    copied: int = 0
    #: One line per site whose copy or verification failed.
    problems: list[str] = field(default_factory=list)


def compare(site: str, src: Sequence[StoredMemory], dst: Sequence[StoredMemory]) -> list[str]:
    """The differences between a site's memories on the two sides, one line each (none when equal)."""
    a = {s.memory.memory_id: s for s in src}
    b = {s.memory.memory_id: s for s in dst}
    out = [f"MISMATCH {site}: memory {mid} missing at the destination" for mid in sorted(a.keys() - b.keys())]
    out += [f"MISMATCH {site}: memory {mid} is at the destination only" for mid in sorted(b.keys() - a.keys())]
    for mid in sorted(a.keys() & b.keys()):
        if record_body(a[mid].memory) != record_body(b[mid].memory):
            out.append(f"MISMATCH {site}: memory {mid} differs (record)")
        elif a[mid].vector != b[mid].vector:
            out.append(f"MISMATCH {site}: memory {mid} differs (stored vector)")
    return out


def copy_site(src: LongTermStore, dst: LongTermStore, site: str) -> tuple[int, int]:
    """Copy what ``dst`` lacks of ``site``'s memories; (memories at the source, copied now)."""
    records = src.export_stored(site)
    added, _present = dst.import_stored(site, records)
    return len(records), added


def migrate_memories(src: LongTermStore, dst: LongTermStore, sites: Sequence[str] | None, quiet: bool) -> MemoryCopy:
    """Copy and verify the memories of every site of ``src`` (of ``sites`` only, when given)."""
    names = src.sites()
    if sites is not None:
        names = [s for s in names if s in set(sites)]
    result = MemoryCopy(sites=len(names))
    for site in names:
        try:
            held, added = copy_site(src, dst, site)
        except StoreError as exc:
            if exc.retryable:  # I/O or contention: stop, a re-run continues
                raise
            # A conflict with what the destination holds (another memory with this id or dedupe_key, a full
            # site): reported, and the other sites go on.
            result.problems.append(f"MISMATCH {site}: memories not copied: {exc}")
            continue
        result.memories += held
        result.copied += added
        if added and not quiet:
            what = "long-term memory" if added == 1 else "long-term memories"
            print(f"copied {site}: {added} {what}", file=sys.stderr)
    for site in names:
        result.problems += compare(site, src.export_stored(site), dst.export_stored(site))
    return result
