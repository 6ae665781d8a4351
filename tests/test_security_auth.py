"""Authentication under attack and across credential changes (in process, real scrypt, real files)."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from convmem.logstore.site_credentials import SCRYPT_N, CredentialFile, PasswordHash, _scrypt
from convmem.mcp_adapter import auth as auth_module
from convmem.mcp_adapter.auth import Authenticator
from convmem.mcp_adapter.errors import ToolFailure
from convmem.mcp_adapter.throttle import LoginThrottle, ThrottleSettings

pytestmark = pytest.mark.anyio

SITE = "secure-site"
OTHER = "other-secure-site"
PASSWORD = "correct-horse-battery"
OTHER_PASSWORD = "other-correct-horse-battery"


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def creds(tmp_path: Path) -> CredentialFile:
    creds = CredentialFile(tmp_path / "data")
    creds.add(SITE, PASSWORD)
    creds.add(OTHER, OTHER_PASSWORD)
    return creds


class Counting:
    """Counts KDF runs while delegating to the real :meth:`PasswordHash.verify`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs = 0
        real = PasswordHash.verify

        def verify(hash_: PasswordHash, password: str) -> bool:
            self.runs += 1
            return real(hash_, password)

        monkeypatch.setattr(auth_module.PasswordHash, "verify", verify)


