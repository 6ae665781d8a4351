"""Refusing credentials: a memory field that looks like a secret is rejected before anything is written.

Long-term memories are shown to agents again and again (search, auto-surface,
export); a credential must never become one. :func:`check` looks at every
text field of a write and raises :class:`.errors.LooksLikeSecret` naming the
field and the kind of credential found.

The patterns are precise on purpose: each matches the documented shape of
one kind of credential (a PEM private key block, an AWS access key id, a
GitHub token, ...) or an explicit assignment (``password: ...``,
``Authorization: Bearer ...``, ``scheme://user:password@host``). There is no
generic "high entropy" rule: commit hashes, UUIDs, checksums and base64 of
images are ordinary memory content and pass. One pass of a few regular
expressions over at most ~3 KB of text: microseconds per write.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .errors import LooksLikeSecret

#: (kind, pattern): the first match names the kind. Kinds are stable, documented identifiers.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx)) for kind, rx in (
        ("private_key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
        ("aws_access_key", r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"),
        ("aws_secret_key", r"(?i)aws_?secret(?:_?access)?_?key[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}\b"),
        ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
        ("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
        ("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
        ("slack_webhook", r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+"),
        ("stripe_key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"),
        ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
        ("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}"
                       r"|\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}"),
        ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}\b"),
        ("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
        ("pypi_token", r"\bpypi-AgE[A-Za-z0-9_-]{50,}"),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
        ("bearer_token", r"(?i)\b(?:bearer|token)\s+[A-Za-z0-9._~+/-]{20,}=*"),
        ("basic_auth", r"(?i)\bauthorization\s*:\s*basic\s+[A-Za-z0-9+/]{8,}=*"),
    )
)

# scheme://user:password@host — the password part, judged by _real_value.
_URL_CREDENTIALS = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:(?P<v>[^\s@/]+)@[^\s/]+")
# password: x / api_key = "x" — an assignment; the value is judged by _real_value.
_ASSIGNMENT = re.compile(
    r"(?i)\b(?P<k>password|passwd|pwd|passphrase|secret|client[_-]?secret|api[_-]?key|access[_-]?key|"
    r"secret[_-]?key|access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key)"
    r"[\"']?\s*(?:[:=]|=>|\bis\b)\s*(?P<v>\"[^\"\n]+\"|'[^'\n]+'|[^\s,;]+)(?P<rest>[^\n]*)"
)
_PLACEHOLDER = re.compile(
    r"(?i)^(?:<[^>]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{[^}]*\}\}|%\(?\w*\)?s|\*+|x+|\.+|redacted|hidden|"
    r"none|null|nil|empty|unset|changeme|example|placeholder|secret|password|your[_-]?\w*|env(?:\[[^\]]*\])?|"
    r"os\.environ\S*|process\.env\S*|getenv\S*|vault\S*|1password|bitwarden|keychain|keepass\w*)$"
)


def _real_value(value: str, rest: str) -> bool:
    """True when ``value`` (after an assignment) is a literal secret, not prose or a placeholder.

    Prose goes on after the first word ("password: kept in 1Password"); a
    literal value mixes letters with digits or symbols, or is a word of six
    letters or more that ends its clause ("password: swordfish").
    """
    quoted = value[:1] in "\"'" and value[-1:] == value[:1] and len(value) > 1
    v = value.strip("\"'`").rstrip(".!?:")
    if len(v) < 4 or _PLACEHOLDER.match(v):
        return False
    ends_clause = not rest.strip() or rest.lstrip()[:1] in ",;)." or quoted
    mixed = bool(re.search(r"[A-Za-z]", v)) and bool(re.search(r"[^A-Za-z]", v))
    if mixed or not v.isalpha():
        return len(v) >= 6 or ends_clause
    return ends_clause and len(v) >= 6


def kind_of(text: str) -> str | None:
    """The kind of credential ``text`` appears to hold, or None."""
    for kind, rx in _PATTERNS:
        if rx.search(text):
            return kind
    for m in _URL_CREDENTIALS.finditer(text):
        if _real_value(m.group("v"), ""):
            return "connection_string_password"
    for m in _ASSIGNMENT.finditer(text):
        if _real_value(m.group("v"), m.group("rest")):
            return "password_assignment"
    return None


def check(named: Iterable[tuple[str, str]]) -> None:
    """Raise LooksLikeSecret for the first ``(field, text)`` whose text looks like a credential."""
    for field, text in named:
        kind = kind_of(text)
        if kind is not None:
            raise LooksLikeSecret(field, kind)
