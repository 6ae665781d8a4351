"""convmem's MCP adapter: the server agents connect to, over streamable HTTP or stdio.

It validates tool arguments, authenticates the caller's site, runs the storage
call on :mod:`logstore` and maps the outcome to an MCP tool result. Storage
semantics live in :mod:`logstore`; nothing here reimplements them.
"""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("convmem")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
