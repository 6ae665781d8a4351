"""Running the server: HTTP (uvicorn) or stdio, start-up banner, graceful shutdown.

On SIGTERM or SIGINT the HTTP server stops accepting connections, lets
in-flight requests (appends included) finish, closes the store and exits 0.
The stdio server does the same for its one client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import os
import signal
import socket
import sys
from typing import Any

import anyio
import uvicorn
from mcp.server.stdio import stdio_server

from logstore import MemoryStore, StoreError

from . import __version__
from .auth import Authenticator
from .credentials import CredentialError, CredentialFile, generate_password
from .http import HEALTH_PATH, MCP_PATH, build_app
from .server import Backend, build_server
from .store_select import StoreChoice, StoreConfigError, choose, credentials_for, open_chosen

logger = logging.getLogger("convmem")

INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector@2.12.0"
#: Seconds to wait for in-flight requests and storage calls on shutdown.
GRACEFUL_TIMEOUT = 30.0


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The SDK logs every stateless request at INFO; keep that for debugging only.
    if level != "debug":
        for name in ("mcp.server.streamable_http", "mcp.server.streamable_http_manager"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _choice(args: argparse.Namespace) -> StoreChoice | None:
    try:
        return choose(args)
    except StoreConfigError as exc:
        print(f"convmem: {exc}", file=sys.stderr)
        return None


def _open_store(args: argparse.Namespace, choice: StoreChoice) -> MemoryStore | None:
    try:
        return open_chosen(choice, args)
    except (OSError, StoreError) as exc:
        what = "reach PostgreSQL" if choice.is_postgres else "open the data directory"
        print(f"convmem: cannot {what} ({choice.describe()}): {exc}", file=sys.stderr)
        return None


def _health(store: MemoryStore) -> Any:
    """The database probe for /healthz, or None to check the data directory."""
    ping = getattr(store, "ping", None)
    return ping if callable(ping) else None


def basic_header(site: str, password: str) -> str:
    """The ``Authorization`` header value for ``site``/``password``."""
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def ensure_demo_site(creds: CredentialFile, site: str) -> str:
    """Create the demo site on first run; return its password (same on every later run).

    The password lives in ``DATA_DIR/auth/demo-site.password`` (mode 0600). If
    that file is lost, or no longer matches, the site gets a new password.
    """
    password = creds.read_demo_password()
    if password is not None and creds.verify(site, password):
        return password
    password = generate_password()
    try:
        creds.add(site, password)
    except CredentialError:
        creds.set_password(site, password)
    creds.write_demo_password(password)
    return password


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _banner(
    args: argparse.Namespace, port: int, demo: tuple[str, str] | None, site_count: int, choice: StoreChoice
) -> str:
    base = f"http://{_client_host(args.host)}:{port}"
    url = base + MCP_PATH
    lines = [
        f"convmem {__version__} listening on {args.host}:{port} ({choice.describe()})",
        f"  MCP endpoint (streamable HTTP): {url}",
        f"  health check:                   {base}{HEALTH_PATH}",
        "  Clients authenticate with HTTP Basic: user name = site name, password = the site's password.",
    ]
    if demo is not None:
        site, password = demo
        header = basic_header(site, password)
        if choice.is_postgres:
            demo_file = f"the table {choice.schema}.settings"
        else:
            demo_file = os.path.join(choice.target, "auth", "demo-site.password")
        lines += [
            f"  Demo site {site!r}; its password is kept in {demo_file}",
            "",
            "Claude Code:",
            f'  claude mcp add --transport http convmem {url} --header "Authorization: {header}"',
            "MCP Inspector (CLI):",
            f'  npx -y {INSPECTOR_PACKAGE} --cli {url} --transport http --header "Authorization: {header}"'
            " --method tools/list",
        ]
    elif site_count == 0:
        lines.append("  No sites exist yet: create one with `convmem site add NAME --data-dir DIR`.")
    lines += ["", "Press Ctrl+C to stop."]
    return "\n".join(lines)


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv4 or IPv6)."""
    family, socktype, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, socktype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _quiet_signals() -> None:
    """Make SIGINT/SIGTERM harmless once uvicorn has handled them.

    uvicorn re-raises the signal that stopped it after its graceful shutdown;
    with these handlers in place that does nothing, and we exit 0.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)


def serve_http(args: argparse.Namespace) -> int:
    """Serve MCP over streamable HTTP until SIGTERM/SIGINT. Returns the exit status."""
    _configure_logging(args.log_level)
    choice = _choice(args)
    if choice is None:
        return 2
    store = _open_store(args, choice)
    if store is None:
        return 2
    creds = credentials_for(choice, store)
    demo = None
    try:
        creds.ensure_dir()
        if args.demo_site:
            from .cli import DEMO_SITE

            demo = (DEMO_SITE, ensure_demo_site(creds, DEMO_SITE))
        site_count = len(creds.sites())
    except (OSError, StoreError) as exc:
        store.close()
        print(f"convmem: cannot set up the credentials ({choice.describe()}): {exc}", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        store.close()
        print(f"convmem: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]

    backend = Backend(
        store=store,
        data_dir="" if choice.is_postgres else os.path.abspath(choice.target),
        authenticator=Authenticator(creds),
        max_concurrency=args.max_concurrency,
        health=_health(store),
    )
    app = build_app(build_server(backend), backend, host=args.host)
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(GRACEFUL_TIMEOUT),
        lifespan="on",
        access_log=args.log_level == "debug",
        server_header=False,
    )
    server = uvicorn.Server(config)
    print(_banner(args, port, demo, site_count, choice), flush=True)
    _quiet_signals()
    try:
        asyncio.run(_serve_uvicorn(server, sock, backend))
    finally:
        sock.close()
        store.close()
        logger.info("stopped; store closed")
    return 0


async def _serve_uvicorn(server: uvicorn.Server, sock: socket.socket, backend: Backend) -> None:
    await server.serve(sockets=[sock])
    # uvicorn has waited for in-flight requests; make sure no storage call is still running.
    if not await backend.drain(GRACEFUL_TIMEOUT):
        logger.warning("storage calls still running after %.0fs; closing the store anyway", GRACEFUL_TIMEOUT)


def serve_stdio(args: argparse.Namespace) -> int:
    """Serve one MCP client over stdin/stdout as ``--site``, after verifying CONVMEM_PASSWORD."""
    _configure_logging(args.log_level)
    if not args.site:
        print("convmem: --stdio needs --site NAME (or CONVMEM_SITE)", file=sys.stderr)
        return 2
    password = os.environ.get("CONVMEM_PASSWORD")
    if not password:
        print(
            "convmem: --stdio needs the site's password in the CONVMEM_PASSWORD environment variable", file=sys.stderr
        )
        return 2
    choice = _choice(args)
    if choice is None:
        return 2
    store: MemoryStore | None = None
    if choice.is_postgres:
        store = _open_store(args, choice)
        if store is None:
            return 2
    creds = credentials_for(choice, store)
    try:
        verified = creds.verify(args.site, password)
    except StoreError as exc:
        if store is not None:
            store.close()
        print(f"convmem: cannot read the site credentials ({choice.describe()}): {exc}", file=sys.stderr)
        return 2
    if not verified:
        if store is not None:
            store.close()
        print("convmem: the site name or the password in CONVMEM_PASSWORD is wrong", file=sys.stderr)
        return 3
    if store is None:
        store = _open_store(args, choice)
    if store is None:
        return 2
    backend = Backend(
        store=store,
        data_dir="" if choice.is_postgres else os.path.abspath(choice.target),
        fixed_site=args.site,
        max_concurrency=args.max_concurrency,
    )
    server = build_server(backend)
    logger.info("convmem %s serving site %r over stdio", __version__, args.site)
    try:
        anyio.run(_serve_stdio, server, backend)
    finally:
        store.close()
    return 0


async def _serve_stdio(server: Any, backend: Backend) -> None:
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for sig in signals:
                    logger.info("received %s; finishing in-flight calls", signal.Signals(sig).name)
                    await backend.drain(GRACEFUL_TIMEOUT)
                    await anyio.sleep(0.1)  # let the writer flush the answers of finished calls
                    backend.store.close()
                    logger.info("stopped; store closed")
                    sys.stdout.flush()
                    sys.stderr.flush()
                    # The stdin reader is a thread blocked in read(2) that cannot be cancelled;
                    # everything is written and closed, so leave without waiting for it.
                    os._exit(0)

        tg.start_soon(stop_on_signal)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        tg.cancel_scope.cancel()
