"""How long a standby's ``hot_standby_feedback`` holds back the primary's removal horizon past a new transaction.

``python -m bench.probes.pg_standby_feedback [--interval S] [--rounds N]``: starts a throwaway
primary and an idle standby (``pg_basebackup``, ``hot_standby_feedback = on``, the given
``wal_receiver_status_interval``, PostgreSQL's default 10 s when not given), then, N times, takes a
new transaction id on the primary and waits until the standby's walsender ``backend_xmin`` has
passed it: the time an erasure's rewrite keeps the deleted row versions on such a primary with no
query running on the standby. Prints ``uptime`` beside the figures.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import psycopg

from tests import pgcluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    bindir = pgcluster.pg_bin()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found")
    base = pgcluster.make_base("convmem-probe-hsf-")
    nodes: list[pgcluster.Cluster] = []
    try:
        primary = pgcluster.start_cluster(base, "primary", "wal_level = replica", "max_wal_senders = 4")
        nodes.append(primary)
        standby = pgcluster.Cluster(base, "standby", pgcluster.free_port(), bindir)
        standby.basebackup_from(primary, "probe_standby")
        extra = [f"wal_receiver_status_interval = {args.interval}s"] if args.interval is not None else []
        standby.configure(f"port = {standby.port}", "hot_standby_feedback = on", *extra)
        nodes.append(standby)
        standby.start()
        query = (
            "SELECT age(backend_xmin) >= age(%s::xid8::xid) FROM pg_stat_replication"
            " WHERE application_name = 'probe_standby'"
        )
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            while conn.execute(query, ("1",)).fetchone() in (None, (None,)):
                time.sleep(0.05)  # the standby's first feedback
            held = []
            for _ in range(args.rounds):
                xid = str(conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
                started = time.monotonic()
                while conn.execute(query, (xid,)).fetchone() == (True,):
                    time.sleep(0.02)
                held.append(time.monotonic() - started)
                time.sleep(0.7)
        print("held for " + ", ".join(f"{s:.2f}" for s in held) + " s")
    finally:
        for node in nodes:
            node.stop()
        pgcluster.remove(base)
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
