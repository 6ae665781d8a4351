"""What needs no database driver: telling a PostgreSQL URI from a directory, and the default schema.

A command that is given ``DATA_DIR`` or ``postgresql://...`` decides which
with :func:`is_dsn`; this module imports nothing but the standard library, so
that a command working on a data directory never loads psycopg.
"""

from __future__ import annotations

#: The schema convmem's tables live in unless ``--pg-schema`` says otherwise.
DEFAULT_SCHEMA = "convmem"


def is_dsn(text: str | None) -> bool:
    """True when ``text`` names a PostgreSQL server rather than a directory."""
    return bool(text) and str(text).startswith(("postgresql://", "postgres://"))
