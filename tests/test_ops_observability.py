"""Metrics and request logs against a real server: counters move by what the traffic did; logs hold no secrets."""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp_helpers import basic, error_of
from ops_support import OpsServer, add_site, connect
from prometheus_client.parser import text_string_to_metric_families

from convmem.logstore import layout

SITE, PASSWORD = "obs-site-01", "the-right-password-Zq8v"
WRONG = "wrong-password-Kx7vQ2"
SECRET = "payload-secret-Hb93k"


def scrape(base: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    res = httpx2.get(base + "/metrics", headers=headers, timeout=10)
    assert res.status_code == 200, res.text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(res.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def delta(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def compact(items: list[dict[str, Any]]) -> int:
    return len(json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode())


@pytest.mark.anyio
async def test_metrics_and_request_log_after_traffic(tmp_path: Path) -> None:
    data = tmp_path / "data"
    add_site(data, SITE, PASSWORD)
    server = OpsServer(data, "--log-format", "json")
    try:
        before = scrape(server.base)
        batches = [
            ("conv-obs-one", [{"role": "user", "text": SECRET}]),
            ("conv-obs-one", [{"n": 1}, {"n": 2, "text": "é"}]),
            ("conv-obs-two", [{"k": "v" * 100}]),
        ]
        async with connect(server.url, basic(SITE, PASSWORD)) as client:
            for cid, items in batches:
                res = await client.call_tool("append_memory", {"conversation_id": cid, "items": items})
                assert not res.is_error, res
            for _ in range(2):
                assert not (await client.call_tool("recall_memory", {"conversation_id": "conv-obs-one"})).is_error
            bad = await client.call_tool("append_memory", {"conversation_id": "conv-obs-one", "items": []})
            bad_error = error_of(bad)

            # A lock wait: hold the conversation's lock while an append arrives, releasing it 2 s after the
            # call is sent (0.3 s was once too short for a server on a machine at load 10).
            lock_path = os.path.join(layout.conversation_dir(str(data), SITE, "conv-obs-two"), layout.LOCK_FILE)
            fd = os.open(lock_path, os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX)
            timer = threading.Timer(2.0, lambda: (fcntl.flock(fd, fcntl.LOCK_UN), os.close(fd)))
            timer.start()
            waited = await client.call_tool("append_memory", {"conversation_id": "conv-obs-two", "items": [{"w": 1}]})
            timer.join()
            assert not waited.is_error, waited
        failures = []
        for _ in range(2):
            async with connect(server.url, basic(SITE, WRONG)) as client:
                failures.append(error_of(await client.call_tool("recall_memory", {"conversation_id": "conv-obs-one"})))
        after = scrape(server.base)

        m = "convmem_tool_calls_total"
        assert delta(before, after, m, tool="append_memory", outcome="ok") == 4
        assert delta(before, after, m, tool="append_memory", outcome="error") == 1
        assert delta(before, after, m, tool="recall_memory", outcome="ok") == 2
        assert delta(before, after, m, tool="recall_memory", outcome="error") == 2
        assert delta(before, after, "convmem_tool_errors_total", code=bad_error["code"]) == 1
        assert delta(before, after, "convmem_tool_errors_total", code="Unauthenticated") == 2
        assert delta(before, after, "convmem_auth_failures_total") == 2
        assert delta(before, after, "convmem_auth_throttled_total") == 0
        assert delta(before, after, "convmem_tool_latency_seconds_count", tool="append_memory") == 5
        assert delta(before, after, "convmem_tool_latency_seconds_count", tool="recall_memory") == 4
        want_bytes = sum(compact(items) for _, items in batches) + compact([{"w": 1}])
        assert delta(before, after, "convmem_appended_bytes_total") == want_bytes
        assert delta(before, after, "convmem_lock_waits_total") >= 1
        assert delta(before, after, "convmem_lock_wait_seconds_total") > 0
        # Every acknowledged append synced its record at least once.
        assert delta(before, after, "convmem_fsync_seconds_count", call="fdatasync") >= 4
        assert after[("convmem_open_conversations", ())] == 2

        # A relayed request is not a loopback client, whatever its socket says.
        relayed = httpx2.get(server.base + "/metrics", headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10)
        assert relayed.status_code == 403 and "--metrics-token" in relayed.text
    finally:
        assert server.stop() == 0, server.log()

    log = server.log()
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]  # every line is JSON
    requests = [line for line in lines if line.get("msg") == "request"]
    tool_lines = [r for r in requests if r.get("tool")]
    assert len(tool_lines) == 9
    for r in tool_lines:
        assert re.fullmatch(r"[0-9a-f]{16}", r["request_id"])
        assert r["client"] == "127.0.0.1" and r["method"] == "POST" and r["path"] == "/mcp"
        assert r["status"] == 200 and r["latency_ms"] >= 0 and r["request_bytes"] > 0 and r["response_bytes"] > 0
    ids = [r["request_id"] for r in requests]
    assert len(ids) == len(set(ids))
    # The id in an error's text and object is the id of its request's log line.
    assert f"(request id {bad_error['request_id']})" in bad.content[0].text
    (bad_line,) = [r for r in requests if r["request_id"] == bad_error["request_id"]]
    assert bad_line["error_code"] == bad_error["code"] and bad_line["outcome"] == "error" and bad_line["site"] == SITE
    for failure in failures:
        (line,) = [r for r in requests if r["request_id"] == failure["request_id"]]
        assert line["error_code"] == "Unauthenticated" and line["level"] == "warning"
        assert line["client"] == "127.0.0.1" and line["site"] == SITE
    ok_appends = [r for r in tool_lines if r["tool"] == "append_memory" and r["outcome"] == "ok"]
    assert len(ok_appends) == 4 and all(r["site"] == SITE and r["error_code"] is None for r in ok_appends)
    # Never a payload, a password, or the Authorization header.
    for secret in (SECRET, PASSWORD, WRONG, basic(SITE, PASSWORD).split()[1], basic(SITE, WRONG).split()[1]):
        assert secret not in log


def test_metrics_token(tmp_path: Path) -> None:
    token_file = tmp_path / "metrics.token"
    token_file.write_text("s3cret-metrics-token\n")
    server = OpsServer(tmp_path / "data", "--metrics-token-file", str(token_file))
    try:
        assert httpx2.get(server.base + "/metrics", timeout=10).status_code == 401
        wrong = httpx2.get(server.base + "/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        got = scrape(server.base, Authorization="Bearer s3cret-metrics-token")
        assert ("convmem_auth_failures_total", ()) in got
    finally:
        assert server.stop() == 0
    assert "s3cret-metrics-token" not in server.log()


def test_text_log_format_has_request_fields(tmp_path: Path) -> None:
    server = OpsServer(tmp_path / "data")
    try:
        res = httpx2.get(server.base + "/healthz", timeout=10)
        rid = res.headers["x-request-id"]
        deadline = time.monotonic() + 10
        while rid not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
    finally:
        server.stop()
    (line,) = [line for line in server.log().splitlines() if rid in line]
    assert "convmem.request: request" in line and "path=/healthz" in line and "status=200" in line


def test_http_level_errors_quote_the_request_id(tmp_path: Path) -> None:
    server = OpsServer(tmp_path / "data")
    try:
        checks = [
            httpx2.get(server.base + "/mcp", timeout=10),  # 405, plain text
            httpx2.get(server.base + "/metrics", headers={"Forwarded": "for=203.0.113.9"}, timeout=10),  # 403
            httpx2.post(  # a JSON-RPC parse error
                server.url,
                content=b"{not json",
                headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
                timeout=10,
            ),
        ]
        for res in checks:
            assert res.status_code >= 400
            rid = res.headers["x-request-id"]
            assert f"(request id {rid})" in res.text, res.text
            assert int(res.headers["content-length"]) == len(res.content)
        body = checks[2].json()
        assert body["error"]["message"].endswith(f"(request id {checks[2].headers['x-request-id']})")
    finally:
        assert server.stop() == 0


def test_the_request_log_names_a_site_by_the_one_site_name_rule() -> None:
    """The log's ``site`` field takes any well-formed site name (1-64 characters), not the conversation-id rule."""
    import base64

    from convmem.mcp_adapter.requestlog import _claimed_site

    def scope(user: str) -> dict[str, Any]:
        token = base64.b64encode(f"{user}:some-password".encode()).decode()
        return {"headers": [(b"authorization", f"Basic {token}".encode())]}

    assert _claimed_site(scope("acme")) == "acme"
    assert _claimed_site(scope("a" * 64)) == "a" * 64
    for bad in ("", "a" * 65, "no spaces", "dots.not.allowed"):
        assert _claimed_site(scope(bad)) is None, bad
