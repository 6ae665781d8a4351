"""The ``convmem`` console script: runs :func:`mcp_adapter.cli.main`.

In a wheel the import below reads ``from convmem.mcp_adapter.cli import main``
(rewritten at build time); in a checkout it is the top-level package.
"""

from __future__ import annotations

from mcp_adapter.cli import main

__all__ = ["main"]
