"""``convmem serve`` and ``convmem site``: the server's own commands.

:data:`COMMANDS` gives their one-line help and :func:`add_subcommands` their
full parsers; :mod:`convmem.cli` puts them on the ``convmem`` command line
next to the operator tools. Every option of ``serve`` can also be given as a
``CONVMEM_*`` environment variable (see :mod:`convmem.options`). Nothing
here imports the engine, the MCP types, psycopg or numpy at module level:
each command imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from convmem.options import add_quota_options, env, env_flag, env_float, env_int

if TYPE_CHECKING:
    from convmem.logstore import MemoryStore

MIN_PASSWORD_LENGTH = 12


def _fail(message: str, code: int = 1) -> int:
    print(f"convmem: {message}", file=sys.stderr)
    return code


def _site_name(name: str) -> str | None:
    """The validated site name, or None after printing why it is invalid."""
    from convmem.logstore import InvalidConversationId, SiteName
    from convmem.logstore.ids import SITE_NAME_RULE

    try:
        return SiteName(name)
    except InvalidConversationId as exc:
        _fail(f"invalid site name {name!r}: {exc}. A site name is {SITE_NAME_RULE}.")
        return None


def _read_password_stdin() -> str | None:
    line = sys.stdin.readline().rstrip("\r\n")
    if len(line) < MIN_PASSWORD_LENGTH:
        _fail(f"the password read from stdin must be at least {MIN_PASSWORD_LENGTH} characters")
        return None
    return line


# -- site commands -------------------------------------------------------------


class _StoreUnusable(Exception):
    """The store named on the command line cannot be opened (message says why)."""


@contextlib.contextmanager
def _site_store(args: argparse.Namespace, *, need_store: bool) -> Iterator[tuple[Any, MemoryStore | None, str]]:
    """(credentials, store or None, where) for a ``site`` command; PostgreSQL always opens the store."""
    from convmem.logstore import StoreError

    from .store_select import StoreConfigError, choose, credentials_for, open_chosen

    try:
        choice = choose(args)
    except StoreConfigError as exc:
        raise _StoreUnusable(str(exc)) from None
    store: MemoryStore | None = None
    if choice.is_postgres or need_store:
        try:
            store = open_chosen(choice, args)
        except (StoreError, OSError) as exc:
            raise _StoreUnusable(f"cannot open the store ({choice.describe()}): {exc}") from None
    try:
        yield credentials_for(choice, store), store, choice.describe() if choice.is_postgres else choice.target
    finally:
        if store is not None:
            store.close()


def _site_command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn an unusable store or a database failure into a clear message and exit status."""

    def run(args: argparse.Namespace) -> int:
        from convmem.logstore import StoreError
        from convmem.logstore.site_credentials import CredentialFileDamaged

        try:
            return fn(args)
        except (_StoreUnusable, CredentialFileDamaged) as exc:
            return _fail(str(exc), 2)
        except StoreError as exc:
            return _fail(f"the store failed: {exc}", 2)

    run.__doc__ = fn.__doc__
    return run


@_site_command
def cmd_site_add(args: argparse.Namespace) -> int:
    """``convmem site add NAME``: create a site; print its password once (or take it from stdin)."""
    from convmem.logstore import StoreError
    from convmem.logstore.site_credentials import CredentialError, generate_password

    site = _site_name(args.name)
    if site is None:
        return 2
    password = _read_password_stdin() if args.password_stdin else generate_password()
    if password is None:
        return 2
    with _site_store(args, need_store=False) as (creds, store, where):
        if site in creds.sites():
            return _fail(f"site {site!r} already exists")
        place = "the database" if store is not None else "the data directory"
        memory_root = _memory_root(args, store, where)
        try:
            leftover = _leftover_site_data(store, where, site)
            memories = _memories_held(memory_root, store, site)
            if (leftover == "conversations" or memories) and not args.purge_data:
                return _fail(
                    f"{place} still holds data of an earlier site named {site!r}; a new owner would see it. "
                    "Add --purge-data to delete that data first, or choose another name"
                )
            _drop_memories(memory_root, store, site)
            if leftover is not None:
                # Conversations only with --purge-data; a site without any (e.g. listing files) always.
                with _data_store(store, where) as data:
                    data.drop_site(site)
        except (StoreError, OSError) as exc:
            return _fail(f"cannot check the store ({where}): {exc}")
        try:
            creds.add(site, password)
        except CredentialError as exc:
            return _fail(str(exc))
    print(
        f"created site {site!r} in {where}"
        + (" after deleting its old conversations" if leftover == "conversations" else ""),
        file=sys.stderr,
    )
    if not args.password_stdin:
        print("its password follows; it is shown only this once, so store it now:", file=sys.stderr)
        print(password)
    return 0


