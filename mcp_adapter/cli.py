"""The ``convmem`` command: serve the MCP server and manage sites.

Every option of ``serve`` can also be given as a ``CONVMEM_*`` environment
variable (the option name in upper case, dashes as underscores, e.g.
``CONVMEM_DATA_DIR``); a command-line option wins over the environment.

Start-up: :func:`main` builds the full parser of the one command it runs
(``convmem fsck`` imports the maintenance code, not the MCP server), and
``convmem --help`` builds none: it lists the commands from their one-line
help in :data:`COMMANDS` and :data:`convmem.tools.cli.COMMANDS`. Nothing
here imports the engine, the MCP types, psycopg or numpy at module level.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from convmem.logstore import MemoryStore

ENV_PREFIX = "CONVMEM_"
DEMO_SITE = "demo-site"
MIN_PASSWORD_LENGTH = 12


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(ENV_PREFIX + name, default)


def _env_flag(name: str) -> bool:
    return str(_env(name, "")).strip().lower() in ("1", "true", "yes", "on")


def _env_int(name: str, default: int) -> int:
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"convmem: {ENV_PREFIX}{name} must be an integer, got {raw!r}") from None


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

        try:
            return fn(args)
        except _StoreUnusable as exc:
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
    from convmem.logstore.site_credentials import CredentialError, generate_password

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
    from convmem.logstore.site_credentials import CredentialError

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
            if hasattr(creds, "forget_demo_password"):
                creds.forget_demo_password()
            else:
                creds.demo_password_path.unlink(missing_ok=True)
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
    from .serve import serve_http, serve_stdio

    if args.stdio:
        return serve_stdio(args)
    return serve_http(args)


# -- parser ------------------------------------------------------------------------


def _data_dir_parent() -> argparse.ArgumentParser:
    from .store_select import add_store_arguments

    parent = argparse.ArgumentParser(add_help=False)
    add_store_arguments(parent)
    return parent


def _env_float(name: str, default: float) -> float:
    raw = _env(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"convmem: {ENV_PREFIX}{name} must be a number, got {raw!r}") from None


def add_security_options(serve: argparse.ArgumentParser) -> None:
    """``serve`` options limiting what clients (authenticated or not) can make the server do."""
    from .connguard import DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    from .http import BODY_TIMEOUT
    from .throttle import ThrottleSettings

    t = ThrottleSettings()
    allowed = [h.strip() for h in str(_env("ALLOWED_HOSTS", "")).split(",") if h.strip()]
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
        default=_env_int("LIMIT_CONCURRENCY", 512),
        help="most connections and requests at once; beyond it requests are answered 503 "
        "(env CONVMEM_LIMIT_CONCURRENCY)",
    )
    serve.add_argument(
        "--max-connections-per-address",
        type=int,
        default=_env_int("MAX_CONNECTIONS_PER_ADDRESS", DEFAULT_MAX_CONNECTIONS_PER_ADDRESS),
        help="most connections one client address may hold (env CONVMEM_MAX_CONNECTIONS_PER_ADDRESS)",
    )
    serve.add_argument(
        "--header-timeout",
        type=float,
        default=_env_float("HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT),
        help="seconds a client has to send a request's headers (env CONVMEM_HEADER_TIMEOUT)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        default=_env_float("BODY_TIMEOUT", BODY_TIMEOUT),
        help="seconds a client has to send a request's body (env CONVMEM_BODY_TIMEOUT)",
    )
    add_quota_options(serve)
    for scope, burst, rate in (("address", t.address_burst, t.address_rate), ("site", t.site_burst, t.site_rate)):
        upper = scope.upper()
        serve.add_argument(
            f"--login-failures-per-{scope}",
            dest=f"throttle_{scope}_burst",
            type=int,
            default=_env_int(f"LOGIN_FAILURES_PER_{upper}", burst),
            help=f"failed logins one {scope} may make in a burst before being throttled "
            f"(env CONVMEM_LOGIN_FAILURES_PER_{upper})",
        )
        serve.add_argument(
            f"--login-refill-per-{scope}",
            dest=f"throttle_{scope}_rate",
            type=float,
            default=_env_float(f"LOGIN_REFILL_PER_{upper}", rate),
            help=f"failed logins per second a throttled {scope} gets back (env CONVMEM_LOGIN_REFILL_PER_{upper})",
        )


def parse_size(text: str) -> int:
    """A byte count: digits with an optional K, M, G or T suffix (powers of 1024); 0 means unlimited."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(raw[-1:], 1)
    digits = raw[:-1] if raw[-1:] in units else raw
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500M, 20G)")
    return int(digits) * scale


