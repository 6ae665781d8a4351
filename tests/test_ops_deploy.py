"""deploy/convmem.service: systemd accepts it, its sandbox scores well, and it sets only options convmem has."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_helpers import run_convmem

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "convmem.service"


def _unit_for_here(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists here (verify checks it)."""
    unit = tmp_path / "convmem.service"
    unit.write_text(UNIT.read_text().replace("/opt/convmem/bin/convmem", str(Path(sys.executable).parent / "convmem")))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_verifies_and_is_well_sandboxed(tmp_path: Path) -> None:
    unit = _unit_for_here(tmp_path)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    res = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True, timeout=60
    )
    match = re.search(r"Overall exposure level for convmem\.service: ([0-9.]+)", res.stdout + res.stderr)
    assert match, res.stdout + res.stderr
    assert float(match.group(1)) <= 2.0, res.stdout


def test_unit_settings() -> None:
    text = UNIT.read_text()
    for line in (
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/convmem",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
        "User=convmem",
        "KillSignal=SIGTERM",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ):
        assert f"\n{line}\n" in text, line
    # Room for the server's graceful shutdown (30 s for requests, 30 s for storage calls).
    assert int(re.search(r"\nTimeoutStopSec=(\d+)\n", text).group(1)) > 60  # type: ignore[union-attr]


def test_unit_environment_names_real_options() -> None:
    helptext = run_convmem("serve", "--help").stdout
    names = set(re.findall(r"\b(CONVMEM_[A-Z_]+)=", UNIT.read_text() + (REPO / "deploy" / "convmem.env").read_text()))
    assert names
    for name in names:
        assert name in helptext, f"{name} is not a `convmem serve` setting"
