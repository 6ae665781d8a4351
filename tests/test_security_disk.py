"""Storage-side attacks, each driven against a running server or the real CLI as the attack did.

Covered here: a delete token binds ``force``; ``site remove`` covers a site's
memories; the memory store follows no symbolic link; ``serve`` refuses a
linked or loosely-moded data directory; quotas count what the disk holds.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from disk_support import ToolCaller, memory_fields, tree
from mcp_helpers import ServerProcess, convmem_cmd, run_convmem, subprocess_env
from memories_support import create, files_holding

from convmem.logstore import SiteQuota, open_store, site_usage
from convmem.logstore.layout import site_dir
from convmem.logstore.memories import LongTermMemory
from convmem.logstore.memories.access import ACCESS_FILE
from convmem.logstore.memories.site import LOG_NAME, memories_dir
from convmem.logstore.memories.tokens import SECRET_FILE, USED_FILE
from convmem.logstore.quota import ACCOUNT_FILE, DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES
from convmem.logstore.site_credentials import CredentialFile

SITE, PASSWORD = "disk-site-0001", "disk-password-0123456789"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    CredentialFile(data).add(SITE, PASSWORD)
    return data


@pytest.fixture
def served(data_dir: Path) -> Iterator[ToolCaller]:
    server = ServerProcess(data_dir)
    caller = ToolCaller(server.url, SITE, PASSWORD)
    try:
        yield caller
    finally:
        caller.close()
        assert server.stop() == 0, server.log()


def _create(caller: ToolCaller, subject: str, summary: str) -> str:
    fields = memory_fields(subject, summary)
    token = caller.ok("memory_verify", {"intent": "create", "candidate": fields})["verify_token"]
    memory_id: str = caller.ok("memory_upsert", {"memory": fields, "verify_token": token})["memory"]["id"]
    return memory_id


# ------------------------------------------------------------------ the delete token binds force


def test_a_token_asked_for_a_soft_delete_cannot_erase(served: ToolCaller) -> None:
    mid = _create(served, "Parking spot", "The user parks on level 3, spot 41")
    soft = served.ok("memory_verify", {"intent": "delete", "memory_id": mid})["verify_token"]
    refused = served.error("memory_delete", {"memory_id": mid, "verify_token": soft, "force": True})
    assert refused["code"] == "VerifyRequired" and refused["reason"] == "other-force", refused
    # Nothing happened: the memory is still active, and the token still does what it was asked for.
    assert served.ok("memory_get", {"memory_id": mid})["memory"]["status"] == "active"
    done = served.ok("memory_delete", {"memory_id": mid, "verify_token": soft})
    assert done["status"] == "deleted"
    # An erasure needs a token asked with force: true; that one cannot merely soft-delete.
    erase = served.ok("memory_verify", {"intent": "delete", "memory_id": mid, "force": True})["verify_token"]
    assert served.error("memory_delete", {"memory_id": mid, "verify_token": erase})["reason"] == "other-force"
    assert served.ok("memory_delete", {"memory_id": mid, "verify_token": erase, "force": True})["status"] == "erased"


def test_force_is_only_for_a_delete_token(served: ToolCaller) -> None:
    fields = memory_fields("Coffee", "Black, no sugar")
    refused = served.error("memory_verify", {"intent": "create", "candidate": fields, "force": True})
    assert refused["code"] == "InvalidArguments" and refused["field"] == "force", refused


# ------------------------------------------------------------------ site remove covers memories


def test_site_remove_covers_a_site_holding_only_memories(data_dir: Path) -> None:
    server = ServerProcess(data_dir)
    caller = ToolCaller(server.url, SITE, PASSWORD)
    try:
        _create(caller, "Door code", "remove-me-marker-quokka 4711")
        kept = run_convmem("site", "remove", SITE, "--data-dir", str(data_dir))
        assert kept.returncode != 0
        assert "1 long-term memories" in kept.stderr and "--force" in kept.stderr, kept.stderr
        assert SITE in CredentialFile(data_dir).sites()  # refused: nothing changed
        assert caller.ok("memory_search", {"query": "door code"})["memories"]
        gone = run_convmem("site", "remove", SITE, "--data-dir", str(data_dir), "--force", "--grace", "0")
        assert gone.returncode == 0, gone.stderr
    finally:
        caller.close()
        assert server.stop() == 0, server.log()
    assert SITE not in CredentialFile(data_dir).sites()
    assert not os.path.exists(memories_dir(str(data_dir), SITE))
    assert files_holding(data_dir, [b"remove-me-marker-quokka"]) == []


# ------------------------------------------------------------------ serve refuses an unsafe data directory


def _serve_refused(data: Path) -> str:
    """Run ``convmem serve`` on ``data``; it must exit at once with status 2. Its stderr."""
    proc = subprocess.run(
        convmem_cmd("serve", "--data-dir", str(data), "--host", "127.0.0.1", "--port", "0"),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "MCP endpoint" not in proc.stdout
    return proc.stderr


def test_serve_refuses_a_data_directory_that_is_a_symbolic_link(data_dir: Path, tmp_path: Path) -> None:
    link = tmp_path / "linked-data"
    link.symlink_to(data_dir)
    why = _serve_refused(link)
    assert "symbolic link" in why and "realpath" in why and str(data_dir) in why, why


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_serve_refuses_a_data_directory_writable_by_group_or_others(data_dir: Path, mode: int) -> None:
    os.chmod(data_dir, mode)
    why = _serve_refused(data_dir)
    assert f"{mode:04o}" in why and f"chmod 700 {data_dir}" in why, why
    if mode == 0o777:
        os.chmod(data_dir, 0o755)  # readable is only fsck's warning: the files below are 0600
        server = ServerProcess(data_dir)
        assert server.stop() == 0, server.log()


# ------------------------------------------------------------------ the memory store follows no link


def test_a_planted_token_key_link_never_becomes_the_secret(data_dir: Path, tmp_path: Path) -> None:
    attacker_key = tmp_path / "attacker.key"
    attacker_key.write_bytes(b"k" * 32)  # a secret the attacker knows: tokens could be forged with it
    (data_dir / SECRET_FILE).symlink_to(attacker_key)
    server = ServerProcess(data_dir)
    caller = ToolCaller(server.url, SITE, PASSWORD)
    try:
        fields = memory_fields("Wifi", "The guest network password is on the fridge")
        refused = caller.error("memory_verify", {"intent": "create", "candidate": fields})
        assert refused["code"] == "Unavailable", refused
        text = caller.call("memory_verify", {"intent": "create", "candidate": fields})["content"][0]["text"]
        assert "memory-token.key" in text and "symbolic link" in text, text
        assert str(tmp_path) not in text
        # The operator removes the link: the store makes its own secret, never the planted one.
        (data_dir / SECRET_FILE).unlink()
        _create(caller, "Wifi", "The guest network password is on the fridge")
    finally:
        caller.close()
        assert server.stop() == 0, server.log()
    secret = data_dir / SECRET_FILE
    assert not secret.is_symlink() and secret.read_bytes() != attacker_key.read_bytes()
    assert attacker_key.read_bytes() == b"k" * 32


def test_memory_text_is_never_written_through_a_linked_memories_directory(data_dir: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    site_path = Path(site_dir(str(data_dir), SITE))
    site_path.mkdir(parents=True, mode=0o700)
    (site_path / "memories").symlink_to(outside)
    server = ServerProcess(data_dir)
    caller = ToolCaller(server.url, SITE, PASSWORD)
    try:
        fields = memory_fields("Safe combination", "linked-dir-marker-okapi 12-34-56")
        refused = caller.error("memory_verify", {"intent": "create", "candidate": fields})
        assert refused["code"] == "Unavailable", refused
        assert caller.error("memory_search", {"query": "safe combination"})["code"] == "Unavailable"
    finally:
        caller.close()
        assert server.stop() == 0, server.log()
    assert list(outside.iterdir()) == []
    assert files_holding(tmp_path, [b"linked-dir-marker-okapi"]) == []


@pytest.mark.parametrize("name", [USED_FILE, ACCESS_FILE, LOG_NAME])
def test_a_file_of_the_memory_store_replaced_by_a_link_is_refused(data_dir: Path, tmp_path: Path, name: str) -> None:
    server = ServerProcess(data_dir)
    caller = ToolCaller(server.url, SITE, PASSWORD)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "target-file"
    try:
        first = _create(caller, "Bike lock", "The code is 2468")
        assert caller.ok("memory_get", {"memory_id": first})["memory"]["subject"] == "Bike lock"
        directory = Path(memories_dir(str(data_dir), SITE))
        planted = directory / name
        target.write_bytes(planted.read_bytes() if planted.exists() else b"")
        before = target.read_bytes()
        planted.unlink(missing_ok=True)
        planted.symlink_to(target)
        fields = memory_fields("Locker", "planted-file-marker-tapir 97")
        token = caller.call("memory_verify", {"intent": "create", "candidate": fields})
        if not token.get("isError"):
            args = {"memory": fields, "verify_token": token["structuredContent"]["verify_token"]}
            if name == ACCESS_FILE:  # access times are a hint: the link is replaced, never followed
                caller.ok("memory_upsert", args)
            else:
                assert caller.error("memory_upsert", args)["code"] == "Unavailable"
        assert target.read_bytes() == before
    finally:
        caller.close()
        assert server.stop() == 0, server.log()
    assert target.read_bytes() == before
    assert files_holding(outside, [b"planted-file-marker-tapir"]) == []


# ------------------------------------------------------------------ quotas count what the disk holds


def _append(caller: ToolCaller, conversation_id: str) -> dict[str, Any]:
    return caller.call("append_memory", {"conversation_id": conversation_id, "items": [{"n": conversation_id}]})


def _settled_tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """The tree under ``root`` once background work (pool fills, extend-ahead) has stopped changing it."""
    last = tree(root)
    for _ in range(100):
        time.sleep(0.2)
        now = tree(root)
        if now == last:
            return now
        last = now
    raise AssertionError("the data directory never settled")


def _fill_with_one_item_conversations(caller: ToolCaller, prefix: str, most: int) -> tuple[int, dict[str, Any]]:
    """Create one-item conversations until one is refused (as the attack did): how many, and the refusal."""
    for i in range(most):
        result = _append(caller, f"{prefix}-{i:08d}")
        if result.get("isError"):
            error: dict[str, Any] = result["_meta"]["convmem/error"]
            return i, error
    raise AssertionError(f"{most} one-item conversations were all admitted")


def test_a_byte_quota_counts_what_the_disk_holds(data_dir: Path) -> None:
    limit = 300 * 1024
    site_path = Path(site_dir(str(data_dir), SITE))
    first = ServerProcess(data_dir, "--quota-bytes", "300K")
    second = ServerProcess(data_dir, "--quota-bytes", "300K")  # a second process on the same directory
    a, b = ToolCaller(first.url, SITE, PASSWORD), ToolCaller(second.url, SITE, PASSWORD)
    try:
        admitted, refusal = _fill_with_one_item_conversations(a, "one-item", 3000)
        assert refusal["code"] == "QuotaExceeded" and refusal["unit"] == "bytes" and refusal["limit"] == limit
        assert 2 <= admitted <= 20, admitted  # the run admitted 2,068
        # The second process's first use of the site settles its pool claims once (logstore.poolclaims,
        # which may write pool/settled): let it happen before the snapshot, with a read.
        b.ok("recall_memory", {"conversation_id": "one-item-00000000"})
        settled = _settled_tree(data_dir)
        usage = site_usage(str(data_dir), SITE)
        assert usage.conversations == admitted and usage.bytes <= limit * 1.1, usage
        # The other process shares the account: it refuses too, and a refused write changes nothing on disk.
        assert b.error("append_memory", {"conversation_id": "other-proc-0001", "items": [{"x": 1}]})["unit"] == "bytes"
        assert a.error("append_memory", {"conversation_id": "same-proc-0001", "items": [{"x": 1}]})["unit"] == "bytes"
        time.sleep(1)
        assert _settled_tree(data_dir) == settled
    finally:
        a.close()
        b.close()
        assert first.stop() == 0, first.log()
        assert second.stop() == 0, second.log()
    # After a restart the account is still there: refused again at once, or after the few conversations
    # that fit the zeros the closed ones gave back (a pool entry's first segment is cut back to its data
    # at close), never after the thousands a forgotten account would admit.
    again = ServerProcess(data_dir, "--quota-bytes", "300K")
    c = ToolCaller(again.url, SITE, PASSWORD)
    try:
        more, refusal = _fill_with_one_item_conversations(c, "after-restart", 50)
        assert refusal["code"] == "QuotaExceeded" and refusal["unit"] == "bytes", refusal
        assert more <= 3, more
    finally:
        c.close()
        assert again.stop() == 0, again.log()
    usage = site_usage(str(data_dir), SITE)
    assert usage.conversations == admitted + more and usage.bytes <= limit * 1.1, usage
    assert (site_path / ACCOUNT_FILE).exists()


def test_a_file_quota_counts_files_and_directories(data_dir: Path) -> None:
    server = ServerProcess(data_dir, "--quota-files", "60")
    caller = ToolCaller(server.url, SITE, PASSWORD)
    try:
        admitted, refusal = _fill_with_one_item_conversations(caller, "few-files", 100)
        assert refusal["code"] == "QuotaExceeded" and refusal["unit"] == "files" and refusal["limit"] == 60
        assert 2 <= admitted <= 12, admitted
        _settled_tree(data_dir)
    finally:
        caller.close()
        assert server.stop() == 0, server.log()
    assert site_usage(str(data_dir), SITE).files <= 60


def test_every_site_has_a_default_quota_that_an_operator_can_raise_or_lift(data_dir: Path) -> None:
    with open_store(data_dir) as store:
        store.append(SITE, "default-quota-01", [{"a": 1}])
    shown = run_convmem("stats", str(data_dir))
    assert shown.returncode == 0, shown.stderr
    assert f"of {DEFAULT_MAX_FILES}" in shown.stdout and "of 10.0 GiB" in shown.stdout, shown.stdout
    lifted = run_convmem("stats", str(data_dir), "--quota-bytes", "0", "--quota-files", "0")
    assert "quota usage (no quota set)" in lifted.stdout, lifted.stdout
    assert SiteQuota.from_options(None, None, None) == SiteQuota(DEFAULT_MAX_BYTES, None, DEFAULT_MAX_FILES)
    assert SiteQuota.from_options(0, 0, 0) == SiteQuota()
    assert SiteQuota.from_options(1 << 40, None, 5).max_bytes == 1 << 40


def test_site_add_refuses_a_name_whose_old_memories_are_still_on_disk(data_dir: Path) -> None:
    with LongTermMemory(data_dir) as store:
        create(store, memory_fields("Old tenant", "old-owner-marker-gecko"), site=SITE)
    CredentialFile(data_dir).remove(SITE)  # a removal that revoked the password and was interrupted
    refused = run_convmem("site", "add", SITE, "--data-dir", str(data_dir), "--password-stdin", input=PASSWORD + "\n")
    assert refused.returncode != 0 and "--purge-data" in refused.stderr, refused.stderr
    assert SITE not in CredentialFile(data_dir).sites()
    assert files_holding(data_dir, [b"old-owner-marker-gecko"]) != []
    purged = run_convmem(
        "site", "add", SITE, "--data-dir", str(data_dir), "--password-stdin", "--purge-data", input=PASSWORD + "\n"
    )
    assert purged.returncode == 0, purged.stderr
    assert files_holding(data_dir, [b"old-owner-marker-gecko"]) == []
