"""The ``convmem site`` commands, run as real subprocesses on a temporary data directory."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from mcp_helpers import REPO_ROOT, run_convmem

from convmem.cli import build_parser
from convmem.logstore import Tail, layout, open_store
from convmem.logstore.site_credentials import CredentialFile
from convmem.mcp_adapter.serve import INSPECTOR_PACKAGE


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_site_add_prints_a_strong_password_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = run_convmem("site", "add", "team-alpha", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    password = done.stdout.strip()
    assert len(password) >= 32 and "\n" not in password
    assert "only this once" in done.stderr
    creds = CredentialFile(data)
    assert creds.verify("team-alpha", password)
    assert not creds.verify("team-alpha", password + "x")
    # Only a salted hash is stored, in owner-only files.
    raw = (data / "auth" / "sites.json").read_text()
    assert password not in raw
    entry = json.loads(raw)["sites"]["team-alpha"]
    assert entry["kdf"] == "scrypt" and entry["salt"] and entry["hash"]
    assert mode_of(data / "auth") == 0o700
    assert mode_of(data / "auth" / "sites.json") == 0o600
    # Adding a site writes credentials only: no site directory (named by the hex of the name) yet.
    site_dir = Path(layout.site_dir(str(data), "team-alpha"))
    assert site_dir.name == b"team-alpha".hex()
    assert not site_dir.exists()


def test_site_add_refuses_duplicates_and_bad_names(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    assert run_convmem("site", "add", "team-alpha", "--data-dir", data).returncode == 0
    again = run_convmem("site", "add", "team-alpha", "--data-dir", data)
    assert again.returncode == 1 and "already exists" in again.stderr
    for bad in ("", "x" * 65, "has space", "semi;colon"):
        done = run_convmem("site", "add", bad, "--data-dir", data)
        assert done.returncode == 2 and "1-64 characters" in done.stderr, bad


def test_short_site_names_are_accepted_and_stored_as_before(tmp_path: Path) -> None:
    """Site names of 1-7 characters work; the layout (hex of the name) is unchanged for longer ones."""
    data = tmp_path / "data"
    for name in ("a", "demo", "acme"):
        assert run_convmem("site", "add", name, "--data-dir", str(data)).returncode == 0, name
    with open_store(data) as store:
        store.append("demo", "conv-0001", [{"a": 1}])
        store.append("team-alpha", "conv-0001", [{"b": 2}])
    assert (data / "sites" / b"demo".hex()).is_dir()
    assert (data / "sites" / b"team-alpha".hex()).is_dir()
    with open_store(data) as store:
        assert store.read("demo", "conv-0001", Tail(1))[0].payload == {"a": 1}
    assert sorted(CredentialFile(data).sites()) == ["a", "acme", "demo"]


def test_password_stdin_list_and_passwd(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    done = run_convmem("site", "add", "team-bravo", "--password-stdin", "--data-dir", data, input="correct-horse-1\n")
    assert done.returncode == 0 and done.stdout == ""
    too_short = run_convmem("site", "add", "team-short", "--password-stdin", "--data-dir", data, input="short\n")
    assert too_short.returncode == 2
    assert run_convmem("site", "add", "team-alpha", "--data-dir", data).returncode == 0
    listed = run_convmem("site", "list", "--data-dir", data)
    assert listed.stdout.split() == ["team-alpha", "team-bravo"]
    creds = CredentialFile(data)
    assert creds.verify("team-bravo", "correct-horse-1")
    changed = run_convmem("site", "passwd", "team-bravo", "--data-dir", data)
    assert changed.returncode == 0
    assert creds.verify("team-bravo", changed.stdout.strip())
    assert not creds.verify("team-bravo", "correct-horse-1")
    missing = run_convmem("site", "passwd", "team-nobody", "--data-dir", data)
    assert missing.returncode == 1 and "no site" in missing.stderr


def test_remove_refuses_while_the_site_holds_conversations(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert run_convmem("site", "add", "team-alpha", "--data-dir", str(data)).returncode == 0
    assert run_convmem("site", "add", "team-empty", "--data-dir", str(data)).returncode == 0
    with open_store(data) as store:
        store.append("team-alpha", "conv-0001", [{"a": 1}])
    refused = run_convmem("site", "remove", "team-alpha", "--data-dir", str(data))
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert "team-alpha" in CredentialFile(data).sites()
    assert run_convmem("site", "remove", "team-empty", "--data-dir", str(data)).returncode == 0
    forced = run_convmem("site", "remove", "team-alpha", "--force", "--data-dir", str(data))
    assert forced.returncode == 0, forced.stderr
    assert CredentialFile(data).sites() == []
    with open_store(data) as store:
        assert store.read("team-alpha", "conv-0001", Tail(10)) == []
    gone = run_convmem("site", "remove", "team-alpha", "--data-dir", str(data))
    assert gone.returncode == 1


def test_data_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVMEM_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("CONVMEM_PORT", "9999")
    monkeypatch.setenv("CONVMEM_HOST", "0.0.0.0")
    parser, _ = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.data_dir, args.port, args.host) == (str(tmp_path / "env-data"), 9999, "0.0.0.0")
    args = parser.parse_args(["serve", "--port", "1234"])
    assert args.port == 1234
    args = parser.parse_args(["site", "list"])
    assert args.data_dir == str(tmp_path / "env-data")


def test_version() -> None:
    done = run_convmem("--version")
    assert done.returncode == 0 and done.stdout.startswith("convmem ")


def test_readme_matches_the_cli() -> None:
    """The documented option table (docs/operations.md) and the README's Inspector command line follow the code."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"npx -y {INSPECTOR_PACKAGE} --cli" in readme
    _, sub = build_parser()
    serve_options = {opt for action in sub.choices["serve"]._actions for opt in action.option_strings}
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    table = operations.split("\n## Serving\n", 1)[1].split("\n## ", 1)[0]
    documented = {line.split("`")[1].split()[0] for line in table.splitlines() if line.startswith("| `--")}
    assert documented == serve_options - {"-h", "--help"}


