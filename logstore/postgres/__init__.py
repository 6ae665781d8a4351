"""The PostgreSQL backend of :mod:`logstore` (psycopg 3 and psycopg_pool).

:class:`PgStore` implements :class:`logstore.MemoryStore` with the semantics
and errors of :class:`logstore.FileStore`, for several stateless servers
sharing one database. See ``_schema`` for the tables and ``deploy/citus.sql``
for distributing them with Citus. :class:`PgLongTermMemory` keeps long-term
memories in the same database (``_memories``); :mod:`.memcheck` is what fsck and
stats read of them. :class:`PgCredentials` keeps the sites' password hashes
there (``_credentials``), the database twin of
:class:`convmem.logstore.site_credentials.CredentialFile`.

Importing this package loads no driver: :func:`is_dsn` and
:data:`DEFAULT_SCHEMA` are plain Python, and every other name here is
imported (with psycopg) the first time it is asked for, so a command given a
data directory can ask "is this a PostgreSQL URI?" without loading psycopg.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._dsn import DEFAULT_SCHEMA, is_dsn

if TYPE_CHECKING:
    from ._credentials import PgCredentials
    from ._memories import PgLongTermMemory, drop_site_memories, held_memories
    from ._schema import SCHEMA_VERSION
    from ._store import AsyncCommitRefused, PgStore, item_crc, redact_dsn

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
    "redact_dsn",
]

#: The names that need psycopg, and the module of this package each comes from.
_LAZY = {
    "PgCredentials": "_credentials",
    "PgLongTermMemory": "_memories",
    "drop_site_memories": "_memories",
    "held_memories": "_memories",
    "SCHEMA_VERSION": "_schema",
    "AsyncCommitRefused": "_store",
    "PgStore": "_store",
    "item_crc": "_store",
    "redact_dsn": "_store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
