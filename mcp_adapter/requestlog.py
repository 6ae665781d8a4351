"""One log line per request, request ids, and the per-tool-call bookkeeping behind the metrics.

Every HTTP request gets a random 16-hex-digit request id, sent back in the
``X-Request-Id`` response header and added to every error's text: a tool
error's text and ``convmem/error`` object, a JSON-RPC error's message, and a
plain-text HTTP error (401, 403, 405, 413, ...), so a user can quote it and
an operator can find the line. When the request ends, one line is written to stderr (logger
``convmem.request``) with: request id, client address, method, path, HTTP
status, site, tool, outcome, error code, latency, request and response
sizes. With ``--log-format json`` every log line, this one included, is one
JSON object.

Never logged: request or response bodies (so no payload), the
``Authorization`` header or any password. For a failed login the line
carries the client address and the site name that was claimed (the user
name of Basic authentication, only when it is a well-formed site name).

Over stdio there is no HTTP request: each tool call gets its own id and line.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from convmem.logstore import InvalidConversationId, SiteName

from .errors import ToolFailure
from .metrics import METRICS, record_auth_failure

logger = logging.getLogger("convmem.request")


def _is_site_name(user: str) -> bool:
    """True when ``user`` is a well-formed site name (the rule of :class:`convmem.logstore.SiteName`)."""
    try:
        SiteName(user)
    except InvalidConversationId:
        return False
    return True


#: Attributes of a LogRecord that are not extra fields.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


@dataclass(slots=True)
class RequestInfo:
    """What the request line reports; filled in as the request is served."""

    request_id: str
    client: str | None = None
    method: str | None = None
    path: str | None = None
    status: int | None = None
    site: str | None = None
    tool: str | None = None
    outcome: str | None = None
    error_code: str | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    started: float = field(default_factory=time.perf_counter)

    def latency_ms(self) -> float:
        """Milliseconds since the request began, as the line reports them."""
        return round((time.perf_counter() - self.started) * 1000, 3)

    def fields(self, latency_ms: float | None = None) -> dict[str, Any]:
        """The line's fields (``latency_ms``: measured now unless given)."""
        return {
            "request_id": self.request_id,
            "client": self.client,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "site": self.site,
            "tool": self.tool,
            "outcome": self.outcome,
            "error_code": self.error_code,
            "latency_ms": self.latency_ms() if latency_ms is None else latency_ms,
            "request_bytes": self.request_bytes,
            "response_bytes": self.response_bytes,
        }


_current: contextvars.ContextVar[RequestInfo | None] = contextvars.ContextVar("convmem_request", default=None)


#: Request ids taken from one ``os.urandom`` call at a time (a syscall per :data:`_IDS_PER_CALL` ids, not per id).
_IDS_PER_CALL = 256
_ids: Iterator[str] = iter(())


def new_request_id() -> str:
    """16 random hex digits.

    Ids are cut from a batch of random bytes. Taking one is a list
    iterator's ``next``, atomic under the GIL, so threads never share an id;
    a forked child drops the batch it inherited (its parent hands out the
    same ids).
    """
    global _ids
    try:
        return next(_ids)
    except StopIteration:
        digits = os.urandom(8 * _IDS_PER_CALL).hex()
        batch = [digits[i : i + 16] for i in range(0, len(digits), 16)]
        _ids = iter(batch[1:])
        return batch[0]


def _drop_ids() -> None:
    global _ids
    _ids = iter(())


os.register_at_fork(after_in_child=_drop_ids)


def current() -> RequestInfo | None:
    """The request being served in this context (None outside an HTTP request)."""
    return _current.get()


def request_id() -> str:
    """The current request's id (a fresh one outside a request)."""
    info = _current.get()
    return info.request_id if info is not None else new_request_id()


def _emit(info: RequestInfo) -> None:
    """Log the request line: what ``logger.log(level, "request", extra=...)`` would write.

    When the line could only reach the text handler :func:`configure`
    installed (:func:`_direct_handler`), it is formatted and written straight
    to that handler's stream, without a LogRecord. Otherwise the record
    ``Logger.log`` would make is made (without its stack walk: the record
    names the same file, line and function) and handled as usual.
    """
    level = logging.WARNING if info.error_code == "Unauthenticated" else logging.INFO
    if not logger.isEnabledFor(level):
        return
    handler = _direct_handler(level)
    if handler is not None:
        _write_direct(handler, level, info)
        return
    logger.handle(_record(level, info.fields()))


