"""Raw JSON-RPC tool calls to running servers, for the many-processes coherence tests."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx2

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}


def auth(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def call(http: httpx2.Client, url: str, authorization: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC ``result`` of one tool call (asserting HTTP 200)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    r = http.post(url, content=json.dumps(body), headers={**HEADERS, "Authorization": authorization})
    assert r.status_code == 200, (r.status_code, r.text[:300])
    result: dict[str, Any] = r.json()["result"]
    return result


def error_code(result: dict[str, Any]) -> str | None:
    """The ``convmem/error`` code of a failed result; None for a success."""
    if not result.get("isError"):
        return None
    return str(result.get("_meta", {}).get("convmem/error", {}).get("code", "?"))


def new_memory(tag: str) -> dict[str, Any]:
    unique = uuid.uuid4().hex[:8]
    return {
        "category": "fact",
        "subject": f"Coherence {tag} {unique}",
        "summary": f"Memory {tag} {unique} written during a site replacement",
        "details": "",
        "tags": [unique],
        "source_uris": [],
    }


def create_memory(http: httpx2.Client, url: str, authorization: str, raw: dict[str, Any]) -> dict[str, Any]:
    """``memory_verify`` then ``memory_upsert``: the upsert's result (or the verify's, when it failed)."""
    verified = call(http, url, authorization, "memory_verify", {"intent": "create", "candidate": raw})
    if verified.get("isError"):
        return verified
    token = verified["structuredContent"]["verify_token"]
    return call(http, url, authorization, "memory_upsert", {"memory": raw, "verify_token": token})
