"""``convmem serve --workers N``: N server processes on one port and one data directory.

Pre-fork without ``fork``: the supervisor makes every check ``serve`` makes,
binds the one listening socket, and starts each worker as a fresh interpreter
running ``convmem serve`` with the same arguments, handing it one end of a
Unix socket pair (the channel) and the read end of a pipe. The supervisor
alone accepts; each connection goes over its channel to the worker holding
the fewest open connections (:mod:`.handoff` says why the kernel's spread is
not good enough for a few long-lived agent connections). A worker is an
ordinary server in every way (its own store, TLS context, connection guards,
request limits and credentials cache); only its connections come from the
supervisor, and it prints no banner. A fresh interpreter rather than a forked
child: the supervisor has opened the store (to set up credentials), and
forking a process that may hold threads and locks would hand the child locks
nobody will release. Several processes on one data directory are safe
(:mod:`convmem.logstore.incarnation` and the engine's file locks). While no
worker can take a connection (all being replaced), connections wait in the
listening socket's queue.

Shutdown: SIGTERM or SIGINT to the supervisor stops its accepting and is
passed on (as SIGTERM) to every worker; each finishes its in-flight requests
and closes its store, and the supervisor exits 0 when all of them did. Workers
run in their own session, so a Ctrl+C on the terminal reaches them once,
through the supervisor. If the supervisor dies, the pipe's write end closes
and each worker stops itself. A worker that dies on its own is started again
(after a pause), with a new channel.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from .handoff import Dispatcher

logger = logging.getLogger("convmem.workers")

#: Response header naming the worker process that answered (only with --workers above 1).
WORKER_HEADER = b"x-convmem-worker"
#: Seconds between a worker's unexpected exit and its replacement.
RESPAWN_DELAY = 1.0


def add_arguments(serve: argparse.ArgumentParser) -> None:
    """``--workers`` and the hidden option a supervisor starts its workers with."""
    serve.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("CONVMEM_WORKERS", "1") or 1),
        help="server processes sharing the port and the data directory (env CONVMEM_WORKERS; default 1)",
    )
    # "CHANNEL_FD,PIPE_FD": set by the supervisor for each worker; not for people.
    serve.add_argument("--worker-fds", default=None, help=argparse.SUPPRESS)


def worker_fds(args: argparse.Namespace) -> tuple[int, int] | None:
    """(connection channel, supervisor pipe) descriptors when this process is a worker; else None."""
    raw = getattr(args, "worker_fds", None)
    if not raw:
        return None
    listen, _, pipe = raw.partition(",")
    return int(listen), int(pipe)


def check_count(args: argparse.Namespace) -> str | None:
    """Why ``--workers`` is refused (None when it is fine)."""
    n = getattr(args, "workers", 1)
    if n < 1 or n > 64:
        return f"--workers must be between 1 and 64, got {n}"
    if n > 1 and getattr(args, "stdio", False):
        return "--workers applies to HTTP serving; --stdio serves one client in one process"
    return None


def watch_supervisor(pipe_fd: int) -> None:
    """In a worker: stop (SIGTERM to itself) once the supervisor is gone (its end of the pipe closes)."""

    def wait() -> None:
        try:
            while os.read(pipe_fd, 1):
                pass
        except OSError:
            pass
        logger.warning("the supervisor process is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="convmem-supervisor-watch", daemon=True).start()


def tag_worker(app: Any) -> Any:
    """Wrap the ASGI app so every HTTP response names the worker process (header :data:`WORKER_HEADER`)."""
    pid = str(os.getpid()).encode("ascii")

    async def tagged(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await app(scope, receive, send)
            return

        async def send_tagged(message: Any) -> None:
            if message.get("type") == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (WORKER_HEADER, pid)]}
            await send(message)

        await app(scope, receive, send_tagged)

    return tagged


class Supervisor:
    """Starts, watches and stops the worker processes of one ``serve --workers N``."""

    def __init__(self, argv: Sequence[str], listener: socket.socket, count: int) -> None:
        """``listener``: the bound, listening socket; ``count``: how many workers to run."""
        self._argv = list(argv)
        self._count = count
        self._dispatcher = Dispatcher(listener, count)
        self._read_end, self._write_end = os.pipe()
        os.set_inheritable(self._read_end, True)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stopping = False

    def _command(self, channel: socket.socket) -> list[str]:
        fds = f"{channel.fileno()},{self._read_end}"
        # The `convmem` command again (`python -m convmem`, so a worker needs no console script on PATH).
        # Later options win in argparse: each worker is one process serving what it is handed.
        return [sys.executable, "-m", "convmem", *self._argv, "--workers", "1", "--worker-fds", fds]

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        channel = self._dispatcher.attach(i)
        try:
            return subprocess.Popen(
                self._command(channel),
                pass_fds=(channel.fileno(), self._read_end),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # the supervisor prints the banner; logs go to stderr
                start_new_session=True,
            )
        finally:
            channel.close()  # the worker has its copy; the supervisor must not keep the channel open

    def open_connections(self) -> list[int]:
        """Connections each worker holds (``-1`` for a worker being replaced)."""
        return self._dispatcher.open_connections()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _signal_all(self, sig: int) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def run(self) -> int:
        """Run the workers until SIGTERM/SIGINT; the exit status (0 when every worker stopped cleanly)."""
        stop = threading.Event()

        def on_stop(_sig: int, _frame: object) -> None:
            self._stopping = True
            stop.set()

        old = {s: signal.signal(s, on_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        old_hup = signal.signal(signal.SIGHUP, lambda *_: self._signal_all(signal.SIGHUP))
        accepting = threading.Thread(target=self._dispatcher.run, args=(stop,), name="convmem-accept", daemon=True)
        try:
            self._procs = [self._spawn(i) for i in range(self._count)]
            logger.info("started %d workers: %s", self._count, " ".join(map(str, self.pids())))
            accepting.start()
            while not stop.wait(0.2):
                for i, p in enumerate(self._procs):
                    rc = p.poll()
                    if rc is not None and not self._stopping:
                        logger.error("worker %d exited with status %d; starting another", p.pid, rc)
                        if stop.wait(RESPAWN_DELAY):
                            break
                        self._procs[i] = self._spawn(i)
            accepting.join()  # no connection is handed to a worker that is stopping
            return self._shutdown()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            signal.signal(signal.SIGHUP, old_hup)
            self._dispatcher.close()
            os.close(self._read_end)
            os.close(self._write_end)

    def _shutdown(self, timeout: float = 45.0) -> int:
        """SIGTERM every worker and wait for them (SIGKILL after ``timeout``); 0 when all exited 0."""
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        status = 0
        for p in self._procs:
            try:
                rc = p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                logger.error("worker %d did not stop within %.0fs; killing it", p.pid, timeout)
                p.kill()
                rc = p.wait()
            if rc != 0:
                logger.error("worker %d exited with status %d", p.pid, rc)
                status = 1
        logger.info("all workers stopped")
        return status
