"""The installed wheel, not the checkout: every ``convmem`` command and an MCP session run from it.

The wheel is built from a copy of the checkout (nothing is rewritten at build
time, so its files are the files the rest of the suite imports) and installed,
with a small distribution that ships its own top-level ``tools`` package, into
a fresh virtual environment outside the checkout with ``--no-deps
--no-index``. The dependencies (mcp, uvicorn, psycopg, ...) are not
reinstalled: the fresh environment reaches the test environment's
site-packages through a plain path entry placed after its own, which does not
run that directory's ``.pth`` files, so the checkout (installed there in
editable mode) stays invisible; the import probe checks it. Set
``CONVMEM_FULL_WHEEL_TEST=1`` to install the real dependencies from the
package index instead (slower; uses pip's cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from convmem.cli import build_parser
from tests.mcp_helpers import ServerProcess, basic, connect
from tests.pg_support import drop_schema, new_schema

REPO = Path(__file__).resolve().parent.parent
#: Build a wheel with the test environment's setuptools: nothing is downloaded.
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
SITE, PASSWORD = "wheel-site", "wheel-password-0123456789"
CONV = "conv-from-the-wheel"


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def _other_tools_wheel(tmp_path: Path, out: Path) -> None:
    src = tmp_path / "othertools"
    (src / "tools").mkdir(parents=True)
    (src / "tools" / "__init__.py").write_text('OWNER = "othertools"\n')
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "othertools"
            version = "1.0"
            [tool.setuptools]
            packages = ["tools"]
            """
        )
    )
    _run([*PIP_WHEEL, "-w", str(out), str(src)])