async def test_a_check_running_across_a_password_change_cannot_cache_the_old_answer(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first check verifies the old hash; it finishes only after the change is seen by another request."""
    real = PasswordHash.verify
    entered, release = threading.Event(), threading.Event()
    first = [True]

    def verify(hash_: PasswordHash, password: str) -> bool:
        result = real(hash_, password)
        if first[0]:
            first[0] = False
            entered.set()
            assert release.wait(30)
        return result

    monkeypatch.setattr(auth_module.PasswordHash, "verify", verify)
    authenticator = Authenticator(creds)
    old = header(SITE, PASSWORD)
    async with anyio.create_task_group() as tg:

        async def slow_check() -> None:
            # Started before the change: whatever it answers, it must not poison the cache.
            try:
                await authenticator.authenticate(old, "10.0.0.1")
            except ToolFailure:
                pass

        tg.start_soon(slow_check)
        await anyio.to_thread.run_sync(entered.wait, 30)
        await anyio.to_thread.run_sync(creds.set_password, SITE, "the-new-password-000")
        # Any other request now notices the change (and drops the cache) while the old check still runs.
        assert await authenticator.authenticate(header(OTHER, OTHER_PASSWORD), "10.0.0.2") == OTHER
        release.set()
    for address in ("10.0.0.3", "10.0.0.4"):
        with pytest.raises(ToolFailure) as info:
            await authenticator.authenticate(old, address)
        assert info.value.code == "Unauthenticated"
    assert await authenticator.authenticate(header(SITE, "the-new-password-000"), "10.0.0.5") == SITE


async def test_the_cache_evicts_the_least_recently_used_header(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds.add("third-secure-site", "third-password-000")
    counting = Counting(monkeypatch)
    authenticator = Authenticator(creds, max_entries=2)
    a, b, c = header(SITE, PASSWORD), header(OTHER, OTHER_PASSWORD), header("third-secure-site", "third-password-000")
    await authenticator.authenticate(a)
    await authenticator.authenticate(b)
    await authenticator.authenticate(a)  # a is now the most recently used
    await authenticator.authenticate(c)  # evicts b, not a
    assert counting.runs == 3
    await authenticator.authenticate(a)
    assert counting.runs == 3
    await authenticator.authenticate(b)
    assert counting.runs == 4


async def test_failed_logins_are_throttled_per_address_without_running_the_kdf(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = Counting(monkeypatch)
    throttle = LoginThrottle(ThrottleSettings(address_burst=3, address_rate=0.01, site_burst=100, site_rate=0.01))
    authenticator = Authenticator(creds, throttle=throttle)
    for i in range(3):
        with pytest.raises(ToolFailure) as info:
            await authenticator.authenticate(header(SITE, f"guess-{i}"), "192.0.2.7")
        assert info.value.code == "Unauthenticated"
    assert counting.runs == 3
    for i in range(20):
        with pytest.raises(ToolFailure) as info:
            await authenticator.authenticate(header(OTHER, f"guess-again-{i}"), "192.0.2.7")
        error = info.value.error_object()
        assert error["code"] == "Throttled" and error["retryable"] is True
        assert error["retry_after_seconds"] >= 1
    assert counting.runs == 3  # throttled attempts cost no KDF run
    # Another client, of either site, is not affected.
    assert await authenticator.authenticate(header(OTHER, OTHER_PASSWORD), "192.0.2.8") == OTHER
    assert await authenticator.authenticate(header(SITE, PASSWORD), "192.0.2.9") == SITE


async def test_failed_logins_are_throttled_per_site(creds: CredentialFile, monkeypatch: pytest.MonkeyPatch) -> None:
    counting = Counting(monkeypatch)
    throttle = LoginThrottle(ThrottleSettings(address_burst=100, address_rate=0.01, site_burst=3, site_rate=0.01))
    authenticator = Authenticator(creds, throttle=throttle)
    for i in range(3):
        with pytest.raises(ToolFailure):
            await authenticator.authenticate(header(SITE, f"guess-{i}"), f"198.51.100.{i}")
    with pytest.raises(ToolFailure) as info:
        await authenticator.authenticate(header(SITE, "guess-x"), "198.51.100.50")
    assert info.value.code == "Throttled"
    assert counting.runs == 3
    assert await authenticator.authenticate(header(OTHER, OTHER_PASSWORD), "198.51.100.50") == OTHER


async def test_a_weak_hash_is_upgraded_on_the_next_successful_login(creds: CredentialFile) -> None:
    doc = json.loads(creds.path.read_text())
    salt = b"s" * 16
    weak = PasswordHash(salt=salt, digest=_scrypt(PASSWORD, salt, 2**14, 8, 1), n=2**14)
    doc["sites"][SITE] = {**weak.to_json(), "created_at": "2026-01-01T00:00:00Z"}
    creds.path.write_text(json.dumps(doc))
    assert weak.needs_rehash()
    authenticator = Authenticator(creds)
    assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE
    entry = json.loads(creds.path.read_text())["sites"][SITE]
    assert entry["n"] == SCRYPT_N >= 2**17 and entry["r"] == 8 and entry["p"] == 1
    assert entry["created_at"] == "2026-01-01T00:00:00Z"
    assert creds.verify(SITE, PASSWORD)
    assert not creds.verify(SITE, "wrong-password-0000")


def test_a_rehash_never_undoes_a_password_change(creds: CredentialFile) -> None:
    old = creds.load()[SITE]
    creds.set_password(SITE, "changed-meanwhile-000")
    assert creds.rehash(SITE, PASSWORD, old) is False
    assert creds.verify(SITE, "changed-meanwhile-000")
    assert not creds.verify(SITE, PASSWORD)


def test_new_hashes_use_owasp_scrypt_settings(creds: CredentialFile) -> None:
    entry = creds.load()[SITE]
    assert (entry.n, entry.r, entry.p) == (2**17, 8, 1)
    assert not entry.needs_rehash()


def test_a_stdio_login_upgrades_a_weak_hash_too(creds: CredentialFile) -> None:
    doc = json.loads(creds.path.read_text())
    salt = b"t" * 16
    doc["sites"][SITE] = PasswordHash(salt=salt, digest=_scrypt(PASSWORD, salt, 2**14, 8, 1), n=2**14).to_json()
    creds.path.write_text(json.dumps(doc))
    assert not creds.login(SITE, "wrong-password-0000")
    assert creds.load()[SITE].n == 2**14
    assert creds.login(SITE, PASSWORD)
    assert creds.load()[SITE].n == SCRYPT_N


async def test_concurrent_checks_of_one_header_share_one_kdf_run(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = Counting(monkeypatch)
    authenticator = Authenticator(creds)
    results: list[str] = []

    async def login() -> None:
        results.append(await authenticator.authenticate(header(SITE, PASSWORD), "203.0.113.1"))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(login)
    assert results == [SITE] * 8
    assert counting.runs == 1
