"""Basic-credential parsing, password hashing and the verified-credential cache."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from convmem.logstore.site_credentials import CredentialFile, PasswordHash
from convmem.mcp_adapter import auth as auth_module
from convmem.mcp_adapter.auth import Authenticator, parse_basic
from convmem.mcp_adapter.errors import ToolFailure

pytestmark = pytest.mark.anyio

SITE, PASSWORD = "cache-site", "cache-password-0123456789"


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_parse_basic_accepts_well_formed_headers() -> None:
    assert parse_basic(header("site-name", "pa:ss word")) == ("site-name", "pa:ss word")
    assert parse_basic("basic " + base64.b64encode(b"a-site-x:pw").decode()) == ("a-site-x", "pw")


@pytest.mark.parametrize(
    ("value", "bearer"),
    [
        (None, False),
        ("", False),
        ("Bearer abc.def", True),
        ("bearer abc", True),
        ("Basic", False),
        ("Basic ***", False),
        ("Basic " + base64.b64encode(b"no-colon").decode(), False),
        ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), False),
        ("Token abc", False),
    ],
)
def test_parse_basic_rejects_everything_else(value: str | None, bearer: bool) -> None:
    with pytest.raises(ToolFailure) as info:
        parse_basic(value)
    assert info.value.code == "Unauthenticated"
    assert "Basic authentication" in info.value.message
    assert ("Bearer tokens are not accepted" in info.value.message) is bearer


def test_password_hash_round_trip() -> None:
    hashed = PasswordHash.create("s3cret-password")
    assert hashed.verify("s3cret-password")
    assert not hashed.verify("s3cret-passwore")
    again = PasswordHash.from_json(hashed.to_json())
    assert again == hashed
    assert PasswordHash.create("s3cret-password").salt != hashed.salt


@pytest.fixture
def creds(tmp_path: Path) -> CredentialFile:
    creds = CredentialFile(tmp_path / "data")
    creds.add(SITE, PASSWORD)
    return creds


class CountingHash:
    """Counts KDF runs while delegating to the real :meth:`PasswordHash.verify`."""

    runs = 0
    real = PasswordHash.verify

    @staticmethod
    def verify(self: PasswordHash, password: str) -> bool:
        CountingHash.runs += 1
        return CountingHash.real(self, password)


async def test_verified_headers_are_cached(creds: CredentialFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module.PasswordHash, "verify", CountingHash.verify)
    CountingHash.runs = 0
    authenticator = Authenticator(creds)
    for _ in range(5):
        assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE
    assert CountingHash.runs == 1
    for _ in range(3):
        with pytest.raises(ToolFailure):
            await authenticator.authenticate(header(SITE, "wrong-password"))
    assert CountingHash.runs == 2  # a rejected header is remembered briefly too
    with pytest.raises(ToolFailure):
        await authenticator.authenticate(header("ghost-site", PASSWORD))
    # An unknown site waits as long as a check takes, but runs no KDF (see test_security_logins).
    assert CountingHash.runs == 2


async def test_cache_expires(creds: CredentialFile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth_module.PasswordHash, "verify", CountingHash.verify)
    CountingHash.runs = 0
    authenticator = Authenticator(creds, ttl=0.0)
    await authenticator.authenticate(header(SITE, PASSWORD))
    await authenticator.authenticate(header(SITE, PASSWORD))
    assert CountingHash.runs == 2


async def test_credential_changes_drop_the_cache(creds: CredentialFile) -> None:
    authenticator = Authenticator(creds)
    assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE
    creds.set_password(SITE, "a-brand-new-password")
    with pytest.raises(ToolFailure):
        await authenticator.authenticate(header(SITE, PASSWORD))
    assert await authenticator.authenticate(header(SITE, "a-brand-new-password")) == SITE
    creds.remove(SITE)
    with pytest.raises(ToolFailure):
        await authenticator.authenticate(header(SITE, "a-brand-new-password"))


async def test_invalid_site_names_are_refused_without_hints(creds: CredentialFile) -> None:
    authenticator = Authenticator(creds)
    with pytest.raises(ToolFailure) as info:
        await authenticator.authenticate(header("bad", PASSWORD))
    assert info.value.code == "Unauthenticated"
    assert "bad" not in info.value.message


async def test_a_damaged_credential_file_lets_nobody_in_and_says_so(creds: CredentialFile) -> None:
    """A logged-in site must not keep its access on hashes read before the file was damaged."""
    authenticator = Authenticator(creds)
    assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE
    creds.path.write_bytes(b'{"version": 1, "sites": {')  # torn by hand: not valid JSON
    with pytest.raises(ToolFailure) as info:
        await authenticator.authenticate(header(SITE, PASSWORD))
    assert info.value.code == "Unavailable"
    assert "credential file is damaged" in info.value.message
    creds.path.unlink()
    creds.add(SITE, PASSWORD)  # restored: the same password works again
    assert await authenticator.authenticate(header(SITE, PASSWORD)) == SITE
