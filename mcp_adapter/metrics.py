"""Prometheus metrics at ``GET /metrics`` (text exposition format).

Series (all prefixed ``convmem_``):

* ``tool_calls_total{tool,outcome}`` - tool calls, ``outcome`` ``ok`` or ``error``;
* ``tool_errors_total{code}`` - failed tool calls by error code (``Timeout``, ``Unauthenticated``, ...);
* ``tool_latency_seconds{tool}`` - histogram of a tool call's time in the server;
* ``fsync_seconds{call}`` - histogram of each ``fdatasync``/``fsync`` the engine makes;
* ``appended_bytes_total`` - JSON bytes of acknowledged batches;
* ``open_conversations`` - conversations holding open descriptors in the store;
* ``lock_waits_total`` and ``lock_wait_seconds_total`` - times, and total seconds, an append
  or probe waited for a conversation another thread or process held;
* ``auth_failures_total`` - requests refused for missing or wrong credentials;
* ``auth_throttled_total`` - authentication attempts refused by throttling (see :func:`record_throttle`);

and the standard ``process_*``, ``python_info`` and ``python_gc_*`` series.

Who may read them: a ``/metrics`` request is answered when it comes straight
from a loopback address (no ``X-Forwarded-For``/``Forwarded`` header: a
request relayed by a proxy is treated as remote), or, when the server was
started with ``--metrics-token`` (``CONVMEM_METRICS_TOKEN``), from anywhere
with ``Authorization: Bearer TOKEN``. Everything else gets 403 (or 401 for a
wrong token). The series carry no site names, so a scrape reveals no tenant.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from convmem.logstore import observe
from convmem.logstore.store import OpenConversationCount

METRICS_PATH = "/metrics"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The server's metric families, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.tool_calls = Counter(
            "convmem_tool_calls", "Tool calls by tool and outcome", ["tool", "outcome"], registry=r
        )
        self.tool_errors = Counter("convmem_tool_errors", "Failed tool calls by error code", ["code"], registry=r)
        self.tool_latency = Histogram(
            "convmem_tool_latency_seconds", "Time to serve a tool call", ["tool"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.fsync = Histogram(
            "convmem_fsync_seconds", "Duration of the engine's sync calls", ["call"], buckets=_FSYNC_BUCKETS, registry=r
        )
        self.appended_bytes = Counter("convmem_appended_bytes", "JSON bytes of acknowledged batches", registry=r)
        self.open_conversations = Gauge(
            "convmem_open_conversations", "Conversations holding open descriptors in the store", registry=r
        )
        self.lock_waits = Counter("convmem_lock_waits", "Waits for a conversation held by someone else", registry=r)
        self.lock_wait_seconds = Counter(
            "convmem_lock_wait_seconds", "Total seconds spent waiting for busy conversations", registry=r
        )
        self.auth_failures = Counter(
            "convmem_auth_failures", "Requests refused for missing or wrong credentials", registry=r
        )
        self.auth_throttled = Counter(
            "convmem_auth_throttled", "Authentication attempts refused by throttling", registry=r
        )
        #: (tool, outcome) -> its call counter and latency histogram, looked up by label once.
        self._tool_series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    def observe_engine(self, event: str, value: float) -> None:
        """The :mod:`logstore.observe` callback."""
        if event in ("fdatasync", "fsync"):
            self.fsync.labels(event).observe(value)
        elif event == "lock_wait":
            self.lock_waits.inc()
            self.lock_wait_seconds.inc(value)
        elif event == "append_bytes":
            self.appended_bytes.inc(value)

    def tool_call(self, tool: str, seconds: float, error_code: str | None) -> None:
        """Count one finished tool call."""
        outcome = "ok" if error_code is None else "error"
        series = self._tool_series.get((tool, outcome))
        if series is None:  # the first call of this tool with this outcome (tool names are the server's own)
            series = (self.tool_calls.labels(tool, outcome), self.tool_latency.labels(tool))
            self._tool_series[(tool, outcome)] = series
        series[0].inc()
        series[1].observe(seconds)
        if error_code is not None:
            self.tool_errors.labels(error_code).inc()
            if error_code == "Unauthenticated":
                self.auth_failures.inc()


#: The process's metrics. Module-level so that any part of the server (and
#: the authentication throttle) can count into it without plumbing.
METRICS = Metrics()


def record_throttle() -> None:
    """Count one authentication attempt refused by throttling (for the throttle to call)."""
    METRICS.auth_throttled.inc()


def record_auth_failure() -> None:
    """Count one refused authentication outside a tool call (e.g. rejected by HTTP middleware)."""
    METRICS.auth_failures.inc()


def install(store: Any) -> None:
    """Start collecting from the engine, and read ``store``'s open-conversation count at each scrape."""
    observe.set_observer(METRICS.observe_engine)
    if isinstance(store, OpenConversationCount):
        counter = store.open_conversations
        METRICS.open_conversations.set_function(lambda: float(counter()))


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint(token: str | None) -> Any:
    """The Starlette endpoint for ``GET /metrics``, guarded as the module docstring says."""
    expected = f"Bearer {token}".encode() if token else None

    async def metrics(request: Request) -> Response:
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return PlainTextResponse("metrics need Authorization: Bearer <the --metrics-token>", status_code=401)
        else:
            client = request.client.host if request.client else None
            relayed = "x-forwarded-for" in request.headers or "forwarded" in request.headers
            if relayed or not _loopback(client):
                return PlainTextResponse(
                    "metrics are served to loopback clients only; start the server with --metrics-token "
                    "to scrape from elsewhere",
                    status_code=403,
                )
        return Response(generate_latest(METRICS.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def token_from(args: argparse.Namespace) -> str | None:
    """The metrics token configured for ``args``; raises OSError/ValueError for an unreadable or empty file."""
    path = getattr(args, "metrics_token_file", None)
    if path:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"the metrics token file {path} is empty")
        return token
    return os.environ.get("CONVMEM_METRICS_TOKEN") or None