def _record(level: int, fields: dict[str, Any]) -> logging.LogRecord:
    line = sys._getframe(1).f_lineno  # the frame is not kept: it would hold this request's objects in a cycle
    return logger.makeRecord(logger.name, level, _EMIT_FILE, line, "request", (), None, "_emit", {"request": fields})


_EMIT_FILE = _emit.__code__.co_filename

#: The handler :func:`configure` installed last, while it is the root logger's.
_configured: logging.StreamHandler[Any] | None = None


def _direct_handler(level: int) -> logging.StreamHandler[Any] | None:
    """The text handler of :func:`configure`, when a request line of ``level`` would reach it and nothing else.

    That is: records are plain LogRecords (no record factory installed), the
    request logger is an ordinary enabled logger without filters, no logger
    between it and the root has a handler, the root's only handler is that
    one, without filters, taking ``level``, with its :class:`TextFormatter`.
    Then the line the logging machinery would write is known
    (:func:`direct_line`); any other set-up goes through the machinery.
    """
    handler = _configured
    if (
        handler is None
        or type(handler.formatter) is not TextFormatter
        or handler.filters
        or level < handler.level
        or logging.getLogRecordFactory() is not logging.LogRecord
        or type(logger) is not logging.Logger
        or logger.disabled
        or logger.filters
    ):
        return None
    node: logging.Logger | None = logger
    while node is not None and node is not logging.root:
        if node.handlers or not node.propagate:
            return None
        node = node.parent
    root_handlers = logging.root.handlers
    if node is None or len(root_handlers) != 1 or root_handlers[0] is not handler:
        return None
    return handler


#: The record's clock: since Python 3.13 a LogRecord takes its time from ``time.time_ns()``.
_NS_CLOCK = sys.version_info >= (3, 13)


def _now() -> tuple[float, float]:
    """``created`` and ``msecs`` as a LogRecord made now has them."""
    if _NS_CLOCK:  # pragma: no cover - the record's clock since 3.13
        ns = time.time_ns()
        return ns / 1e9, (ns % 1_000_000_000) // 1_000_000 + 0.0
    created = time.time()
    return created, int((created - int(created)) * 1000) + 0.0


def direct_line(formatter: TextFormatter, level: int, created: float, msecs: float, fields: dict[str, Any]) -> str:
    """The text :class:`TextFormatter` makes of the request line's record (``created``, ``msecs``, ``fields``)."""
    return f"{formatter.stamp(created, msecs)} {logging.getLevelName(level)} {logger.name}: request {_pairs(fields)}"


def _write_direct(handler: logging.StreamHandler[Any], level: int, info: RequestInfo) -> None:
    """What ``handler.handle(record)`` does with the request line's record, without the record.

    The line is :func:`direct_line` of the record's fields, made in one
    f-string: the time stamp from the formatter's per-second cache
    (:meth:`TextFormatter.stamp`), the pairs from ``info``
    (:func:`info_pairs`), the handler's terminator; then one ``write`` and
    the handler's ``flush``, under the handler's lock, errors handled as
    ``StreamHandler.emit`` handles them.
    """
    latency_ms = round((time.perf_counter() - info.started) * 1000, 3)  # RequestInfo.latency_ms, inlined
    created, msecs = _now()
    formatter = handler.formatter
    assert isinstance(formatter, TextFormatter)
    handler.acquire()
    try:
        stream = handler.stream
        stream.write(
            f"{formatter.stamp(created, msecs)} {logging.getLevelName(level)} {logger.name}: request "
            f"{info_pairs(info, latency_ms)}{handler.terminator}"
        )
        if stream and hasattr(stream, "flush"):
            stream.flush()
    except RecursionError:  # as StreamHandler.emit
        raise
    except Exception:
        handler.handleError(_record(level, info.fields(latency_ms)))
    finally:
        handler.release()


