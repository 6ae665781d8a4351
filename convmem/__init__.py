"""convmem's one installed import name.

A wheel of convmem installs a single top-level package, ``convmem``, holding
the engine (``convmem.logstore``), the MCP server (``convmem.mcp_adapter``)
and the operator tools (``convmem.tools``), so nothing it installs can
collide with another distribution's ``tools`` or ``logstore``. The
repository keeps those directories at its top level and its code imports
them by their short names (``from logstore import ...``); the wheel build
(``build_support.py``) rewrites those imports to ``convmem.*``.

In a source checkout or an editable install the short names are real
top-level packages on ``sys.path`` (the repository root); :mod:`convmem.cli`
then simply runs the checkout's :mod:`mcp_adapter.cli`.
"""

import os as _os
import sys as _sys


def _use_checkout() -> None:
    """In a checkout (``convmem/`` beside ``mcp_adapter/``), make the short names importable.

    ``make`` installs the checkout in setuptools' ``compat`` editable mode,
    which already puts the repository root on ``sys.path``; a plain ``pip
    install -e .`` maps only ``convmem`` itself, so add the root here. In a
    wheel ``convmem/mcp_adapter`` exists and nothing is changed.
    """
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.isdir(_os.path.join(here, "mcp_adapter")):
        return
    root = _os.path.dirname(here)
    if _os.path.isfile(_os.path.join(root, "mcp_adapter", "__init__.py")) and root not in _sys.path:
        _sys.path.append(root)


_use_checkout()
