"""The in-flight figure's arithmetic (bench/ltm_eval/concurrency.py): the ratio and the cores used each way."""

from __future__ import annotations

import pytest

from bench.ltm_eval.concurrency import Timings, interleaved


def test_cores_are_cpu_time_over_wall_time_each_way() -> None:
    # Alone: 4 calls of 2 ms wall with 1 ms of CPU each: half a core. In flight: 8 calls, 1.5 ms of CPU
    # each, in 6 ms of wall time all told: 2 cores.
    t = Timings(alone=[2.0] * 4, together=[10.0] * 8, cpu_alone=1.0, cpu_together=1.5, wall_together=0.006)
    alone, in_flight = t.cores
    assert alone == pytest.approx(0.5)
    assert in_flight == pytest.approx(2.0)
    assert t.ratio == pytest.approx(5.0)
    assert "cores used 0.50 alone, 2.00 in flight" in t.summary(8)


def test_interleaved_makes_every_call_once() -> None:
    seen: list[int] = []
    t = interleaved(seen.append, in_flight=3, rounds=2, per_thread=4)
    assert sorted(seen) == list(range(len(seen)))  # a new i for every call, none twice
    assert len(t.alone) == 2 * (3 * 4 // 2) and len(t.together) == 2 * 3 * 4
    assert t.cores[0] >= 0 and t.cores[1] >= 0
