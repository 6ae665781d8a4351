"""Per-site quotas: bytes on disk, files and conversations, enforced on append, shown by ``stats``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx2
import pytest
from mcp_helpers import ServerProcess, basic, run_convmem

from convmem.logstore import (
    ListSelector,
    QuotaExceeded,
    SiteQuota,
    Tail,
    convpool,
    layout,
    open_store,
    quota,
    site_usage,
)
from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.errors import from_store_error

SITE = "quota-site-01"
OTHER = "quota-site-02"


def test_the_byte_quota_refuses_the_append_that_would_pass_it_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    limit = 300 * 1024  # room for the site pool's ready entries (convpool.TARGET of quota.POOL_ENTRY_BYTES) and more
    with open_store(data, quota=SiteQuota(max_bytes=limit)) as store:
        acked = 0
        with pytest.raises(QuotaExceeded) as info:
            for i in range(1000):
                store.append(SITE, "quota-conv-0001", [{"i": i, "pad": "p" * 900}])
                acked += 1
        # What the disk holds counts: records, the space preallocated for them, the site's other files.
        assert 20 < acked < 250, acked
        before = store.read(SITE, "quota-conv-0001", Tail(1000))
        assert len(before) == acked
        # Other sites have their own allowance.
        store.append(OTHER, "quota-conv-0001", [{"x": 1}])
    exc = info.value
    assert exc.retryable is False and exc.code == "QuotaExceeded"
    assert exc.details() == {"limit": limit, "actual": exc.actual, "unit": "bytes"} and exc.actual > limit
    failure = from_store_error(exc, str(data))
    assert failure.code == "QuotaExceeded" and failure.retryable is False
    assert "quota" in failure.text() and "retrying will not help" in failure.text()
    usage = site_usage(str(data), SITE)
    assert usage.bytes <= limit * 1.1 + (convpool.TARGET + 1) * 4096 and usage.conversations == 1
    # A fresh process finds the site's account on disk: the quota still holds. Closing the store gave
    # the conversation's unused zeros back (logstore.zerofill.trim): only that room takes more batches.
    room = max(0, limit - usage.bytes)
    with open_store(data, quota=SiteQuota(max_bytes=limit)) as store:
        more = 0
        with pytest.raises(QuotaExceeded):
            for i in range(1000):
                store.append(SITE, "quota-conv-0001", [{"i": i, "pad": "p" * 900}])
                more += 1
        assert more <= 2 + room // 900
        assert len(store.read(SITE, "quota-conv-0001", Tail(1000))) == acked + more
    # (Plus a block for each ready pool entry's lock file, a sector of zeros in entries older
    # engines built, and for pool/settled: FORMAT.md 6.)
    assert site_usage(str(data), SITE).bytes <= limit * 1.1 + (convpool.TARGET + 1) * 4096


def test_the_conversation_quota_counts_conversations_exactly_under_concurrency(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data, quota=SiteQuota(max_conversations=5)) as store:
        outcomes: list[str] = []
        lock = threading.Lock()

        def create(i: int) -> None:
            try:
                store.append(SITE, f"conv-{i:010d}", [{"i": i}])
                result = "ok"
            except QuotaExceeded:
                result = "quota"
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count("ok") == 5, outcomes
        listed = store.list_conversations(SITE, ListSelector(limit=100)).summaries
        assert len(listed) == 5
        # Existing conversations keep taking appends.
        for s in listed:
            store.append(SITE, str(s.conversation_id), [{"more": 1}])
        store.drop_site(SITE)  # a dropped site starts from nothing
        store.append(SITE, "conv-after-drop", [{"a": 1}])
    assert site_usage(str(data), SITE).conversations == 1


def test_a_site_is_measured_once_per_process_not_on_every_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[str] = []
    real = quota.site_usage

    def counting(root: str, site: str) -> quota.Usage:
        measured.append(site)
        return real(root, site)

    monkeypatch.setattr(quota, "site_usage", counting)
    with open_store(tmp_path / "data", quota=SiteQuota(max_bytes=10**9, max_conversations=10**6)) as store:
        for i in range(200):
            store.append(SITE, f"conv-{i % 7:010d}", [{"i": i}])
    assert measured == [SITE]


def test_the_server_answers_quota_exceeded_and_stats_shows_the_usage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, "quota-password-0123")
    server = ServerProcess(data, "--quota-conversations", "2", "--quota-bytes", "1M")
    try:
        with httpx2.Client(timeout=30) as http:

            def append(cid: str) -> dict[str, object]:
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": [{"a": 1}]}},
                }
                r = http.post(
                    server.url,
                    content=json.dumps(body),
                    headers={
                        "Authorization": basic(SITE, "quota-password-0123"),
                        "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream",
                    },
                )
                result: dict[str, object] = r.json()["result"]
                return result

            assert not append("quota-conv-aaaa").get("isError")
            assert not append("quota-conv-bbbb").get("isError")
            refused = append("quota-conv-cccc")
            assert refused["isError"] is True
            error = refused["_meta"]["convmem/error"]  # type: ignore[index]
            assert error["code"] == "QuotaExceeded" and error["retryable"] is False
            assert error["unit"] == "conversations" and error["limit"] == 2 and error["actual"] == 3
            assert not append("quota-conv-aaaa").get("isError")
    finally:
        assert server.stop() == 0
    shown = run_convmem("stats", str(data), "--quota-conversations", "2", "--quota-bytes", "1M")
    assert shown.returncode == 0, shown.stderr
    assert "2 conversations of 2 (100.0%)" in shown.stdout and "of 1.0 MiB" in shown.stdout, shown.stdout
    as_json = json.loads(run_convmem("stats", "--json", str(data)).stdout)
    assert as_json[0]["quota_usage"]["conversations"] == 2
    assert as_json[0]["quota_usage"]["bytes"] == site_usage(str(data), SITE).bytes > 0


def test_a_pool_entry_being_built_is_counted_once(tmp_path: Path) -> None:
    """A walk while the pool is being refilled counts an entry under construction by what it holds, not twice."""
    data = tmp_path / "data"
    pool = Path(layout.pool_dir(layout.site_dir(str(data), SITE)))

    def ready() -> list[Path]:
        names = sorted(pool.iterdir()) if pool.is_dir() else []
        return [p for p in names if p.name.startswith(layout.POOL_READY_PREFIX)]

    with open_store(data) as store:
        store.append(SITE, "quota-conv-0001", [{"x": 1}])
        for _ in range(200):  # the pool is filled in the background
            if len(ready()) >= convpool.TARGET:
                break
            time.sleep(0.05)
    entries = ready()
    assert len(entries) >= convpool.TARGET, sorted(pool.iterdir())
    full = quota.accountable_usage(str(data), SITE)
    # One ready entry becomes one being built (as a refill's entry is before its rename): the walk still
    # sees its bytes, and the estimate of the missing entries must not add it again.
    entries[0].rename(pool / (layout.POOL_BUILDING_PREFIX + entries[0].name[len(layout.POOL_READY_PREFIX):]))
    assert quota.accountable_usage(str(data), SITE) == full
