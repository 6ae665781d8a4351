"""``recorded_at`` timestamps: integer microseconds since the Unix epoch, UTC.

On disk and in memory a timestamp is an int of microseconds; callers see it as
RFC 3339 text with exactly six fractional digits and a ``Z`` suffix, e.g.
``2026-11-30T01:54:43.123456Z``. That text sorts in time order.
"""

from __future__ import annotations

import datetime as _dt
import time

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def now_us() -> int:
    """The wall clock in microseconds (may step backwards; callers clamp)."""
    return time.time_ns() // 1000


#: Last second of year 9999: beyond it (or before 1970) the slow path keeps the exact old output.
_FAST_MAX_S = 253_402_300_799
#: Formatted whole seconds, recently used (timestamps cluster: a batch, a burst of appends).
_seconds: dict[int, str] = {}


def format_us(us: int) -> str:
    """Microseconds since the epoch as RFC 3339 UTC text with microseconds.

    Hot: every listed summary and every returned record formats one, so the
    common range (1970-9999) uses ``time.gmtime`` and a cache of recently
    formatted seconds: several times cheaper than ``datetime.strftime``, and
    identical in output.
    """
    secs, frac = divmod(us, 1_000_000)
    if 0 <= secs <= _FAST_MAX_S:
        prefix = _seconds.get(secs)
        if prefix is None:
            t = time.gmtime(secs)
            prefix = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
            if len(_seconds) >= 4096:
                _seconds.clear()
            _seconds[secs] = prefix
        return f"{prefix}.{frac:06d}Z"
    when = _EPOCH + _dt.timedelta(microseconds=us)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> int:
    """Parse text made by :func:`format_us` back to microseconds.

    Raises ValueError on anything else.
    """
    if len(text) != 27 or not text.endswith("Z"):
        raise ValueError(f"not a recorded_at timestamp: {text!r}")
    t = _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=_dt.UTC)
    delta = t - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
