"""The SDK's OpenTelemetry span is opened for every request once a tracer provider is configured, and not before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_a_provider_named_by_the_environment_is_used(tmp_path: Path) -> None:
    # A provider package of the test's own, found by its entry point as OpenTelemetry finds any.
    (tmp_path / "convmem_test_provider.py").write_text(
        "from opentelemetry import trace\n"
        "class Provider(trace.TracerProvider):\n"
        "    def get_tracer(self, *args, **kwargs):\n"
        "        return trace.NoOpTracer()\n"
    )
    info = tmp_path / "convmem_test_provider-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: convmem-test-provider\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_tracer_provider]\nconvmem_test = convmem_test_provider:Provider\n"
    )
    script = "from convmem.mcp_adapter.tracing import tracing\nprint(tracing())\n"
    base = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    path = os.pathsep.join([str(tmp_path), *filter(None, [base.get("PYTHONPATH")])])
    seen = {}
    for name, extra in (("named", {"OTEL_PYTHON_TRACER_PROVIDER": "convmem_test"}), ("unset", {})):
        env = {**base, "PYTHONPATH": path, **extra}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        seen[name] = done.stdout.strip().splitlines()[-1]
    assert seen == {"named": "True", "unset": "False"}