@_site_command
def cmd_site_list(args: argparse.Namespace) -> int:
    """``convmem site list``: the sites, one per line."""
    with _site_store(args, need_store=False) as (creds, _store, _where):
        names = creds.sites()
    for site in names:
        print(site)
    return 0


@_site_command
def cmd_site_passwd(args: argparse.Namespace) -> int:
    """``convmem site passwd NAME``: give a site a new password (generated, or from stdin)."""
    from convmem.logstore.site_credentials import DEMO_SITE, CredentialError, generate_password

    password = _read_password_stdin() if args.password_stdin else generate_password()
    if password is None:
        return 2
    with _site_store(args, need_store=False) as (creds, _store, _where):
        try:
            creds.set_password(args.name, password)
        except CredentialError as exc:
            return _fail(str(exc))
        if args.name == DEMO_SITE and creds.read_demo_password() is not None:
            creds.write_demo_password(password)
    print(f"changed the password of site {args.name!r}", file=sys.stderr)
    if not args.password_stdin:
        print("the new password follows; it is shown only this once:", file=sys.stderr)
        print(password)
    return 0


@_site_command
def cmd_site_remove(args: argparse.Namespace) -> int:
    """``convmem site remove NAME [--force]``: delete a site (and, with --force, its conversations)."""
    from convmem.logstore import ListSelector, StoreError
    from convmem.logstore.site_credentials import DEMO_SITE, CredentialError

    with _site_store(args, need_store=False) as (creds, store, where):
        if args.name not in creds.sites():
            return _fail(f"no site named {args.name!r}")
        site = _site_name(args.name)
        if site is None:
            return 2
        # Order matters: the password is revoked before any data is deleted, so that no client of the
        # old tenant can authenticate (and recreate data by appending) while the data goes.
        memory_root = _memory_root(args, store, where)
        try:
            with _data_store(store, where) as data:
                holds = bool(data.list_conversations(site, ListSelector(limit=1)).summaries)
            memories = _memories_held(memory_root, store, site)
        except StoreError as exc:
            return _fail(f"cannot open the store ({where}): {exc}")
        if (holds or memories) and not args.force:
            what = " and ".join(
                (["conversations"] if holds else []) + ([f"{memories} long-term memories"] if memories else [])
            )
            return _fail(f"site {site!r} still holds {what}; use --force to delete them with the site")
        try:
            creds.remove(site)
        except CredentialError as exc:
            return _fail(str(exc))
        if site == DEMO_SITE:
            creds.forget_demo_password()
        if args.force:
            # Calls that authenticated just before the revocation may still be running in a server;
            # let them finish (they are bounded by the server's lock timeout) before deleting.
            time.sleep(args.grace)
            try:
                _drop_memories(memory_root, store, site)
                with _data_store(store, where) as data:
                    data.drop_site(site)
            except (StoreError, OSError) as exc:
                return _fail(
                    f"revoked site {site!r} but could not delete its data: {exc}. "
                    f"`convmem site add {site} --purge-data` deletes it before the name is reused"
                )
    print(f"removed site {site!r}" + (" and all its data" if args.force else ""), file=sys.stderr)
    return 0


@contextlib.contextmanager
def _data_store(store: MemoryStore | None, data_dir: str) -> Iterator[MemoryStore]:
    """The store for one step of a site command: the open database, or the data directory opened just for it."""
    from convmem.logstore import open_store

    if store is not None:
        yield store
        return
    with open_store(data_dir) as opened:
        yield opened


def _leftover_site_data(store: MemoryStore | None, data_dir: str, site: str) -> str | None:
    """What the store still holds for ``site``: "conversations", "empty", or None.

    ``store`` is the open PostgreSQL store (there "conversations" means rows of
    that site in the database), or None to look in the data directory.
    """
    from convmem.logstore import ListSelector

    if store is None:
        return _leftover_site_dir(data_dir, site)
    if site not in store.sites():
        return None
    return "conversations" if store.list_conversations(site, ListSelector(limit=1)).summaries else "empty"


def _memories_held(memory_root: str | None, store: MemoryStore | None, site: str) -> int:
    """How many long-term memories ``site`` holds: in the data directory, and in the database."""
    from convmem.logstore.memories.drop import memories_held

    held = memories_held(memory_root, site) if memory_root else 0
    if store is not None:  # a database (psycopg is loaded only then)
        from convmem.logstore.postgres import PgStore, held_memories

        held += held_memories(store, site) if isinstance(store, PgStore) else 0
    return held


