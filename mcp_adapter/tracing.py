"""The SDK's OpenTelemetry span per request, opened only when there is somewhere for spans to go.

The SDK puts :class:`mcp.server._otel.OpenTelemetryMiddleware` first on every
``Server.middleware`` list: each request opens a span through the global
tracer. With no tracer provider configured (``opentelemetry-api`` alone, as
convmem ships) that span is the API's non-recording one: nothing is recorded
or exported, and the whole detour (a dictionary of attributes, two context
managers, a context attach and detach) cost about a quarter of a ``ping``'s
CPU in the server.

:class:`SpanWhenTracing` keeps the SDK's middleware and runs it whenever a
tracer provider is configured (``opentelemetry.trace.get_tracer_provider()``
is not the API's proxy: ``set_tracer_provider`` was called, or the
``OTEL_PYTHON_TRACER_PROVIDER`` variable names one), decided per request, so
a provider installed after start-up is used from its next request on.
Otherwise the request goes straight to the rest of the chain. Nothing a
client sees differs: the non-recording span changes no result and no error,
and convmem's handlers never read the current span.

The decision itself costs next to nothing: ``get_tracer_provider()``, while
no provider is set, looks the variable up in ``os.environ`` (a mapping
lookup that raises and catches ``KeyError``: about 13 us in a request's
context, a tenth of a ``ping``'s CPU, measured with
``python -m bench.mcp_profile --floor``). The variable is looked up once, when
:mod:`.tracing` is imported (the process's OpenTelemetry configuration
comes from its environment at start-up); after that a request asks the API
only when its provider global is set or the variable was there.
"""

from __future__ import annotations

import os
from typing import Any

from mcp.server import Server
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from opentelemetry import trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

#: The provider variable was set when the process started (the API loads the provider it names on first use).
_PROVIDER_VARIABLE = OTEL_PYTHON_TRACER_PROVIDER in os.environ
_ABSENT = object()


def tracing() -> bool:
    """True when a tracer provider is configured, i.e. a span opened now would be recorded."""
    if not _PROVIDER_VARIABLE and getattr(trace, "_TRACER_PROVIDER", _ABSENT) is None:
        return False  # the API's own global: nothing set (if the API drops that name, it is asked every time)
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


class SpanWhenTracing:
    """The SDK's span middleware ``inner``, entered only while :func:`tracing` holds."""

    def __init__(self, inner: ServerMiddleware[Any]) -> None:
        self.inner = inner

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if tracing():
            return await self.inner(ctx, call_next)
        return await call_next(ctx)


def span_only_when_tracing(server: Server[Any]) -> None:
    """Wrap the SDK's OpenTelemetry middleware on ``server`` in :class:`SpanWhenTracing` (others unchanged)."""
    server.middleware = [
        SpanWhenTracing(m) if isinstance(m, OpenTelemetryMiddleware) else m for m in server.middleware
    ]
