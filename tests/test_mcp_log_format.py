"""The request line's fast formatting writes exactly what the general escaping path writes."""

from __future__ import annotations

import io
import logging
import re
import sys
from http import HTTPStatus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convmem.mcp_adapter import requestlog
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


#: Mostly plain values (the usual line), sometimes one that needs escaping, quoting or leaving out.
PLAIN = st.from_regex(r"[a-z0-9./:-]{1,10}", fullmatch=True)
TEXTS = st.one_of(PLAIN, PLAIN, PLAIN, st.none(), st.text(max_size=6), st.sampled_from(["", "a b", "x=1", "é", "\x1b"]))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])  # a shared, busy machine
@given(
    st.tuples(*[TEXTS] * 8),
    st.one_of(st.none(), st.integers(100, 599), st.sampled_from([HTTPStatus.OK, HTTPStatus.NOT_FOUND, True])),
    st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)),
    st.floats(min_value=0, max_value=10**6),
)
def test_the_usual_line_from_the_request_is_what_the_pairs_of_its_fields_are(
    texts: tuple[str | None, ...], status: int | None, sizes: tuple[int, int], latency_ms: float
) -> None:
    request_id, client, method, path, site, tool, outcome, error_code = texts
    info = requestlog.RequestInfo(
        request_id,  # type: ignore[arg-type]  # None too: the line leaves out what is missing
        client=client, method=method, path=path, status=status, site=site, tool=tool, outcome=outcome,
        error_code=error_code, request_bytes=sizes[0], response_bytes=sizes[1],
    )
    assert requestlog.info_pairs(info, latency_ms) == _pairs(info.fields(latency_ms))


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


REQUEST_KEYS = ["request_id", "client", "method", "path", "status", "site", "tool", "outcome", "latency_ms"]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(REQUEST_KEYS), VALUES, min_size=1),
    st.floats(min_value=0, max_value=4_000_000_000),
    st.sampled_from([logging.INFO, logging.WARNING]),
)
def test_the_direct_line_is_what_the_formatter_makes_of_the_record(
    fields: dict[str, object], created: float, level: int
) -> None:
    record = requestlog.logger.makeRecord(
        requestlog.logger.name, level, __file__, 1, "request", (), None, "_emit", {"request": fields}
    )
    record.created, record.msecs = created, int((created - int(created)) * 1000) + 0.0
    formatter = TextFormatter()
    assert requestlog.direct_line(formatter, level, record.created, record.msecs, fields) == formatter.format(record)


class _Seen(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


def test_the_request_line_goes_straight_to_the_stream_only_when_nothing_else_would_see_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        requestlog.configure("text")
        root.setLevel(logging.INFO)
        info = requestlog.RequestInfo("00112233aabbccdd", client="127.0.0.1", method="POST", path="/mcp", status=200)
        assert requestlog._direct_handler(logging.INFO) is requestlog._configured
        requestlog._emit(info)
        direct = stream.getvalue()
        # A filter on the request logger must see every record: the line then goes through logging.
        seen = _Seen()
        requestlog.logger.addFilter(seen)
        try:
            assert requestlog._direct_handler(logging.INFO) is None
            requestlog._emit(info)
        finally:
            requestlog.logger.removeFilter(seen)
        assert len(seen.records) == 1 and seen.records[0].request["request_id"] == "00112233aabbccdd"  # type: ignore[attr-defined]
        # So must a second handler (a test's, an operator's).
        other = io.StringIO()
        extra = logging.StreamHandler(other)
        root.addHandler(extra)
        try:
            assert requestlog._direct_handler(logging.INFO) is None
            requestlog._emit(info)
        finally:
            root.removeHandler(extra)
        assert other.getvalue() == "request\n"  # its own (default) format: it was handed the record
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)
        requestlog._configured = None
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and lines[0] == direct.rstrip("\n")
    # Time stamp and latency differ from line to line; the rest is the same, and what the formatter writes.
    shape = re.compile(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO convmem.request: request request_id=00112233aabbccdd "
        r"client=127.0.0.1 method=POST path=/mcp status=200 latency_ms=[0-9.e+-]+ request_bytes=0 response_bytes=0$"
    )
    assert all(shape.match(line) for line in lines), lines