@dataclass
class Installed:
    """A fresh virtual environment holding the built wheel."""

    wheel: Path
    venv: Path
    work: Path
    env: dict[str, str]

    @property
    def convmem(self) -> str:
        return str(self.venv / "bin" / "convmem")

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return _run([self.convmem, *args], input=stdin, cwd=self.work, env=self.env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheels = tmp_path / "wheels"
    src = tmp_path / "src"  # a copy: a build leaves build/ behind, and stale files there would enter the wheel
    src.mkdir()
    for name in ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for name in ("convmem", "logstore", "mcp_adapter", "tools"):
        # symlinks=True: convmem/logstore etc. stay links to the copied top-level directories, as in the checkout.
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    _run([*PIP_WHEEL, "-w", str(wheels), str(src)])
    _other_tools_wheel(tmp_path, wheels)
    (ours,) = wheels.glob("convmem-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet"]
    if os.environ.get("CONVMEM_FULL_WHEEL_TEST") == "1":
        _run([*install, str(ours), *map(str, wheels.glob("othertools-*.whl"))])
    else:
        _run([*install, "--no-deps", "--no-index", *map(str, wheels.glob("*.whl"))])
        site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
        # Last on sys.path, and not a site dir: the test env's .pth files (the editable checkout) are not run.
        (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    work = tmp_path / "cwd"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CONVMEM_"))}
    yield Installed(ours, venv, work, env)


def test_wheel_installs_only_convmem_beside_another_tools(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
    dist_info = "-".join(installed.wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"convmem", dist_info}
    # The wheel holds the checkout's own bytes: no file was rewritten on the way in.
    with zipfile.ZipFile(installed.wheel) as z:
        for name in ("convmem/logstore/filestore.py", "convmem/mcp_adapter/serve.py", "convmem/tools/fsck.py"):
            top = name.split("/")[1]
            assert z.read(name) == (REPO / top / name.split("/", 2)[2]).read_bytes(), name
    assert "convmem/logstore/FORMAT.md" in names and "convmem/logstore/py.typed" in names
    probe = textwrap.dedent(
        """\
        import importlib.util, tools, convmem.logstore, convmem.mcp_adapter, convmem.tools
        print(tools.OWNER)
        for name in ("logstore", "mcp_adapter", "bench"):
            print(name, importlib.util.find_spec(name))
        print(convmem.logstore.__file__)
        """
    )
    py = str(installed.venv / "bin" / "python")
    out = _run([py, "-c", probe], cwd=installed.work, env=installed.env).stdout.splitlines()
    assert out[0] == "othertools"
    assert out[1:4] == ["logstore None", "mcp_adapter None", "bench None"]
    assert out[4].startswith(str(installed.venv))


def _commands() -> set[str]:
    _parser, sub = build_parser()
    return set(sub.choices)


def _ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return dict(result.structured_content)


async def _mcp_session(url: str) -> None:
    async with connect(url, basic(SITE, PASSWORD)) as client:
        batch = {"conversation_id": CONV, "items": [{"n": 1}, {"n": 2}]}
        appended = _ok(await client.call_tool("append_memory", batch))
        assert (appended["first_seq"], appended["last_seq"]) == (0, 1)
        recalled = _ok(await client.call_tool("recall_memory", {"conversation_id": CONV, "count": 5}))
        assert [i["payload"] for i in recalled["items"]] == [{"n": 1}, {"n": 2}]
        fact = {
            "category": "preference",
            "subject": "Units of measure",
            "summary": "The user wants metric units and Celsius temperatures",
            "tags": ["units"],
        }
        verified = _ok(await client.call_tool("memory_verify", {"intent": "create", "candidate": fact}))
        upsert = {"memory": fact, "verify_token": verified["verify_token"]}
        created = _ok(await client.call_tool("memory_upsert", upsert))
        assert created["memory"]["subject"] == "Units of measure"


async def _pg_memory_session(url: str) -> None:
    """The memory migrated in is found; a new one is written verify-first and found too."""
    async with connect(url, basic(SITE, PASSWORD)) as client:
        found = _ok(await client.call_tool("memory_search", {"query": "metric units Celsius"}))
        assert [m["subject"] for m in found["memories"]] == ["Units of measure"]
        fact = {
            "category": "project",
            "subject": "Deploy window",
            "summary": "Production deploys happen on Tuesday mornings only",
            "dedupe_key": "deploy-window",
        }
        verified = _ok(await client.call_tool("memory_verify", {"intent": "create", "candidate": fact}))
        upsert = {"memory": fact, "verify_token": verified["verify_token"]}
        created = _ok(await client.call_tool("memory_upsert", upsert))["memory"]
        found = _ok(await client.call_tool("memory_search", {"query": "when are production deploys"}))
        assert found["memories"][0]["id"] == created["id"], found


async def _migrate_and_serve_on_postgresql(installed: Installed, data: Path, dsn: str, schema: str) -> None:
    """``migrate`` carries the site (its memory too) into PostgreSQL, ``serve --store`` serves it, and
    ``migrate`` brings both memories back into a new data directory."""
    moved = installed.run("migrate", "--dst-schema", schema, str(data), dsn)
    assert "migrated 1 site, 1 conversation" in moved.stdout, moved.stdout
    assert "1 long-term memory of 1 site (1 copied in this run); verified" in moved.stdout, moved.stdout
    (installed.work / "pg-serve").mkdir()
    server = ServerProcess(
        installed.work / "pg-serve" / "data", "--store", dsn, "--pg-schema", schema,
        command=[installed.convmem], env=installed.env,
    )
    try:
        await _pg_memory_session(server.url)
    finally:
        assert server.stop() == 0, server.log()
    back = installed.run("migrate", "--src-schema", schema, dsn, str(installed.work / "back"))
    assert "2 long-term memories of 1 site (2 copied in this run); verified" in back.stdout, back.stdout


@pytest.mark.anyio
async def test_every_command_and_an_mcp_session_from_the_wheel(installed: Installed, pg_server: str) -> None:
    """Each subcommand of the installed ``convmem`` runs against real data, the server included."""
    ran: set[str] = set()

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        ran.add(args[0])
        return installed.run(*args, stdin=stdin)

    helptext = run("--help").stdout
    assert {c for c in _commands() if c not in helptext} == set()
    assert run("--version").stdout.strip()
    data = installed.work / "data"
    run("site", "add", SITE, "--data-dir", str(data), "--password-stdin", stdin=PASSWORD + "\n")
    assert SITE in run("site", "list", "--data-dir", str(data)).stdout

    server = ServerProcess(data, command=[installed.convmem], env=installed.env)
    try:
        ran.add("serve")
        await _mcp_session(server.url)
    finally:
        assert server.stop() == 0, server.log()

    fsck = run("fsck", str(data))
    assert "0 problems" in fsck.stdout + fsck.stderr or "clean" in (fsck.stdout + fsck.stderr).lower()
    assert SITE in run("stats", str(data), "--json").stdout
    located = json.loads(run("locate", "--json", str(data), SITE, CONV).stdout)
    segment = next(f["path"] for f in located["files"] if f["name"].endswith(".seg"))
    assert '[0] {"n":1}' in run("dump", segment).stdout
    export = installed.work / "export.jsonl"
    run("export", str(data), "--site", SITE, "--output", str(export))
    assert export.read_text().count("\n") == 2
    memories = installed.work / "memories.json"
    run("export", str(data), "--site", SITE, "--memories", "--output", str(memories))
    assert "Units of measure" in memories.read_text()
    copy = installed.work / "copy"
    run("import", str(copy), "--site", "wheel-copy", "--input", str(export))
    run("backup", str(data), str(installed.work / "backup"))
    assert (installed.work / "backup" / "logstore.json").is_file()
    schema = new_schema(pg_server)
    try:
        await _migrate_and_serve_on_postgresql(installed, data, pg_server, schema)
        ran.add("migrate")
    finally:
        drop_schema(pg_server, schema)
    redacted = run("redact", SITE, CONV, "--seqs", "0", "--data-dir", str(data))
    assert "1" in redacted.stdout, redacted.stdout
    run("fsck", str(data))  # clean after the redaction (run() checks the exit status)
    run("forget", SITE, CONV, "--data-dir", str(data))
    run("site", "passwd", SITE, "--data-dir", str(data), "--password-stdin", stdin=PASSWORD + "-new\n")
    run("site", "remove", SITE, "--data-dir", str(data), "--force")
    assert SITE not in run("site", "list", "--data-dir", str(data)).stdout
    assert ran >= _commands(), f"not run from the wheel: {sorted(_commands() - ran)}"

