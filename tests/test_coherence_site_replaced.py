"""A site removed and added again by the CLI while servers hold it open.

Reproduced as the attack did: running servers keep the site's listing, pool,
memory store and lock descriptors open; ``convmem site remove NAME --force``
and ``site add NAME`` run in other processes; then the new owner uses the
name. The servers must notice the site is another incarnation (FORMAT.md 1,
"Site incarnations") and never serve, list or write through what they held.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import threading
import time
from pathlib import Path

import httpx2
import pytest
from coherence_support import auth, call, create_memory, error_code, new_memory
from mcp_helpers import ServerProcess, run_convmem

from convmem.logstore import layout
from convmem.logstore.incarnation import read_id
from convmem.logstore.site_credentials import CredentialFile

SITE = "echo"
OLD_PW = "old-owner-password-0123"
NEW_PW = "new-owner-password-4567"


def _replace_site(data: Path) -> None:
    removed = run_convmem("site", "remove", SITE, "--force", "--grace", "0", "--data-dir", str(data))
    assert removed.returncode == 0, removed.stderr
    added = run_convmem("site", "add", SITE, "--password-stdin", "--data-dir", str(data), input=NEW_PW)
    assert added.returncode == 0, added.stderr


def _fsck_clean(data: Path) -> dict[str, object]:
    out = run_convmem("fsck", "--json", str(data))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report: dict[str, object] = json.loads(out.stdout)
    return report


def _append(conversation_id: str, text: str) -> dict[str, object]:
    return {"conversation_id": conversation_id, "items": [{"t": text}]}


def _conversations(http: httpx2.Client, url: str, who: str) -> list[str]:
    listing = call(http, url, who, "list_conversations", {"limit": 100})
    assert error_code(listing) is None, listing
    return [c["conversation_id"] for c in listing["structuredContent"]["conversations"]]


@pytest.mark.timeout(120)
def test_a_re_added_site_never_shows_the_old_tenants_conversations(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, OLD_PW)
    old, new = auth(SITE, OLD_PW), auth(SITE, NEW_PW)
    server = ServerProcess(data)
    try:
        with httpx2.Client(timeout=30) as http:
            res = call(http, server.url, old, "append_memory", _append("acme-merger-plan", "secret"))
            assert error_code(res) is None, res
            assert _conversations(http, server.url, old) == ["acme-merger-plan"]
            first_id = read_id(layout.site_dir(str(data), SITE))
            assert first_id is not None

            _replace_site(data)

            res = call(http, server.url, new, "append_memory", _append("new-owner-notes", "mine"))
            assert error_code(res) is None, res
            assert _conversations(http, server.url, new) == ["new-owner-notes"]
            got = call(http, server.url, new, "recall_memory", {"conversation_id": "acme-merger-plan"})
            assert got["structuredContent"]["items"] == []
            second_id = read_id(layout.site_dir(str(data), SITE))
            assert second_id is not None and second_id != first_id
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    # The new site's manifest log never received the old listing: after a restart (which lists from
    # the manifest files only) and for fsck, the site holds exactly the new owner's conversation.
    server = ServerProcess(data)
    try:
        with httpx2.Client(timeout=30) as http:
            assert _conversations(http, server.url, new) == ["new-owner-notes"]
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    report = _fsck_clean(data)
    assert not report.get("problems"), report


def _create_waits_for_the_lock(url: str, who: str, data: Path) -> None:
    lock = Path(layout.site_dir(str(data), SITE)) / "memories" / "lock"
    released = threading.Event()
    outcome: list[tuple[bool, str | None]] = []

    raw = new_memory("waits")
    with httpx2.Client(timeout=60) as http:
        verified = call(http, url, who, "memory_verify", {"intent": "create", "candidate": raw})
    token = verified["structuredContent"]["verify_token"]

    def create() -> None:
        with httpx2.Client(timeout=60) as http:
            res = call(http, url, who, "memory_upsert", {"memory": raw, "verify_token": token})
            outcome.append((released.is_set(), error_code(res)))

    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)  # as any process of the engine opens it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t = threading.Thread(target=create)
        t.start()
        time.sleep(2.5)  # far longer than an upsert takes: one that does not wait is done by then
        released.set()
        fcntl.flock(fd, fcntl.LOCK_UN)
        t.join(timeout=60)
    finally:
        os.close(fd)
    assert outcome == [(True, None)], outcome


@pytest.mark.timeout(150)
def test_two_servers_keep_one_memory_log_whole_after_the_site_is_replaced(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, OLD_PW)
    old, new = auth(SITE, OLD_PW), auth(SITE, NEW_PW)
    servers = [ServerProcess(data), ServerProcess(data)]
    try:
        with httpx2.Client(timeout=30) as http:
            # Both servers open the site's memory store (and its lock file) before the replacement.
            for i, s in enumerate(servers):
                res = create_memory(http, s.url, old, new_memory(f"old-{i}"))
                assert error_code(res) is None, res
        _replace_site(data)
        with httpx2.Client(timeout=60) as http:
            res = create_memory(http, servers[0].url, new, new_memory("first"))
            assert error_code(res) is None, res
        # The other server's memory lock must be the file now at the path: while this process
        # holds that file's lock, a create through it waits (its old descriptor would not).
        _create_waits_for_the_lock(servers[1].url, new, data)

        def create(i: int) -> tuple[str | None, dict[str, object]]:
            with httpx2.Client(timeout=60) as http:
                res = create_memory(http, servers[i % 2].url, new, new_memory(f"new-{i}"))
                return error_code(res), res

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(create, range(12)))
        failures = [r for code, r in results if code is not None]
        assert not failures, failures
        created = {r["structuredContent"]["memory"]["id"] for _code, r in results}  # type: ignore[index]
        assert len(created) == 12
        with httpx2.Client(timeout=30) as http:
            for s in servers:
                for mid in created:
                    got = call(http, s.url, new, "memory_get", {"memory_id": mid})
                    assert error_code(got) is None, got
                found = call(http, s.url, new, "memory_search", {"query": "Coherence old", "limit": 20})
                assert error_code(found) is None, found
                subjects = [m["subject"] for m in found["structuredContent"]["memories"]]
                assert not [t for t in subjects if "Coherence old" in t], subjects
    finally:
        for s in servers:
            assert s.stop() == 0, s.log()[-3000:]
    report = _fsck_clean(data)
    assert not report.get("problems"), report
