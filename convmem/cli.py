"""The ``convmem`` console script: runs :func:`convmem.mcp_adapter.cli.main`."""

from __future__ import annotations

from convmem.mcp_adapter.cli import main

__all__ = ["main"]
