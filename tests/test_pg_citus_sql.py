"""``deploy/citus.sql`` describes the same schema the PostgreSQL store creates.

Citus itself cannot be installed here, so the file runs on the plain test
server with stand-ins for Citus's functions (they only record what they were
asked to distribute). The objects it creates are then compared, through the
catalog, with those the store's own DDL (``logstore/postgres/_schema.py``)
creates in another schema: the same tables and columns (types, nullability,
collations), primary keys, indexes, table options, sequences and functions
(arguments, results and bodies, compared without comments, schema
qualification and layout). A change to one that is not made to the other
fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg

from convmem.logstore.postgres import PgStore
from tests.pg_support import drop_schema, new_schema

CITUS_SQL = Path(__file__).resolve().parent.parent / "deploy" / "citus.sql"

#: Citus's distribution functions as no-ops that record each call (in the schema ``citus_stub``).
STUBS = """
CREATE SCHEMA citus_stub;
CREATE TABLE citus_stub.calls (kind text, target text, arg text, colocate text);
CREATE FUNCTION citus_stub.create_distributed_table(table_name regclass, distribution_column text,
        colocate_with text DEFAULT 'default') RETURNS void LANGUAGE sql
    AS $$ INSERT INTO citus_stub.calls VALUES ('distributed', table_name::text, distribution_column, colocate_with) $$;
CREATE FUNCTION citus_stub.create_reference_table(table_name regclass) RETURNS void LANGUAGE sql
    AS $$ INSERT INTO citus_stub.calls VALUES ('reference', table_name::text, NULL, NULL) $$;
CREATE FUNCTION citus_stub.create_distributed_function(function_name regprocedure,
        distribution_arg_name text DEFAULT NULL, colocate_with text DEFAULT 'default') RETURNS void LANGUAGE sql
    AS $$ INSERT INTO citus_stub.calls
          VALUES ('function', function_name::text, distribution_arg_name, colocate_with) $$;
"""


def _citus_script(schema: str) -> str:
    text = CITUS_SQL.read_text()
    text = re.sub(r"(?m)^CREATE EXTENSION IF NOT EXISTS citus;$", "", text)
    text = text.replace("CREATE SCHEMA IF NOT EXISTS convmem", f'CREATE SCHEMA "{schema}"')
    return re.sub(r"\bconvmem\.", f'"{schema}".', text)


def _normal_body(body: str, schema: str) -> str:
    body = re.sub(r"--[^\n]*", "", body)
    body = body.replace(f'"{schema}".', "").replace(f"{schema}.", "").replace("pg_catalog.", "")
    return " ".join(body.split())


def _catalog(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    def rows(query: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(query.encode(), (schema,)).fetchall()]

    return {
        "columns": rows(
            "SELECT table_name, column_name, data_type, is_nullable, collation_name, column_default, ordinal_position"
            " FROM information_schema.columns WHERE table_schema = %s ORDER BY 1, 7"
        ),
        "constraints": rows(
            "SELECT t.relname, c.contype, pg_get_constraintdef(c.oid) FROM pg_constraint c"
            " JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = %s ORDER BY 1, 2, 3"
        ),
        "indexes": [
            (name, definition.replace(f'"{schema}".', "").replace(f"{schema}.", ""))
            for name, definition in rows("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s ORDER BY 1")
        ],
        "options": rows(
            "SELECT c.relname, c.relkind, coalesce(c.reloptions, '{}') FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'S')"
            " ORDER BY 1"
        ),
        "partitions": rows(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), pg_get_partkeydef(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p')"
            " ORDER BY 1"
        ),
        "statistics": rows(
            "SELECT c.relname, a.attname, a.attstattarget FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND a.attnum > 0"
            " AND c.relkind IN ('r', 'p') ORDER BY 1, 2"
        ),
        "functions": [
            (name, args, result, _normal_body(body, schema))
            for name, args, result, body in rows(
                "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), p.prosrc"
                " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1, 2"
            )
        ],
        "meta": [tuple(r) for r in conn.execute(f'SELECT * FROM "{schema}".meta ORDER BY 1'.encode())],
    }


def test_citus_sql_matches_the_store_schema(pg_server: str) -> None:
    ours, theirs = new_schema(pg_server), new_schema(pg_server)
    PgStore(pg_server, schema=ours, pool_min=1, pool_max=1).close()
    try:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS citus_stub CASCADE")
            conn.execute(STUBS.encode())
            with conn.transaction():
                conn.execute("SET LOCAL search_path = citus_stub, public")
                conn.execute(_citus_script(theirs).encode())
            expected, got = _catalog(conn, ours), _catalog(conn, theirs)
            for part in expected:
                assert got[part] == expected[part], f"deploy/citus.sql and the store's DDL differ in {part}"
            calls = conn.execute("SELECT kind, target, arg, colocate FROM citus_stub.calls ORDER BY 1, 2").fetchall()
            tables = {r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.columns WHERE table_schema = %s AND column_name = 'site'",
                (theirs,),
            )}
            # Partitions are distributed with their parent.
            every = {r[0] for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition", (theirs,)
            )}
    finally:
        drop_schema(pg_server, ours)
        drop_schema(pg_server, theirs)
        drop_schema(pg_server, "citus_stub")
    placed = {target.split(".")[-1].strip('"'): (kind, arg) for kind, target, arg, _c in calls if kind != "function"}
    # Every table is placed: those that grow with the data distributed by site, the rest replicated.
    assert set(placed) == every, f"tables deploy/citus.sql does not place: {sorted(every - set(placed))}"
    for table, (kind, arg) in placed.items():
        if kind == "distributed":
            assert arg == "site" and table in tables
    assert [c for c in calls if c[0] == "function"], "the append function is not distributed"

