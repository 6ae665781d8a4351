"""The current state of a site's memories, rebuilt by applying events in log order."""

from __future__ import annotations

from typing import Any

from logstore.timefmt import format_us, parse_rfc3339

from .record import STATUS_ACTIVE, STATUS_DELETED, Memory, fields_from_stored


def record_body(m: Memory) -> dict[str, Any]:
    """What a create/update event stores: the whole record except last_accessed_at."""
    out = m.to_json()
    del out["last_accessed_at"]
    return out


def memory_from_body(body: dict[str, Any], last_accessed_us: int = 0) -> Memory:
    deleted = body.get("deleted_at")
    updated = parse_rfc3339(body["updated_at"])
    return Memory(
        memory_id=body["id"],
        fields=fields_from_stored(body),
        status=body["status"],
        created_us=parse_rfc3339(body["created_at"]),
        updated_us=updated,
        last_accessed_us=max(last_accessed_us, updated),
        deleted_us=parse_rfc3339(deleted) if deleted is not None else None,
        version=int(body["version"]),
    )


def apply(state: dict[str, Memory], body: dict[str, Any]) -> str:
    """Apply one event to ``state``; returns the id it touched."""
    op = body["op"]
    mid = str(body["id"])
    if op in ("create", "update"):
        prev = state.get(mid)
        state[mid] = memory_from_body(body["record"], prev.last_accessed_us if prev is not None else 0)
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
