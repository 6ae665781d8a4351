"""The server's default timeouts and per-client limits: plain numbers.

``convmem serve`` shows them as its options' defaults; the modules that
enforce them (:mod:`.http`, :mod:`.connguard`, :mod:`.tlsgate`) import them
from here. This module imports nothing, so building the ``serve`` parser
(``convmem serve --help``) loads neither the MCP SDK nor Starlette nor uvicorn.
"""

from __future__ import annotations

#: Seconds a client has to deliver a whole request body.
BODY_TIMEOUT = 30.0
#: Seconds a client has to send a request's line and headers.
DEFAULT_HEADER_TIMEOUT = 10.0
#: Most connections one client address may hold at once.
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 64
#: Seconds a client has to complete its TLS handshake.
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
