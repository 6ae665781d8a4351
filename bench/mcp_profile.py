"""Profile one MCP call kind through the whole server stack: ``python -m bench.mcp_profile``.

Starts ``convmem serve`` (127.0.0.1, a free port, default options) as a child
process under a profiler, drives ``--calls`` raw JSON-RPC POSTs of one kind
(``ping``, ``recall_memory`` of 50 items, ``append_memory`` of one item) over
one kept-alive ``http.client`` connection, stops the server with SIGTERM and
leaves the profile in ``--out``:

* ``--profiler pyinstrument``: ``TOOL.txt``, the call tree of the server's
  event-loop thread (pyinstrument must be installed in the venv; it is not a
  dependency of convmem);
* ``--profiler cprofile``: ``TOOL.prof`` plus ``TOOL.txt``, the functions by
  own time, with the number of calls per request;
* ``--profiler none``: no profile, only the client-side latencies.

The client prints each kind's p50 and the load average beside it. The
profile includes the server's idle wait for the next request (the event
loop's ``select``); subtract it to get the CPU per request.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import mcpserver
from .mcp_e2e import RawClient
from .util import payloads

CONV = "prof-conv-0001"
#: ``bare_app``: the bench's floor (:mod:`bench.noopserver` ``--bare``) answering the same ``ping`` POST.
KINDS = ("ping", "recall_memory", "append_memory", "bare_app")


def _profiler_prefix(profiler: str, out: str, kind: str) -> list[str]:
    if profiler == "pyinstrument":
        return ["-m", "pyinstrument", "--interval", "0.0005", "-r", "text", "-o", os.path.join(out, f"{kind}.txt")]
    if profiler == "cprofile":
        return ["-m", "cProfile", "-o", os.path.join(out, f"{kind}.prof")]
    return []


def _calls(c: RawClient, kind: str) -> Callable[[], object]:
    if kind in ("ping", "bare_app"):
        request = c.prepare("ping")
    elif kind == "recall_memory":
        request = c.prepare_tool("recall_memory", {"conversation_id": CONV, "count": 50})
    else:
        request = c.prepare_tool("append_memory", {"conversation_id": CONV + "-a", "items": payloads(1, 1024)})
    return lambda: c.send(request)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (its threads now: one that has ended is not counted).

    Nanoseconds on the CPU from each thread's ``schedstat`` where the kernel keeps them, else the clock
    ticks of ``/proc/PID/stat`` (10 ms each: enough over thousands of calls, not over a few).
    """
    if not os.path.exists(f"/proc/{pid}/schedstat"):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile (ESRCH once its file is open)
            continue
    return total / 1e9


def profile(
    kind: str, calls: int, profiler: str, out: str, server_args: list[str], gap: float = 0.0
) -> tuple[list[float], float, float, int]:
    """Run ``calls`` calls of ``kind`` against a profiled server, ``gap`` seconds apart (0: back to back).

    Returns the client-side seconds of each call, the server's and the client's CPU seconds per call, and
    the server's resident set (KiB) after the calls.
    """
    data = tempfile.mkdtemp(prefix="convmem-mcp-profile-")
    server = mcpserver.Server(
        os.path.join(data, "data"), python_args=_profiler_prefix(profiler, out, kind), extra_args=server_args,
        bare=kind == "bare_app",
    )
    try:
        c = RawClient(server.url)
        for _ in range(5 if kind != "bare_app" else 0):  # 50 items to recall
            c.tool("append_memory", {"conversation_id": CONV, "items": payloads(10, 1024)})
        fn = _calls(c, kind)
        for _ in range(50):  # warm-up: caches, first-use imports
            fn()
        times = []
        server_cpu, client_cpu = cpu_seconds(server.pid), time.process_time()
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if gap:
                time.sleep(gap)  # the server goes idle between calls, as between the bench's interleaved calls
        server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
        rss_kib = resident_kib(server.pid)
        c.close()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    if profiler == "cprofile":
        import pstats

        with open(os.path.join(out, f"{kind}.txt"), "w") as f:
            stats = pstats.Stats(os.path.join(out, f"{kind}.prof"), stream=f)
            f.write(stage_table(stats, calls + 55) + "\n\n")  # 5 set-up appends, 50 warm-up calls
            stats.sort_stats("tottime").print_stats(60)
    return times, server_cpu / calls, client_cpu / calls, rss_kib


