"""Small helpers shared by the tools: exit statuses, argument errors, sizes."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

#: Exit statuses, as ``e2fsck`` uses them.
EXIT_CLEAN = 0
EXIT_REPAIRED = 1
EXIT_PROBLEMS_LEFT = 4
EXIT_OPERATIONAL = 8
#: A reader of our output went away.
EXIT_BROKEN_PIPE = 141


def exit_8_on_usage_error(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` exit with status 8 (not argparse's 2) on bad arguments."""

    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        sys.exit(EXIT_OPERATIONAL)

    # The parsers come from add_parser (no subclass to override error() in), so the method is replaced.
    parser.error = error  # type: ignore[method-assign]
    return parser


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fail(message: str, status: int = EXIT_OPERATIONAL) -> int:
    """Print ``convmem: message`` to stderr and return ``status``."""
    sys.stderr.write(f"convmem: {message}\n")
    return status


def plural(n: int, word: str) -> str:
    """``plural(1, "site")`` -> ``"1 site"``; ``plural(2, "site")`` -> ``"2 sites"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def command(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a tool's ``run``: a reader that goes away (``convmem dump ... | head``) ends it quietly.

    The exit status is then 141 (128 + SIGPIPE), as a shell pipeline expects.
    """

    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # nothing more can be written; don't fail at exit either
            os.close(devnull)
            return EXIT_BROKEN_PIPE

    return wrapped


def registered_sites(data_dir: str) -> list[str]:
    """The sites the MCP server's credential file lists (``convmem site add``), sorted; [] when there is no file.

    A site exists from ``site add`` on, but the engine writes its directory
    only with its first conversation; the tools treat such a site as empty.
    A credential file that exists but cannot be read or parsed is a
    :class:`MaintenanceError` naming it: an empty answer would hide every
    site that was added and not yet written to.
    """
    from convmem.logstore.maintenance import MaintenanceError
    from convmem.logstore.site_credentials import CredentialFile, CredentialFileDamaged

    credentials = CredentialFile(data_dir)
    try:
        return credentials.sites()
    except CredentialFileDamaged as exc:
        raise MaintenanceError(str(exc)) from None
    except OSError as exc:
        raise MaintenanceError(f"the site credential file {credentials.path} cannot be read: {exc}") from None


def add_target_options(p: argparse.ArgumentParser) -> None:
    """``--data-dir`` (a data directory or a ``postgresql://`` URI) and ``--lock-timeout``: an erasure's target."""
    p.add_argument(
        "--data-dir",
        default=os.environ.get("CONVMEM_DATA_DIR"),
        help="the data directory, or a postgresql:// URI (default: $CONVMEM_DATA_DIR)",
    )
    p.add_argument("--lock-timeout", type=float, default=30.0, help="seconds to wait for the conversation")


def run_on_target(
    args: argparse.Namespace, doing: str, on_postgres: Callable[[Any], str], on_data_dir: Callable[[str], str]
) -> int:
    """Run an operation on the target :func:`add_target_options` named; print its summary line; the exit status.

    ``on_postgres`` gets a ``PgStore`` (opened here with one connection, closed
    after), ``on_data_dir`` the data directory; each returns the line to
    print. A missing or wrong target, and the engine's refusals (StoreError,
    MaintenanceError, RedactionError, OSError), print ``cannot <doing>: ...``
    and return 8.
    """
    from convmem.logstore import StoreError
    from convmem.logstore.maintenance import MaintenanceError
    from convmem.logstore.redaction import RedactionError

    if not args.data_dir:
        return fail("give --data-dir (or set CONVMEM_DATA_DIR)")
    try:
        if args.data_dir.startswith(("postgresql://", "postgres://")):
            from convmem.logstore.postgres import PgStore

            store = PgStore(args.data_dir, pool_min=1, pool_max=1)
            try:
                line = on_postgres(store)
            finally:
                store.close()
        elif not os.path.isdir(args.data_dir):
            return fail(f"{args.data_dir} is not a directory")
        else:
            line = on_data_dir(str(args.data_dir))
    except (StoreError, MaintenanceError, RedactionError, OSError) as exc:
        return fail(f"cannot {doing}: {exc}", EXIT_OPERATIONAL)
    print(line)
    return EXIT_CLEAN
