"""The state one run shares between workloads: sizes, backends, where data lives."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backends import Convmem, Floor, Postgres, Sqlite
from .util import Progress, engine_sync_disabled

SITE = "bench-site"


@dataclass
class Sizes:
    """How big each workload is; ``quick`` shrinks them to run in under two minutes."""

    rounds: int = 7
    append_rounds: int = 11
    append_batches: dict[int, int] = field(default_factory=lambda: {1: 100, 10: 100, 100: 30})
    conv_lengths: tuple[int, ...] = (1_000, 10_000, 100_000)
    recall_calls: int = 200
    replay_rounds: int = 3
    site_sizes: tuple[int, ...] = (1_000, 10_000, 100_000)
    list_calls: int = 200
    concurrent_appends: int = 40
    concurrency_rounds: int = 3
    cold_rounds: int = 5
    mcp_calls: int = 300
    item_bytes: int = 1024

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            rounds=3,
            append_rounds=5,
            append_batches={1: 30, 10: 30, 100: 8},
            conv_lengths=(1_000, 10_000, 100_000),
            recall_calls=50,
            replay_rounds=2,
            site_sizes=(1_000, 10_000),
            list_calls=50,
            concurrent_appends=12,
            concurrency_rounds=2,
            cold_rounds=3,
            mcp_calls=60,
            item_bytes=1024,
        )


@dataclass
class Ctx:
    """Backends opened on one work directory, plus run options."""

    workdir: str
    sizes: Sizes
    quick: bool
    durable_setup: bool
    progress: Progress
    convmem: Convmem = field(init=False)
    sqlite: Sqlite = field(init=False)
    floor: Floor = field(init=False)
    #: None when no PostgreSQL server could be had (the run then says so and goes on without it).
    postgres: Postgres | None = field(init=False, default=None)
    postgres_dsn: str | None = field(init=False, default=None)
    _pg_cluster: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.convmem = Convmem(self.convmem_dir)
        self.sqlite = Sqlite(self.sqlite_path)
        self.floor = Floor(self.floor_dir)
        self._start_postgres()

    def _start_postgres(self) -> None:
        """``CONVMEM_BENCH_POSTGRES`` (a DSN), else a throwaway loopback cluster, else no PostgreSQL column."""
        dsn = os.environ.get("CONVMEM_BENCH_POSTGRES")
        if not dsn:
            from tools import pgcluster

            if pgcluster.pg_bin() is None:
                print("bench: no PostgreSQL server binaries; the postgres column stays empty", file=sys.stderr)
                return
            base = pgcluster.make_base("convmem-bench-pg-")
            try:
                self._pg_cluster = (pgcluster.start_cluster(base, "bench"), base)
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

    def backends(self) -> list[Convmem | Sqlite | Floor | Postgres]:
        out: list[Convmem | Sqlite | Floor | Postgres] = [self.convmem, self.sqlite, self.floor]
        if self.postgres is not None:
            out.append(self.postgres)
        return out

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
        if self.postgres is not None:
            self.postgres.bulk = True
        try:
            with engine_sync_disabled():
                yield
        finally:
            self.sqlite.set_synchronous("FULL")
            self.floor.sync = True
            if self.postgres is not None:
                self.postgres.bulk = False
                self.postgres.analyze()  # what autovacuum would do shortly after a bulk load

    def close(self) -> None:
        for b in self.backends():
            b.close()
        if self._pg_cluster is not None:
            from tools import pgcluster

            cluster, base = self._pg_cluster
            cluster.stop()
            pgcluster.remove(Path(base))
            self._pg_cluster = None
