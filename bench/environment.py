"""How quiet the machine was: load average and CPU steal over the run, recorded in the JSON.

Steal is read from ``/proc/stat`` (the eighth field of the ``cpu`` line: time
the hypervisor gave to other guests) as a share of all CPU time between the
start and the end of the run. A run is flagged noisy when the 1-minute load
average, at the start or the end, exceeded half the CPUs, or steal exceeded
2%: its ratios then carry more noise than their intervals show.
"""

from __future__ import annotations

import os
from typing import Any

LOAD_LIMIT_PER_CPU = 0.5
STEAL_LIMIT = 0.02


def _cpu_times() -> list[int] | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:]]


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Quiet:
    """Snapshot at the start of a run; :meth:`report` compares with the end."""

    def __init__(self) -> None:
        self.cpu_start = _cpu_times()
        self.load_start = _loadavg()

    def report(self) -> dict[str, Any]:
        cpu_end = _cpu_times()
        load_end = _loadavg()
        steal = None
        if self.cpu_start and cpu_end and len(cpu_end) > 7:
            delta = [b - a for a, b in zip(self.cpu_start, cpu_end, strict=False)]
            # guest and guest_nice (fields 9-10) are already counted in user and nice.
            total = sum(delta[:8])
            steal = delta[7] / total if total > 0 else 0.0
        cpus = os.cpu_count() or 1
        reasons = []
        for when, load in (("start", self.load_start), ("end", load_end)):
            if load and load[0] > LOAD_LIMIT_PER_CPU * cpus:
                reasons.append(f"1-minute load average {load[0]:.2f} at the {when} on {cpus} CPUs "
                               f"(limit {LOAD_LIMIT_PER_CPU * cpus:.1f})")
        if steal is not None and steal > STEAL_LIMIT:
            reasons.append(f"CPU steal {steal:.1%} (limit {STEAL_LIMIT:.0%})")
        return {
            "loadavg_start": self.load_start, "loadavg_end": load_end, "cpus": cpus,
            "cpu_steal_share": steal, "noisy": bool(reasons), "noisy_reasons": reasons,
        }