class ToolCall:
    """One tool call: metrics, request-line fields, and the request id in its error."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.started = time.perf_counter()
        info = _current.get()
        self._own_line = info is None  # stdio: no HTTP request line, so the call writes its own
        self.info = info if info is not None else RequestInfo(new_request_id(), client="stdio")
        self.info.tool = tool
        self.request_id = self.info.request_id

    def set_site(self, site: str) -> None:
        self.info.site = site

    def _finish(self, error_code: str | None) -> None:
        METRICS.tool_call(self.tool, time.perf_counter() - self.started, error_code)
        self.info.outcome = "ok" if error_code is None else "error"
        self.info.error_code = error_code
        if self._own_line:
            _emit(self.info)

    def succeeded(self, result: types.CallToolResult) -> types.CallToolResult:
        self._finish(None)
        return result

    def failed(self, failure: ToolFailure) -> types.CallToolResult:
        """The error result for ``failure``, tagged with this request's id."""
        failure.details.setdefault("request_id", self.request_id)
        self._finish(failure.code)
        return failure.to_result(self.tool)


def _claimed_site(scope: Scope) -> str | None:
    """The Basic user name of the request, when it is a well-formed site name (never the password)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, encoded = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() != "basic":
                return None
            try:
                user = base64.b64decode(encoded.strip(), validate=True).split(b":", 1)[0].decode("ascii")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
            return user if _is_site_name(user) else None
    return None


def _tag_error_response(held: list[Message], rid: str) -> tuple[Message, bytes]:
    """An HTTP error response (start message, whole body) with the request id added to its text.

    A JSON-RPC error gets it appended to ``error.message`` (unless the message
    already names it, as the server's own errors do for stdio clients), a
    plain-text body at its end; other bodies are left as they are.
    """
    start, body = held[0], b"".join(m.get("body", b"") for m in held[1:])
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"").decode("latin-1").lower()
    suffix = f" (request id {rid})"
    if ctype.startswith("application/json"):
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str) and suffix not in error["message"]:
            error["message"] += suffix
            body = json.dumps(doc, separators=(",", ":")).encode()
    elif ctype.startswith("text/plain"):
        text = body.decode("utf-8", "replace")
        stripped = text.rstrip("\n")
        body = (stripped + suffix + text[len(stripped) :]).encode()
    headers.append((b"content-length", str(len(body)).encode()))
    return {**start, "headers": headers}, body


def counting(info: RequestInfo, receive: Receive) -> Receive:
    """``receive`` counting the request's body bytes into ``info``."""

    async def counting_receive() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            info.request_bytes += len(message.get("body", b""))
        return message

    return counting_receive


def tagging(info: RequestInfo, send: Send) -> Send:
    """``send`` recording the response into ``info``, with the request id in its headers and in an error's text."""
    held: list[Message] = []  # an error response's start and body chunks, until its body is complete

    async def tagging_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            info.status = message["status"]
            headers = list(message.get("headers", []))
            headers.append((b"x-request-id", info.request_id.encode()))
            message = {**message, "headers": headers}
            if info.status >= 400:
                held.append(message)
                return
        elif message["type"] == "http.response.body":
            if held:
                held.append(message)
                if message.get("more_body", False):
                    return
                start, body = _tag_error_response(held, info.request_id)
                held.clear()
                await send(start)
                message = {"type": "http.response.body", "body": body}
            info.response_bytes += len(message.get("body", b""))
        await send(message)

    return tagging_send


def begin(scope: Scope) -> tuple[RequestInfo, contextvars.Token[RequestInfo | None]]:
    """A new request's :class:`RequestInfo`, made the current one; the token :func:`end` takes."""
    client = scope.get("client")
    info = RequestInfo(
        new_request_id(), client=client[0] if client else None, method=scope["method"], path=scope["path"]
    )
    return info, _current.set(info)


def end(info: RequestInfo, token: contextvars.Token[RequestInfo | None], scope: Scope) -> None:
    """The request is over (answered, refused or failed): it is no longer current, and its line is written."""
    _current.reset(token)
    if info.tool is None:
        failed = info.status is None or info.status >= 400
        info.outcome = "error" if failed else "ok"
        if info.status == 401:
            info.error_code = "Unauthenticated"
            record_auth_failure()
    if info.error_code == "Unauthenticated":
        info.site = info.site or _claimed_site(scope)
    _emit(info)


class RequestLog:
    """ASGI middleware: a request id per HTTP request, and its log line when it ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        info, token = begin(scope)
        try:
            await self.app(scope, counting(info, receive), tagging(info, send))
        finally:
            end(info, token, scope)


# -- log formatting -----------------------------------------------------------------

#: Matches the data directory's absolute path (and its resolved form), see :func:`name_files_relative_to`.
_data_dir_re: re.Pattern[str] | None = None


def name_files_relative_to(data_dir: str) -> None:
    """From now on, log lines name files inside ``data_dir`` relative to it (the directory itself as ``.``).

    Store errors and tracebacks carry absolute paths; the log needs only
    where a file is within the data directory, like the errors clients see.
    """
    global _data_dir_re
    if not data_dir:
        return
    roots = {os.path.abspath(data_dir).rstrip(os.sep), os.path.realpath(data_dir).rstrip(os.sep)}
    alternatives = "|".join(re.escape(r) for r in sorted(roots, key=len, reverse=True) if r)
    _data_dir_re = re.compile(f"(?:{alternatives})(?:{re.escape(os.sep)}+|(?![^\\s'\",:;()\\]]))")


def relative_paths(text: str) -> str:
    """``text`` with the data directory's prefix cut from every path inside it."""
    pattern = _data_dir_re
    if pattern is None:
        return text
    return pattern.sub(lambda m: "" if m.group().endswith(os.sep) else ".", text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and a request line's fields at the top level."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": relative_paths(record.getMessage()),
        }
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            out.update(request)
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and key != "request" and key not in out:
                out[key] = value if isinstance(value, str | int | float | bool | type(None)) else repr(value)
        if record.exc_info:
            out["exc"] = relative_paths(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


#: Characters a text log line never carries raw: C0 controls (CR, LF and ESC among them), DEL, C1
#: controls, the Unicode line and paragraph separators, and the backslash that starts an escape.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
#: A field value that would read as more than one ``key=value`` pair is quoted.
_NEEDS_QUOTES = re.compile('[ "=]')


def _escape_char(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_text(text: str) -> str:
    """``text`` with every control character written as a visible escape (``\\n``, ``\\x1b``, ...).

    What a client sends (a path, a claimed site name, a tool name) can then
    never start a new log line or drive the terminal that shows the log.
    """
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


def _field_value(value: object) -> str:
    text = escape_text(str(value))
    if text == "" or _NEEDS_QUOTES.search(text):
        return '"' + text.replace('"', '\\"') + '"'
    return text


#: A string value holding none of these is written as it is (no escape, no quotes).
_SPECIAL = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029\\\\ "=]')


def _pairs(fields: dict[str, Any]) -> str:
    """The request line's ``key=value`` pairs (None values left out), each value as :func:`_field_value` writes it.

    Numbers, and strings without a character that needs escaping or quoting,
    are written as they are without going through the escaping. The usual
    line (every value a number or such a string) is recognised with one
    search over all its strings together: a character to escape or quote is
    in one of them exactly when it is in their concatenation.
    """
    texts = []
    for value in fields.values():
        kind = type(value)
        if kind is str:
            if not value:
                break
            texts.append(value)
        elif not (value is None or kind is int or kind is float or kind is bool):
            break
    else:
        if _SPECIAL.search("".join(texts)) is None:
            return " ".join([f"{key}={value}" for key, value in fields.items() if value is not None])
    out = []
    for key, value in fields.items():
        if value is None:
            continue
        kind = type(value)
        if kind is int or kind is float or kind is bool or (kind is str and value and _SPECIAL.search(value) is None):
            out.append(f"{key}={value}")
        else:
            out.append(f"{key}={_field_value(value)}")
    return " ".join(out)


def info_pairs(info: RequestInfo, latency_ms: float) -> str:
    """``_pairs(info.fields(latency_ms))``, the usual line's pairs written from ``info`` without the dictionary.

    The usual line: a status that is an ``int``, byte counts that are ``int``,
    a request id, client, method, path and outcome, and a site, tool or error
    code when there is one; every string non-empty and free of what
    :data:`_SPECIAL` matches (one search over them all, as in :func:`_pairs`).
    It is written in one f-string; any other line goes through
    :func:`_other_pairs`.
    """
    request_id, client, method, path, outcome = info.request_id, info.client, info.method, info.path, info.outcome
    status, request_bytes, response_bytes = info.status, info.request_bytes, info.response_bytes
    if not (
        type(request_id) is str and request_id and type(client) is str and client and type(method) is str
        and method and type(path) is str and path and type(outcome) is str and outcome and type(status) is int
        and type(request_bytes) is int and type(response_bytes) is int
    ):  # fmt: skip
        return _other_pairs(info, latency_ms)
    texts = f"{request_id}{client}{method}{path}{outcome}"
    site, tool, error_code = info.site, info.tool, info.error_code
    between = code = ""  # the site and tool pairs (after the status), the error code's (after the outcome)
    if site is not None:
        if type(site) is not str or not site:
            return _other_pairs(info, latency_ms)
        texts += site
        between = f" site={site}"
    if tool is not None:
        if type(tool) is not str or not tool:
            return _other_pairs(info, latency_ms)
        texts += tool
        between += f" tool={tool}"
    if error_code is not None:
        if type(error_code) is not str or not error_code:
            return _other_pairs(info, latency_ms)
        texts += error_code
        code = f" error_code={error_code}"
    if _SPECIAL.search(texts) is not None:
        return _other_pairs(info, latency_ms)
    return (
        f"request_id={request_id} client={client} method={method} path={path} status={status}{between} "
        f"outcome={outcome}{code} latency_ms={latency_ms} request_bytes={request_bytes} "
        f"response_bytes={response_bytes}"
    )


def _other_pairs(info: RequestInfo, latency_ms: float) -> str:
    """:func:`info_pairs` of a line with a field missing (no status, no client...) or one to escape or quote."""
    status, request_bytes, response_bytes = info.status, info.request_bytes, info.response_bytes
    texts = (info.request_id, info.client, info.method, info.path, info.site, info.tool, info.outcome, info.error_code)
    if (status is None or type(status) is int) and type(request_bytes) is int and type(response_bytes) is int:
        present = [text for text in texts if text is not None]
        for text in present:
            if type(text) is not str or not text:
                break
        else:
            if _SPECIAL.search("".join(present)) is None:
                request_id, client, method, path, site, tool, outcome, error_code = texts
                named = (
                    ("request_id", request_id), ("client", client), ("method", method), ("path", path),
                    ("status", status), ("site", site), ("tool", tool), ("outcome", outcome),
                    ("error_code", error_code),
                )  # fmt: skip
                out = [f"{key}={value}" for key, value in named if value is not None]
                out.append(f"latency_ms={latency_ms} request_bytes={request_bytes} response_bytes={response_bytes}")
                return " ".join(out)
    return _pairs(info.fields(latency_ms))


class TextFormatter(logging.Formatter):
    """The plain format, with a request line's fields as ``key=value`` pairs.

    One record is one line: the message and every field have their control
    characters escaped (:func:`escape_text`), values holding a space, ``=`` or
    ``"`` are quoted, and a traceback's lines are escaped the same way and
    indented under a ``|`` so none of them can pass for a record of its own.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """The standard time stamp, its date and time part computed once per second."""
        if datefmt is not None:  # pragma: no cover - this formatter never sets one
            return super().formatTime(record, datefmt)
        return self.stamp(record.created, record.msecs)

    def stamp(self, created: float, msecs: float) -> str:
        """:meth:`formatTime` of a record with these ``created`` and ``msecs``."""
        second = int(created)
        if self._second[0] != second:
            self._second = (second, time.strftime(self.default_time_format, self.converter(created)))
        stamp = self._second[1]
        return self.default_msec_format % (stamp, msecs) if self.default_msec_format else stamp

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_text(relative_paths(record.message))
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        lines = relative_paths(super().formatException(ei)).split("\n")
        return "\n".join("  | " + escape_text(line) for line in lines)

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("  | " + escape_text(line) for line in relative_paths(stack_info).split("\n"))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request = getattr(record, "request", None)
        if isinstance(request, dict):
            text += " " + _pairs(request)
        return text


def configure(fmt: str) -> None:
    """Send every log record to stderr in ``fmt`` (``text`` or ``json``), replacing earlier handlers."""
    global _configured
    handler = logging.StreamHandler(sys.stderr)
    _configured = handler
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