def test_operator_tools_plug_into_the_same_command() -> None:
    """The operator subcommands from ``tools.cli`` are always there, dispatched like the built-in ones."""
    _, sub = build_parser()
    assert {"serve", "site"} <= set(sub.choices)
    assert {"fsck", "dump", "export", "import", "stats"} <= set(sub.choices)
    for name in ("fsck", "dump", "export", "import", "stats", "locate"):
        assert callable(sub.choices[name].get_default("func")), name


def test_a_busy_port_says_how_to_pick_another(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_convmem("serve", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1", "--port", str(port))
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "--port N" in done.stderr and "make serve PORT=N" in done.stderr and "--port 0" in done.stderr


def test_make_serve_passes_port() -> None:
    import shutil
    import subprocess

    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "-n", "-s", "serve", "PORT=9123"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert "--port 9123" in done.stdout.splitlines()[-1], done.stdout
    done = subprocess.run([make, "-n", "-s", "serve"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert "--port" not in done.stdout.splitlines()[-1]  # CONVMEM_PORT (or the default) applies


@pytest.mark.parametrize(
    "damage", [b'{"version": 1, "sites": {', b"[1, 2]", b'{"sites": {"team-alpha": {"kdf": "md5"}}}'],
    ids=["torn", "not-a-document", "bad-entry"],
)
def test_a_damaged_credential_file_is_reported_and_left_alone(tmp_path: Path, damage: bytes) -> None:
    """Every command that reads the site list names the damaged file instead of reading it as empty;
    a change is refused rather than written over the damage."""
    data = tmp_path / "data"
    assert run_convmem("site", "add", "team-alpha", "--data-dir", str(data)).returncode == 0
    sites = data / "auth" / "sites.json"
    sites.write_bytes(damage)
    commands = [("site", "add", "team-beta", "--data-dir", str(data))]
    if damage != b'{"sites": {"team-alpha": {"kdf": "md5"}}}':  # the names are still readable there
        commands += [("stats", str(data)), ("export", "--site", "team-alpha", str(data)),
                     ("site", "list", "--data-dir", str(data)), ("serve", "--data-dir", str(data), "--port", "0")]
    for command in commands:
        done = run_convmem(*command)
        assert done.returncode != 0, (command, done.stdout)
        assert str(sites) in done.stderr and "Traceback" not in done.stderr, (command, done.stderr)
        assert sites.read_bytes() == damage, command
