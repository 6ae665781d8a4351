"""The append path's write-and-sync (``fileio.pwrite_synced``): one call where it can, two where a test watches.

Unwatched, a record goes to disk in one ``pwritev(..., RWF_DSYNC)``; with a
recorder, a fault hook or a crash point the seam makes the two calls it always
made (``write`` then ``sync``, the crash points between them in order), so the
power-cut and fault suites see the same operations. Either way the bytes land
where they were asked to, and the observer counts one ``fdatasync``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convmem.logstore import FileStore, Range, fileio, observe
from convmem.logstore.preallocation import wait_for_extensions

REPO = Path(__file__).resolve().parent.parent


def _open(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, bytes(size), 0)
    os.fsync(fd)
    return fd


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6000), st.binary(min_size=1, max_size=3000)), min_size=1, max_size=8))
def test_bytes_land_where_asked(tmp_path_factory: Any, writes: list[tuple[int, bytes]]) -> None:
    """Each write lands at its offset, over zeros or past the end, as a model byte array says."""
    path = tmp_path_factory.mktemp("synced") / "f"
    fd = _open(path, 4096)
    model = bytearray(4096)
    try:
        for offset, data in writes:
            fileio.pwrite_synced(fd, data, offset)
            if offset + len(data) > len(model):
                model.extend(bytes(offset + len(data) - len(model)))
            model[offset : offset + len(data)] = data
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(model)


def test_one_call_unwatched(tmp_path: Path) -> None:
    """No hook, recorder or crash point: ``pwritev`` with ``RWF_DSYNC`` (on Linux), and no separate sync."""
    assert sys.platform != "linux" or fileio._RWF_DSYNC is not None
    calls: list[str] = []
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync

    def pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        calls.append(f"pwritev flags={flags}")
        return real_pwritev(fd, buffers, offset, flags)

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real_fdatasync(fd)

    fd = _open(tmp_path / "f", 4096)
    os.pwritev, os.fdatasync = pwritev, fdatasync  # type: ignore[assignment]
    try:
        fileio.pwrite_synced(fd, b"record", 100)
    finally:
        os.pwritev, os.fdatasync = real_pwritev, real_fdatasync  # type: ignore[assignment]
        os.close(fd)
    if fileio._RWF_DSYNC is None:
        assert calls == ["fdatasync"]
    else:
        assert calls == [f"pwritev flags={fileio._RWF_DSYNC}"]
    assert (tmp_path / "f").read_bytes()[100:106] == b"record"


def test_recorder_sees_write_then_sync(tmp_path: Path) -> None:
    """With a recorder (the power-cut suites), the seam reports the write and then the sync, as before."""
    ops: list[tuple[Any, ...]] = []
    fd = _open(tmp_path / "f", 4096)
    fileio.recorder = lambda *op: ops.append(op)
    try:
        fileio.pwrite_synced(fd, b"abc", 10)
    finally:
        fileio.recorder = None
        os.close(fd)
    assert ops == [("write", fd, 10, b"abc"), ("sync", fd)]


def test_fault_hook_still_fails_the_sync(tmp_path: Path) -> None:
    """A fault hook failing ``fdatasync`` fails the call after the write (the fault suites' case)."""
    seen: list[str] = []

    def hook(op: str) -> None:
        seen.append(op)
        if op == "fdatasync":
            raise OSError(5, "injected")

    fd = _open(tmp_path / "f", 4096)
    fileio.fault_hook = hook
    try:
        try:
            fileio.pwrite_synced(fd, b"abc", 10)
        except OSError as exc:
            assert exc.errno == 5
        else:
            raise AssertionError("the injected sync failure was not raised")
    finally:
        fileio.fault_hook = None
        os.close(fd)
    assert seen == ["write", "fdatasync"]


def _observed_syncs(root: Path, two_calls: bool) -> int:
    """``fdatasync`` events on the calling thread over 5 appends to an open conversation (background jobs apart)."""
    events: list[str] = []
    me = threading.get_ident()
    store = FileStore(str(root))
    try:
        store.append("site-synced", "conversation-1", [{"n": 0}])
        wait_for_extensions()
        if two_calls:
            fileio.fault_hook = lambda op: None  # a watched seam: the two calls
        observe.set_observer(
            lambda event, value: events.append(event) if event == "fdatasync" and threading.get_ident() == me else None
        )
        try:
            for i in range(1, 6):
                store.append("site-synced", "conversation-1", [{"n": i}])
        finally:
            observe.set_observer(None)
            fileio.fault_hook = None
        assert [i.payload["n"] for i in store.read("site-synced", "conversation-1", Range(0, 10))] == list(range(6))
    finally:
        store.close()
    return len(events)


def test_observer_counts_the_same_syncs(tmp_path: Path) -> None:
    """The metrics count an append's fused write-and-sync as the one ``fdatasync`` the two calls made."""
    fused = _observed_syncs(tmp_path / "fused", False)
    assert fused == _observed_syncs(tmp_path / "two", True)
    assert fused >= 5


_CHILD = r"""
import sys
from convmem.logstore import FileStore
store = FileStore(sys.argv[1])
store.append("site-synced", "conversation-1", [{"n": 0}])
store.append("site-synced", "conversation-1", [{"n": 1}])
print("acknowledged", flush=True)
"""


def test_crash_between_write_and_sync_loses_only_the_unacknowledged(tmp_path: Path) -> None:
    """A crash point between the write and the sync (``before-data-sync``) is still reached on the append path."""
    seed = random.SystemRandom().randrange(1, 3)
    print(f"crash at the append number {seed}")
    root = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(REPO), CONVMEM_CRASH_AT=f"before-data-sync:{seed}")
    child = subprocess.run([sys.executable, "-c", _CHILD, str(root)], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == fileio.CRASH_EXIT_STATUS, child.stderr
    assert "acknowledged" not in child.stdout
    store = FileStore(str(root))
    try:
        got = [i.payload["n"] for i in store.read("site-synced", "conversation-1", Range(0, 10))]
    finally:
        store.close()
    assert got in ([], [0]) if seed == 1 else got in ([0], [0, 1])


def test_a_file_system_refusing_the_flag_gets_the_two_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pwritev`` refusing ``RWF_DSYNC`` (``EOPNOTSUPP``, before writing anything): the record is written and
    synced the two-call way, and every later call goes that way at once."""
    import errno

    if fileio._RWF_DSYNC is None:
        pytest.skip("the platform never takes the one-call way")
    monkeypatch.setattr(fileio, "_RWF_DSYNC", fileio._RWF_DSYNC)  # put back afterwards
    calls: list[str] = []
    real_fdatasync = os.fdatasync

    def refuse(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        calls.append("pwritev")
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "pwritev", refuse)
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd))[1])
    fd = _open(tmp_path / "f", 4096)
    try:
        fileio.pwrite_synced(fd, b"first", 100)
        fileio.pwrite_synced(fd, b"second", 200)
    finally:
        os.close(fd)
    assert calls == ["pwritev", "fdatasync", "fdatasync"]
    data = (tmp_path / "f").read_bytes()
    assert data[100:105] == b"first" and data[200:206] == b"second"


def test_other_write_errors_are_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error of the one call is the append's error (it is never retried the other way)."""
    import errno

    if fileio._RWF_DSYNC is None:
        pytest.skip("the platform never takes the one-call way")

    def fail(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "pwritev", fail)
    fd = _open(tmp_path / "f", 4096)
    try:
        with pytest.raises(OSError) as err:
            fileio.pwrite_synced(fd, b"record", 100)
    finally:
        os.close(fd)
    assert err.value.errno == errno.EIO and fileio._RWF_DSYNC is not None
