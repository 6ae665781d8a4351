"""What other local users and links in the data directory can reach; what OS errors tell a client."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from convmem.logstore import Io, ListSelector, StoreError, Tail, Unavailable, open_store
from convmem.logstore.layout import conversation_dir, site_dir
from convmem.logstore.maintenance import check_access
from convmem.mcp_adapter.errors import from_store_error

SITE_A = "tenant-aaaa"
SITE_B = "tenant-bbbb"
REPO = Path(__file__).resolve().parent.parent


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_the_engine_creates_private_directories_and_files(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask: the engine must not rely on the caller's
    try:
        data = tmp_path / "data"
        with open_store(data, segment_bytes=4096) as store:
            for i in range(30):
                store.append(SITE_A, "private-conv-01", [{"i": i, "pad": "x" * 300}])
            store.append(SITE_B, "private-conv-02", [{"b": 1}])
            store.list_conversations(SITE_A, ListSelector(limit=10))
    finally:
        os.umask(old)
    modes = _modes(data)
    assert len(modes) > 10
    loose = {p: oct(m) for p, m in modes.items() if m & 0o077}
    assert loose == {}, loose
    assert check_access(str(data)) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVMEM_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", "import sys; from convmem.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_fsck_warns_about_loose_permissions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE_A, "loose-conv-0001", [{"a": 1}])
    clean = _cli("fsck", str(data))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "WARNING" not in clean.stdout
    os.chmod(data, 0o755)
    seg = next(p for p in data.rglob("*.seg"))
    os.chmod(seg, 0o644)
    warned = _cli("fsck", "--json", str(data))
    assert warned.returncode == 0, warned.stdout + warned.stderr  # a warning, not damage
    access = json.loads(warned.stdout)["access"]
    assert {a["path"] for a in access} == {".", os.path.relpath(seg, data)}
    assert all(a["kind"] == "LOOSE_PERMISSIONS" for a in access)
    text = _cli("fsck", str(data))
    assert "WARNING" in text.stdout and "0755" in text.stdout and "chmod" in text.stdout


def test_a_site_linked_to_another_site_is_refused_and_reported(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE_A, "secret-conv-001", [{"secret": "of tenant A"}])
        store.append(SITE_B, "b-conv-0000001", [{"b": 1}])
    victim, thief = site_dir(str(data), SITE_A), site_dir(str(data), SITE_B)
    shutil.rmtree(thief)
    os.symlink(victim, thief)
    with open_store(data) as store:
        with pytest.raises(Unavailable) as info:
            store.read(SITE_B, "secret-conv-001", Tail(10))
        assert "symbolic link" in str(info.value)
        assert str(data) not in str(info.value)
        with pytest.raises(Unavailable):
            store.append(SITE_B, "secret-conv-001", [{"planted": 1}])
        with pytest.raises(Unavailable):
            store.list_conversations(SITE_B, ListSelector(limit=10))
        assert [i.payload for i in store.read(SITE_A, "secret-conv-001", Tail(10))] == [{"secret": "of tenant A"}]
    findings = check_access(str(data))
    assert [(f.kind, f.path) for f in findings] == [("SYMLINK", os.path.relpath(thief, data))]
    out = _cli("fsck", str(data))
    assert out.returncode == 4 and "SYMLINK" in out.stdout, out.stdout + out.stderr


def test_a_linked_segment_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE_A, "secret-conv-001", [{"secret": 1}])
        store.append(SITE_B, "b-conv-0000001", [{"b": 1}])
    a_dir = Path(conversation_dir(str(data), SITE_A, "secret-conv-001"))
    b_dir = Path(conversation_dir(str(data), SITE_B, "b-conv-0000001"))
    seg = next(b_dir.glob("*.seg"))
    seg.unlink()
    os.symlink(next(a_dir.glob("*.seg")), seg)
    with open_store(data) as store, pytest.raises(Unavailable):
        store.read(SITE_B, "b-conv-0000001", Tail(10))


def test_os_errors_reach_the_client_without_absolute_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with open_store(data) as store:
        store.append(SITE_A, "broken-conv-001", [{"a": 1}])
    conv = Path(conversation_dir(str(data), SITE_A, "broken-conv-001"))
    seg = next(conv.glob("*.seg"))
    seg.unlink()
    seg.mkdir()  # the segment's name now holds a directory: opening it fails with EISDIR
    with open_store(data) as store:
        with pytest.raises(StoreError) as info:
            store.append(SITE_A, "broken-conv-001", [{"a": 2}])
    exc = info.value
    assert isinstance(exc, (Io, Unavailable)), exc
    failure = from_store_error(exc, str(data))
    text = failure.text() + json.dumps(failure.error_object())
    assert str(tmp_path) not in text, text
    assert str(tmp_path) in str(exc)  # the OS error named the file with its absolute path...
    assert os.path.relpath(seg, data) in text, text  # ...which the client sees relative to the data directory
