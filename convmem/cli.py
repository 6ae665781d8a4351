"""The ``convmem`` command: where the server's commands and the operator tools meet.

This is the composition root. The server (:mod:`convmem.mcp_adapter.cli`:
``serve``, ``site``) and the operator tools (:mod:`convmem.tools.cli`:
``fsck``, ``export``, ...) know nothing of each other; this module puts both
on one command line.

Start-up: :func:`main` builds the full parser of the one command it runs
(``convmem fsck`` imports the maintenance code, not the MCP server), and
``convmem --help`` builds none: it lists the commands from their one-line
help in the two ``COMMANDS`` tables. Nothing here, nor in those two modules,
imports the engine, the MCP types, psycopg or numpy at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from convmem.mcp_adapter import cli as server_cli
from convmem.tools import cli as tools_cli

__all__ = ["COMMANDS", "build_parser", "main"]

#: Every command and its one-line help: the server's, then the operator tools'.
COMMANDS = {**server_cli.COMMANDS, **tools_cli.COMMANDS}


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
        from convmem.mcp_adapter import __version__

        sys.stdout.write(f"convmem {__version__}\n")  # where argparse's own version action prints it
        parser.exit()


def build_parser(
    only: str | None = None,
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The argument parser and its subcommand collection.

    With ``only``, the full parser of that one command (what :func:`main`
    runs); without, every command's (for the tests and the documentation).
    """
    parser, sub = _top_parser()
    server_cli.add_subcommands(sub, only=only)
    tools_cli.add_subcommands(sub, only=only)
    return parser, sub


def _listing_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command named but none built: ``--help``, ``--version`` and typos."""
    parser, sub = _top_parser()
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``convmem`` console script."""
    # Everything convmem writes (data, credentials, exports) is tenant data: owner only,
    # whatever umask the caller runs with. The engine also sets explicit modes itself.
    os.umask(0o077)
    argv = list(sys.argv[1:] if argv is None else argv)
    # The command is the first word that is not an option (the top level takes only --help and --version).
    name = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=name)[0] if name in COMMANDS else _listing_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # what `serve --workers` starts each worker with
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