def resident_kib(pid: int) -> int:
    """Process ``pid``'s resident set now (``VmRSS``, KiB); 0 where ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


_UVICORN = "uvicorn.protocols.http.httptools_impl:"
#: The stages of a request, outermost first: (label, "module:qualified.name" of the function). Each is
#: reported as the time spent inside it, its callees included, per request.
STAGES: tuple[tuple[str, str], ...] = (
    ("uvicorn: bytes in, parse, start the request task", _UVICORN + "HttpToolsProtocol.data_received"),
    ("uvicorn: the request task (the whole ASGI app)", _UVICORN + "RequestResponseCycle.run_asgi"),
    ("uvicorn: writing the response", _UVICORN + "RequestResponseCycle.send"),
    ("Starlette app (everything below)", "starlette.applications:Starlette.__call__"),
    ("POST /mcp endpoint (everything below)", "convmem.mcp_adapter.endpoint:McpEndpoint.__call__"),
    ("  the request log line", "convmem.mcp_adapter.requestlog:_emit"),
    ("    written straight to the text handler", "convmem.mcp_adapter.requestlog:_write_direct"),
    ("  body read (the deadline armed only to wait)", "convmem.mcp_adapter.http:read_body"),
    ("    the body deadline's timer", "convmem.mcp_adapter.deadline:Deadline.__enter__"),
    ("request log middleware (not on the endpoint's path)", "convmem.mcp_adapter.requestlog:RequestLog.__call__"),
    ("admission middleware (not on the endpoint's path)", "convmem.mcp_adapter.http:RequestAdmission.__call__"),
    ("  authentication (a large body only)", "convmem.mcp_adapter.http:RequestAdmission._authenticate"),
    ("splice middleware (not on the endpoint's path)", "convmem.mcp_adapter.wire:ResultSplice.__call__"),
    ("Starlette routing (not on POST /mcp)", "starlette.routing:Router.app"),
    ("SDK body-size limit (not on POST /mcp)", "mcp.server.transport_security:RequestBodyLimitMiddleware.__call__"),
    ("single exchange, in place (below: the SDK's kernel)", "convmem.mcp_adapter.exchange:SingleExchange.answer"),
    ("  header checks (a combination not seen before)", "convmem.mcp_adapter.exchange:SingleExchange._headers_pass"),
    ("    Host/Origin/Content-Type checks", "mcp.server.transport_security:"
     "TransportSecurityMiddleware.validate_request"),
    ("  JSON-RPC parse (msgspec, or the SDK's union)", "convmem.mcp_adapter.envelope:parse"),
    ("  the SDK's kernel and the response", "convmem.mcp_adapter.exchange:SingleExchange._reply"),
    ("    the SDK's kernel, driven as serve_one drives it", "convmem.mcp_adapter.exchange:_serve_one"),
    ("      context and session objects", "mcp.server.runner:ServerRunner._make_context"),
    ("      OpenTelemetry span middleware", "mcp.server._otel:OpenTelemetryMiddleware.__call__"),
    ("      method surface validation", "mcp_types.methods:validate_client_request"),
    ("      result sieve (serialize_server_result)", "mcp_types.methods:serialize_server_result"),
    ("      connection teardown (aclose_shielded)", "mcp.server.runner:aclose_shielded"),
    ("    born-ready connection", "convmem.mcp_adapter.exchange:_born_ready"),
    ("    response JSON (msgspec, or the SDK's model)", "convmem.mcp_adapter.envelope:encode_response"),
    ("tool call (everything below)", "convmem.mcp_adapter.server:call_tool"),
    ("  authentication (header cache)", "convmem.mcp_adapter.auth:Authenticator.authenticate"),
    ("  argument validation", "convmem.mcp_adapter.validation:parse_arguments"),
    ("  the store's call and its result", "convmem.mcp_adapter.server:_execute"),
    ("  metrics of the call", "convmem.mcp_adapter.metrics:Metrics.tool_call"),
    ("splice of a read result into the response", "convmem.mcp_adapter.wire:Splice.chunks"),
)


def _code_key(target: str) -> tuple[str, int, str] | None:
    """The profiler's key (file, first line, name) of the function ``module:qualified.name``; None if absent."""
    import importlib
    import inspect

    module_name, _, qualname = target.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    code = getattr(inspect.unwrap(obj), "__code__", None)  # type: ignore[arg-type]
    if code is None:
        return None
    return code.co_filename, code.co_firstlineno, code.co_name