def add_quota_options(parser: argparse.ArgumentParser) -> None:
    """``--quota-bytes``, ``--quota-files`` and ``--quota-conversations`` (shared by ``serve`` and ``stats``).

    Absent: the default (None here; see :meth:`SiteQuota.from_options`); 0 lifts the limit.
    """
    from convmem.logstore.quota import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES

    default_bytes = _env("QUOTA_BYTES")
    default_files = _env("QUOTA_FILES")
    default_convs = _env("QUOTA_CONVERSATIONS")
    parser.add_argument(
        "--quota-bytes",
        type=parse_size,
        default=parse_size(default_bytes) if default_bytes else None,
        metavar="SIZE",
        help=f"most bytes one site may take on disk (preallocated space included), e.g. 20G; default "
        f"{DEFAULT_MAX_BYTES // 1024**3}G; 0 = unlimited (env CONVMEM_QUOTA_BYTES)",
    )
    parser.add_argument(
        "--quota-files",
        type=int,
        default=int(default_files) if default_files else None,
        metavar="N",
        help=f"most files and directories one site may take on disk; default {DEFAULT_MAX_FILES}; "
        "0 = unlimited (env CONVMEM_QUOTA_FILES)",
    )
    parser.add_argument(
        "--quota-conversations",
        type=int,
        default=int(default_convs) if default_convs else None,
        metavar="N",
        help="most conversations one site may hold; default and 0: unlimited (env CONVMEM_QUOTA_CONVERSATIONS)",
    )


#: The built-in commands and their one-line help (the operator tools' are in convmem.tools.cli).
COMMANDS = {
    "serve": "run the MCP server",
    "site": "manage sites (tenants) and their passwords",
}


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(prog="convmem", description="Durable conversation memory for AI agents, over MCP.")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return parser, sub


class _VersionAction(argparse.Action):
    """``--version``: the installed version, read (from the package metadata) only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        from . import __version__

        sys.stdout.write(f"convmem {__version__}\n")  # where argparse's own version action prints it
        parser.exit()


def build_parser(
    only: str | None = None,
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The argument parser and its subcommand collection.

    With ``only``, the full parser of that one command (what :func:`main`
    runs); without, every command's (for the tests and the documentation).
    """
    from convmem.tools.cli import add_subcommands

    parser, sub = _top_parser()
    if only in (None, "serve"):
        _add_serve(sub)
    if only in (None, "site"):
        _add_site(sub)
    add_subcommands(sub, only=only)
    return parser, sub


def _listing_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command named but none built: ``--help``, ``--version`` and typos."""
    from convmem.tools.cli import COMMANDS as TOOL_COMMANDS

    parser, sub = _top_parser()
    for name, text in {**COMMANDS, **TOOL_COMMANDS}.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from . import metrics, requestlog, tls, workers
    from .store_select import add_store_arguments

    serve = sub.add_parser(
        "serve",
        help=COMMANDS["serve"],
        description="Run the MCP server (streamable HTTP at /mcp, or stdio).",
    )
    add_store_arguments(serve, server=True)
    serve.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="interface to listen on (env CONVMEM_HOST)")
    serve.add_argument(
        "--port", type=int, default=_env_int("PORT", 8765), help="TCP port; 0 picks a free one (env CONVMEM_PORT)"
    )
    serve.add_argument(
        "--stdio",
        action="store_true",
        default=_env_flag("STDIO"),
        help="serve one client over stdin/stdout instead of HTTP (env CONVMEM_STDIO)",
    )
    serve.add_argument(
        "--site",
        default=_env("SITE"),
        help="with --stdio: the site to act for; its password comes from CONVMEM_PASSWORD (env CONVMEM_SITE)",
    )
    serve.add_argument(
        "--demo-site",
        action="store_true",
        default=_env_flag("DEMO_SITE"),
        help=f"create the site {DEMO_SITE!r} on first run, keep its password under DATA_DIR/auth and "
        "print a ready-to-paste client configuration (env CONVMEM_DEMO_SITE)",
    )
    serve.add_argument(
        "--max-concurrency",
        type=int,
        default=_env_int("MAX_CONCURRENCY", 16),
        help="most storage calls running at once (env CONVMEM_MAX_CONCURRENCY)",
    )
    serve.add_argument(
        "--lock-timeout",
        type=float,
        default=float(_env("LOCK_TIMEOUT", "5.0")),
        help="seconds an append waits for a busy conversation before Timeout (env CONVMEM_LOCK_TIMEOUT)",
    )
    serve.add_argument(
        "--memory-retention-days",
        type=float,
        default=float(_env("MEMORY_RETENTION_DAYS", "30")),
        help="days a soft-deleted long-term memory is kept before it is erased (env CONVMEM_MEMORY_RETENTION_DAYS)",
    )
    serve.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (env CONVMEM_LOG_LEVEL)",
    )
    tls.add_arguments(serve)  # ops: TLS, --trust-proxy, --insecure-bind
    metrics.add_arguments(serve)  # ops: --metrics-token-file
    requestlog.add_arguments(serve)  # ops: --log-format
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``convmem`` console script."""
    # Everything convmem writes (data, credentials, exports) is tenant data: owner only,
    # whatever umask the caller runs with. The engine also sets explicit modes itself.
    os.umask(0o077)
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command is the first word that is not an option (the top level takes only --help and --version).
    name = next((a for a in argv if not a.startswith("-")), None)
    from convmem.tools.cli import COMMANDS as TOOL_COMMANDS

    if name in COMMANDS or name in TOOL_COMMANDS:
        parser, _ = build_parser(only=name)
    else:
        parser = _listing_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # what `serve --workers` starts each worker with
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
