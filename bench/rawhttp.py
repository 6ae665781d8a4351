"""A lean load generator's HTTP/1.1 client: pre-built POSTs over one kept-alive socket.

The MCP workloads run their clients on the same two cores as the server they
measure, so every microsecond the client spends is taken from the server, and
a client library's cost sits inside every latency on both sides of a ratio
(``ping`` over the bare app looks closer to 1 the slower the client is).
``http.client`` spends about 0.3 ms of CPU per call here (header objects,
a parser, a buffered file per response); this client sends bytes it built
once and reads the response with one ``recv`` in the common case, so the
server's share is what the figures show. It speaks only what the workloads
need: ``Content-Length`` responses, keep-alive; anything else is an error,
never a silent misread.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
from typing import Any

_HEAD_END = b"\r\n\r\n"


class KeptAlive:
    """One TCP connection to ``url``'s host and port, posting to its path."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float = 120.0) -> None:
        u = urllib.parse.urlsplit(url)
        self.path = u.path or "/"
        self.host = f"{u.hostname or '127.0.0.1'}:{u.port}"
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        #: The last response's headers, lower-cased names (read them only outside timed loops).
        self.last_headers = b""

    def request(self, body: bytes) -> bytes:
        """The bytes of a POST of ``body`` to the path, to be sent as often as wanted."""
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n{self._headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def send(self, request: bytes) -> tuple[int, bytes]:
        """Send a request made by :meth:`request`; (status, body) of its response."""
        self.sock.sendall(request)
        buf = self._buf
        while True:
            end = buf.find(_HEAD_END)
            if end >= 0:
                break
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection before answering")
            buf += chunk
        head = buf[:end].lower()
        status = int(head[9:12])
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"response without Content-Length: {head[:300]!r}")
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop > 0 else None])
        body_end = end + 4 + length
        while len(buf) < body_end:
            chunk = self.sock.recv(max(65536, body_end - len(buf)))
            if not chunk:
                raise ConnectionError("the server closed the connection in the middle of a response")
            buf += chunk
        self._buf = buf[body_end:]
        self.last_headers = head
        return status, buf[end + 4 : body_end]

    def header(self, name: str) -> str | None:
        """A header of the last response (case-insensitive), or None."""
        key = b"\r\n" + name.lower().encode("latin-1") + b":"
        at = self.last_headers.find(key)
        if at < 0:
            return None
        stop = self.last_headers.find(b"\r\n", at + len(key))
        return self.last_headers[at + len(key) : stop if stop > 0 else None].strip().decode("latin-1")

    def close(self) -> None:
        self.sock.close()


def jsonrpc(method: str, params: dict[str, Any] | None = None, request_id: int = 1) -> bytes:
    """The body of one JSON-RPC request."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()
