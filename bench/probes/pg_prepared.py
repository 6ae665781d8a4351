"""How many statements stay prepared on one pooled connection when calls go round-robin over 16 sites.

``python -m bench.probes.pg_prepared [--dsn DSN] [--rounds N] [--prepared-max M]``: one
:class:`PgStore` with a single pooled connection and a :class:`PgLongTermMemory` on it; 16 sites,
one in each partition of ``memories``; each round calls, for every site in turn, create, update,
get, search and a soft delete, while a second server writes to the sites too (so reads fetch
changed rows). Printed: the statements prepared on the connection (``pg_prepared_statements``),
how many PREPAREs psycopg sent in all (more than the first number: statements were evicted and
prepared again), the memory of the server backend's plan cache, and the median and 90th
percentile of each call's latency. ``--prepared-max`` overrides the store's ``prepared_max`` on
the connection (100 is psycopg's default). Without ``--dsn`` it starts a throwaway cluster.
Prints ``uptime`` beside the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from convmem.logstore.postgres import PgLongTermMemory, PgStore
from convmem.logstore.postgres._memscrub import partition_of
from convmem.logstore.postgres._schema import MEMORY_PARTITIONS


def _fields(n: int) -> dict[str, Any]:
    return {
        "category": "preference", "subject": f"subject {n} zebra{n}", "summary": f"summary {n} quokka{n}",
        "details": f"details {n}", "tags": ["t"], "source_uris": [], "dedupe_key": f"k-{n}",
    }


def one_site_per_partition(store: PgStore, prefix: str = "probe-site-") -> dict[str, str]:
    """A site name for each partition of ``memories``: {partition: site}."""
    found: dict[str, str] = {}
    with store._conn() as conn:
        for i in range(10_000):
            name = f"{prefix}{i:04d}"
            found.setdefault(partition_of(conn, store.schema, name), name)
            if len(found) == MEMORY_PARTITIONS:
                return found
    raise RuntimeError(f"only {len(found)} partitions reached")


def run(dsn: str, rounds: int, prepared_max: int | None) -> None:
    schema = f"probe_{os.getpid()}"
    logs = PgStore(dsn, schema=schema, pool_min=1, pool_max=1)
    other_logs = PgStore(dsn, schema=schema, pool_min=1, pool_max=1)
    mem = PgLongTermMemory(logs, listen=False)
    other = PgLongTermMemory(other_logs, listen=False)
    try:
        if prepared_max is not None:
            with logs._conn() as conn:
                conn.prepared_max = prepared_max
        with logs._conn() as conn:
            in_use = conn.prepared_max
        sites = sorted(one_site_per_partition(logs).values())
        times: dict[str, list[float]] = {}

        @contextmanager
        def timed(name: str) -> Iterator[None]:
            started = time.perf_counter()
            yield
            times.setdefault(name, []).append(time.perf_counter() - started)

        n = 0
        for _ in range(rounds):
            for site in sites:
                n += 1
                with timed("verify"):
                    _, tok, _ = mem.verify(site, "create", _fields(n))
                with timed("create"):
                    m = mem.upsert(site, _fields(n), tok)
                _, tok, _ = mem.verify(site, "update", _fields(n + 1_000_000), m.memory_id)
                with timed("update"):
                    mem.upsert(site, _fields(n + 1_000_000), tok, memory_id=m.memory_id)
                _, otok, _ = other.verify(site, "create", _fields(n + 2_000_000))
                other.upsert(site, _fields(n + 2_000_000), otok)
                with timed("get"):
                    mem.get(site, m.memory_id)
                with timed("search"):
                    mem.search(site, f"quokka{n}")
                _, tok, _ = mem.verify(site, "delete", None, m.memory_id)
                with timed("soft delete"):
                    mem.delete(site, m.memory_id, tok)
            mem.flush_access()
        with logs._conn() as conn:
            held = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            sent = conn._prepared._prepared_idx
            plans = conn.execute(
                "SELECT coalesce(sum(total_bytes), 0) FROM pg_backend_memory_contexts"
                " WHERE name IN ('CachedPlanSource', 'CachedPlanQuery', 'CachedPlan')"
            ).fetchone()
        print(f"prepared_max {in_use}: {held[0] if held else 0} statements prepared on the connection, "
              f"{sent} PREPAREs sent in {rounds} rounds over {len(sites)} sites; "
              f"the server backend's plan cache holds {(plans[0] if plans else 0) / 1024:.0f} KiB")
        for name, values in times.items():
            values.sort()
            p90 = values[int(len(values) * 0.9)]
            print(f"  {name:12s} median {statistics.median(values) * 1e3:6.2f} ms   p90 {p90 * 1e3:6.2f} ms")
    finally:
        for closing in (mem, other, logs, other_logs):
            closing.close()
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prepared-max", type=int)
    args = parser.parse_args()
    if args.dsn:
        run(args.dsn, args.rounds, args.prepared_max)
        return
    from tests import pgcluster

    base = pgcluster.make_base("convmem-probe-pg-")
    cluster = pgcluster.start_cluster(base)
    try:
        run(cluster.dsn(), args.rounds, args.prepared_max)
    finally:
        cluster.stop()
        pgcluster.remove(base)


if __name__ == "__main__":
    main()
