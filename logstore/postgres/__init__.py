"""The PostgreSQL backend of :mod:`logstore` (psycopg 3 and psycopg_pool).

:class:`PgStore` implements :class:`logstore.MemoryStore` with the semantics
and errors of :class:`logstore.FileStore`, for several stateless servers
sharing one database. See ``_schema`` for the tables and ``deploy/citus.sql``
for distributing them with Citus. :class:`PgLongTermMemory` keeps long-term
memories in the same database (``_memories``); :mod:`.memcheck` is what fsck and
stats read of them. :class:`PgCredentials` keeps the sites' password hashes
there (``_credentials``), the database twin of
:class:`convmem.logstore.site_credentials.CredentialFile`.
"""

from __future__ import annotations

from ._credentials import PgCredentials
from ._memories import PgLongTermMemory, drop_site_memories, held_memories
from ._schema import SCHEMA_VERSION
from ._store import DEFAULT_SCHEMA, AsyncCommitRefused, PgStore, is_dsn, item_crc

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "AsyncCommitRefused",
    "PgCredentials",
    "PgLongTermMemory",
    "PgStore",
    "drop_site_memories",
    "held_memories",
    "is_dsn",
    "item_crc",
]
