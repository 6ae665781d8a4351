"""Listing cursors are sealed: nothing readable in them, no altering them, no using another site's.

Cursors used to be unsigned base64 that showed a conversation id and a
timestamp. They are now MAC'd and encrypted with keys derived from the data
directory's secret (:mod:`convmem.mcp_adapter.cursors`).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx2
import pytest
from mcp_helpers import ServerProcess

from convmem.logstore import InvalidCursor, ListCursor
from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.cursors import CursorSeal

SITE, PASSWORD = "cursor-site-01", "cursor-password-01"
OTHER, OTHER_PASSWORD = "cursor-site-02", "cursor-password-02"
CONV = "secret-plan-conversation"
POSITION = ListCursor("2026-12-01T21:30:00.123456Z", CONV)


def test_a_sealed_cursor_opens_for_its_site_only_and_shows_nothing() -> None:
    seal = CursorSeal(b"k" * 32)
    token = seal.seal(POSITION, SITE)
    assert seal.open(token, SITE) == POSITION
    raw = base64.urlsafe_b64decode(token[2:] + "=" * (-len(token[2:]) % 4))
    for hidden in (CONV.encode(), b"2026", b"1796"):
        assert hidden not in raw and hidden.decode() not in token
    with pytest.raises(InvalidCursor):
        seal.open(token, OTHER)
    with pytest.raises(InvalidCursor):
        CursorSeal(b"j" * 32).open(token, SITE)  # another data directory's key


def test_every_altered_character_of_a_cursor_is_refused() -> None:
    seal = CursorSeal(b"k" * 32)
    token = seal.seal(POSITION, SITE)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(token)):
        replacement = alphabet[(alphabet.find(token[i]) + 1) % len(alphabet)]
        altered = token[:i] + replacement + token[i + 1 :]
        if altered == token:
            continue
        with pytest.raises(InvalidCursor):
            seal.open(altered, SITE)
    for bad in ("", "c1", "c1" + "A" * 300, token[:-3], token + "AAAA", "x" * 40, "c1é"):
        with pytest.raises(InvalidCursor):
            seal.open(bad, SITE)


def _headers(site: str, password: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode(),
    }


def _call(proc: ServerProcess, site: str, password: str, tool: str, arguments: dict[str, object]) -> dict[str, object]:
    msg = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    with httpx2.Client(timeout=60) as http:
        r = http.post(proc.url, content=json.dumps(msg), headers=_headers(site, password))
    assert r.status_code == 200, r.text[:300]
    result: dict[str, object] = r.json()["result"]
    return result


def _error_code(result: dict[str, object]) -> str:
    assert result.get("isError"), result
    meta = result["_meta"]
    assert isinstance(meta, dict)
    return str(meta["convmem/error"]["code"])


def test_running_servers_on_one_data_directory_accept_each_others_cursors_and_refuse_forgeries(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    creds = CredentialFile(data)
    creds.add(SITE, PASSWORD)
    creds.add(OTHER, OTHER_PASSWORD)
    first = ServerProcess(data)
    second = ServerProcess(data)
    try:
        for i in range(3):
            for site, password in ((SITE, PASSWORD), (OTHER, OTHER_PASSWORD)):
                appended = _call(
                    first, site, password, "append_memory", {"conversation_id": f"{CONV}-{i}", "items": [{"i": i}]}
                )
                assert not appended.get("isError"), appended
        page = _call(first, SITE, PASSWORD, "list_conversations", {"limit": 1})
        content = page["structuredContent"]
        assert isinstance(content, dict)
        token = content["next_cursor"]
        assert isinstance(token, str) and CONV not in token
        # The other process continues the listing from the first one's cursor.
        rest = _call(second, SITE, PASSWORD, "list_conversations", {"cursor": token, "limit": 10})
        rest_content = rest["structuredContent"]
        assert isinstance(rest_content, dict)
        listed = [c["conversation_id"] for c in content["conversations"] + rest_content["conversations"]]
        assert sorted(listed) == [f"{CONV}-{i}" for i in range(3)]
        # Another site's cursor, an altered one, and one sealed with another key are refused.
        other_page = _call(second, OTHER, OTHER_PASSWORD, "list_conversations", {"limit": 1})
        other_content = other_page["structuredContent"]
        assert isinstance(other_content, dict)
        foreign = other_content["next_cursor"]
        assert isinstance(foreign, str)
        flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
        forged = CursorSeal(b"z" * 32).seal(ListCursor("2026-12-01T00:00:00.000000Z", f"{CONV}-0"), SITE)
        for bad in (foreign, flipped, forged):
            for proc in (first, second):
                assert (
                    _error_code(_call(proc, SITE, PASSWORD, "list_conversations", {"cursor": bad})) == "InvalidCursor"
                )
    finally:
        assert first.stop() == 0
        assert second.stop() == 0
