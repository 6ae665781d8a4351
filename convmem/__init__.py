"""convmem's one installed import name.

A wheel of convmem installs a single top-level package, ``convmem``, holding
the engine (``convmem.logstore``), the MCP server (``convmem.mcp_adapter``)
and the operator tools (``convmem.tools``), so nothing it installs can
collide with another distribution's ``tools`` or ``logstore``. In the
repository those three live at the top level and ``convmem/`` holds symbolic
links to them: a checkout imports exactly the files a wheel installs.
"""