def _drop_memories(memory_root: str | None, store: MemoryStore | None, site: str) -> None:
    """Delete every long-term memory of ``site``: in the data directory, and in the database."""
    from convmem.logstore.memories.drop import drop_memories

    if memory_root:
        drop_memories(memory_root, site)
    if store is not None:  # a database (psycopg is loaded only then)
        from convmem.logstore.postgres import PgStore, drop_site_memories

        if isinstance(store, PgStore):
            drop_site_memories(store, site)


def _memory_root(args: argparse.Namespace, store: MemoryStore | None, where: str) -> str | None:
    """The data directory that may hold the sites' long-term memories: the store's, or PostgreSQL's ``--data-dir``
    (memories of an earlier version; today they live in the database with PostgreSQL)."""
    root = where if store is None else getattr(args, "data_dir", None)
    return str(root) if root else None


def _leftover_site_dir(data_dir: str, site: str) -> str | None:
    """What the data directory still holds for ``site``: "conversations" (segments), "empty", or None."""
    from convmem.logstore import open_store, site_usage

    if not os.path.exists(os.path.join(data_dir, "logstore.json")):
        return None
    with open_store(data_dir) as store:
        if site not in store.sites():
            return None
    return "conversations" if site_usage(data_dir, site).conversations else "empty"


# -- serve -----------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """``convmem serve``: run the MCP server over HTTP (default) or stdio."""
    from convmem.logstore.site_credentials import CredentialFileDamaged

    from .serve import serve_http, serve_stdio

    try:
        if args.stdio:
            return serve_stdio(args)
        return serve_http(args)
    except CredentialFileDamaged as exc:
        return _fail(f"cannot start: {exc}", 2)


# -- parser ------------------------------------------------------------------------


def _data_dir_parent() -> argparse.ArgumentParser:
    from .store_select import add_store_arguments

    parent = argparse.ArgumentParser(add_help=False)
    add_store_arguments(parent)
    return parent


def add_security_options(serve: argparse.ArgumentParser) -> None:
    """``serve`` options limiting what clients (authenticated or not) can make the server do."""
    from .limits import BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    from .throttle import ThrottleSettings

    t = ThrottleSettings()
    allowed = [h.strip() for h in str(env("ALLOWED_HOSTS", "")).split(",") if h.strip()]
    serve.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=allowed,
        metavar="HOST[:PORT]",
        help="a Host name clients use to reach the server (repeatable); required when binding to a "
        "non-loopback address (env CONVMEM_ALLOWED_HOSTS, comma-separated)",
    )
    serve.add_argument(
        "--limit-concurrency",
        type=int,
        default=env_int("LIMIT_CONCURRENCY", 512),
        help="most connections and requests at once; beyond it requests are answered 503 "
        "(env CONVMEM_LIMIT_CONCURRENCY)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=int,
        default=env_int("MAX_CONNECTIONS_PER_ADDRESS", DEFAULT_MAX_CONNECTIONS_PER_ADDRESS),
        help="most connections one client address may hold (env CONVMEM_MAX_CONNECTIONS_PER_ADDRESS)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=env_float("HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT),
        help="seconds a client has to send a request's headers (env CONVMEM_HEADER_TIMEOUT)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=env_float("BODY_TIMEOUT", BODY_TIMEOUT),
        help="seconds a client has to send a request's body (env CONVMEM_BODY_TIMEOUT)",
    )
    add_quota_options(serve)
    for scope, burst, rate in (("address", t.address_burst, t.address_rate), ("site", t.site_burst, t.site_rate)):
        upper = scope.upper()
        serve.add_argument(
            f"--login-failures-per-{scope}",
            dest=f"throttle_{scope}_burst",
            type=int,
            default=env_int(f"LOGIN_FAILURES_PER_{upper}", burst),
            help=f"failed logins one {scope} may make in a burst before being throttled "
            f"(env CONVMEM_LOGIN_FAILURES_PER_{upper})",
        )
        serve.add_argument(
            f"--login-refill-per-{scope}",
            dest=f"throttle_{scope}_rate",
            type=float,
            default=env_float(f"LOGIN_REFILL_PER_{upper}", rate),
            help=f"failed logins per second a throttled {scope} gets back (env CONVMEM_LOGIN_REFILL_PER_{upper})",
        )


