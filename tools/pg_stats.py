"""``convmem stats postgresql://...``: the same per-site figures from a PostgreSQL store.

Conversations and items per site come from the conversation rows; bytes are
the stored payload bytes (the compact JSON of every item, summed), not table
or index sizes, which PostgreSQL reports itself (``pg_total_relation_size``).
Each site's long-term memories are counted too: active and soft-deleted, the
bytes of their records and vectors, and how many have a stored vector.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from convmem.logstore import MAX_CONVERSATION_ITEMS, StoreError
from convmem.logstore.memories.limits import MAX_MEMORIES_PER_SITE
from convmem.logstore.postgres import PgStore
from convmem.logstore.postgres.memcheck import memory_stats
from convmem.logstore.timefmt import format_us

from .common import EXIT_CLEAN, EXIT_OPERATIONAL, fail, human_bytes, plural


def collect(store: PgStore, site: str | None, top: int) -> list[dict[str, Any]]:
    """Per site: conversations, items, payload bytes, and the ``top`` largest conversations."""
    s = store.schema.replace('"', '""')
    conv, items = f'"{s}".conversations', f'"{s}".items'
    out = []
    with store._conn() as conn:
        sites = (
            [site]
            if site
            else [str(r[0]) for r in conn.execute(f"SELECT DISTINCT site FROM {conv} ORDER BY 1".encode())]
        )
        for name in sites:
            n_conv, n_items = conn.execute(
                f"SELECT count(*), coalesce(sum(next_seq), 0) FROM {conv} WHERE site = %s".encode(), (name,)
            ).fetchone() or (0, 0)
            (payload,) = conn.execute(
                f"SELECT coalesce(sum(octet_length(payload)), 0) FROM {items} WHERE site = %s".encode(), (name,)
            ).fetchone() or (0,)
            largest = []
            for cid, n in conn.execute(
                f"SELECT conversation_id, next_seq FROM {conv} WHERE site = %s "
                "ORDER BY next_seq DESC, conversation_id LIMIT %s".encode(),
                (name, top),
            ).fetchall():
                (size,) = conn.execute(
                    f"SELECT coalesce(sum(octet_length(payload)), 0) FROM {items} "
                    "WHERE site = %s AND conversation_id = %s".encode(),
                    (name, cid),
                ).fetchone() or (0,)
                largest.append(
                    {
                        "conversation_id": str(cid),
                        "items": int(n),
                        "bytes": int(size),
                        "fill": int(n) / MAX_CONVERSATION_ITEMS,
                    }
                )
            out.append(
                {
                    "site": name,
                    "conversations": int(n_conv),
                    "items": int(n_items),
                    "payload_bytes": int(payload),
                    "largest": largest,
                }
            )
    _add_memories(store, site, out)
    return out


def _add_memories(store: PgStore, site: str | None, out: list[dict[str, Any]]) -> None:
    """Add ``memories`` to each site's entry (and an entry for each site holding only memories)."""
    by_site = {d["site"]: d for d in out}
    for m in memory_stats(store, site):
        entry = {
            "active": m.active,
            "deleted": m.deleted,
            "bytes": m.bytes,
            "vectors": m.vectors,
            "vectors_missing": m.missing_vectors,
            "fill": (m.active + m.deleted) / MAX_MEMORIES_PER_SITE,
            "oldest_deleted_at": format_us(m.oldest_deleted_us) if m.oldest_deleted_us is not None else None,
        }
        if m.site not in by_site:
            by_site[m.site] = {"site": m.site, "conversations": 0, "items": 0, "payload_bytes": 0, "largest": []}
            out.append(by_site[m.site])
        by_site[m.site]["memories"] = entry
    out.sort(key=lambda d: str(d["site"]))


def _memory_line(m: dict[str, Any]) -> str:
    line = (
        f"  memories: {m['active']} active, {m['deleted']} soft-deleted ({m['fill'] * 100:.2f}% of the "
        f"{MAX_MEMORIES_PER_SITE:,} limit), {human_bytes(m['bytes'])} of records and vectors, "
        f"{plural(m['vectors'], 'vector')} stored, {m['vectors_missing']} missing"
    )
    if m["oldest_deleted_at"] is not None:
        line += f", oldest soft delete {m['oldest_deleted_at']}"
    return line


def run(args: argparse.Namespace) -> int:
    try:
        store = PgStore(args.data_dir, schema=args.pg_schema, pool_max=1)
        with store:
            result = collect(store, args.site, args.top)
    except StoreError as exc:
        return fail(str(exc), EXIT_OPERATIONAL)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return EXIT_CLEAN
    for s in result:
        lines = [
            f"site {s['site']}: {plural(s['conversations'], 'conversation')}, {plural(s['items'], 'item')}, "
            f"{human_bytes(s['payload_bytes'])} of payloads"
        ]
        if s["largest"]:
            lines.append(f"  largest conversations (limit {MAX_CONVERSATION_ITEMS} items):")
            width = max(len(c["conversation_id"]) for c in s["largest"])
            for c in s["largest"]:
                lines.append(
                    f"    {c['conversation_id']:<{width}}  {c['items']:>7} items  {c['fill'] * 100:6.2f}% of limit  "
                    f"{human_bytes(c['bytes']):>10}"
                )
        if "memories" in s:
            lines.append(_memory_line(s["memories"]))
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_CLEAN
