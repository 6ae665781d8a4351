"""How long a read waits in one process right after another process's append to the same conversation.

``python -m bench.probes.xproc_read [--appends N] [--gap SECONDS]`` forks a
writer process that appends one item, tells the reader over a pipe, waits for
its answer and sleeps ``--gap`` before the next append. The reader reads the
last item as soon as it is told (it must be the one just acknowledged) and
times that read. A gap longer than a second shows a lone append (an agent's
turn through another worker); a short one, a conversation written busily.
Prints the read's percentiles in milliseconds. Not part of the bench's ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from convmem import logstore

SITE = "site-xproc"
CONV = "conversation-xproc"


def _writer(root: str, told: int, answered: int, appends: int, gap: float) -> None:
    store = logstore.open_store(root)
    with os.fdopen(told, "wb", 0) as tell, os.fdopen(answered, "rb", 0) as hear:
        for i in range(appends):
            store.append(SITE, CONV, [{"i": i}])
            tell.write(b"x")
            hear.read(1)
            time.sleep(gap)
    store.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--gap", type=float, default=1.2, help="seconds between the writer's appends")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="xproc-read-", dir=".")
    try:
        store = logstore.open_store(root)
        store.append(SITE, CONV, [{"i": -1}])
        store.read(SITE, CONV, logstore.Tail(1))
        tell_r, tell_w = os.pipe()
        ans_r, ans_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(tell_r)
            os.close(ans_w)
            try:
                _writer(root, tell_w, ans_r, args.appends, args.gap)
            finally:
                os._exit(0)
        os.close(tell_w)
        os.close(ans_r)
        waits: list[float] = []
        with os.fdopen(tell_r, "rb", 0) as hear, os.fdopen(ans_w, "wb", 0) as answer:
            for i in range(args.appends):
                hear.read(1)
                started = time.perf_counter()
                items = store.read(SITE, CONV, logstore.Tail(1))
                waits.append((time.perf_counter() - started) * 1e3)
                if items[-1].payload["i"] != i:
                    raise SystemExit(f"read {items[-1].payload} after the writer acknowledged item {i}")
                answer.write(b"y")
        os.waitpid(pid, 0)
        store.close()
        waits.sort()

        def q(p: float) -> float:
            return waits[min(len(waits) - 1, int(p * len(waits)))]

        print(f"gap {args.gap * 1e3:.0f} ms, {len(waits)} reads after another process's append: "
              f"p50 {q(0.5):.3f} ms, p90 {q(0.9):.3f}, max {waits[-1]:.3f} (load {os.getloadavg()[0]:.2f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
