"""Large tool results written into the HTTP response once, as bytes, instead of through the SDK's models.

The SDK turns a ``CallToolResult`` into its JSON-RPC response in several
passes, each a full copy of the result: ``model_dump``, the per-version
validation and its second dump, ``model_dump_json``. For ``recall_memory`` and
``replay_memory`` the result is almost all items, and each item is a payload
that already sits on disk as compact JSON; the result also carries its JSON
twice (the text block and ``structuredContent``). Decoding the payloads only
for the SDK to encode them again three times made a large ``replay_memory``
page cost about eight times its size in memory, and most of a recall's time.

Here a read's result is encoded once, from the stored bytes
(:class:`Prepared`), and spliced into the response the SDK built around
placeholders:

* :class:`ResultSplice` (ASGI middleware, innermost on ``POST /mcp``) puts a
  :class:`Splice` in the request's scope and watches the response.
* The tool handler, finding that :class:`Splice` on its own request, hands it
  the prepared parts and returns an ordinary result whose text and
  ``structuredContent`` are placeholders naming a random per-call nonce;
  the SDK validates and serialises that small result as usual (envelope, id,
  ``isError``, headers, status).
* When the response body comes back, each placeholder (found only in the
  response of the request that made it: the nonce is unguessable and
  per-request) is replaced: the text placeholder by the text as a JSON
  string, the structured one by the JSON object. ``Content-Length`` is
  recomputed; a large body goes out in chunks, uvicorn waiting for the socket
  between them, so nothing is copied again.

The bytes a client receives decode to exactly what the SDK path gives:
the same text and the same ``structuredContent``. Without a :class:`Splice`
(stdio, in-process transports) the handler builds the ordinary result from
the same bytes (:meth:`Prepared.decoded`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

import mcp_types as types
import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Where a request's :class:`Splice` sits in its ASGI scope.
SCOPE_KEY = "convmem.splice"
#: Key of the placeholder ``structuredContent`` object.
_STRUCTURED_KEY = "convmem-splice"
_TEXT_PREFIX = "convmem-splice-"
#: Text is escaped in pieces of about this many bytes; bodies larger than this go out in chunks.
PIECE = 1 << 20

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

Chunk = bytes | memoryview


def escape(text: Chunk) -> list[Chunk]:
    """UTF-8 ``text`` as the inside of a JSON string (no quotes), in pieces of about :data:`PIECE` bytes.

    Pieces end on character boundaries. Raises UnicodeDecodeError for bytes
    that are not UTF-8 (never the case for what a read returns: checked).
    """
    view = memoryview(text)
    out: list[Chunk] = []
    pos, size = 0, len(view)
    while pos < size:
        cut = min(pos + PIECE, size)
        while cut < size and view[cut] & 0xC0 == 0x80:  # never split a character
            cut += 1
        out.append(memoryview(_encoder.encode(str(view[pos:cut], "utf-8")))[1:-1])
        pos = cut
    return out


class Prepared:
    """A tool result as bytes: ``structuredContent`` as JSON chunks, the text as escaped JSON-string chunks.

    ``structured`` joined is one compact JSON object; ``text`` joined is the
    text block's content escaped for a JSON string, without the quotes.
    """

    __slots__ = ("structured", "text")

    def __init__(self, structured: list[Chunk], text: list[Chunk]) -> None:
        self.structured = structured
        self.text = text

    @classmethod
    def from_json(cls, doc: bytes) -> Prepared:
        """The result whose ``structuredContent`` is the JSON object ``doc`` and whose text is ``doc`` itself."""
        return cls([doc], escape(doc))

    def with_memories(self, memories: Sequence[dict[str, str]], section: str) -> Prepared:
        """This result plus ``memories`` as the structured content's last member and ``section`` after the text."""
        structured = list(self.structured)
        last = memoryview(structured.pop())
        assert last[-1] == 0x7D  # "}": the object is closed after the new member
        structured += [last[:-1], b',"memories":', _encoder.encode(memories), b"}"]
        return Prepared(structured, [*self.text, *escape(("\n\n" + section).encode())])

    def decoded(self) -> types.CallToolResult:
        """The ordinary result (for transports without a :class:`Splice`)."""
        structured = _decoder.decode(b"".join(self.structured))
        text = _decoder.decode(b'"' + b"".join(self.text) + b'"')
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=structured)


