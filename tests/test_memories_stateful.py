"""Hypothesis stateful test: the memory store against a plain model.

Rules create, update (with a right or wrong expected_version), soft delete,
erase, reopen, and "kill": the store is abandoned without closing (as a
killed process leaves it) and a torn, half-written record is left at the end
of the log. After every step the store must hold exactly what the model
holds, and an erased memory's unique marker must be in no file.

The same machine runs against PostgreSQL (``PgMemoriesVsModel``): there
"reopen" and "kill" open a new server on the same schema (a killed server
leaves no torn write behind: its transaction rolled back), and an erased
marker must be in no row of the memory tables.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from memories_support import SITE, files_holding

from convmem.logstore.memories import DuplicateMemory, LongTermMemory, NotFound, VersionConflict
from convmem.logstore.memories.site import LOG_NAME, memories_dir

KEYS = [None, "k-a", "k-b", "k-c"]
texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30).filter(
    lambda s: bool(s.strip())
)


class MemoriesVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="convmem-mem-stateful-")
        self.abandoned: list[Any] = []
        self.store = self._open()
        self.model: dict[str, dict[str, Any]] = {}  # id -> {"fields", "status", "version", "marker"}
        self.erased_markers: list[bytes] = []
        self.counter = 0

    def _open(self) -> Any:
        return LongTermMemory(self.dir, lock_timeout=2.0)

    def _holding(self, needles: list[bytes]) -> list[Any]:
        return files_holding(self.dir, needles)

    def teardown(self) -> None:
        self.store.close()
        for s in self.abandoned:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _fields(self, summary: str, key: str | None, tags: list[str]) -> tuple[dict[str, Any], str]:
        self.counter += 1
        marker = f"marker{self.counter:05d}q"
        return {
            "category": "fact",
            "subject": f"subject {marker}",
            "summary": summary,
            "tags": tags,
            "dedupe_key": key,
        }, marker

    def _active_key_owner(self, key: str | None, but: str | None = None) -> str | None:
        if key is None:
            return None
        for mid, m in self.model.items():
            if mid != but and m["status"] == "active" and m["fields"]["dedupe_key"] == key:
                return mid
        return None

    @rule(summary=texts, key=st.sampled_from(KEYS), tags=st.lists(st.sampled_from(["x", "y", "z"]), max_size=2))
    def create(self, summary: str, key: str | None, tags: list[str]) -> None:
        raw, marker = self._fields(summary, key, tags)
        _, token, _ = self.store.verify(SITE, "create", raw)
        owner = self._active_key_owner(key)
        try:
            m = self.store.upsert(SITE, raw, token)
        except DuplicateMemory as exc:
            assert exc.existing_id == owner
            return
        assert owner is None
        self.model[m.memory_id] = {"fields": raw, "status": "active", "version": 1, "marker": marker}

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), summary=texts, key=st.sampled_from(KEYS), right_version=st.booleans())
    def update(self, data: st.DataObject, summary: str, key: str | None, right_version: bool) -> None:
        mid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[mid]
        raw = dict(m["fields"], summary=summary, dedupe_key=key)
        if m["status"] != "active":
            try:
                self.store.verify(SITE, "update", raw, mid)
                raise AssertionError("updating a soft-deleted memory must fail")
            except NotFound:
                return
        _, token, _ = self.store.verify(SITE, "update", raw, mid)
        expected = m["version"] if right_version else m["version"] + 1
        owner = self._active_key_owner(key, but=mid)
        try:
            got = self.store.upsert(SITE, raw, token, memory_id=mid, expected_version=expected)
        except VersionConflict as exc:
            assert not right_version and exc.current == m["version"]
            return
        except DuplicateMemory as exc:
            assert right_version and exc.existing_id == owner
            return
        assert right_version and owner is None and got.version == m["version"] + 1
        m["fields"], m["version"] = raw, got.version

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def soft_delete(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.model)))
        m = self.model[mid]
        _, token, _ = self.store.verify(SITE, "delete", None, mid)
        got = self.store.delete(SITE, mid, token)
        assert got is not None and got.status == "deleted"
        if m["status"] == "active":
            m["status"], m["version"] = "deleted", m["version"] + 1
        assert got.version == m["version"]

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def erase(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.model)))
        _, token, _ = self.store.verify(SITE, "delete", None, mid, force=True)
        assert self.store.delete(SITE, mid, token, force=True) is None
        self.erased_markers.append(self.model.pop(mid)["marker"].encode())
        assert self._holding(self.erased_markers) == []

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()

    @rule(torn=st.binary(min_size=1, max_size=60))
    def kill_and_reopen(self, torn: bytes) -> None:
        # The old "process" is gone without closing anything; it left half a record behind.
        self.abandoned.append(self.store)
        self._tear(torn)
        self.store = self._open()

    def _tear(self, torn: bytes) -> None:
        path = os.path.join(memories_dir(self.dir, SITE), LOG_NAME)
        if os.path.exists(path):
            with open(path, "ab") as f:
                f.write(torn)

    @invariant()
    def store_matches_model(self) -> None:
        got = {m.memory_id: m for m in self.store.all(SITE)}
        assert set(got) == set(self.model)
        for mid, want in self.model.items():
            m = got[mid]
            assert (m.status, m.version) == (want["status"], want["version"])
            stored = m.fields.to_json()
            assert {k: stored[k] for k in want["fields"]} == want["fields"]

    @invariant()
    def search_never_returns_erased_or_deleted(self) -> None:
        active = {mid for mid, m in self.model.items() if m["status"] == "active"}
        for m, _ in self.store.search(SITE, "subject marker", limit=20):
            assert m.memory_id in active


MemoriesVsModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("CONVMEM_MEMORY_EXAMPLES", "40")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestMemoriesVsModel = MemoriesVsModel.TestCase


class PgMemoriesVsModel(MemoriesVsModel):
    """The same rules against PostgreSQL: every store is another server on one schema."""

    def __init__(self) -> None:
        from memories_support import MemoryStores

        from tests import node_support, pg_support

        dsn = pg_support.session_dsn()
        if dsn is None:
            node_support.cannot_run(pg_support.missing_reason())
        self.tmp = Path(tempfile.mkdtemp(prefix="convmem-mem-stateful-pg-"))
        self.stores = MemoryStores("postgres", self.tmp, dsn)
        super().__init__()

    def _open(self) -> Any:
        return self.stores.open(lock_timeout=2.0)

    def _holding(self, needles: list[bytes]) -> list[Any]:
        return list(self.stores.holding(needles))

    def _tear(self, torn: bytes) -> None:
        pass  # an unfinished transaction of a killed server is rolled back: nothing of it remains

    def teardown(self) -> None:
        self.stores.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)  # the directory made for the PostgreSQL stores


PgMemoriesVsModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("CONVMEM_MEMORY_PG_EXAMPLES", "6")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestPgMemoriesVsModel = PgMemoriesVsModel.TestCase
