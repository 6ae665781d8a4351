"""Command-line options the server and the operator tools share.

``CONVMEM_*`` environment defaults (the option name in upper case, dashes as
underscores; a command-line option wins over the environment), byte sizes
with a unit, and the per-site quota flags that ``convmem serve`` enforces and
``convmem stats`` measures against. Both :mod:`convmem.mcp_adapter` and
:mod:`convmem.tools` build their parsers with these, so this module imports
only the standard library (and, when a parser is built, the engine's quota
defaults): never the server, never the tools.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

ENV_PREFIX = "CONVMEM_"


def env(name: str, default: Any = None) -> Any:
    """The value of ``CONVMEM_<name>``, or ``default`` when it is not set."""
    return os.environ.get(ENV_PREFIX + name, default)


def env_flag(name: str) -> bool:
    """Whether ``CONVMEM_<name>`` says yes (1, true, yes, on; any case)."""
    return str(env(name, "")).strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    """``CONVMEM_<name>`` as an integer (``default`` when unset or empty); anything else stops the command."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"convmem: {ENV_PREFIX}{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    """``CONVMEM_<name>`` as a number (``default`` when unset or empty); anything else stops the command."""
    raw = env(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"convmem: {ENV_PREFIX}{name} must be a number, got {raw!r}") from None


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

    default_bytes = env("QUOTA_BYTES")
    default_files = env("QUOTA_FILES")
    default_convs = env("QUOTA_CONVERSATIONS")
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