#: The server's commands and their one-line help (the operator tools' are in convmem.tools.cli).
COMMANDS = {
    "serve": "run the MCP server",
    "site": "manage sites (tenants) and their passwords",
}


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None) -> None:
    """Add ``serve`` and ``site`` (or only the one named ``only``, if it is one) to a ``convmem`` command line."""
    if only in (None, "serve"):
        _add_serve(subparsers)
    if only in (None, "site"):
        _add_site(subparsers)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from convmem.logstore.site_credentials import DEMO_SITE

    # Only modules that load no server code (the MCP SDK, Starlette, uvicorn): `serve --help` stays quick.
    from . import tls, workers
    from .store_select import add_store_arguments

    serve = sub.add_parser(
        "serve",
        help=COMMANDS["serve"],
        description="Run the MCP server (streamable HTTP at /mcp, or stdio).",
    )
    add_store_arguments(serve, server=True)
    serve.add_argument("--host", default=env("HOST", "127.0.0.1"), help="interface to listen on (env CONVMEM_HOST)")
    serve.add_argument(
        "--port", type=int, default=env_int("PORT", 8765), help="TCP port; 0 picks a free one (env CONVMEM_PORT)"
    )
    serve.add_argument(
        "--stdio",
        action="store_true",
        default=env_flag("STDIO"),
        help="serve one client over stdin/stdout instead of HTTP (env CONVMEM_STDIO)",
    )
    serve.add_argument(
        "--site",
        default=env("SITE"),
        help="with --stdio: the site to act for; its password comes from CONVMEM_PASSWORD (env CONVMEM_SITE)",
    )
    serve.add_argument(
        "--demo-site",
        action="store_true",
        default=env_flag("DEMO_SITE"),
        help=f"create the site {DEMO_SITE!r} on first run, keep its password under DATA_DIR/auth and "
        "print a ready-to-paste client configuration (env CONVMEM_DEMO_SITE)",
    )
    serve.add_argument(
        "--max-concurrency",
        type=int,
        default=env_int("MAX_CONCURRENCY", 16),
        help="most storage calls running at once (env CONVMEM_MAX_CONCURRENCY)",
    )
    serve.add_argument(
        "--lock-timeout",
        type=float,
        default=float(env("LOCK_TIMEOUT", "5.0")),
        help="seconds an append waits for a busy conversation before Timeout (env CONVMEM_LOCK_TIMEOUT)",
    )
    serve.add_argument(
        "--memory-retention-days",
        type=float,
        default=float(env("MEMORY_RETENTION_DAYS", "30")),
        help="days a soft-deleted long-term memory is kept before it is erased (env CONVMEM_MEMORY_RETENTION_DAYS)",
    )
    serve.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (env CONVMEM_LOG_LEVEL)",
    )
    tls.add_arguments(serve)  # ops: TLS, --trust-proxy, --insecure-bind
    serve.add_argument(
        "--metrics-token-file",
        default=env("METRICS_TOKEN_FILE"),
        metavar="FILE",
        help="file holding a token that lets non-loopback clients read /metrics with "
        "'Authorization: Bearer TOKEN' (env CONVMEM_METRICS_TOKEN_FILE, or the token itself in "
        "CONVMEM_METRICS_TOKEN); without one, /metrics answers loopback clients only",
    )
    serve.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", "text"),
        choices=["text", "json"],
        help="stderr log lines as text or one JSON object each (env CONVMEM_LOG_FORMAT)",
    )
    add_security_options(serve)
    workers.add_arguments(serve)  # --workers N
    serve.set_defaults(func=cmd_serve)


def _add_site(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from convmem.logstore.ids import SITE_NAME_RULE

    data_dir = _data_dir_parent()
    site = sub.add_parser(
        "site",
        help=COMMANDS["site"],
        description="Manage sites. A site is a tenant: its name is the HTTP Basic user name.",
    )
    site_sub = site.add_subparsers(dest="site_command", required=True, metavar="ACTION")

    add = site_sub.add_parser("add", parents=[data_dir], help="create a site and print its generated password")
    add.add_argument("name", help=f"site name: {SITE_NAME_RULE}")
    add.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    add.add_argument(
        "--purge-data",
        action="store_true",
        help="delete data an earlier site of the same name left behind (otherwise such a name is refused)",
    )
    add.set_defaults(func=cmd_site_add)

    lst = site_sub.add_parser("list", parents=[data_dir], help="list the sites")
    lst.set_defaults(func=cmd_site_list)

    passwd = site_sub.add_parser("passwd", parents=[data_dir], help="set a new password for a site")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    passwd.set_defaults(func=cmd_site_passwd)

    remove = site_sub.add_parser("remove", parents=[data_dir], help="delete a site")
    remove.add_argument("name")
    remove.add_argument(
        "--force", action="store_true", help="also delete the site's conversations and long-term memories"
    )
    remove.add_argument(
        "--grace",
        type=float,
        default=1.0,
        help="with --force: seconds between revoking the password and deleting the data, for calls a "
        "running server had already admitted (default 1)",
    )
    remove.set_defaults(func=cmd_site_remove)
