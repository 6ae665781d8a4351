"""Site removal and re-creation against a running server: the old tenant's data never reaches a new owner.

Four writers of the old tenant append as fast as they can while
``convmem site remove --force`` runs; then the name is given to a new owner
with a new password. The new owner must see none of the old conversations,
and the old password must not work any more.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp_helpers import ServerProcess, run_convmem

from convmem.logstore.site_credentials import CredentialFile

SITE = "tenant-site"
OLD_PASSWORD = "old-owner-password-0123"
NEW_PASSWORD = "new-owner-password-4567"
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}


def _auth(password: str) -> str:
    return "Basic " + base64.b64encode(f"{SITE}:{password}".encode()).decode()


def _call(http: httpx2.Client, url: str, password: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    r = http.post(url, content=json.dumps(body), headers={**HEADERS, "Authorization": _auth(password)})
    assert r.status_code == 200, (r.status_code, r.text[:300])
    result: dict[str, Any] = r.json()["result"]
    return result


class Writer(threading.Thread):
    """Appends to fresh conversations with the old password until stopped."""

    def __init__(self, url: str, index: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.index = index
        self.stop = threading.Event()
        self.conversations: list[str] = []
        self.acked = 0
        self.rejected = 0

    def run(self) -> None:
        with httpx2.Client(timeout=30) as http:
            n = 0
            while not self.stop.is_set():
                cid = f"old-w{self.index}-c{n:05d}"
                n += 1
                self.conversations.append(cid)
                res = _call(
                    http, self.url, OLD_PASSWORD, "append_memory", {"conversation_id": cid, "items": [{"n": n}]}
                )
                if res.get("isError"):
                    self.rejected += 1
                else:
                    self.acked += 1


@pytest.mark.timeout(180)
def test_a_removed_sites_data_never_reaches_the_next_owner_of_its_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, OLD_PASSWORD)
    server = ServerProcess(data)
    writers = [Writer(server.url, i) for i in range(4)]
    try:
        for w in writers:
            w.start()
        deadline = time.monotonic() + 30
        while sum(w.acked for w in writers) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(w.acked for w in writers) >= 40, server.log()[-2000:]

        removed = run_convmem("site", "remove", SITE, "--force", "--data-dir", str(data))
        assert removed.returncode == 0, removed.stderr
        time.sleep(0.5)  # the old tenant keeps trying for a while

        added = run_convmem("site", "add", SITE, "--password-stdin", "--data-dir", str(data), input=NEW_PASSWORD)
        if added.returncode != 0:
            # Data written by calls admitted just before the revocation: the name is refused, never handed over.
            assert "--purge-data" in added.stderr, added.stderr
            added = run_convmem(
                "site", "add", SITE, "--password-stdin", "--purge-data", "--data-dir", str(data), input=NEW_PASSWORD
            )
        assert added.returncode == 0, added.stderr
        time.sleep(0.3)
    finally:
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(timeout=60)
    try:
        assert all(w.rejected > 0 for w in writers), "the old password kept working after the removal"
        with httpx2.Client(timeout=30) as http:
            listing = _call(http, server.url, NEW_PASSWORD, "list_conversations", {"limit": 100})
            assert not listing.get("isError"), listing
            assert listing["structuredContent"]["conversations"] == []
            for w in writers:
                for cid in w.conversations[:: max(1, len(w.conversations) // 20)] + w.conversations[-3:]:
                    got = _call(http, server.url, NEW_PASSWORD, "recall_memory", {"conversation_id": cid})
                    assert got["structuredContent"]["items"] == [], cid
            old = _call(http, server.url, OLD_PASSWORD, "list_conversations", {})
            assert old["isError"] and old["_meta"]["convmem/error"]["code"] in ("Unauthenticated", "Throttled")
    finally:
        assert server.stop() == 0


def test_site_add_refuses_a_name_whose_data_still_exists(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run_convmem("site", "add", SITE, "--data-dir", str(data)).returncode == 0
    from convmem.logstore import open_store

    with open_store(data) as store:
        store.append(SITE, "left-behind-01", [{"secret": 1}])
    # The credentials disappear without the data (e.g. a removal interrupted after the revocation).
    CredentialFile(data).remove(SITE)
    refused = run_convmem("site", "add", SITE, "--password-stdin", "--data-dir", str(data), input=NEW_PASSWORD)
    assert refused.returncode != 0 and "--purge-data" in refused.stderr
    assert SITE not in CredentialFile(data).sites()
    purged = run_convmem(
        "site", "add", SITE, "--password-stdin", "--purge-data", "--data-dir", str(data), input=NEW_PASSWORD
    )
    assert purged.returncode == 0, purged.stderr
    with open_store(data) as store:
        from convmem.logstore import Tail

        assert store.read(SITE, "left-behind-01", Tail(10)) == []


@pytest.mark.timeout(180)
def test_a_changed_password_stops_working_at_once_under_concurrent_requests(tmp_path: Path) -> None:
    """Requests with the old password race a `site passwd`; none sent after it returned may be accepted."""
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, OLD_PASSWORD)
    server = ServerProcess(data)
    stop = threading.Event()
    log: list[tuple[float, bool]] = []  # (time the request was sent, accepted)
    lock = threading.Lock()

    def hammer() -> None:
        with httpx2.Client(timeout=30) as http:
            while not stop.is_set():
                sent = time.monotonic()
                res = _call(http, server.url, OLD_PASSWORD, "list_conversations", {})
                with lock:
                    log.append((sent, not res.get("isError")))

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        changed = run_convmem("site", "passwd", SITE, "--password-stdin", "--data-dir", str(data), input=NEW_PASSWORD)
        assert changed.returncode == 0, changed.stderr
        done = time.monotonic()
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    try:
        before = [ok for sent, ok in log if sent < done]
        after = [ok for sent, ok in log if sent > done]
        assert any(before), "the old password never worked before the change"
        assert after and not any(after), f"{sum(after)} of {len(after)} old-password requests accepted after the change"
        with httpx2.Client(timeout=30) as http:
            assert not _call(http, server.url, NEW_PASSWORD, "list_conversations", {}).get("isError")
    finally:
        assert server.stop() == 0


def test_site_add_clears_a_leftover_directory_without_conversations(tmp_path: Path) -> None:
    import shutil

    from convmem.logstore import open_store
    from convmem.logstore.layout import site_dir

    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE, "gone-conv-0001", [{"a": 1}])
    shutil.rmtree(Path(site_dir(str(data), SITE)) / "c")  # listing files remain, no conversation does
    added = run_convmem("site", "add", SITE, "--password-stdin", "--data-dir", str(data), input=NEW_PASSWORD)
    assert added.returncode == 0, added.stderr
    assert not Path(site_dir(str(data), SITE)).exists()
