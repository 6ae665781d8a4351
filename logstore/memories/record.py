"""A long-term memory record: its writable fields, their rules, and the stored record.

Validation happens in :func:`parse_fields`, before anything is written; the
first broken rule raises :class:`InvalidMemory` naming the field, and a field
that looks like a credential raises :class:`.errors.LooksLikeSecret` (see
:mod:`.credentials`). Lengths are
counted in Unicode code points, as JSON Schema's ``maxLength`` counts them.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..timefmt import format_us
from . import credentials, limits
from .errors import InvalidMemory

STATUS_ACTIVE = "active"
STATUS_DELETED = "deleted"

WRITABLE_FIELDS = ("category", "subject", "summary", "details", "tags", "source_uris", "dedupe_key")

# An absolute URI: a scheme, a colon and something after it; no whitespace or control characters.
_ABSOLUTE_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[^\s\x00-\x1f\x7f]+")
_MEMORY_ID = re.compile(r"mem_[0-9A-HJKMNP-TV-Z]{26}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_memory_id(now_us: int | None = None) -> str:
    """``mem_`` + a ULID: 48 bits of milliseconds then 80 random bits, Crockford base32."""
    ms = (now_us if now_us is not None else time.time_ns() // 1000) // 1000
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = [_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5)]
    return "mem_" + "".join(chars)


def is_memory_id(value: object) -> bool:
    """True when ``value`` has the shape of an id this store mints."""
    return isinstance(value, str) and _MEMORY_ID.fullmatch(value) is not None


def check_memory_id(value: object, field: str = "memory_id") -> str:
    if not isinstance(value, str):
        raise InvalidMemory(field, "expected a string")
    if not is_memory_id(value):
        raise InvalidMemory(field, "expected a memory id as returned by the server (mem_ followed by 26 characters)")
    return value


@dataclass(frozen=True, slots=True)
class Fields:
    """The fields a caller writes; every one validated."""

    category: str
    subject: str
    summary: str
    details: str = ""
    tags: tuple[str, ...] = ()
    source_uris: tuple[str, ...] = ()
    dedupe_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "subject": self.subject,
            "summary": self.summary,
            "details": self.details,
            "tags": list(self.tags),
            "source_uris": list(self.source_uris),
            "dedupe_key": self.dedupe_key,
        }


@dataclass(frozen=True, slots=True)
class Memory:
    """One stored memory as the current state holds it (timestamps in microseconds)."""

    memory_id: str
    fields: Fields
    status: str
    created_us: int
    updated_us: int
    last_accessed_us: int
    deleted_us: int | None
    version: int

    @property
    def active(self) -> bool:
        return self.status == STATUS_ACTIVE

    def touched(self, at_us: int) -> Memory:
        return replace(self, last_accessed_us=max(self.last_accessed_us, at_us))

    def to_json(self) -> dict[str, Any]:
        """The record as tools and exports show it."""
        return {
            "id": self.memory_id,
            **self.fields.to_json(),
            "status": self.status,
            "created_at": format_us(self.created_us),
            "updated_at": format_us(self.updated_us),
            "last_accessed_at": format_us(self.last_accessed_us),
            "deleted_at": format_us(self.deleted_us) if self.deleted_us is not None else None,
            "version": self.version,
        }


def _text(raw: Mapping[str, Any], name: str, prefix: str, lo: int, hi: int, default: str | None = None) -> str:
    field = prefix + name
    if name not in raw:
        if default is not None:
            return default
        raise InvalidMemory(field, "this field is required")
    return _bounded(raw[name], field, lo, hi)


def _bounded(value: object, field: str, lo: int, hi: int, *, blank_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidMemory(field, "expected a string")
    if len(value) < lo:
        raise InvalidMemory(field, f"expected at least {lo} character{'s' if lo != 1 else ''}")
    if len(value) > hi:
        raise InvalidMemory(field, f"expected at most {hi} characters, got {len(value)}")
    if lo > 0 and not blank_ok and not value.strip():
        raise InvalidMemory(field, "must not be blank")
    if "\x00" in value:
        raise InvalidMemory(field, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMemory(field, "must be valid Unicode (no lone surrogates)") from None
    return value


def _list(raw: Mapping[str, Any], name: str, prefix: str, most: int, each: int, uri: bool) -> tuple[str, ...]:
    field = prefix + name
    value = raw.get(name, [])
    if value is None:
        value = []
    if not isinstance(value, list):
        raise InvalidMemory(field, "expected a list of strings")
    if len(value) > most:
        raise InvalidMemory(field, f"expected at most {most} entries, got {len(value)}")
    out: list[str] = []
    for i, item in enumerate(value):
        text = _bounded(item, f"{field}[{i}]", 1, each)
        if uri and _ABSOLUTE_URI.fullmatch(text) is None:
            raise InvalidMemory(f"{field}[{i}]", "expected an absolute URI (scheme:rest, no spaces)")
        out.append(text)
    return tuple(out)


def parse_fields(raw: object, prefix: str = "") -> Fields:
    """Validate a caller's writable fields; raises InvalidMemory naming the first bad field."""
    where = prefix.rstrip(".") or "memory"
    if not isinstance(raw, Mapping):
        raise InvalidMemory(where, "expected a JSON object")
    for key in raw:
        if key not in WRITABLE_FIELDS:
            raise InvalidMemory(
                f"{prefix}{key}", f"unknown field; the writable fields are {', '.join(WRITABLE_FIELDS)}"
            )
    category = _text(raw, "category", prefix, 1, limits.CATEGORY_MAX)
    subject = _text(raw, "subject", prefix, 1, limits.SUBJECT_MAX)
    summary = _text(raw, "summary", prefix, 1, limits.SUMMARY_MAX)
    details = _text(raw, "details", prefix, 0, limits.DETAILS_MAX, default="")
    tags = _list(raw, "tags", prefix, limits.TAGS_MAX, limits.TAG_MAX, uri=False)
    uris = _list(raw, "source_uris", prefix, limits.SOURCE_URIS_MAX, limits.SOURCE_URI_MAX, uri=True)
    dedupe = raw.get("dedupe_key")
    if dedupe is not None:
        dedupe = _bounded(dedupe, prefix + "dedupe_key", 1, limits.DEDUPE_KEY_MAX)
    out = Fields(category, subject, summary, details, tags, uris, dedupe)
    credentials.check(_texts(out, prefix))
    return out


def _texts(f: Fields, prefix: str) -> list[tuple[str, str]]:
    """Every text of ``f`` with the name of its field, for the credential check."""
    named = [(prefix + n, getattr(f, n)) for n in ("category", "subject", "summary", "details")]
    named += [(f"{prefix}tags[{i}]", t) for i, t in enumerate(f.tags)]
    named += [(f"{prefix}source_uris[{i}]", u) for i, u in enumerate(f.source_uris)]
    if f.dedupe_key is not None:
        named.append((prefix + "dedupe_key", f.dedupe_key))
    return named


def fields_from_stored(raw: Mapping[str, Any]) -> Fields:
    """Fields as the event log stores them (already validated when written).

    Category and tags are interned: a site's memories share a few of them, and
    a store holds every record of its sites in memory (one string each, not one
    per memory).
    """
    return Fields(
        category=sys.intern(raw["category"]),
        subject=raw["subject"],
        summary=raw["summary"],
        details=raw.get("details", ""),
        tags=tuple(sys.intern(t) for t in raw.get("tags", ())),
        source_uris=tuple(raw.get("source_uris", ())),
        dedupe_key=raw.get("dedupe_key"),
    )
