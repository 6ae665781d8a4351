"""Read results written into the HTTP response as bytes (``mcp_adapter.wire``).

The spliced response must decode to exactly what the SDK's own serialisation
gives: the same text block, the same ``structuredContent``, a correct
``Content-Length``, whatever the payloads hold (quotes, backslashes, control
characters, non-ASCII, characters split across the pieces the text is escaped
in) and however large the page (bodies over one piece go out in chunks).
"""

from __future__ import annotations

import http.client
import json
import random
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec
import pytest
from mcp_helpers import ServerProcess, basic, run_convmem

from convmem.logstore import RawMemoryItem, Tail, open_store
from convmem.mcp_adapter import wire

SITE, PASSWORD = "wire-site", "wire-password-0123456789"
TRICKY = ["plain", 'quo"te', "back\\slash", "ctl\x00\x01\x1f\n\t\r", "é", "\u2028\u2029", "😀", "\x7f", "</script>"]


def _random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(TRICKY) for _ in range(n))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_escape_matches_json_string_encoding_across_pieces(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    monkeypatch.setattr(wire, "PIECE", rng.choice([1, 2, 3, 7, 64]))  # cut inside multi-byte characters
    text = _random_text(rng, 200)
    escaped = b"".join(wire.escape(text.encode()))
    assert json.loads(b'"' + escaped + b'"') == text
    assert escaped == msgspec.json.encode(text)[1:-1]


def test_splice_replaces_exactly_its_placeholders() -> None:
    doc = msgspec.json.encode(
        {"items": [{"seq": 0, "recorded_at": "t", "payload": {"k": _random_text(random.Random(4), 50)}}]}
    )
    splice = wire.Splice()
    result = splice.result(
        wire.Prepared.from_json(doc).with_memories([{"id": "m1", "subject": "s", "summary": "x"}], "Relevant: s")
    )
    placeholder_body = json.dumps(
        {"jsonrpc": "2.0", "id": 7, "result": result.model_dump(by_alias=True, mode="json", exclude_none=True)},
        separators=(",", ":"),
    ).encode()
    out = json.loads(b"".join(splice.chunks(placeholder_body)))
    assert not splice.pending
    structured = out["result"]["structuredContent"]
    assert structured == {**json.loads(doc), "memories": [{"id": "m1", "subject": "s", "summary": "x"}]}
    assert out["result"]["content"][0]["text"] == doc.decode() + "\n\nRelevant: s"
    assert out["id"] == 7 and out["result"]["isError"] is False
    # The ordinary result (stdio) is the same.
    plain = wire.Prepared.from_json(doc).decoded()
    assert plain.structured_content == json.loads(doc)
    assert plain.content[0].text == doc.decode()  # type: ignore[union-attr]


def test_a_body_without_placeholders_is_left_alone() -> None:
    splice = wire.Splice()
    splice.result(wire.Prepared.from_json(b'{"items":[]}'))
    body = b'{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}'
    assert b"".join(splice.chunks(body)) == body


def _post(url: str, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], int, bytes]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
    headers = {
        "Authorization": basic(SITE, PASSWORD),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    body = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    )
    conn.request("POST", u.path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    length = int(response.getheader("Content-Length") or -1)
    conn.close()
    assert response.status == 200, data[:500]
    return json.loads(data), length, data


def test_read_results_over_http_decode_to_what_the_store_holds(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert (
        run_convmem(
            "site", "add", SITE, "--data-dir", str(data_dir), "--password-stdin", input=PASSWORD + "\n"
        ).returncode
        == 0
    )
    rng = random.Random(11)
    print("seed=11")
    small = [{"n": i, "t": _random_text(rng, 30), "nested": {"a": [1, 2.5, None, True]}} for i in range(40)]
    big = [{"n": i, "t": "é" * 60_000 + _random_text(rng, 20)} for i in range(12)]  # ~1.4 MB: sent in chunks
    with open_store(str(data_dir)) as store:
        store.append(SITE, "wire-small-1", small)
        for i in range(0, len(big), 4):
            store.append(SITE, "wire-big-01", big[i : i + 4])
        expected = {c: store.read(SITE, c, Tail(1000)) for c in ("wire-small-1", "wire-big-01")}
        raw = store.read_raw(SITE, "wire-small-1", Tail(5))
        assert all(isinstance(i, RawMemoryItem) for i in raw)
    server = ServerProcess(data_dir)
    try:
        for conv, args in (("wire-small-1", {"count": 25}), ("wire-big-01", {"count": 1000})):
            doc, length, data = _post(server.url, "recall_memory", {"conversation_id": conv, **args})
            assert length == len(data)
            result = doc["result"]
            want = [{"seq": i.seq, "recorded_at": i.recorded_at, "payload": i.payload} for i in expected[conv]]
            want = want[-args["count"] :]
            assert result["structuredContent"] == {"items": want}
            assert json.loads(result["content"][0]["text"]) == {"items": want}
            assert b"convmem-splice" not in data
        doc, length, data = _post(
            server.url, "replay_memory", {"conversation_id": "wire-big-01", "offset": 3, "limit": 5}
        )
        assert [i["seq"] for i in doc["result"]["structuredContent"]["items"]] == [3, 4, 5, 6, 7]
        assert length == len(data)
        doc, _, _ = _post(
            server.url, "recall_memory", {"conversation_id": "wire-small-1", "count": 2, "memory_context": "t"}
        )
        result = doc["result"]
        assert [i["seq"] for i in result["structuredContent"]["items"]] == [38, 39]
        assert result["structuredContent"]["memories"] == []
        text = result["content"][0]["text"]
        spec, _, section = text.partition("\n\n")
        assert json.loads(spec) == {"items": result["structuredContent"]["items"]}
        assert section.startswith("Relevant memories")
    finally:
        assert server.stop() == 0, server.log()


def test_a_response_already_under_way_gets_the_ordinary_result() -> None:
    splice = wire.Splice()
    splice.open = False  # the middleware passed a response start through: nothing could be replaced
    result = splice.result(wire.Prepared.from_json(b'{"items":[]}'))
    assert result.structured_content == {"items": []} and not splice.pending