def stage_table(stats: object, requests: int) -> str:
    """Microseconds per request spent inside each of :data:`STAGES` (profiled, so inflated: compare shares)."""
    table: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    lines = [f"{'stage (time inside it, callees included)':<62} {'us/request':>10} {'calls/request':>13}"]
    for label, target in STAGES:
        key = _code_key(target)
        entry = table.get(key) if key is not None else None
        if entry is None:
            lines.append(f"{label:<62} {'-':>10} {'-':>13}")
            continue
        lines.append(f"{label:<62} {entry[3] / requests * 1e6:>10.1f} {entry[1] / requests:>13.2f}")
    return "\n".join(lines)

#: What ``--floor --without`` leaves out: the request line (written nowhere), the endpoint (the
#: layered stack it stands in front of serves every request, as on any path but the common ``POST /mcp``),
#: or the start-up freeze of the cycle collector (:mod:`convmem.mcp_adapter.startup_gc`).
LAYERS = ("request-line", "endpoint", "gc-freeze")


def _pass_through(names: Sequence[str], app: Any) -> None:
    """Leave out each named part of :data:`LAYERS`, in this process (the bench's, not a server)."""
    from convmem.mcp_adapter import endpoint, requestlog

    for name in names:
        if name == "request-line":
            requestlog._emit = lambda info: None
        elif name == "endpoint":
            assert isinstance(app.middleware_stack, endpoint.McpEndpoint)
            app.middleware_stack = app.middleware_stack.layers


class CollectorWatch:
    """The cycle collector's collections per generation and the seconds they took, while installed."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self.collections[generation] += 1
        self.seconds[generation] += time.perf_counter() - self._started

    def summary(self, calls: int) -> str:
        """Collections per 1,000 calls and microseconds in each generation's collections per call."""
        per_1000 = "/".join(f"{c * 1000 / calls:.2f}" for c in self.collections)
        per_call = "/".join(f"{s * 1e6 / calls:.2f}" for s in self.seconds)
        return f"collections per 1,000 calls (gen0/1/2) {per_1000}, us per call in them {per_call}"


