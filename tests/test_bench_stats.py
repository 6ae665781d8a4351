"""The bench's statistics: percentiles as numpy computes them, intervals around their value, the quiet record."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench import environment
from bench.util import Row, median_ci, paired_median_diff_ci, percentile, percentile_ratio_ci


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentile_matches_numpy(seed: int) -> None:
    print(f"seed {seed}")
    rnd = random.Random(seed)
    xs = [rnd.lognormvariate(0, 1) for _ in range(rnd.randint(1, 3000))]
    for q in (0, 50, 99, 99.9, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_ratio_interval_holds_its_value_and_separates_distinct_samples() -> None:
    rnd = random.Random(7)
    fast = [rnd.gauss(1.0, 0.1) for _ in range(1000)]
    slow = [rnd.gauss(2.0, 0.2) for _ in range(1000)]
    value, lo, hi = percentile_ratio_ci(slow, fast)
    assert lo <= value <= hi
    assert 1.8 < lo and hi < 2.2
    v2, lo2, hi2 = percentile_ratio_ci(fast, fast, 99, 50)
    assert lo2 <= v2 <= hi2 and v2 > 1
    m, mlo, mhi = median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (m, mlo <= m <= mhi) == (3.0, True)


def test_paired_difference_interval_keeps_the_pairing() -> None:
    """A shared per-round stall moves both calls of a round; the paired interval sees through it."""
    rnd = random.Random(11)
    stall = [rnd.choice([0.0, 0.0, 0.0, 5.0]) + rnd.gauss(6.0, 0.5) for _ in range(300)]
    without = [s + rnd.gauss(0, 0.05) for s in stall]
    with_ = [s + 2.0 + rnd.gauss(0, 0.05) for s in stall]
    added, lo, hi = paired_median_diff_ci(with_, without)
    assert lo <= added <= hi
    assert 1.8 < lo and hi < 2.2
    with pytest.raises(ValueError):
        paired_median_diff_ci([1.0], [1.0, 2.0])


def test_row_speed_ratio_is_the_other_p50_over_convmem_p50() -> None:
    row = Row("append", "x", "ms", higher_better=False, per_op=True,
              samples={"convmem": [0.001] * 99 + [1.0], "sqlite": [0.002] * 100})
    assert row.speed_ratio("sqlite") == pytest.approx(2.0)
    st = row.stats("convmem")
    assert st["p50_ms"] == pytest.approx(1.0) and st["p999_ms"] > 100 and st["ops"] == 100


def test_quiet_record_has_load_steal_and_a_flag() -> None:
    rec = environment.Quiet().report()
    assert set(rec) >= {"loadavg_start", "loadavg_end", "cpu_steal_share", "noisy", "noisy_reasons", "cpus"}
    assert rec["noisy"] == bool(rec["noisy_reasons"])
    if rec["cpu_steal_share"] is not None:
        assert 0.0 <= rec["cpu_steal_share"] <= 1.0
