"""Throwaway PostgreSQL clusters on loopback, for the tests and the benchmark.

``initdb`` refuses to run as root, so when this process is root every server
command runs as the ``postgres`` OS user (``runuser``), in a temporary
directory handed to that user. Each cluster listens on 127.0.0.1 on a port
picked free, with its socket in its own directory, and is stopped with
``pg_ctl stop -m immediate`` (or killed) when done. :func:`reap_on_exit`
stops and removes a cluster even when the process that started it dies
without cleaning up (SIGKILL, a crash): a killed benchmark or test run must
not leave a server running and its directory behind.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def pg_bin() -> Path | None:
    """Directory holding ``initdb``/``pg_ctl`` (``CONVMEM_PG_BIN``, PATH, or Debian's layout); None if absent."""
    env = os.environ.get("CONVMEM_PG_BIN")
    if env:
        return Path(env)
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin
    # Debian's layout: /usr/lib/postgresql/<major>/bin, newest first.
    found_dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: _major(p.parent.parent.name))
    return found_dirs[-1].parent if found_dirs else None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


def _as_owner(cmd: Sequence[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """One PostgreSQL server in its own data directory."""

    def __init__(self, base: Path, name: str, port: int, bindir: Path) -> None:
        self.base = base
        self.name = name
        self.port = port
        self.bin = bindir
        self.data = base / name
        self.sockdir = base / f"{name}-sock"
        self.log = base / f"{name}.log"

    def dsn(self, dbname: str = "postgres", **extra: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in extra.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}" + (f"?{query}" if query else "")

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_owner(cmd), check=check, capture_output=True, text=True, timeout=120)

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def initdb(self, *settings: str) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--data-checksums",
            "-E",
            "UTF8",
            "--locale=C.UTF-8" if _has_c_utf8() else "--no-locale",
        )
        self.configure(*settings)

    def configure(self, *settings: str) -> None:
        self.sockdir.mkdir(exist_ok=True)
        self._chown(self.sockdir)
        lines = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.sockdir}'",
            "max_connections = 200",
            "shared_buffers = 32MB",
            "fsync = on",
            "synchronous_commit = on",
            *settings,
        ]
        conf = self.data / "postgresql.conf"
        text = subprocess.run(_as_owner(["cat", str(conf)]), capture_output=True, text=True, check=True).stdout
        body = text + "\n# convmem test cluster\n" + "\n".join(lines) + "\n"
        subprocess.run(_as_owner(["tee", str(conf)]), input=body, capture_output=True, text=True, check=True)

    def start(self) -> None:
        self.log.touch()
        self._chown(self.log)
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False)

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill9(self) -> None:
        """SIGKILL the postmaster (its backends notice and exit)."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote")

    def basebackup_from(self, primary: Cluster, application_name: str) -> None:
        """Make this a streaming standby of ``primary`` (replication slot-less, waits for the copy)."""
        self._run(
            str(self.bin / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.data),
            "-X",
            "stream",
            "-c",
            "fast",
        )
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres application_name={application_name}"
        self.configure(f"primary_conninfo = '{conninfo}'", "hot_standby = on")
        subprocess.run(_as_owner(["touch", str(self.data / "standby.signal")]), check=True)


def _has_c_utf8() -> bool:
    out = subprocess.run(["locale", "-a"], capture_output=True, text=True, check=False).stdout.lower()
    return "c.utf8" in out or "c.utf-8" in out


def make_base(prefix: str = "convmem-pg-") -> Path:
    """A temporary directory the server user can write."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(base, pw.pw_uid, pw.pw_gid)
    return base


def start_cluster(base: Path, name: str = "main", *settings: str) -> Cluster:
    """initdb and start a cluster under ``base`` on a free port (retrying if the port is taken meanwhile)."""
    bindir = pg_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) were not found; install postgresql")
    last: Exception | None = None
    for _ in range(3):
        cluster = Cluster(base, name, free_port(), bindir)
        if not cluster.data.exists():
            cluster.initdb(*settings)
        else:
            cluster.configure(f"port = {cluster.port}")
        try:
            cluster.start()
            return cluster
        except subprocess.CalledProcessError as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"could not start PostgreSQL in {base}: {last}")


def remove(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)


# Run by the reaper process: wait until standard input reaches end of file (the
# process that started it has exited, however it died: the kernel closes its
# end of the pipe), then stop the cluster and remove its directory.
_REAPER = """
import shutil, subprocess, sys
sys.stdin.buffer.read()
subprocess.run(sys.argv[2:], capture_output=True, timeout=120, check=False)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def reap_on_exit(cluster: Cluster, base: Path) -> subprocess.Popen[bytes]:
    """Start a process that stops ``cluster`` and removes ``base`` once this process has exited.

    It holds the read end of a pipe whose write end only this process holds
    (not inherited by programs it runs), in a session of its own so that a
    terminal's signals to this process's group leave it alive to clean up.
    A normal stop first and the reaper after it is harmless: stopping a
    stopped server fails quietly and the directory is already gone.
    """
    stop = _as_owner([str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "stop"])
    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, str(base), *stop],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
