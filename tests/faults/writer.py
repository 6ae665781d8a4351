"""A writer process for the crash tests: appends until killed, recording every ack.

Usage: ``python writer.py --data-dir D --id W --convs a,b,c --acks FILE [...]``

Prints ``ready`` once the store is open. Each acknowledged batch is recorded
as one JSON line in the ack file with a single ``os.write`` (no user-space
buffer that a SIGKILL could lose). Exits 0 after ``--batches`` batches (or
never, with 0), or with status 86 at a named crash point
(``CONVMEM_CRASH_AT``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import SITE, Ack, make_batch

from convmem.logstore import FileStore, Io, Timeout


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--convs", required=True, help="comma-separated conversation ids")
    ap.add_argument("--acks", required=True)
    ap.add_argument("--batches", type=int, default=0, help="stop after this many (0: until killed)")
    ap.add_argument("--start-batch", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--segment-bytes", type=int, default=16384)
    ap.add_argument("--index-interval", type=int, default=4096)
    ap.add_argument("--max-items", type=int, default=6)
    ap.add_argument("--max-pad", type=int, default=300)
    ap.add_argument("--compact-bytes", type=int, default=0, help="shrink the manifest compaction threshold")
    ap.add_argument("--lock-timeout", type=float, default=10.0)
    ap.add_argument(
        "--idempotent",
        action="store_true",
        help="append batch b under the idempotency key ID-b, and retry a retryable failure until it is acknowledged",
    )
    ap.add_argument(
        "--conversation-pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first appends claim pre-created directories (the engine's default)",
    )
    args = ap.parse_args()

    rng = random.Random(args.seed)
    convs = args.convs.split(",")
    store = FileStore(
        args.data_dir,
        lock_timeout=args.lock_timeout,
        segment_bytes=args.segment_bytes,
        index_interval=args.index_interval,
        conversation_pool=args.conversation_pool,
    )
    if args.compact_bytes:
        # Exercise manifest compaction (normally past 4 MiB of activity log) under crashes.
        store._manifest(SITE)._compact_bytes = args.compact_bytes
    ack_fd = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    b = args.start_batch
    done = 0
    while args.batches == 0 or done < args.batches:
        conv = rng.choice(convs)
        n = rng.randint(1, args.max_items)
        pad = rng.randint(0, args.max_pad)
        key = f"{args.id}-{b}" if args.idempotent else None
        try:
            r = store.append(SITE, conv, make_batch(args.id, b, n, pad), idempotency_key=key)
        except (Timeout, Io) as exc:  # retryable; with no retry the batch simply is not acknowledged
            sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
            if args.idempotent:
                continue  # the same batch again, under its key
            b += 1
            continue
        os.write(ack_fd, Ack(conv, r.first, r.last, args.id, b, n, pad).line())
        b += 1
        done += 1
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
