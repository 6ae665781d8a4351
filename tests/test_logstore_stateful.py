"""The engine against a plain in-memory model: appends, reads, listings, reopen.

Hypothesis drives random sequences of operations (valid and invalid) over a
few sites and conversations, with tiny segments and index intervals so that
rolls and index lookups happen constantly, and checks every answer against
the model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore import (
    EmptyBatch,
    FileStore,
    InvalidConversationId,
    ListSelector,
    MemoryStore,
    Range,
    Tail,
)
from logstore.postgres import PgStore

SITES = ["site-aaaa", "site-bbbb"]
CONVS = ["conv-0000", "conv-0001", "Conv-0001", "c" * 64]
BAD_IDS = ["", "short", "x" * 65, "has space!"]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
payloads = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
batches = st.lists(payloads, min_size=1, max_size=6)


class EngineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="convmem-stateful-")
        self.abandoned: list[MemoryStore] = []
        self.store = self._open()
        # (site, conv) -> list of (payload, recorded_at)
        self.model: dict[tuple[str, str], list[tuple[dict[str, Any], str]]] = {}

    def _open(self) -> MemoryStore:
        return FileStore(self.dir, segment_bytes=700, index_interval=96, lock_timeout=2.0)

    def teardown(self) -> None:
        self.store.close()
        for s in self.abandoned:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        self._drop()

    def _drop(self) -> None:
        """Remove what the backend keeps outside ``self.dir`` (nothing, for the file store)."""

    @rule(site=st.sampled_from(SITES), conv=st.sampled_from(CONVS), batch=batches)
    def append(self, site: str, conv: str, batch: list[dict[str, Any]]) -> None:
        log = self.model.setdefault((site, conv), [])
        rng = self.store.append(site, conv, batch)
        assert (rng.first, rng.last) == (len(log), len(log) + len(batch) - 1)
        stamp = self.store.read(site, conv, Tail(1))[0].recorded_at
        if log:
            assert stamp >= log[-1][1], "recorded_at went backwards"
        log.extend((p, stamp) for p in batch)

    @rule(site=st.sampled_from(SITES), conv=st.sampled_from(CONVS))
    def append_empty(self, site: str, conv: str) -> None:
        try:
            self.store.append(site, conv, [])
        except EmptyBatch:
            return
        raise AssertionError("an empty batch was accepted")

    @rule(bad=st.sampled_from(BAD_IDS), as_site=st.booleans(), batch=batches)
    def append_bad_id(self, bad: str, as_site: bool, batch: list[dict[str, Any]]) -> None:
        site, conv = (bad, CONVS[0]) if as_site else (SITES[0], bad)
        try:
            self.store.append(site, conv, batch)
        except InvalidConversationId:
            return
        raise AssertionError("a malformed id was accepted")

    @rule(site=st.sampled_from(SITES), conv=st.sampled_from(CONVS), count=st.integers(0, 30))
    def read_tail(self, site: str, conv: str, count: int) -> None:
        log = self.model.get((site, conv), [])
        got = self.store.read(site, conv, Tail(count))
        start = max(0, len(log) - count)
        assert [i.seq for i in got] == list(range(start, len(log)))
        assert [(i.payload, i.recorded_at) for i in got] == log[start:]

    @rule(site=st.sampled_from(SITES), conv=st.sampled_from(CONVS), start=st.integers(0, 60), limit=st.integers(0, 30))
    def read_range(self, site: str, conv: str, start: int, limit: int) -> None:
        log = self.model.get((site, conv), [])
        got = self.store.read(site, conv, Range(start, limit))
        want = list(range(start, min(len(log), start + limit)))
        assert [i.seq for i in got] == want
        assert [(i.payload, i.recorded_at) for i in got] == log[start : start + limit]

    @rule(site=st.sampled_from(SITES), limit=st.integers(1, 4))
    def list_all_pages(self, site: str, limit: int) -> None:
        expect = sorted(
            ((log[-1][1], conv, log[0][1]) for (s, conv), log in self.model.items() if s == site and log),
            key=lambda t: (_neg(t[0]), t[1]),
        )
        seen = []
        cursor = None
        for _ in range(50):
            page = self.store.list_conversations(site, ListSelector(cursor, limit))
            assert len(page.summaries) <= limit
            seen.extend((s.last_appended_at, s.conversation_id, s.created_at) for s in page.summaries)
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == expect

    @rule(site=st.sampled_from(SITES))
    def list_zero(self, site: str) -> None:
        page = self.store.list_conversations(site, ListSelector(None, 0))
        assert page.summaries == []

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()

    @precondition(lambda self: len(self.abandoned) < 5)
    @rule()
    def abandon_and_reopen(self) -> None:
        # Another "process" takes over while the old one still has files open.
        self.abandoned.append(self.store)
        self.store = self._open()

    @invariant()
    def store_is_usable(self) -> None:
        assert isinstance(self.store, MemoryStore)


def _neg(stamp: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in stamp)


EngineVsModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestEngineVsModel = EngineVsModel.TestCase


class PostgresVsModel(EngineVsModel):
    """The same machine against :class:`logstore.postgres.PgStore`, one schema per example."""

    def _open(self) -> MemoryStore:
        from tests.pg_support import new_schema, session_dsn

        if not hasattr(self, "pg"):
            dsn = session_dsn()
            if dsn is None:
                pytest.skip("no PostgreSQL server for the tests")
            self.pg = (dsn, new_schema(dsn))
        return PgStore(self.pg[0], schema=self.pg[1], pool_min=1, pool_max=2, lock_timeout=2.0)

    def _drop(self) -> None:
        from tests.pg_support import drop_schema

        drop_schema(*self.pg)


PostgresVsModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("CONVMEM_PG_STATEFUL_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestPostgresVsModel = PostgresVsModel.TestCase
