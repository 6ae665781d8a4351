"""Running the server: HTTP (uvicorn) or stdio, start-up banner, graceful shutdown.

On SIGTERM or SIGINT the HTTP server stops accepting connections, lets
in-flight requests (appends included) finish, closes the store and exits 0.
The stdio server does the same for its one client.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import errno
import functools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.stdio import stdio_server

from convmem.logstore import MemoryStore, SiteQuota, StoreError, open_store
from convmem.logstore.memories import turn_off_sqlite_statistics
from convmem.logstore.site_credentials import (
    DEMO_SITE,
    CredentialError,
    CredentialFile,
    SharedSecrets,
    generate_password,
)
from convmem.logstore.store import HealthProbe

from . import __version__, handoff, metrics, requestlog, startup_gc, tls, workers
from .auth import Authenticator
from .connguard import guarded_protocol
from .cursors import CURSOR_SECRET_KEY, LazySeal, seal_for
from .http import HEALTH_PATH, MCP_PATH, build_app, is_loopback
from .server import Backend, build_server
from .store_select import StoreChoice, StoreConfigError, choose, credentials_for, memory_opener
from .throttle import LoginThrottle, ThrottleSettings
from .tlsgate import tls_gate_protocol

logger = logging.getLogger("convmem")

INSPECTOR_PACKAGE = "@modelcontextprotocol/inspector@2.12.0"
#: Seconds to wait for in-flight requests and storage calls on shutdown.
GRACEFUL_TIMEOUT = 30.0


def _configure_logging(level: str, fmt: str = "text") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    requestlog.configure(fmt)  # ops: --log-format text|json
    # The SDK logs every stateless request at INFO; keep that for debugging only.
    if level != "debug":
        for name in ("mcp.server.streamable_http", "mcp.server.streamable_http_manager"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _quiet_sqlite_statistics() -> None:
    """SQLite's heap statistics off, before anything opens SQLite or starts a thread (each worker runs this too).

    Their mutex serialised the BM25 lookups of concurrent memory searches; see
    :mod:`logstore.memories.sqlite_statistics`. ``CONVMEM_SQLITE_MEMSTATUS=1`` keeps them.
    """
    outcome = turn_off_sqlite_statistics()
    (logger.warning if outcome.failed else logger.info)(outcome.detail)


def _choice(args: argparse.Namespace) -> StoreChoice | None:
    try:
        return choose(args)
    except StoreConfigError as exc:
        print(f"convmem: {exc}", file=sys.stderr)
        return None


def _open_store(args: argparse.Namespace, choice: StoreChoice) -> MemoryStore | None:
    """Open the chosen store; None after printing why it cannot be opened or used as asked."""
    quota = site_quota(args)
    if _unsafe_data_dir(args, choice):
        return None
    try:
        if choice.is_postgres:
            if any(getattr(args, f"quota_{n}", None) for n in ("bytes", "files", "conversations")):
                # Quotas are enforced by the file engine only (see README "Quotas").
                print(
                    "convmem: --quota-bytes/--quota-files/--quota-conversations apply to a data directory only; "
                    "they are not enforced with a PostgreSQL store, so drop them or serve a data directory",
                    file=sys.stderr,
                )
                return None
            from convmem.logstore.postgres import PgStore

            return PgStore(
                choice.target,
                schema=choice.schema,
                lock_timeout=args.lock_timeout,
                statement_timeout=args.pg_statement_timeout,
                connect_timeout=args.pg_connect_timeout,
                pool_max=max(args.pg_pool_max, 1),
                prepare=not args.pg_no_prepare,
                allow_async_commit=args.pg_allow_async_commit,
            )
        Path(choice.target).mkdir(mode=0o700, parents=True, exist_ok=True)
        return open_store(choice.target, lock_timeout=args.lock_timeout, quota=quota)
    except (OSError, StoreError) as exc:
        what = "reach PostgreSQL" if choice.is_postgres else "open the data directory"
        print(f"convmem: cannot {what} ({choice.describe()}): {exc}", file=sys.stderr)
        return None


def _unsafe_data_dir(args: argparse.Namespace, choice: StoreChoice) -> bool:
    """True after printing why the data directory (created if missing) must not be served."""
    from convmem.logstore.maintenance import unsafe_data_dir

    data_dir = args.data_dir if choice.is_postgres else choice.target
    if not data_dir:
        return False
    with contextlib.suppress(OSError):  # an unusable path is reported by the check (or the open) below
        Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    why = unsafe_data_dir(str(data_dir))
    if why is not None:
        print(f"convmem: refusing to serve: {why}", file=sys.stderr)
    return why is not None


def _memory_dir(args: argparse.Namespace, choice: StoreChoice) -> str:
    """The data directory of the server: ``--data-dir`` (or the store's directory); "" for PostgreSQL without one.

    With PostgreSQL the long-term memories live in the database (``store_select.memory_opener``); a
    ``--data-dir`` that still holds memories of an earlier version is left untouched, with a warning.
    """
    if not choice.is_postgres:
        return os.path.abspath(choice.target)
    if not args.data_dir:
        return ""
    data_dir = str(args.data_dir)
    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    held = _sites_with_memories(data_dir)
    if held:
        print(
            f"convmem: warning: {len(held)} site(s) have long-term memories in {data_dir}, which this server does "
            "not serve: with a PostgreSQL store memories live in the database (the files are left as they are)",
            file=sys.stderr,
        )
    return os.path.abspath(data_dir)


def _sites_with_memories(data_dir: str) -> list[str]:
    sites = os.path.join(data_dir, "sites")
    names = os.listdir(sites) if os.path.isdir(sites) else []
    return [n for n in names if os.path.isdir(os.path.join(sites, n, "memories"))]


def _health(store: MemoryStore) -> Any:
    """The database probe for /healthz, or None to check the data directory."""
    return store.ping if isinstance(store, HealthProbe) else None


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
    base = f"{tls.scheme(args)}://{_client_host(args.host)}:{port}"
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
    return sock


def bind_policy_refusal(host: str, allowed_hosts: list[str]) -> str | None:
    """Why serving on ``host`` is refused (None when it is allowed).

    Off loopback, the Host and Origin checks need to know the names clients
    use; without them any web page could reach the server by DNS rebinding.
    """
    if is_loopback(host) or allowed_hosts:
        return None
    return (
        f"binding to the non-loopback address {host} needs the host names clients use to reach the server: "
        "give --allowed-host NAME (repeatable) or CONVMEM_ALLOWED_HOSTS=NAME1,NAME2; requests naming any other "
        "Host are refused"
    )


def site_quota(args: argparse.Namespace) -> SiteQuota:
    """The per-site quota from the command line (absent: the default; 0: unlimited)."""
    limits = (getattr(args, f"quota_{n}", None) for n in ("bytes", "files", "conversations"))
    return SiteQuota.from_options(*limits)


def throttle_settings(args: argparse.Namespace) -> ThrottleSettings:
    """The failed-login limits from the command line."""
    return ThrottleSettings(
        address_burst=args.throttle_address_burst,
        address_rate=args.throttle_address_rate,
        site_burst=args.throttle_site_burst,
        site_rate=args.throttle_site_rate,
    )


def connection_limits(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn settings bounding connections: concurrency cap, keep-alive, header deadline, per-address cap.

    Request heads stay limited to 16 KiB (h11's default, enforced for httptools by the guard).
    """
    return {
        "limit_concurrency": args.limit_concurrency,
        "timeout_keep_alive": 5,
        "http": guarded_protocol(args.header_timeout, args.max_connections_per_address),
    }


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` to completion on uvloop's event loop where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def shared_cursor_seal(choice: StoreChoice, creds: Any) -> LazySeal:
    """The listing-cursor seal every server on this store shares (security: :mod:`.cursors`).

    A data directory keys it from its own secret; PostgreSQL from a secret in
    the database, since servers sharing a database need not share a directory.
    """
    if choice.is_postgres and isinstance(creds, SharedSecrets):
        return seal_for("", lambda: bytes(creds.shared_secret(CURSOR_SECRET_KEY)))
    return seal_for(os.path.abspath(choice.target))


def gate_tls_handshakes(config: uvicorn.Config, handshake_timeout: float) -> bool:
    """Do TLS in our own protocol instead of uvicorn's listener (see :mod:`.tlsgate`); a loaded ``config``.

    A handshake then counts against the per-address connection cap from the
    moment the connection is accepted, and is abandoned after
    ``handshake_timeout`` seconds. Nothing changes without TLS. True when the gate is in place.
    """
    if config.ssl is None:
        return False
    inner = config.http_protocol_class
    config.http_protocol_class = tls_gate_protocol(
        inner,
        config.ssl,
        inner.address_table,  # type: ignore[attr-defined]
        handshake_timeout,
    )
    config.ssl = None  # uvicorn's listener is plain TCP now; the gate's handshake makes it HTTPS
    return True


def _quiet_signals() -> None:
    """Make SIGINT/SIGTERM harmless once uvicorn has handled them.

    uvicorn re-raises the signal that stopped it after its graceful shutdown;
    with these handlers in place that does nothing, and we exit 0.
    """
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)


def serve_http(args: argparse.Namespace) -> int:
    """Serve MCP over streamable HTTP until SIGTERM/SIGINT. Returns the exit status."""
    _configure_logging(args.log_level, args.log_format)
    _quiet_sqlite_statistics()
    refused = tls.check_options(args) or (tls.check_files(args.tls_cert, args.tls_key) if args.tls_cert else None)
    # Both start-up refusals are argument checks, made before anything is created; each is printed.
    refusal = bind_policy_refusal(args.host, args.allowed_hosts) or workers.check_count(args)
    if refused or refusal:  # ops: no plain HTTP off loopback; TLS files must load; security: --allowed-host
        for message in (refused, refusal):
            if message:
                print(f"convmem: {message}", file=sys.stderr)
        return 2
    try:
        metrics_token = metrics.token_from(args)
    except (OSError, ValueError) as exc:
        print(f"convmem: cannot read the metrics token: {exc}", file=sys.stderr)
        return 2
    choice = _choice(args)
    if choice is None:
        return 2
    store = _open_store(args, choice)
    if store is None:
        return 2
    creds = credentials_for(choice, store)
    demo = None
    worker = workers.worker_fds(args)
    try:
        creds.ensure_dir()
        if args.demo_site and worker is None:
            demo = (DEMO_SITE, ensure_demo_site(creds, DEMO_SITE))
        site_count = len(creds.sites())
    except (OSError, StoreError) as exc:
        store.close()
        print(f"convmem: cannot set up the credentials ({choice.describe()}): {exc}", file=sys.stderr)
        return 2
    try:
        # --workers N: the supervisor alone listens and hands connections to the workers.
        sock = _bind(args.host, args.port) if worker is None else None
    except OSError as exc:
        store.close()
        print(f"convmem: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        if exc.errno == errno.EADDRINUSE:
            print(
                "convmem: another program uses that port; pick another with --port N (or CONVMEM_PORT=N, "
                "or `make serve PORT=N`), or --port 0 to let the system choose a free one",
                file=sys.stderr,
            )
        return 2
    port = sock.getsockname()[1] if sock is not None else 0
    if sock is not None and args.workers > 1:
        store.close()
        return _supervise(args, sock, _banner(args, port, demo, site_count, choice))
    handed = None
    if worker is not None:
        workers.watch_supervisor(worker[1])
        handed = handoff.Receiver(worker[0])

    backend = Backend(
        store=store,
        data_dir=_memory_dir(args, choice),
        authenticator=Authenticator(creds, throttle=LoginThrottle(throttle_settings(args))),
        cursor_seal=shared_cursor_seal(choice, creds),
        max_concurrency=args.max_concurrency,
        memory_retention_seconds=args.memory_retention_days * 86400,
        memory_opener=memory_opener(choice, store, args.memory_retention_days * 86400),
        health=_health(store),
    )
    requestlog.name_files_relative_to(choice.target if not choice.is_postgres else backend.data_dir)
    backend.start_memory_sweeper()
    metrics.install(store)  # ops: engine measurements into /metrics
    app = build_app(
        build_server(backend),
        backend,
        host=args.host,
        allowed_hosts=args.allowed_hosts,
        body_timeout=args.body_timeout,
        metrics_token=metrics_token,
    )
    if worker is not None:
        app = workers.tag_worker(app)
    # ops, security: uvicorn's lines go through our formatter too (JSON, or text with control characters escaped)
    json_logs: dict[str, Any] = {"log_config": None}
    config = uvicorn.Config(
        app,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(GRACEFUL_TIMEOUT),
        lifespan="on",
        access_log=args.log_level == "debug",
        server_header=False,
        **connection_limits(args),
        **tls.uvicorn_options(args),  # ops: TLS files, forwarded headers
        **json_logs,
    )
    config.load()  # builds the TLS context now, so SIGHUP can reload it
    on_sighup = functools.partial(tls.reload_certificate, config.ssl, args.tls_cert, args.tls_key)
    gated = gate_tls_handshakes(config, args.tls_handshake_timeout)  # security: handshakes counted and timed
    server = uvicorn.Server(config) if handed is None else _HandedServer(config, handed)
    if worker is None:
        print(_banner(args, port, demo, site_count, choice), flush=True)
    _quiet_signals()
    startup_gc.freeze_start_up()  # the app and its imports out of every later collection
    try:
        # The TLS gate is tested on asyncio's loop only (with uvloop a handshake hung after a SIGHUP reload).
        (asyncio.run if gated else run_event_loop)(_serve_uvicorn(server, sock, backend, on_sighup))
    finally:
        if sock is not None:
            sock.close()
        if handed is not None:
            handed.close()
        backend.close_memories()
        store.close()
        logger.info("stopped; store closed")
    return 0


def _supervise(args: argparse.Namespace, sock: socket.socket, banner: str) -> int:
    """``--workers N``: N worker processes served from ``sock``, until SIGTERM/SIGINT (see :mod:`.workers`)."""
    supervisor = workers.Supervisor(getattr(args, "argv", None) or sys.argv[1:], sock, args.workers)
    print(banner, flush=True)
    try:
        return supervisor.run()
    finally:
        sock.close()


class _HandedServer(uvicorn.Server):
    """uvicorn for a ``--workers`` worker: no listening socket; connections come from the supervisor."""

    def __init__(self, config: uvicorn.Config, handed: handoff.Receiver) -> None:
        super().__init__(config)
        self._handed = handed

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])
        config = self.config
        # The protocol uvicorn builds for each connection it accepts (guards and TLS gate included).
        protocol: Any = config.http_protocol_class
        factory = functools.partial(
            protocol, config=config, server_state=self.server_state, app_state=self.lifespan.state
        )
        self._handed.start(factory, config.ssl)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._handed.stop()
        await super().shutdown(sockets=[])


async def _serve_uvicorn(
    server: uvicorn.Server, sock: socket.socket | None, backend: Backend, on_sighup: Callable[[], object]
) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
    await server.serve(sockets=[sock] if sock is not None else [])
    # uvicorn has waited for in-flight requests; make sure no storage call is still running.
    if not await backend.drain(GRACEFUL_TIMEOUT):
        logger.warning("storage calls still running after %.0fs; closing the store anyway", GRACEFUL_TIMEOUT)


def serve_stdio(args: argparse.Namespace) -> int:
    """Serve one MCP client over stdin/stdout as ``--site``, after verifying CONVMEM_PASSWORD."""
    _configure_logging(args.log_level, args.log_format)
    _quiet_sqlite_statistics()
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
        verified = creds.login(args.site, password)
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
        data_dir=_memory_dir(args, choice),
        fixed_site=args.site,
        cursor_seal=shared_cursor_seal(choice, creds),
        max_concurrency=args.max_concurrency,
        memory_retention_seconds=args.memory_retention_days * 86400,
        memory_opener=memory_opener(choice, store, args.memory_retention_days * 86400),
    )
    requestlog.name_files_relative_to(choice.target if not choice.is_postgres else backend.data_dir)
    backend.start_memory_sweeper()
    server = build_server(backend)
    logger.info("convmem %s serving site %r over stdio", __version__, args.site)
    try:
        anyio.run(_serve_stdio, server, backend)
    finally:
        backend.close_memories()
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
                    backend.close_memories()
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
