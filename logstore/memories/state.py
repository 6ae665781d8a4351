"""The current state of a site's memories, rebuilt by applying events in log order."""

from __future__ import annotations

import calendar
import sys
from typing import Any

from ..timefmt import format_us, parse_rfc3339
from .record import STATUS_ACTIVE, STATUS_DELETED, Memory, fields_from_stored


def record_body(m: Memory) -> dict[str, Any]:
    """What a create/update event stores: the whole record except last_accessed_at."""
    out = m.to_json()
    del out["last_accessed_at"]
    return out


_seconds: dict[str, int] = {}


def parse_ts(text: str) -> int:
    """``parse_rfc3339`` for our own ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` text, without strptime (hot on open)."""
    if len(text) == 27 and text[19] == "." and text[26] == "Z" and text[20:26].isdigit():
        head = text[:19]
        secs = _seconds.get(head)
        if secs is None:
            if not (head[:4] + head[5:7] + head[8:10] + head[11:13] + head[14:16] + head[17:19]).isdigit():
                return parse_rfc3339(text)
            secs = calendar.timegm(
                (int(head[:4]), int(head[5:7]), int(head[8:10]), int(head[11:13]), int(head[14:16]), int(head[17:19]))
            )
            if len(_seconds) > 65536:
                _seconds.clear()
            _seconds[head] = secs
        return secs * 1_000_000 + int(text[20:26])
    return parse_rfc3339(text)


def memory_from_body(body: dict[str, Any], last_accessed_us: int = 0, event_id: str | None = None) -> Memory:
    """The record ``body``; ``event_id``, its event's id, is the one string kept for both when they are equal
    (a store holds every record in memory: one copy of each id rather than two)."""
    deleted = body.get("deleted_at")
    updated = parse_ts(body["updated_at"])
    rid = body["id"]
    return Memory(
        memory_id=event_id if event_id is not None and event_id == rid else rid,
        fields=fields_from_stored(body),
        status=sys.intern(body["status"]),
        created_us=parse_ts(body["created_at"]),
        updated_us=updated,
        last_accessed_us=max(last_accessed_us, updated),
        deleted_us=parse_ts(deleted) if deleted is not None else None,
        version=int(body["version"]),
    )


def apply(state: dict[str, Memory], body: dict[str, Any]) -> str:
    """Apply one event to ``state``; returns the id it touched."""
    op = body["op"]
    mid = str(body["id"])
    if op in ("create", "update"):
        prev = state.get(mid)
        state[mid] = memory_from_body(body["record"], prev.last_accessed_us if prev is not None else 0, mid)
    elif op == "delete":
        prev = state.get(mid)
        if prev is not None:
            at = int(body["at"])
            state[mid] = Memory(
                prev.memory_id,
                prev.fields,
                STATUS_DELETED,
                prev.created_us,
                at,
                max(prev.last_accessed_us, at),
                at,
                int(body["version"]),
            )
    elif op == "erase":
        state.pop(mid, None)
    return mid


def is_active(m: Memory) -> bool:
    return m.status == STATUS_ACTIVE


__all__ = ["apply", "format_us", "is_active", "memory_from_body", "record_body"]
