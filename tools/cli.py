"""Registration of the operator tools as ``convmem`` subcommands.

:data:`COMMANDS` names each tool, its module and its one-line help, so that
``convmem --help`` lists them without importing any. ``add_subcommands``
adds their full parsers (``fsck``, ``dump``, ``export``, ``import``, ``stats``,
``locate``, ``backup``, ``migrate``), importing only the modules it needs; each
sets ``func`` to a callable taking the parsed arguments and returning the
process exit status.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

#: Command -> its one-line help (the same as its module's ``add_parser`` gives; a test checks).
COMMANDS = {
    "fsck": "check (and repair) a data directory",
    "dump": "print the records of a segment file (.seg) or the entries of an index file (.idx)",
    "export": "export conversations as JSON Lines",
    "import": "load an export file into an empty site, or restore one conversation",
    "stats": "sizes of sites and their largest conversations",
    "locate": "print the files holding one conversation",
    "backup": "copy a live data directory consistently",
    "migrate": "copy all data between a data directory and PostgreSQL (resumable, verified)",
    "forget": "erase one conversation and every copy of its items",
    "redact": "replace a seq range of one conversation by tombstones, erasing the payloads",
}
#: Command -> the module of this package that defines it (where the two differ).
_MODULES = {"import": "restore"}


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None) -> None:
    """Add the operator tools (or only the one named ``only``, if it is one) to a ``convmem`` command line."""
    for name in COMMANDS:
        if only is None or only == name:
            module = importlib.import_module(f"{__package__}.{_MODULES.get(name, name)}")
            module.add_parser(subparsers)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one tool (for ``python -m convmem.tools``); returns its exit status."""
    parser = argparse.ArgumentParser(prog="convmem", description="convmem operator tools")
    add_subcommands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status
