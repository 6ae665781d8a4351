"""The state one run shares between workloads: sizes, backends, where data lives."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import lmdb_peer
from .backends import Convmem, Postgres
from .backends import Floor as FloorExtending
from .backends import Sqlite as SqliteTextSchema
from .floor_peer import Floor
from .lmdb_peer import Lmdb
from .sqlite_peer import Sqlite
from .util import FLOOR_EXTENDING, SQLITE_NORMAL, SQLITE_TEXT, Progress, engine_sync_disabled

SITE = "bench-site"


@dataclass
class Sizes:
    """How big each workload is: the full run, ``quick`` (a few minutes) and ``smoke`` (CI's check)."""

    #: Timed operations per backend in each op-by-op workload (append, new conversation, recall, MCP).
    ops: int = 1000
    #: Sessions of the session mix (each: a new conversation, 20 appends, a recall every 5: 25 ops).
    sessions: int = 48
    rounds: int = 7
    append_batches: tuple[int, ...] = (1, 10, 100)
    conv_lengths: tuple[int, ...] = (1_000, 10_000, 100_000)
    replay_rounds: int = 3
    site_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    list_calls: int = 200
    writers: tuple[int, ...] = (1, 4, 16, 64)
    writer_processes: bool = True
    #: Appends per backend per concurrency case, over all writers and rounds (at least this many).
    concurrent_ops: int = 1000
    concurrency_rounds: int = 3
    cold_rounds: int = 5
    rss_items: int = 1000
    rss_samples: int = 5
    item_bytes: int = 1024

    @classmethod
    def quick(cls) -> Sizes:
        return cls(ops=150, sessions=4, rounds=3, conv_lengths=(1_000, 100_000), replay_rounds=2,
                   site_sizes=(1_000, 10_000), list_calls=50, writers=(1, 4, 16), concurrent_ops=160,
                   concurrency_rounds=2, cold_rounds=3, rss_items=200, rss_samples=3)

    @classmethod
    def smoke(cls) -> Sizes:
        """Small enough for the test suite: every ratio, none of them meaningful."""
        return cls(ops=25, sessions=1, rounds=2, append_batches=(1, 10, 100), conv_lengths=(300, 3_000),
                   replay_rounds=1, site_sizes=(200, 1_000), list_calls=5, writers=(1, 4, 16),
                   writer_processes=False, concurrent_ops=48, concurrency_rounds=1, cold_rounds=1,
                   rss_items=20, rss_samples=2)


@dataclass
class Ctx:
    """Backends opened on one work directory, plus run options."""

    workdir: str
    sizes: Sizes
    quick: bool
    durable_setup: bool
    progress: Progress
    want_postgres: bool = True
    convmem: Convmem = field(init=False)
    sqlite: Sqlite = field(init=False)
    floor: Floor = field(init=False)
    #: None when the ``lmdb`` package is missing (the LMDB ratios are then unavailable).
    lmdb: Lmdb | None = field(init=False, default=None)
    sqlite_text: SqliteTextSchema = field(init=False)
    sqlite_normal: Sqlite = field(init=False)
    floor_extending: FloorExtending = field(init=False)
    #: None when no PostgreSQL server could be had (the run then says so and goes on without it).
    postgres: Postgres | None = field(init=False, default=None)
    postgres_dsn: str | None = field(init=False, default=None)
    _pg_cluster: Any = field(init=False, default=None)
    _pg_reaper: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.convmem = Convmem(self.convmem_dir)
        self.sqlite = Sqlite(self.sqlite_path)
        self.floor = Floor(self.floor_dir)
        why = lmdb_peer.available()
        if why:
            print(f"bench: {why}; the lmdb column stays empty", file=sys.stderr)
        else:
            self.lmdb = Lmdb(self.lmdb_dir)
        self.sqlite_text = SqliteTextSchema(os.path.join(self.workdir, "sqlite-text-schema.db"))
        self.sqlite_text.name = SQLITE_TEXT
        self.sqlite_normal = Sqlite(os.path.join(self.workdir, "sqlite-normal.db"), "NORMAL", SQLITE_NORMAL)
        self.floor_extending = FloorExtending(os.path.join(self.workdir, "floor-extending"))
        self.floor_extending.name = FLOOR_EXTENDING
        if self.want_postgres:
            self._start_postgres()
        else:
            print("bench: PostgreSQL left out (--no-postgres); the postgres column stays empty", file=sys.stderr)

    def _start_postgres(self) -> None:
        """``CONVMEM_BENCH_POSTGRES`` (a DSN), else a throwaway loopback cluster, else no PostgreSQL column."""
        dsn = os.environ.get("CONVMEM_BENCH_POSTGRES")
        if not dsn:
            from tests import pgcluster

            if pgcluster.pg_bin() is None:
                print("bench: no PostgreSQL server binaries; the postgres column stays empty", file=sys.stderr)
                return
            base = pgcluster.make_base("convmem-bench-pg-")
            try:
                cluster = pgcluster.start_cluster(base, "bench")
                self._pg_cluster = (cluster, base)
                self._pg_reaper = pgcluster.reap_on_exit(cluster, base)
            except Exception as exc:
                print(f"bench: could not start PostgreSQL ({exc}); the postgres column stays empty", file=sys.stderr)
                pgcluster.remove(base)
                return
            dsn = self._pg_cluster[0].dsn()
        self.postgres_dsn = dsn
        self.postgres = Postgres(dsn)

    @property
    def convmem_dir(self) -> str:
        return os.path.join(self.workdir, "convmem")

    @property
    def sqlite_path(self) -> str:
        return os.path.join(self.workdir, "sqlite.db")

    @property
    def floor_dir(self) -> str:
        return os.path.join(self.workdir, "floor")

    @property
    def lmdb_dir(self) -> str:
        return os.path.join(self.workdir, "lmdb")

    def backends(self) -> list[Any]:
        """convmem and its peers: the tuned SQLite, LMDB, the pre-zeroed floor (and PostgreSQL when running)."""
        out: list[Any] = [self.convmem, self.sqlite]
        if self.lmdb is not None:
            out.append(self.lmdb)
        out.append(self.floor)
        if self.postgres is not None:
            out.append(self.postgres)
        return out

    def append_backends(self) -> list[Any]:
        """:meth:`backends` plus the labelled extra rows of the append workloads."""
        return [*self.backends(), self.sqlite_text, self.sqlite_normal, self.floor_extending]

    @contextlib.contextmanager
    def setup_mode(self) -> Iterator[None]:
        """Bulk-load data that is only read back: syncs off unless ``--durable-setup``.

        The bytes on disk are the same either way; only the build is faster.
        """
        if self.durable_setup:
            yield
            return
        self.sqlite.set_synchronous("OFF")
        self.floor.sync = False
        if self.lmdb is not None:
            self.lmdb.begin_bulk()
        if self.postgres is not None:
            self.postgres.bulk = True
        try:
            with engine_sync_disabled():
                yield
        finally:
            self.sqlite.set_synchronous("FULL")
            self.floor.sync = True
            if self.lmdb is not None:
                self.lmdb.end_bulk()
            if self.postgres is not None:
                self.postgres.bulk = False
                self.postgres.analyze()  # what autovacuum would do shortly after a bulk load

    def close(self) -> None:
        for b in self.append_backends():
            b.close()
        if self._pg_cluster is not None:
            from tests import pgcluster

            cluster, base = self._pg_cluster
            cluster.stop()
            pgcluster.remove(Path(base))
            self._pg_cluster = None
        if self._pg_reaper is not None:
            self._pg_reaper.stdin.close()  # nothing left for it to do: it finds the server stopped
            self._pg_reaper.wait(timeout=60)
            self._pg_reaper = None
