"""convmem's one installed import name.

A wheel of convmem installs a single top-level package, ``convmem``, holding
the engine (``convmem.logstore``), the MCP server (``convmem.mcp_adapter``)
and the operator tools (``convmem.tools``), so nothing it installs can
collide with another distribution's ``tools`` or ``logstore``. In the
repository those three live at the top level and ``convmem/`` holds symbolic
links to them: a checkout imports exactly the files a wheel installs.

Two small modules live here, beside the links: :mod:`convmem.options` (the
command-line options the server and the tools share) and :mod:`convmem.cli`
(the ``convmem`` command, the one module that puts the server's commands and
the tools together; neither of those two imports the other).
"""
