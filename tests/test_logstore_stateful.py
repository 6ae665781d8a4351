"""The engine against a plain in-memory model: appends, reads, listings, reopen, kills.

Hypothesis drives random sequences of operations (valid and invalid) over a
few sites and conversations, with tiny segments and index intervals so that
rolls and index lookups happen constantly, and checks every answer against
the model. Payloads are compared type-exactly, as the JSON bytes they
encode to (``true`` is not ``1``, ``1.0`` is not ``1``, ``-0.0`` is not
``0.0``). Writers in child processes are killed with SIGKILL, one right
after an acknowledged append and in the middle of the next one, whose batch
must then be there whole or not at all.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import hypothesis.strategies as st
import msgspec
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from convmem.logstore import (
    EmptyBatch,
    FileStore,
    InvalidConversationId,
    ListSelector,
    MemoryStore,
    Range,
    Tail,
)
from convmem.logstore.postgres import PgStore

SITES = ["site-aaaa", "site-bbbb"]
CONVS = ["conv-0000", "conv-0001", "Conv-0001", "c" * 64]
BAD_IDS = ["", "short", "x" * 65, "has space!"]
#: Site names may be 1-64 characters: "short" is a valid one.
BAD_SITE_NAMES = ["", "x" * 65, "has space!"]

json_scalars = (
    st.none()
    | st.sampled_from([True, False, 1, 0, 1.0, 0.0, -0.0, -1, -1.0])
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


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A writer child: appends batch A, says so, then appends batch B and waits to be killed.
WRITER = """
import sys, time, msgspec
from convmem.logstore import FileStore
root, site, conv = sys.argv[1:4]
a, b = msgspec.json.decode(sys.stdin.buffer.read())
s = FileStore(root, segment_bytes=700, index_interval=96, lock_timeout=2.0)
r = s.append(site, conv, a)
sys.stdout.write(f"{r.first}\\n")
sys.stdout.flush()
s.append(site, conv, b)
sys.stdout.write("b\\n")
sys.stdout.flush()
time.sleep(60)
"""


def exact(payloads: list[Any]) -> bytes:
    """The payloads as JSON bytes: equal only when every value has the same JSON type and spelling."""
    return msgspec.json.encode(payloads)


class EngineVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="convmem-stateful-")
        self.abandoned: list[MemoryStore] = []
        self.kills = 0
        self.kill_budget = 0  # child processes are slow to start: EngineVsModelWithKills allows them
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
        as_site = as_site and bad in BAD_SITE_NAMES
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
        assert [i.recorded_at for i in got] == [t for _p, t in log[start:]]
        assert exact([i.payload for i in got]) == exact([p for p, _t in log[start:]])

    @rule(site=st.sampled_from(SITES), conv=st.sampled_from(CONVS), start=st.integers(0, 60), limit=st.integers(0, 30))
    def read_range(self, site: str, conv: str, start: int, limit: int) -> None:
        log = self.model.get((site, conv), [])
        got = self.store.read(site, conv, Range(start, limit))
        want = list(range(start, min(len(log), start + limit)))
        assert [i.seq for i in got] == want
        assert [i.recorded_at for i in got] == [t for _p, t in log[start : start + limit]]
        assert exact([i.payload for i in got]) == exact([p for p, _t in log[start : start + limit]])

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

    @precondition(lambda self: self.kills < self.kill_budget)
    @rule(
        site=st.sampled_from(SITES),
        conv=st.sampled_from(CONVS),
        a=batches,
        b=batches,
        delay=st.sampled_from([0.0, 0.0005, 0.002, 0.01]),
    )
    def kill_writer(self, site: str, conv: str, a: list[dict[str, Any]], b: list[dict[str, Any]], delay: float) -> None:
        """Another process appends A (acknowledged), starts on B, and is killed with SIGKILL."""
        self.kills += 1
        log = self.model.setdefault((site, conv), [])
        env = dict(os.environ, PYTHONPATH=REPO)
        env.pop("CONVMEM_CRASH_AT", None)
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, self.dir, site, conv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(exact([a, b]))
            child.stdin.close()
            line = child.stdout.readline()
            assert line.strip().isdigit(), child.stderr.read() if child.stderr else line
            assert int(line) == len(log), "the child's append got the wrong seqs"
            time.sleep(delay)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            for f in (child.stdout, child.stderr):
                if f is not None:
                    f.close()
        got = self.store.read(site, conv, Range(len(log), 1000))
        assert len(got) in (len(a), len(a) + len(b)), f"{len(got)} items after the kill: a partial batch is visible"
        assert exact([i.payload for i in got[: len(a)]]) == exact(a)
        log.extend((p, got[0].recorded_at) for p in a)
        if len(got) > len(a):
            assert exact([i.payload for i in got[len(a) :]]) == exact(b)
            log.extend((p, got[len(a)].recorded_at) for p in b)
        if len(log) > len(got):
            assert got[0].recorded_at >= log[-len(got) - 1][1], "recorded_at went backwards"

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


class EngineVsModelWithKills(EngineVsModel):
    """The same model, with writers in child processes killed by SIGKILL (a few per example)."""

    def __init__(self) -> None:
        super().__init__()
        self.kill_budget = 3


EngineVsModelWithKills.TestCase.settings = settings(
    max_examples=int(os.environ.get("CONVMEM_STATEFUL_KILL_EXAMPLES", "25")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestEngineVsModelWithKills = EngineVsModelWithKills.TestCase


class PostgresVsModel(EngineVsModel):
    """The same machine against :class:`logstore.postgres.PgStore`, one schema per example."""

    def _open(self) -> MemoryStore:
        from tests.node_support import cannot_run
        from tests.pg_support import missing_reason, new_schema, session_dsn

        if not hasattr(self, "pg"):
            dsn = session_dsn()
            if dsn is None:
                cannot_run(missing_reason())
            self.pg = (dsn, new_schema(dsn))
        return PgStore(self.pg[0], schema=self.pg[1], pool_min=1, pool_max=2, lock_timeout=2.0)

    def _drop(self) -> None:
        from tests.pg_support import drop_schema

        drop_schema(*self.pg)


PostgresVsModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("CONVMEM_PG_STATEFUL_EXAMPLES", "30")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestPostgresVsModel = PostgresVsModel.TestCase
