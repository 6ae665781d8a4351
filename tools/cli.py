"""Registration of the operator tools as ``convmem`` subcommands.

``add_subcommands(subparsers)`` adds ``fsck``, ``dump``, ``export``, ``import``,
``stats``, ``locate``, ``backup`` and ``migrate``; each sets ``func`` to a callable taking the parsed arguments and
returning the process exit status.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import backup, dump, export, fsck, locate, migrate, restore, stats


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the operator tools to a ``convmem`` command line."""
    for module in (fsck, dump, export, restore, stats, locate, backup, migrate):
        module.add_parser(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one tool (for ``python -m tools``); returns its exit status."""
    parser = argparse.ArgumentParser(prog="convmem", description="convmem operator tools")
    add_subcommands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status
