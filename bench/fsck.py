"""Workload 7: ``fsck`` scan rate against raw reading of the same files.

The convmem data directory built by the other workloads is checked (without
repair) by :func:`logstore.maintenance.check` when it exists, else by the
``convmem fsck DIR --json`` command (whose figure then includes interpreter
start-up). The baseline reads every file of the directory start to end.
Both run warm (the files are in the page cache after the first round).
Figures are MB/s of data-directory bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from . import reads
from .context import Ctx
from .util import CONVMEM, FLOOR, Row, files_under, interleaved, seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps(ctx: Ctx) -> int:
    return 1


def _fsck(root: str) -> tuple[Callable[[], object] | None, str]:
    """A callable running fsck over ``root`` and how it runs, or None when fsck is not there."""
    try:
        from convmem.logstore import maintenance
    except ImportError:
        maintenance = None  # type: ignore[assignment]
    check = getattr(maintenance, "check", None)
    if check is not None:
        return (lambda: check(root)), "logstore.maintenance.check"
    env = dict(os.environ, PYTHONPATH=ROOT)
    cli = "import sys; from convmem.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", cli, "fsck", root, "--json"]
    probe = subprocess.run([*cmd[:3], "fsck", "--help"], capture_output=True, env=env)
    if probe.returncode != 0:
        return None, "no logstore.maintenance.check and no `convmem fsck` command"

    def via_cli() -> None:
        subprocess.run(cmd, capture_output=True, env=env, timeout=3600)

    return via_cli, "`convmem fsck --json` (includes interpreter start-up)"


def _raw_read(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(4 * 1024 * 1024):
                pass


def run(ctx: Ctx) -> list[Row]:
    ctx.progress.step("fsck scan rate")
    reads.build(ctx)
    root = ctx.convmem_dir
    fn, how = _fsck(root)
    if fn is None:
        ctx.progress.step("fsck", advance=1)
        return [Row("fsck", "fsck scan of the data directory", "MB/s", note=f"unavailable: {how}")]
    paths = files_under(root)
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    fns: dict[str, Callable[[], float]] = {
        CONVMEM: lambda: mb / seconds(fn),
        FLOOR: lambda: mb / seconds(lambda: _raw_read(paths)),
    }
    row = Row("fsck", f"fsck scan of {mb:,.0f} MB in {len(paths):,} files", "MB/s",
              samples=interleaved(max(ctx.sizes.replay_rounds, 2), fns),
              note=f"floor: raw read of the same files; fsck via {how}", extra={"megabytes": mb, "how": how})
    ctx.progress.step("fsck", advance=1)
    return [row]