def floor(calls: int, without: Sequence[str] = (), watch: CollectorWatch | None = None) -> list[tuple[str, float]]:
    """CPU microseconds per ``ping`` in-process (no sockets, no uvicorn): the SDK's minimum, and the whole app.

    * ``kernel``: what no server on the SDK can skip for a ``ping``: the
      JSON-RPC parse and validation, :func:`mcp.server.runner.serve_one` (a
      born-ready ``Connection``, the method's surface and params validation,
      the handler, the result sieve) and the response's JSON;
    * ``app``: the whole ASGI application ``convmem serve`` runs (request id
      and log line, admission, the exchange, the kernel), called directly;
      ``without`` (names of :data:`LAYERS`) leaves those layers out, so the
      difference is what they cost in the request's context (where code runs
      with colder caches than in a loop of its own).

    The start-up objects are frozen out of the cycle collector as ``convmem
    serve`` freezes them, unless ``without`` names ``gc-freeze``; ``watch``,
    when given, sees every collection of the timed rounds. The best of 5
    rounds of ``calls`` each, process CPU time.
    """
    import asyncio
    import base64
    import gc

    import pydantic_core
    from mcp.server.connection import Connection
    from mcp.server.runner import serve_one
    from mcp.shared.message import ServerMessageMetadata
    from mcp_types import JSONRPCRequest, JSONRPCResponse, jsonrpc_message_adapter

    from convmem.logstore import open_store
    from convmem.logstore.site_credentials import CredentialFile
    from convmem.mcp_adapter import requestlog, startup_gc
    from convmem.mcp_adapter.auth import Authenticator
    from convmem.mcp_adapter.exchange import _DispatchContext
    from convmem.mcp_adapter.http import build_app
    from convmem.mcp_adapter.serve import run_event_loop
    from convmem.mcp_adapter.server import Backend, build_server

    data = tempfile.mkdtemp(prefix="convmem-mcp-floor-")
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    auth = "Basic " + base64.b64encode(f"{mcpserver.SITE}:{mcpserver.PASSWORD}".encode()).decode()
    headers = [(k.lower().encode(), v.encode()) for k, v in {**mcpserver.mcp_headers(), "Authorization": auth,
               "Host": "127.0.0.1:8765", "Content-Length": str(len(body))}.items()]
    results: list[tuple[str, float]] = []

    async def main() -> None:
        CredentialFile(data).add(mcpserver.SITE, mcpserver.PASSWORD)
        store = open_store(data)
        backend = Backend(store=store, data_dir=data, authenticator=Authenticator(CredentialFile(data)))
        server = build_server(backend)
        app = build_app(server, backend, host="127.0.0.1")
        _pass_through(without, app)

        async def kernel() -> None:
            message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
            assert isinstance(message, JSONRPCRequest)
            dctx = _DispatchContext(message.id, ServerMessageMetadata(request_context=None, can_send_request=False))
            connection = Connection.from_envelope("2025-06-18", None, None)
            result = await serve_one(server, dctx, message.method, message.params, connection=connection,
                                     lifespan_state=None)
            JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result).model_dump_json(by_alias=True,
                                                                                       exclude_unset=True)

        async def whole() -> None:
            sent: list[object] = []
            delivered = False

            async def receive() -> dict[str, object]:
                nonlocal delivered
                if delivered:
                    await asyncio.sleep(3600)
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: object) -> None:
                sent.append(message)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "",
                     "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8765), "state": {}}
            await app(scope, receive, send)

        async with app.router.lifespan_context(app):
            if "gc-freeze" not in without:
                startup_gc.freeze_start_up()
            if watch is not None:
                gc.callbacks.append(watch)
            for name, fn in (("kernel", kernel), ("app", whole)):
                best = float("inf")
                for _ in range(5):
                    t0 = time.process_time()
                    for _ in range(calls):
                        await fn()
                    best = min(best, (time.process_time() - t0) / calls)
                results.append((name, best * 1e6))
            if watch is not None:
                gc.callbacks.remove(watch)
        gc.unfreeze()
        store.close()

    log = open(os.path.join(data, "server.log"), "w")
    saved, sys.stderr = sys.stderr, log
    requestlog.configure("text")  # the request line goes where convmem serve's stderr would
    logging.getLogger().setLevel(logging.INFO)
    try:
        run_event_loop(main())
    finally:
        sys.stderr = saved
        log.close()
        shutil.rmtree(data, ignore_errors=True)
    return results

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mcp_profile", description=__doc__.splitlines()[0])
    p.add_argument("--profiler", choices=["pyinstrument", "cprofile", "none"], default="pyinstrument")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {', '.join(KINDS)}")
    p.add_argument("--out", default="mcp-profile", help="directory for the profiles")
    p.add_argument("--floor", action="store_true", help="time a ping in-process: the SDK's kernel alone, the whole app")
    p.add_argument("--gap-us", type=float, default=0.0,
                   help="microseconds the client waits between calls (the server idle in between)")
    p.add_argument("--without", default="", help=f"with --floor: comma-separated layers left out ({', '.join(LAYERS)})")
    p.add_argument("server_args", nargs="*", help="extra `convmem serve` options (after --)")
    args = p.parse_args(argv)
    if args.floor:
        load = open("/proc/loadavg").read().split()[:3]
        without = [w.strip() for w in args.without.split(",") if w.strip()]
        if any(w not in LAYERS for w in without):
            p.error(f"--without takes {', '.join(LAYERS)}")
        label = f" without {', '.join(without)}" if without else ""
        watch = CollectorWatch()
        for name, us in floor(args.calls, without, watch):
            print(f"ping in-process, {name}{label}: {us:.1f} us CPU per call, load average {' '.join(load)}",
                  file=sys.stderr)
        print(f"ping in-process{label}, both: {watch.summary(args.calls * 10)}", file=sys.stderr)
        return 0
    os.makedirs(args.out, exist_ok=True)
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        if kind not in KINDS:
            p.error(f"unknown kind {kind}")
        load = open("/proc/loadavg").read().split()[:3]
        times, server_cpu, client_cpu, rss_kib = profile(
            kind, args.calls, args.profiler, args.out, args.server_args, args.gap_us / 1e6
        )
        p50 = statistics.median(times) * 1000
        print(
            f"{kind}: {args.calls} calls, p50 {p50:.3f} ms, server CPU {server_cpu * 1000:.3f} ms/call, "
            f"client CPU {client_cpu * 1000:.3f} ms/call, server RSS {rss_kib / 1024:.1f} MiB, "
            f"load average {' '.join(load)}"
            f" -> {' '.join(open('/proc/loadavg').read().split()[:3])}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
