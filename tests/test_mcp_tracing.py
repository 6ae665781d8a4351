"""The SDK's OpenTelemetry span is opened for every request once a tracer provider is configured, and not before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import anyio, json
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, INVALID_SPAN_CONTEXT
    from convmem.mcp_adapter.server import Backend, build_server
    from convmem.mcp_adapter.tracing import SpanWhenTracing, tracing
    from convmem.logstore import open_store
    from mcp import Client

    started = []

    class RecordingTracer(trace.NoOpTracer):
        def start_span(self, name, *args, **kwargs):
            started.append(name)
            return NonRecordingSpan(INVALID_SPAN_CONTEXT)

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args, **kwargs):
            return RecordingTracer()

    async def main(data):
        server = build_server(Backend(store=open_store(data), data_dir=data, fixed_site="s"))
        assert any(isinstance(m, SpanWhenTracing) for m in server.middleware)
        async with Client(server, mode="legacy") as client:
            assert not tracing()
            await client.send_ping()
            before = list(started)
            trace.set_tracer_provider(Provider())
            assert tracing()
            await client.send_ping()
            await client.list_tools()
        print(json.dumps({"before": before, "after": started}))

    import sys, tempfile
    anyio.run(main, tempfile.mkdtemp())
    """
)


def test_spans_start_once_a_tracer_provider_is_set() -> None:
    # A process of its own: a tracer provider can be set only once per process.
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []
    server_spans = [name for name in seen["after"] if not name.startswith("MCP send ")]  # the client's own spans
    assert server_spans == ["ping", "tools/list"]
