"""Does ranking serialise? ``Retriever.search`` p50 with 8 calls in flight against its p50 alone.

``python -m bench.ltm_eval.concurrency [--threads 8] [--rounds 8] [--per-thread 10]``: one site's retriever
over the labelled memories (their vectors encoded once first), then searches, each with a hint never searched
before (so each one runs the encoder), alone and ``--threads`` at once in alternating blocks
(:func:`interleaved`). Prints both p50s, their ratio, the CPU time per call and the cores used each way, and the
1-minute load average before and after: on a shared machine the ratio is only as good as the cores it got.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from convmem.logstore.memories.retrieval import Retriever

from . import memories, no_answer, queries
from .evaluate import docs_only


@dataclass(frozen=True)
class Timings:
    """Latencies (ms) of calls made alone and with others in flight, and the CPU time (ms) per call each way."""

    alone: list[float]
    together: list[float]
    cpu_alone: float
    cpu_together: float
    wall_together: float

    @property
    def ratio(self) -> float:
        return statistics.median(self.together) / statistics.median(self.alone)

    @property
    def cores(self) -> tuple[float, float]:
        """The cores the process used alone and in flight: its CPU time over the wall time of the calls."""
        alone = self.cpu_alone * len(self.alone) / sum(self.alone)
        return alone, self.cpu_together * len(self.together) / (self.wall_together * 1000)

    def summary(self, in_flight: int) -> str:
        p1, p8 = statistics.median(self.alone), statistics.median(self.together)
        c1, c8 = self.cores
        return (f"p50 alone {p1:.2f} ms; with {in_flight} in flight {p8:.2f} ms: {p8 / p1:.2f}x; CPU per call "
                f"{self.cpu_alone:.2f} ms alone, {self.cpu_together:.2f} ms in flight; "
                f"{len(self.together) / self.wall_together:.0f} calls/s in flight; cores used {c1:.2f} alone, "
                f"{c8:.2f} in flight")


def interleaved(call: Callable[[int], object], in_flight: int, rounds: int, per_thread: int) -> Timings:
    """Time ``call(i)`` (a new ``i`` each time) alone and ``in_flight`` at once, in ``rounds`` alternating blocks.

    Each round makes ``in_flight * per_thread // 2`` calls one after another, then ``per_thread`` calls from
    each of ``in_flight`` threads started together: a shared machine's load changes over seconds, and this way
    both figures see the same load, so their ratio is what running at once costs, not when each was measured.
    Process CPU time per call shows how much of the in-flight wall time was work and how much waiting; the
    cores the process used each way (:attr:`Timings.cores`) show what the machine gave it: the ratio can be no
    better than ``in_flight`` times the CPU per call in flight over the CPU per call alone, over the cores in
    flight over the cores alone.
    """
    alone: list[float] = []
    together: list[float] = []
    done = threading.Lock()
    start, end = threading.Barrier(in_flight + 1), threading.Barrier(in_flight + 1)
    base = [0]
    cpu_alone = cpu_together = wall = 0.0

    def timed(i: int) -> float:
        t0 = time.perf_counter()
        call(i)
        return (time.perf_counter() - t0) * 1000

    def worker(w: int) -> None:
        for _ in range(rounds):
            start.wait()
            mine = [timed(base[0] + w * per_thread + j) for j in range(per_thread)]
            with done:
                together.extend(mine)
            end.wait()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(in_flight)]
    for th in threads:
        th.start()
    n = 0
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(max(1, in_flight * per_thread // 2)):
            alone.append(timed(n))
            n += 1
        cpu_alone += time.process_time() - c0
        base[0] = n
        n += in_flight * per_thread
        c0, t0 = time.process_time(), time.perf_counter()
        start.wait()
        end.wait()
        cpu_together += time.process_time() - c0
        wall += time.perf_counter() - t0
    for th in threads:
        th.join()
    return Timings(alone, together, cpu_alone * 1000 / len(alone), cpu_together * 1000 / len(together), wall)


def _hints(n: int) -> list[str]:
    base = [q.text for q in queries()] + [h.text for h in no_answer()]
    return [f"{base[i % len(base)]} ({i})" for i in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.concurrency", description=__doc__)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-thread", type=int, default=10)
    a = ap.parse_args(argv)
    load0 = open("/proc/loadavg").read().split()[0]
    with tempfile.TemporaryDirectory(prefix="ltm-conc-") as tmp:
        r = Retriever(tmp, answers_kept=0, query_vectors_kept=0, embedder=docs_only())
        r.load(memories())
        for h in _hints(20):  # warm up
            r.search("warm " + h, limit=10)
        hints = _hints(2 * a.rounds * a.threads * a.per_thread)
        t = interleaved(lambda i: r.search(hints[i], limit=10), a.threads, a.rounds, a.per_thread)
        r.close()
    load1 = open("/proc/loadavg").read().split()[0]
    print(f"search {t.summary(a.threads)}; load average {load0} -> {load1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
