"""The SQL of the long-term memory store on PostgreSQL (tables in ``_schema``'s ``_DDL_MEMORIES``)."""

from __future__ import annotations

from psycopg import sql

from ._schema import MEMORY_PARTITIONS, memory_partition

#: The notification channel of memory changes; the payload is ``schema/site``.
CHANNEL = "convmem_memories"
#: The settings key of the verify-token secret shared by every server on the database.
TOKEN_SECRET_KEY = "memory-token.key"
#: Advisory lock key held by the one server running the retention sweep (any fixed 64-bit number).
SWEEP_LOCK = 0x636D6D656D737770

COLUMNS = "memory_id, status, version, created_at, updated_at, last_accessed_at, deleted_at, record, vec"


class MemoryStatements:
    """Every statement of the memory store, with the schema name quoted in.

    The statements of one site's rows name ``table``: its partition of ``memories`` (the parent when ``table``
    is ``memories``). PostgreSQL 15 locks every relation of a generic plan before it prunes partitions at run
    time, so a statement naming the parent would lock all partitions, and wait for another site's rewrite.
    """

    def __init__(self, schema: str, table: str = "memories") -> None:
        def q(text: str) -> bytes:
            text = text.replace("{s}.memories ", "{s}.{t} ")
            return sql.SQL(text).format(s=sql.Identifier(schema), t=sql.Identifier(table)).as_string(None).encode()

        self.lock_timeout = b"SELECT set_config('lock_timeout', %s, true)"
        self.use_token = q(
            "INSERT INTO {s}.memory_tokens (site, nonce, used_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (site, nonce) DO NOTHING RETURNING 1"
        )
        self.prune_tokens = q("DELETE FROM {s}.memory_tokens WHERE site = %s AND used_at < %s")
        # The first statement of every write: locks the site's row (serialising its writers) and counts the change.
        self.bump = q(
            "INSERT INTO {s}.memory_sites AS ms (site, changes, erased) VALUES (%s, 1, 0) "
            "ON CONFLICT (site) DO UPDATE SET changes = ms.changes + 1 RETURNING ms.changes"
        )
        # In the erasing transaction: the rewrite this erasure needs is owed until a scrub is known to have done it.
        self.owe_scrub = q(
            "INSERT INTO {s}.memory_scrubs AS o (site, erased_xid, owed_since) VALUES (%s, pg_current_xact_id(), %s) "
            "ON CONFLICT (site) DO UPDATE SET erased_xid = excluded.erased_xid"
        )
        self.mark_erased = q("UPDATE {s}.memory_sites SET erased = changes WHERE site = %s")
        self.counters = q("SELECT changes, erased FROM {s}.memory_sites WHERE site = %s")
        self.rows_all = q(f"SELECT {COLUMNS} FROM {{s}}.memories WHERE site = %s")
        self.rows_since = q(f"SELECT {COLUMNS} FROM {{s}}.memories WHERE site = %s AND change > %s")
        self.one = q(f"SELECT {COLUMNS} FROM {{s}}.memories WHERE site = %s AND memory_id = %s")
        self.purge = q(
            "DELETE FROM {s}.memories WHERE site = %s AND status = 'deleted' AND deleted_at <= %s RETURNING memory_id"
        )
        self.drop_site = q("DELETE FROM {s}.memories WHERE site = %s RETURNING memory_id")
        self.drop_tokens = q("DELETE FROM {s}.memory_tokens WHERE site = %s")
        self.count = q("SELECT count(*) FROM {s}.memories WHERE site = %s")
        self.insert = q(
            "INSERT INTO {s}.memories (site, memory_id, status, version, created_at, updated_at, last_accessed_at, "
            f"deleted_at, dedupe_key, record, vec, change) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            f"RETURNING {COLUMNS}"
        )
        # expected_version is checked here, in the statement that writes (NULL: any version).
        self.update = q(
            "UPDATE {s}.memories SET record = %s, dedupe_key = %s, vec = %s, updated_at = greatest(updated_at, %s), "
            "last_accessed_at = greatest(last_accessed_at, updated_at, %s), version = version + 1, change = %s "
            "WHERE site = %s AND memory_id = %s AND status = 'active' AND version = coalesce(%s::bigint, version) "
            f"RETURNING {COLUMNS}"
        )
        self.soft_delete = q(
            "UPDATE {s}.memories SET status = 'deleted', deleted_at = greatest(updated_at, %s), "
            "updated_at = greatest(updated_at, %s), last_accessed_at = greatest(last_accessed_at, updated_at, %s), "
            "version = version + 1, change = %s WHERE site = %s AND memory_id = %s AND status = 'active' "
            f"RETURNING {COLUMNS}"
        )
        self.erase = q("DELETE FROM {s}.memories WHERE site = %s AND memory_id = %s RETURNING memory_id")
        self.owner = q(
            "SELECT memory_id FROM {s}.memories WHERE site = %s AND dedupe_key = %s AND status = 'active'"
        )
        self.touch = q(
            "UPDATE {s}.memories AS m SET last_accessed_at = greatest(m.last_accessed_at, u.t) "
            "FROM unnest(%s::text[], %s::bigint[]) AS u(id, t) WHERE m.site = %s AND m.memory_id = u.id"
        )
        self.sites = q("SELECT DISTINCT site FROM {s}.memories ORDER BY site")
        self.due_sites = q(
            "SELECT DISTINCT site FROM {s}.memories WHERE status = 'deleted' AND deleted_at <= %s ORDER BY site"
        )
        self.notify = b"SELECT pg_notify('" + CHANNEL.encode() + b"', %s)"
        self.new_secret = q(
            "INSERT INTO {s}.settings (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING"
        )
        self.secret = q("SELECT value FROM {s}.settings WHERE key = %s")
        self.try_sweep_lock = b"SELECT pg_try_advisory_lock(%s)"
        self.sweep_unlock = b"SELECT pg_advisory_unlock(%s)"

    def texts(self) -> set[bytes]:
        """Every statement text of this set (what psycopg keys its prepared statements by)."""
        return {v for v in vars(self).values() if isinstance(v, bytes)}


def memory_statement_texts(schema: str) -> set[bytes]:
    """Every statement text the memory store can run: those of the parent table and of each partition.

    Shared statements (the ones naming no partition) are one text whatever the partition.
    """
    tables = ["memories", *(memory_partition(r) for r in range(MEMORY_PARTITIONS))]
    return set().union(*(MemoryStatements(schema, table).texts() for table in tables))
