"""Writes that look like credentials are refused with LooksLikeSecret naming the field and the kind.

The samples are shaped like real credentials (made up, none valid); the ordinary texts, which must pass,
hold what memories legitimately carry: commit hashes, UUIDs, checksums, base64 of an image, prose about
passwords and tokens.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from memories_support import SITE, create, fields, tree_bytes

from convmem.logstore.memories import LongTermMemory, LooksLikeSecret
from convmem.logstore.memories.credentials import kind_of

_PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"

SECRETS = [
    (_PEM, "private_key"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ", "private_key"),
    ("deploy user key AKIAIOSFODNN7EXAMPLE for the bucket", "aws_access_key"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_key"),
    ("token ghp_16C7e42F292c6912E7710c838347Ae178B4a for CI", "github_token"),
    ("glpat-xT3vK9qLm2Pz8RwY4nBc for the runner", "gitlab_token"),
    ("slack bot xoxb-2048361942-4823619423-aB3dE5fG7hJ9kL1mN3pQ5rS7", "slack_token"),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe_key"),
    ("anthropic sk-ant-api03-Xk9fQ2mZ7rT4vB8nL1pW6yH3cJ5dG0sA", "anthropic_key"),
    ("maps key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "google_api_key"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
    ("curl -H 'Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee'", "bearer_token"),
    ("postgres://app:S3cr3t-p4ss@db.internal:5432/atlas", "connection_string_password"),
    ("mongodb+srv://admin:hunter22@cluster0.example.net/prod", "connection_string_password"),
    ("password: Tr0ub4dor&3", "password_assignment"),
    ("the staging password is swordfish", "password_assignment"),
    ('api_key="d41d8c-98f00b-204e98"', "password_assignment"),
    ("PASSWD=correcthorse", "password_assignment"),
]

ORDINARY = [
    "Merged in commit 3f786850e387550fdab836ed7e6dc881de23001b on main",
    "short hash a94a8fe5 fixed the flaky test",
    "The request id was 123e4567-e89b-12d3-a456-426614174000",
    "sha256 of the release: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "logo: data:image/png;base64,"
    + base64.b64encode(bytes(range(256)) * 2).decode(),
    "Sam uses 1Password; never suggest storing passwords in browser autofill.",
    "password: kept in the team vault, ask Priya",
    "The API key is rotated monthly by the platform team.",
    "Use a bearer token from the identity service; never hard-code it.",
    "secret: Santa budget is 20 euros",
    "Connection string format is postgres://user:<password>@host/db",
    "the database URL is postgres://app@db.internal/atlas (password from the environment)",
    "password: ${DB_PASSWORD}",
    "Tokens expire after 10 minutes",
    "skip the sk-8 lane markers in the spreadsheet",
]


@pytest.mark.parametrize(("text", "kind"), SECRETS)
def test_each_kind_is_recognised(text: str, kind: str) -> None:
    assert kind_of(text) == kind


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_passes(text: str) -> None:
    assert kind_of(text) is None


@pytest.mark.parametrize(
    ("over", "field", "kind"),
    [
        ({"details": "db: postgres://app:S3cr3t-p4ss@db.internal/atlas"}, "details", "connection_string_password"),
        ({"summary": "CI token ghp_16C7e42F292c6912E7710c838347Ae178B4a"}, "summary", "github_token"),
        ({"tags": ["ok", "AKIAIOSFODNN7EXAMPLE"]}, "tags[1]", "aws_access_key"),
        ({"source_uris": ["https://bob:pa55w0rd!@git.example.org/repo"]}, "source_uris[0]",
         "connection_string_password"),
    ],
)
def test_verify_and_upsert_refuse_and_write_nothing(tmp_path: Path, over: dict[str, object], field: str,
                                                     kind: str) -> None:
    with LongTermMemory(tmp_path) as store:
        create(store, fields(1))
        before = tree_bytes(tmp_path)
        raw = fields(2, **over)
        with pytest.raises(LooksLikeSecret) as info:
            store.verify(SITE, "create", raw)
        assert (info.value.field, info.value.kind) == (f"candidate.{field}", kind)
        assert info.value.details() == {"field": f"candidate.{field}", "kind": kind}
        with pytest.raises(LooksLikeSecret) as info:
            store.upsert(SITE, raw, "v1.create.0.AAAA.AAAA")
        assert (info.value.field, info.value.kind) == (f"memory.{field}", kind)
        assert tree_bytes(tmp_path) == before
        assert [m.summary for m in (x.fields for x in store.all(SITE))] == [fields(1)["summary"]]


def test_ordinary_memory_with_hashes_and_ids_is_stored(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        raw = fields(3, details=" ".join(ORDINARY[:5]), tags=["3f786850e387550fdab836ed7e6dc881de23001b"])
        m = create(store, raw)
        assert m.fields.details == raw["details"]


def test_the_tool_error_names_the_field_and_kind() -> None:
    from convmem.mcp_adapter.errors import from_store_error

    failure = from_store_error(LooksLikeSecret("memory.details", "private_key"))
    assert failure.code == "LooksLikeSecret" and not failure.retryable
    assert failure.details == {"field": "memory.details", "kind": "private_key"}
    assert "memory.details" in failure.message and "private_key" in failure.message
