"""The server log cannot be forged, and names data files relative to the data directory.

An unauthenticated ``GET /x%0a2026-12-01 ... outcome=ok`` wrote a
separate, believable line into the text log. Every field of the text format
is escaped now; a real server is driven with CR, LF and ESC in the path, in
the claimed site name and in the tool name.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import socket
import time
from pathlib import Path

import httpx2
from mcp_helpers import ServerProcess

from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter import requestlog

SITE, PASSWORD = "log-site-0001", "log-password-0001"
FORGED = "1999-12-31 00:00:00,000 INFO convmem.request: request site=bravo tool=memory_delete outcome=ok"
#: A log line's start: its timestamp, or a traceback line under "  | ".
LINE_START = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} |  \| )")


def _auth(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def _raw(proc: ServerProcess, request: bytes) -> bytes:
    host, port = proc.base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def _wait_for(proc: ServerProcess, text: str) -> str:
    deadline = time.monotonic() + 30
    while text not in (log := proc.log()):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.05)
    return log


def test_control_characters_from_clients_cannot_forge_log_lines(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    proc = ServerProcess(data, "--log-level", "info")
    try:
        # The path: percent-encoded CR, LF and ESC, decoded by the server before it is logged.
        forged_path = "/x%0d%0a" + FORGED.replace(" ", "%20") + "%1b[2J"
        reply = _raw(proc, f"GET {forged_path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        assert reply.startswith(b"HTTP/1.1 404"), reply[:200]
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        with httpx2.Client(timeout=60) as http:
            # The site name: the Basic user name carries CR, LF and ESC.
            bad_site = f"bravo\r\n{FORGED}\x1b[2J"
            r = http.post(proc.url, content=body, headers={**headers, "Authorization": _auth(bad_site, "x" * 12)})
            assert r.status_code == 200
            # The tool name, from an authenticated client.
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": f"recall_memory\r\n{FORGED}\x1b[2J", "arguments": {}},
            }
            r = http.post(
                proc.url, content=json.dumps(call), headers={**headers, "Authorization": _auth(SITE, PASSWORD)}
            )
            assert r.status_code == 200
            rid = r.headers["x-request-id"]
        log = _wait_for(proc, rid)
    finally:
        assert proc.stop() == 0
    log = proc.log()
    for raw in ("\r", "\x1b"):
        assert raw not in log, f"{raw!r} reached the log raw"
    lines = log.splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:10])]
    assert not [line for line in lines if not LINE_START.match(line) and "bravo" in line], log[-3000:]
    (path_line,) = [line for line in lines if "status=404" in line]
    assert "\\r\\n1999-12-31" in path_line and "\\x1b[2J" in path_line


def _format(record_fields: dict[str, object], message: str = "request", json_format: bool = False) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(requestlog.JsonFormatter() if json_format else requestlog.TextFormatter())
    logger = logging.getLogger("convmem.test-escaping")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning(message, extra={"request": record_fields})
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_every_text_field_is_escaped_and_quoted() -> None:
    every_control = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028]))
    out = _format(
        {"path": "/a\nb", "site": "s\r\x1bite", "tool": "t\x9bool", "error_code": every_control, "client": "a b=c"},
        message="hello\nworld\x1b",
    )
    assert out.count("\n") == 1 and out.endswith("\n")
    assert not any(c in out[:-1] for c in every_control)
    assert "hello\\nworld\\x1b" in out
    assert "path=/a\\nb" in out and "site=s\\r\\x1bite" in out and "tool=t\\x9bool" in out
    assert 'client="a b=c"' in out


def test_log_lines_name_data_files_relative_to_the_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    requestlog.name_files_relative_to(str(data))
    try:
        segment = data / "sites" / "ab" / "00000000000000000000.seg"
        text = _format({}, message=f"Corrupted: {segment} offset 5259; data dir {data}, next to it {tmp_path}/other")
        assert str(data) not in text
        assert "Corrupted: sites/ab/00000000000000000000.seg offset 5259; data dir ." in text
        assert f"{tmp_path}/other" in text  # outside the data directory: left alone
        doc = json.loads(_format({}, message=f"cannot open {segment}", json_format=True))
        assert doc["msg"] == "cannot open sites/ab/00000000000000000000.seg"
    finally:
        requestlog._data_dir_re = None


def test_a_running_server_logs_store_errors_with_relative_paths(tmp_path: Path) -> None:
    """A damaged segment makes the server log a Corrupted error: it names the file inside the data directory."""
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": _auth(SITE, PASSWORD),
    }

    def call(proc: ServerProcess, tool: str, arguments: dict[str, object]) -> dict[str, object]:
        msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        with httpx2.Client(timeout=60) as http:
            r = http.post(proc.url, content=json.dumps(msg), headers=headers)
        assert r.status_code == 200, r.text[:300]
        result: dict[str, object] = r.json()["result"]
        return result

    proc = ServerProcess(data)
    try:
        call(proc, "append_memory", {"conversation_id": "damaged-conv-01", "items": [{"text": "q" * 4000}]})
    finally:
        assert proc.stop() == 0
    (segment,) = data.rglob(f"{b'damaged-conv-01'.hex()}/*.seg")
    raw = bytearray(segment.read_bytes())
    raw[2000] ^= 0xFF  # inside the item's text
    segment.write_bytes(bytes(raw))
    proc = ServerProcess(data)
    try:
        result = call(proc, "recall_memory", {"conversation_id": "damaged-conv-01"})
        assert result.get("isError"), result
        log = _wait_for(proc, "Corrupted")
    finally:
        assert proc.stop() == 0
    assert str(data) not in log and str(data.resolve()) not in log, log[-3000:]
    assert "sites/" in log