class Splice:
    """One request's prepared results, by placeholder nonce, until its response is written."""

    __slots__ = ("open", "pending")

    def __init__(self) -> None:
        self.pending: dict[str, Prepared] = {}
        #: False once the response has begun without being held (a stream): too late to splice.
        self.open = True

    def result(self, prepared: Prepared) -> types.CallToolResult:
        """The placeholder result standing for ``prepared`` in this request's response.

        The ordinary result when the response is already under way (nothing could replace the placeholders).
        """
        if not self.open:
            return prepared.decoded()
        nonce = secrets.token_hex(16)
        self.pending[nonce] = prepared
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_TEXT_PREFIX + nonce)],
            structured_content={_STRUCTURED_KEY: nonce},
        )

    def chunks(self, body: bytes) -> list[Chunk]:
        """``body`` with every placeholder of a pending result replaced, as chunks to send in order."""
        marks: list[tuple[int, int, list[Chunk]]] = []
        for nonce, prepared in self.pending.items():
            text = f'"{_TEXT_PREFIX}{nonce}"'.encode()
            structured = _encoder.encode({_STRUCTURED_KEY: nonce})
            for mark, parts in ((text, [b'"', *prepared.text, b'"']), (structured, prepared.structured)):
                at = body.find(mark)
                if at >= 0:
                    marks.append((at, at + len(mark), parts))
        self.pending.clear()
        marks.sort(key=lambda m: m[0])
        out: list[Chunk] = []
        pos = 0
        view = memoryview(body)
        for start, end, parts in marks:
            out.append(view[pos:start])
            out += parts
            pos = end
        out.append(view[pos:])
        return out


class ResultSplice:
    """ASGI middleware: a :class:`Splice` for every ``POST`` request, its placeholders replaced in the response.

    Invariant: a response is rewritten only when a tool handler of this very
    request left a prepared result; any other response passes untouched.

    ``direct``, when given, serves an admitted ``POST /mcp`` (the exact path)
    in place of ``app``: the MCP endpoint reached in this one step rather
    than through Starlette's exception layer, router and route (see
    :func:`convmem.mcp_adapter.http.build_app`). The scope gets what the
    router would have put in it (``router``, ``route``, ``endpoint``,
    ``path_params``). Invariant (``build_app``): this layer sits inside
    :class:`~convmem.mcp_adapter.http.RequestAdmission`, which reads and caps
    the body of every ``POST /mcp``, so whatever the direct route serves has
    been admitted.
    """

    def __init__(self, app: ASGIApp, direct: DirectRoute | None = None) -> None:
        self.app = app
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        splice = Splice()
        scope[SCOPE_KEY] = splice
        direct = self.direct
        if direct is not None and scope["path"] == direct.path and not scope.get("root_path") and "router" not in scope:
            scope["router"], scope["route"] = direct.router, direct.route
            scope["endpoint"], scope["path_params"] = direct.route.endpoint, {}
            await direct.handler()(scope, receive, splicing(splice, send))
            return
        await self.app(scope, receive, splicing(splice, send))


class DirectRoute:
    """The one route :class:`ResultSplice` serves itself: its path, the router and route it stands for, its handler.

    ``handler`` is called per request (the handler may be replaced after the app is built).
    """

    __slots__ = ("handler", "path", "route", "router")

    def __init__(self, path: str, router: Any, route: Any, handler: Callable[[], ASGIApp]) -> None:
        self.path = path
        self.router = router
        self.route = route
        self.handler = handler


def splicing(splice: Splice, send: Send) -> Send:
    """``send`` with ``splice``'s placeholders replaced in the response (held only when a result is pending)."""
    start: Message | None = None
    held: list[bytes] = []

    async def splicing_send(message: Message) -> None:
        nonlocal start
        if not splice.pending and start is None:
            splice.open = False  # this response passes through as it is
            await send(message)
            return
        if message["type"] == "http.response.start":
            start = message
            return
        if message["type"] != "http.response.body" or start is None:
            await send(message)
            return
        held.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(held)
        held.clear()
        begun, start = start, None
        await send_spliced(splice, begun, body, send)

    return splicing_send


async def send_spliced(
    splice: Splice, start: Message, body: bytes, send: Send, after: Sequence[tuple[bytes, bytes]] = ()
) -> int:
    """Send the response ``start`` and ``body`` with ``splice``'s placeholders replaced; the body's size as sent.

    ``Content-Length`` is recomputed (the last header but ``after``'s); a body larger than :data:`PIECE` goes
    out in pieces.
    """
    chunks = splice.chunks(body)
    size = sum(len(c) for c in chunks)
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(size).encode()))
    headers += after
    await send({**start, "headers": headers})
    if size <= PIECE:
        await send({"type": "http.response.body", "body": b"".join(chunks)})
        return size
    pieces = [memoryview(c)[i : i + PIECE] for c in chunks for i in range(0, len(c), PIECE)]
    for i, piece in enumerate(pieces):
        # ASGI bodies are bytes: one piece is copied at a time, while the socket drains.
        await send({"type": "http.response.body", "body": bytes(piece), "more_body": i + 1 < len(pieces)})
    return size


def splice_of(request: Any) -> Splice | None:
    """The :class:`Splice` of the HTTP request a tool call came in (None over stdio)."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, Splice) else None
