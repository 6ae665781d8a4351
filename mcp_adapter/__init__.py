"""convmem's MCP adapter: the server agents connect to, over streamable HTTP or stdio.

It validates tool arguments, authenticates the caller's site, runs the storage
call on :mod:`logstore` and maps the outcome to an MCP tool result. Storage
semantics live in :mod:`logstore`; nothing here reimplements them.

``__version__`` is read from the installed package's metadata when first
asked for (importing :mod:`importlib.metadata` costs more than the rest of
``convmem --help``).
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("convmem")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        version = "0.0.0+unknown"
    globals()["__version__"] = version
    return version
