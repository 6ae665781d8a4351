"""Operator tools for a convmem data directory: ``fsck``, ``dump``, ``export``, ``import``, ``stats``,
``locate``, ``backup``.

Each tool is one module with ``add_parser(subparsers)``; :func:`tools.cli.add_subcommands`
registers them all on a ``convmem`` command line. They use only :mod:`logstore`'s
public API (:mod:`logstore.maintenance`) and the shared options of :mod:`convmem.options`,
never the server (:mod:`convmem.mcp_adapter`).
"""
