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
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from . import mcpserver
from .mcp_e2e import RawClient
from .util import payloads

CONV = "prof-conv-0001"
KINDS = ("ping", "recall_memory", "append_memory")


def _profiler_prefix(profiler: str, out: str, kind: str) -> list[str]:
    if profiler == "pyinstrument":
        return ["-m", "pyinstrument", "--interval", "0.0005", "-r", "text", "-o", os.path.join(out, f"{kind}.txt")]
    if profiler == "cprofile":
        return ["-m", "cProfile", "-o", os.path.join(out, f"{kind}.prof")]
    return []


def _calls(c: RawClient, kind: str) -> Callable[[], object]:
    if kind == "ping":
        request = c.prepare("ping")
    elif kind == "recall_memory":
        request = c.prepare_tool("recall_memory", {"conversation_id": CONV, "count": 50})
    else:
        request = c.prepare_tool("append_memory", {"conversation_id": CONV + "-a", "items": payloads(1, 1024)})
    return lambda: c.send(request)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(kind: str, calls: int, profiler: str, out: str, server_args: list[str]) -> tuple[list[float], float, float]:
    """Run ``calls`` calls of ``kind`` against a profiled server.

    Returns the client-side seconds of each call, and the server's and the client's CPU seconds per call.
    """
    data = tempfile.mkdtemp(prefix="convmem-mcp-profile-")
    server = mcpserver.Server(
        os.path.join(data, "data"), python_args=_profiler_prefix(profiler, out, kind), extra_args=server_args
    )
    try:
        c = RawClient(server.url)
        for _ in range(5):  # 50 items to recall
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
        server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, time.process_time() - client_cpu
        c.close()
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)
    if profiler == "cprofile":
        import pstats

        with open(os.path.join(out, f"{kind}.txt"), "w") as f:
            stats = pstats.Stats(os.path.join(out, f"{kind}.prof"), stream=f)
            stats.sort_stats("tottime").print_stats(60)
    return times, server_cpu / calls, client_cpu / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mcp_profile", description=__doc__.splitlines()[0])
    p.add_argument("--profiler", choices=["pyinstrument", "cprofile", "none"], default="pyinstrument")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {', '.join(KINDS)}")
    p.add_argument("--out", default="mcp-profile", help="directory for the profiles")
    p.add_argument("server_args", nargs="*", help="extra `convmem serve` options (after --)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        if kind not in KINDS:
            p.error(f"unknown kind {kind}")
        load = open("/proc/loadavg").read().split()[:3]
        times, server_cpu, client_cpu = profile(kind, args.calls, args.profiler, args.out, args.server_args)
        p50 = statistics.median(times) * 1000
        print(
            f"{kind}: {args.calls} calls, p50 {p50:.3f} ms, server CPU {server_cpu * 1000:.3f} ms/call, "
            f"client CPU {client_cpu * 1000:.3f} ms/call, load average {' '.join(load)}"
            f" -> {' '.join(open('/proc/loadavg').read().split()[:3])}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
