"""The long-term memory store: records, versions, dedupe, soft delete, erasure, retention, limits."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given
from memories_support import OTHER, SITE, create, delete, fields, files_holding, tree_bytes, update

from convmem.logstore.errors import Corrupted
from convmem.logstore.memories import (
    DuplicateMemory,
    InvalidMemory,
    LongTermMemory,
    MemoryStoreFull,
    NotFound,
    VerifyRequired,
    VersionConflict,
    eventlog,
    is_memory_id,
    limits,
)
from convmem.logstore.memories.site import LOG_NAME, memories_dir
from convmem.logstore.memories.state import parse_ts, record_body
from convmem.logstore.timefmt import format_us, now_us, parse_rfc3339


def test_create_get_update_round_trip(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        m = create(store, fields(1))
        assert is_memory_id(m.memory_id) and m.version == 1 and m.status == "active"
        rec = m.to_json()
        for key in ("created_at", "updated_at", "last_accessed_at"):
            assert rec[key].endswith("Z") and len(rec[key]) == 27
            parse_rfc3339(rec[key])
        assert rec["deleted_at"] is None
        m2 = update(store, m.memory_id, fields(1, summary="changed summary"), expected_version=1)
        assert m2.version == 2 and m2.fields.summary == "changed summary"
        assert m2.created_us == m.created_us and m2.updated_us >= m.updated_us
    with memory_stores.open() as store:
        got = store.get(SITE, m.memory_id)
        assert record_body(got) == record_body(m2)
        assert got.last_accessed_us >= m2.updated_us


def test_version_conflict_carries_current_version(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        m = create(store, fields(1))
        update(store, m.memory_id, fields(1, summary="v2"))
        with pytest.raises(VersionConflict) as info:
            update(store, m.memory_id, fields(1, summary="v3"), expected_version=1)
        assert info.value.current == 2 and info.value.details()["current_version"] == 2
        assert store.get(SITE, m.memory_id).fields.summary == "v2"


def test_dedupe_key_unique_among_active(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        a = create(store, fields(1, dedupe_key="units"))
        with pytest.raises(DuplicateMemory) as info:
            create(store, fields(2, dedupe_key="units"))
        assert info.value.existing_id == a.memory_id
        b = create(store, fields(2, dedupe_key="other"))
        with pytest.raises(DuplicateMemory):
            update(store, b.memory_id, fields(2, dedupe_key="units"))
        delete(store, a.memory_id)  # soft-deleted: the key is free again
        c = create(store, fields(3, dedupe_key="units"))
        assert c.fields.dedupe_key == "units"
        assert len(store.all(SITE)) == 3


def test_soft_delete_hides_from_search_and_surface(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        m = create(store, fields(1))
        assert [x.memory_id for x, _ in store.search(SITE, "quokka1")] == [m.memory_id]
        deleted = delete(store, m.memory_id)
        assert deleted is not None and deleted.status == "deleted" and deleted.version == 2
        assert deleted.deleted_us is not None
        assert store.search(SITE, "quokka1") == []
        assert store.surface(SITE, "quokka1") == []
        assert [x.memory_id for x, _ in store.search(SITE, "quokka1", include_deleted=True)] == [m.memory_id]
        assert store.get(SITE, m.memory_id).status == "deleted"
        with pytest.raises(NotFound):
            update(store, m.memory_id, fields(1))


def test_sites_are_isolated(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        m = create(store, fields(1))
        assert store.search(OTHER, "quokka1") == []
        with pytest.raises(NotFound):
            store.get(OTHER, m.memory_id)
        with pytest.raises(NotFound):
            store.verify(OTHER, "delete", None, m.memory_id)
        create(store, fields(1), site=OTHER)  # the same dedupe key in another site is fine
        assert len(store.all(SITE)) == 1 and len(store.all(OTHER)) == 1


def test_surface_returns_at_most_two_and_repeats(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        ids = [
            create(store, fields(i, summary=f"deploys go out from the release branch {i}")).memory_id for i in range(4)
        ]
        first = store.surface(SITE, "how do deploys go out")
        assert 1 <= len(first) <= 2 and all(m.memory_id in ids for m in first)
        again = store.surface(SITE, "how do deploys go out")
        assert [m.memory_id for m in again] == [m.memory_id for m in first]


# ---------------------------------------------------------------- verify tokens


def test_token_rules(memory_stores: Any) -> None:
    clock = [now_us()]
    with memory_stores.open(clock=lambda: clock[0]) as store:
        raw = fields(1)
        _, token, _ = store.verify(SITE, "create", raw)
        with pytest.raises(VerifyRequired):
            store.upsert(SITE, raw, None)  # no token
        with pytest.raises(VerifyRequired):
            store.upsert(SITE, raw, "v1.create.garbage")
        with pytest.raises(VerifyRequired):
            store.upsert(OTHER, raw, token)  # other site
        with pytest.raises(VerifyRequired):
            store.upsert(SITE, fields(1, summary="another candidate"), token)  # other candidate
        m = store.upsert(SITE, raw, token)
        with pytest.raises(VerifyRequired, match="already used"):
            store.upsert(SITE, raw, token)  # reused (checked before the duplicate key)
        # other intent: a delete token cannot update, an update token cannot delete
        _, del_token, _ = store.verify(SITE, "delete", None, m.memory_id)
        with pytest.raises(VerifyRequired):
            store.upsert(SITE, raw, del_token, memory_id=m.memory_id)
        _, upd_token, _ = store.verify(SITE, "update", raw, m.memory_id)
        with pytest.raises(VerifyRequired):
            store.delete(SITE, m.memory_id, upd_token)
        # other memory id
        other = create(store, fields(2))
        with pytest.raises(VerifyRequired):
            store.delete(SITE, other.memory_id, del_token)
        # expired: 10 minutes and one second later
        _, old, _ = store.verify(SITE, "create", fields(3))
        clock[0] += (limits.VERIFY_TOKEN_TTL_SECONDS + 1) * 1_000_000
        with pytest.raises(VerifyRequired, match="expired"):
            store.upsert(SITE, fields(3), old)
        assert len(store.all(SITE)) == 2


def test_token_single_use_survives_restart(memory_stores: Any) -> None:
    with memory_stores.open() as store:
        m = create(store, fields(1))
        _, token, _ = store.verify(SITE, "delete", None, m.memory_id)
        assert store.delete(SITE, m.memory_id, token) is not None
    with memory_stores.open() as store:
        with pytest.raises(VerifyRequired, match="already used"):
            store.delete(SITE, m.memory_id, token)
        assert store.get(SITE, m.memory_id).status == "deleted"


def test_token_from_another_data_directory_is_refused(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path / "a") as a, LongTermMemory(tmp_path / "b") as b:
        _, token, _ = a.verify(SITE, "create", fields(1))
        with pytest.raises(VerifyRequired):
            b.upsert(SITE, fields(1), token)


# ---------------------------------------------------------------- validation


def _bad_values() -> list[tuple[str, dict[str, Any], str]]:
    """(case, fields, the field the error must name)."""
    over: list[tuple[str, dict[str, Any], str]] = [
        ("category too long", fields(1, category="c" * (limits.CATEGORY_MAX + 1)), "memory.category"),
        ("category empty", fields(1, category=""), "memory.category"),
        ("category not a string", fields(1, category=7), "memory.category"),
        ("subject too long", fields(1, subject="s" * (limits.SUBJECT_MAX + 1)), "memory.subject"),
        ("subject blank", fields(1, subject="   "), "memory.subject"),
        ("summary too long", fields(1, summary="s" * (limits.SUMMARY_MAX + 1)), "memory.summary"),
        ("summary missing", {k: v for k, v in fields(1).items() if k != "summary"}, "memory.summary"),
        ("details too long", fields(1, details="d" * (limits.DETAILS_MAX + 1)), "memory.details"),
        ("details not a string", fields(1, details=["x"]), "memory.details"),
        ("too many tags", fields(1, tags=[f"t{i}" for i in range(limits.TAGS_MAX + 1)]), "memory.tags"),
        ("tag too long", fields(1, tags=["ok", "t" * (limits.TAG_MAX + 1)]), "memory.tags[1]"),
        ("tag empty", fields(1, tags=[""]), "memory.tags[0]"),
        ("tag not a string", fields(1, tags=[3]), "memory.tags[0]"),
        ("tags not a list", fields(1, tags="a,b"), "memory.tags"),
        ("too many uris", fields(1, source_uris=[f"https://x/{i}" for i in range(13)]), "memory.source_uris"),
        ("uri too long", fields(1, source_uris=["https://x/" + "a" * 2040]), "memory.source_uris[0]"),
        ("uri relative", fields(1, source_uris=["docs/readme.md"]), "memory.source_uris[0]"),
        ("uri with space", fields(1, source_uris=["https://x/a b"]), "memory.source_uris[0]"),
        ("dedupe too long", fields(1, dedupe_key="k" * (limits.DEDUPE_KEY_MAX + 1)), "memory.dedupe_key"),
        ("dedupe empty", fields(1, dedupe_key=""), "memory.dedupe_key"),
        ("dedupe not a string", fields(1, dedupe_key=5), "memory.dedupe_key"),
        ("unknown field", fields(1, summery="typo"), "memory.summery"),
        ("NUL in subject", fields(1, subject="a\x00b"), "memory.subject"),
        ("lone surrogate", fields(1, summary="a\ud800b"), "memory.summary"),
    ]
    return over


@pytest.mark.parametrize(("case", "raw", "field"), _bad_values(), ids=[c for c, _, _ in _bad_values()])
def test_every_bad_field_is_rejected_by_name_and_nothing_written(
    memory_stores: Any, case: str, raw: dict[str, Any], field: str
) -> None:
    with memory_stores.open() as store:
        existing = create(store, fields(0))
        before = memory_stores.snapshot()
        with pytest.raises(InvalidMemory) as info:
            store.verify(SITE, "create", raw)
        assert info.value.field == field.replace("memory.", "candidate."), case
        with pytest.raises(InvalidMemory) as info:
            store.upsert(SITE, raw, "v1.x")
        assert info.value.field == field, case
        with pytest.raises(InvalidMemory) as info:
            store.upsert(SITE, raw, "v1.x", memory_id=existing.memory_id)
        assert info.value.field == field, case
        assert memory_stores.snapshot() == before


def test_exact_bounds_are_accepted(memory_stores: Any) -> None:
    raw = fields(
        1,
        category="c" * limits.CATEGORY_MAX,
        subject="s" * limits.SUBJECT_MAX,
        summary="u" * limits.SUMMARY_MAX,
        details="d" * limits.DETAILS_MAX,
        tags=["t" * limits.TAG_MAX] * limits.TAGS_MAX,
        source_uris=["https://e/" + "a" * (limits.SOURCE_URI_MAX - 10)] * limits.SOURCE_URIS_MAX,
        dedupe_key="k" * limits.DEDUPE_KEY_MAX,
    )
    with memory_stores.open() as store:
        m = create(store, raw)
        assert m.fields.to_json() == raw


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.verify(SITE, "rename", {"x": 1}), "intent"),
        (lambda s: s.verify(SITE, "create", None), "candidate"),
        (lambda s: s.verify(SITE, "update", fields(1)), "memory_id"),
        (lambda s: s.verify(SITE, "delete", None, "not-an-id"), "memory_id"),
        (lambda s: s.get(SITE, "mem_short"), "memory_id"),
        (lambda s: s.upsert(SITE, fields(1), "t", expected_version=3), "expected_version"),
    ],
)
def test_malformed_call_arguments_name_the_field(memory_stores: Any, call: Any, field: str) -> None:
    with memory_stores.open() as store:
        with pytest.raises(InvalidMemory) as info:
            call(store)
        assert info.value.field == field


# ---------------------------------------------------------------- erasure


def _needles(raw: dict[str, Any]) -> list[bytes]:
    out = []
    for key in ("subject", "summary", "details", "dedupe_key"):
        out.append(raw[key].encode())
    out += [t.encode() for t in raw["tags"] if t != "shared"]
    out += [u.encode() for u in raw["source_uris"]]
    return out


def test_force_delete_erases_every_byte(tmp_path: Path) -> None:
    secret = fields(
        7,
        subject="Aardvark-7f3e subject",
        summary="Summary of the xylophone-91cc fact",
        details="Details: marmalade-5d21 only here",
        tags=["tag-ocelot-33"],
        source_uris=["https://docs.example/private/narwhal-2b"],
        dedupe_key="dedupe-pangolin-88",
    )
    with LongTermMemory(tmp_path) as store:
        keep = [create(store, fields(i)) for i in range(3)]
        victim = create(store, secret)
        update(store, victim.memory_id, dict(secret, summary=secret["summary"] + " (again)"))
        store.search(SITE, "xylophone")  # reads, access times
        store.site(SITE).flush_access()
        assert files_holding(tmp_path, _needles(secret))  # the content is on disk before
        # ... and so are its vectors (one per create/update event): the base64 text, and its first 48 bytes
        # decoded, in case any file held them raw.
        log = os.path.join(memories_dir(str(tmp_path), SITE), LOG_NAME)
        vecs = [e.body["vec"]["f16"] for e in eventlog.salvage(log)[0] if e.memory_id == victim.memory_id]
        assert len(vecs) == 2
        vec_needles = [v.encode() for v in vecs] + [base64.b64decode(v)[:48] for v in vecs]
        assert files_holding(tmp_path, vec_needles)
        assert delete(store, victim.memory_id, force=True) is None
        # No file under the data directory holds any of it, at the moment the call returned.
        assert files_holding(tmp_path, _needles(secret)) == []
        assert files_holding(tmp_path, vec_needles) == []
        with pytest.raises(NotFound):
            store.get(SITE, victim.memory_id)
        found = store.search(SITE, "xylophone marmalade aardvark", include_deleted=True)
        assert victim.memory_id not in [m.memory_id for m, _ in found]
        assert [m.memory_id for m in store.all(SITE)] == [m.memory_id for m in keep]
    with LongTermMemory(tmp_path) as store:  # every other memory survives, with its history
        assert [m.memory_id for m in store.all(SITE)] == [m.memory_id for m in keep]
        events = eventlog.salvage(os.path.join(memories_dir(str(tmp_path), SITE), LOG_NAME))[0]
        assert [e.op for e in events] == ["create"] * 3 + ["erase"]
        assert all("vec" in e.body for e in events[:3])  # the others keep theirs
    assert files_holding(tmp_path, _needles(secret)) == []
    assert files_holding(tmp_path, vec_needles) == []


def test_retention_erases_soft_deleted_after_the_window(memory_stores: Any) -> None:
    clock = [now_us()]
    secret = fields(5, summary="retained-kiwi-4411 summary")
    with memory_stores.open(clock=lambda: clock[0], retention_seconds=3600) as store:
        m = create(store, secret)
        other = create(store, fields(6))
        delete(store, m.memory_id)
        clock[0] += 3599 * 1_000_000
        assert store.purge_expired(SITE) == []
        assert store.get(SITE, m.memory_id).status == "deleted"
        clock[0] += 2 * 1_000_000
        assert store.purge_expired(SITE) == [m.memory_id]
        assert memory_stores.holding([b"retained-kiwi-4411"]) == []
        assert [x.memory_id for x in store.all(SITE)] == [other.memory_id]


def test_retention_runs_before_writes(memory_stores: Any) -> None:
    clock = [now_us()]
    with memory_stores.open(clock=lambda: clock[0], retention_seconds=60) as store:
        m = create(store, fields(1, summary="short-lived-emu-9"))
        delete(store, m.memory_id)
        clock[0] += 61 * 1_000_000
        create(store, fields(2))
        assert memory_stores.holding([b"short-lived-emu-9"]) == []


def test_site_limit(tmp_path: Path) -> None:
    path = os.path.join(memories_dir(str(tmp_path), SITE), LOG_NAME)
    os.makedirs(os.path.dirname(path))
    at = now_us()
    events = []
    with LongTermMemory(tmp_path / "scratch") as scratch:
        template = create(scratch, fields(0, dedupe_key=None))
    # The template's stored vector goes into every event (they share its text), so that opening
    # the full site reads vectors instead of encoding 10,000 texts.
    [made] = eventlog.salvage(os.path.join(memories_dir(str(tmp_path / "scratch"), SITE), LOG_NAME))[0]
    vec = made.body["vec"]
    for i in range(limits.MAX_MEMORIES_PER_SITE):
        body = record_body(template)
        body["id"] = f"mem_{i:026d}"
        events.append((at, {"op": "create", "id": body["id"], "at": at, "record": body, "vec": vec}))
    eventlog.rewrite_file(path, events)
    with LongTermMemory(tmp_path) as store:
        assert len(store.all(SITE)) == limits.MAX_MEMORIES_PER_SITE
        _, token, _ = store.verify(SITE, "create", fields(1))
        before = tree_bytes(tmp_path)
        with pytest.raises(MemoryStoreFull):
            store.upsert(SITE, fields(1), token)
        # A failed create consumed no token and wrote no event. (The site directory, made here as an
        # old version made it, gets its incarnation id from its first writer: FORMAT.md 1.)
        assert {k: v for k, v in tree_bytes(tmp_path).items() if "search" not in k and "site.id" not in k} == {
            k: v for k, v in before.items() if "search" not in k and "site.id" not in k
        }
        delete(store, "mem_" + "0" * 26, force=True)
        assert create(store, fields(1)).version == 1


# ---------------------------------------------------------------- recovery


def test_torn_tail_is_cut_and_damage_reported(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        ms = [create(store, fields(i)) for i in range(3)]
    path = os.path.join(memories_dir(str(tmp_path), SITE), LOG_NAME)
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x01" * 20)  # a write that never completed
    with LongTermMemory(tmp_path) as store:
        assert [m.memory_id for m in store.all(SITE)] == [m.memory_id for m in ms]
        create(store, fields(9))  # a writer cuts the torn tail first
    assert os.path.getsize(path) > size
    events, damaged, torn = eventlog.salvage(path)
    assert len(events) == 4 and damaged == [] and torn is None
    # Flip a byte inside the first record: damage to acknowledged data, reported with its offset.
    data = bytearray(Path(path).read_bytes())
    first = events[0].offset
    data[first + 40] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    with LongTermMemory(tmp_path) as store, pytest.raises(Corrupted) as info:
        store.all(SITE)
    assert info.value.offset == first
    events, damaged, torn = eventlog.salvage(path)
    assert [e.offset for e in events] == [e.offset for e in eventlog.salvage(path)[0]]
    assert len(events) == 3 and damaged[0][0] == first


def test_export_shape_is_json(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        m = create(store, fields(1))
        dumped = json.dumps([x.to_json() for x in store.all(SITE)])
    assert m.memory_id in dumped


def test_retention_runs_on_reads_too(memory_stores: Any) -> None:
    clock = [now_us()]
    with memory_stores.open(clock=lambda: clock[0], retention_seconds=60) as store:
        m = create(store, fields(1, summary="read-only-site-gecko-3"))
        delete(store, m.memory_id)
        clock[0] += 61 * 1_000_000
        assert store.search(SITE, "gecko", include_deleted=True) == []
        assert memory_stores.holding([b"read-only-site-gecko-3"]) == []


def test_stale_rewrite_temp_is_removed_before_the_next_write(tmp_path: Path) -> None:
    with LongTermMemory(tmp_path) as store:
        create(store, fields(1))
    stale = Path(memories_dir(str(tmp_path), SITE)) / f"{LOG_NAME}.rewrite.999999"
    stale.write_bytes(b"left by a crash: stale-content-tapir")
    with LongTermMemory(tmp_path) as store:
        create(store, fields(2))
    assert not stale.exists()


@given(st.integers(min_value=0, max_value=253_402_300_799_999_999))
def test_fast_timestamp_parser_matches_the_engine(us: int) -> None:
    text = format_us(us)
    assert parse_ts(text) == parse_rfc3339(text) == us


def test_reads_update_last_accessed_without_syncing(tmp_path: Path) -> None:
    from convmem.logstore import fileio

    clock = [now_us()]
    with LongTermMemory(tmp_path, clock=lambda: clock[0]) as store:
        m = create(store, fields(1))
        store.search(SITE, "warm up")  # open everything first
        syncs: list[str] = []
        fileio.fault_hook = lambda op: syncs.append(op) if op != "write" else None
        try:
            for _ in range(30):
                clock[0] += 1_000_000
                store.search(SITE, "quokka1")
                store.get(SITE, m.memory_id)
                store.surface(SITE, "zebra1")
        finally:
            fileio.fault_hook = None
        assert syncs == []
        seen = store.get(SITE, m.memory_id).last_accessed_us
        assert seen == clock[0] > m.last_accessed_us
    with LongTermMemory(tmp_path) as store:  # written to the side file on close
        assert store.all(SITE)[0].last_accessed_us == seen


def test_the_sweeper_erases_expired_memories_of_untouched_sites(memory_stores: Any) -> None:
    clock = [now_us()]
    with memory_stores.open(clock=lambda: clock[0], retention_seconds=60) as store:
        m = create(store, fields(1, summary="swept-away-marmot-7"))
        delete(store, m.memory_id)
    clock[0] += 61 * 1_000_000
    # Another process (here: another store object) only runs its sweeper; nobody calls the site.
    with memory_stores.open(clock=lambda: clock[0], retention_seconds=60) as sweeper:
        sweeper.start_sweeper(interval_seconds=0.05)
        deadline = time.monotonic() + 30
        while memory_stores.holding([b"swept-away-marmot-7"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert memory_stores.holding([b"swept-away-marmot-7"]) == []


def test_memory_files_are_owner_only(tmp_path: Path) -> None:
    """Every file the memory store creates is 0600 and every directory 0700 (sites are tenants)."""
    import stat

    from convmem.logstore import fileio

    root = tmp_path / "data"
    with LongTermMemory(root) as store:
        m = create(store, fields(1))
        store.get(SITE, m.memory_id)
        store.site(SITE).flush_access()
        update(store, m.memory_id, fields(2))
        delete(store, m.memory_id, force=True)
    seen = set()
    for dirpath, dirs, names in os.walk(root):
        for name in dirs:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) == fileio.DIR_MODE, name
        for name in names:
            assert stat.S_IMODE(os.stat(os.path.join(dirpath, name)).st_mode) == fileio.FILE_MODE, name
            seen.add(name)
    assert {"memory-token.key", "used-tokens", "lock", "access.json", LOG_NAME} <= seen
