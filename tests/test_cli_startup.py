"""Start-up: each ``convmem`` command imports only what it uses.

Read from ``python -X importtime`` of a fresh interpreter (no timing is
asserted: the figures depend on the machine; bench/ has none either, the
figures are in the commit history): ``convmem --help`` imports neither the
MCP types nor a database driver nor numpy nor onnxruntime nor the HTTP
server; no command's ``--help`` (``serve --help`` included) loads any of
those either; the operator tools and ``convmem site`` on a data directory
import no server code and no driver (psycopg loads only when a PostgreSQL URI
is given).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from convmem.cli import COMMANDS, build_parser
from convmem.logstore import FileStore

#: Top-level packages no command-line parse may import.
HEAVY = {
    "mcp",
    "mcp_types",
    "psycopg",
    "psycopg_pool",
    "numpy",
    "onnxruntime",
    "tokenizers",
    "uvicorn",
    "starlette",
    "prometheus_client",
}


def imported_by(*argv: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """The top-level packages a fresh ``convmem ARGV`` imports, and how it ended."""
    code = "import sys; from convmem.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *argv], capture_output=True, text=True, timeout=120
    )
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names, done


@pytest.mark.parametrize("argv", [["--help"], ["--version"], [], ["no-such-command"]])
def test_the_top_level_imports_no_engine_server_or_driver(argv: list[str]) -> None:
    names, done = imported_by(*argv)
    assert done.returncode in (0, 2), done.stderr[-2000:]
    assert not names & HEAVY, sorted(names & HEAVY)
    # The listing names no module of the engine either: the commands are named from static help.
    assert "convmem" in names
    assert not any(line.rsplit("|", 1)[1].strip().startswith("convmem.logstore") for line in _import_lines(done))


def _import_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("import time:") and "|" in line]


def test_python_m_convmem_help_imports_nothing_heavy() -> None:
    """``python -m convmem --help`` (the module entry point, as the wheel's workers run it) stays light too."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "convmem", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in _import_lines(done)}
    assert "convmem" in names and "    fsck " in done.stdout
    assert not names & HEAVY, sorted(names & HEAVY)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_commands_help_imports_anything_heavy(command: str) -> None:
    names, done = imported_by(command, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"usage: convmem {command}" in done.stdout
    assert not names & HEAVY, sorted(names & HEAVY)


def test_version_is_printed_on_stdout() -> None:
    _names, done = imported_by("--version")
    assert done.returncode == 0 and done.stdout.startswith("convmem "), (done.stdout, done.stderr[-500:])


def test_help_still_lists_every_command() -> None:
    _names, done = imported_by("--help")
    assert done.returncode == 0
    for name in COMMANDS:
        assert f"    {name} " in done.stdout, name


def test_operator_tools_import_no_server_code(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "data")
    try:
        store.append("site-startup", "conv-startup", [{"k": 1}])
    finally:
        store.close()
    data = str(tmp_path / "data")
    for argv in (
        ["fsck", data],
        ["stats", data],
        ["export", data, "--site", "site-startup"],
        ["locate", data, "site-startup", "conv-startup"],
        ["site", "list", "--data-dir", data],
    ):
        names, done = imported_by(*argv)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert not names & HEAVY, (argv, sorted(names & HEAVY))


def test_the_static_help_is_each_commands_own() -> None:
    """COMMANDS (what ``--help`` lists without building parsers) says what each full parser says."""
    _, sub = build_parser()
    helps = {action.dest: action.help for action in sub._choices_actions}
    assert helps == COMMANDS
