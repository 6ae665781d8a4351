"""The request line's fast formatting writes exactly what the general escaping path writes."""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem.mcp_adapter.requestlog import TextFormatter, _field_value, _pairs

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", " ", "a=b", 'say "hi"', "line\nbreak", "\x1b[31m", "back\\slash", "\u2028", "ok-1.2"]),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])  # a shared, busy machine
@given(st.dictionaries(st.sampled_from(["request_id", "client", "path", "site", "tool", "latency_ms"]), VALUES))
def test_pairs_match_the_general_escaping(fields: dict[str, object]) -> None:
    general = " ".join(f"{k}={_field_value(v)}" for k, v in fields.items() if v is not None)
    assert _pairs(fields) == general


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(min_value=0, max_value=4_000_000_000))
def test_time_stamps_match_the_standard_formatter(created: float) -> None:
    record = logging.makeLogRecord({"msg": "request"})
    record.created, record.msecs = created, int((created - int(created)) * 1000)
    ours = TextFormatter()
    ours.formatTime(record)  # fills the per-second cache with this second
    assert ours.formatTime(record) == logging.Formatter().formatTime(record)
    later = logging.makeLogRecord({"msg": "request"})
    later.created, later.msecs = created + 1.5, record.msecs
    assert ours.formatTime(later) == logging.Formatter().formatTime(later)
