"""Handing accepted connections from the ``--workers`` supervisor to the worker holding the fewest.

Why not let the kernel spread them: with ``SO_REUSEPORT`` each new connection
goes to a listening socket chosen by a hash of its addresses, and agents keep
few connections alive for a long time. Measured with 8 kept-alive connections
over 2 workers, 40 trials: 1/7 five times, 2/6 nine times, 4/4 only nine
times; with 1/7 one worker idles while the other queues. One shared listening
socket instead leaves the choice to whichever worker wakes first.

So the supervisor alone accepts, on the one listening socket, and passes each
connection's descriptor (``SCM_RIGHTS``) over a Unix ``SOCK_SEQPACKET`` pair
to the live worker with the fewest open connections (ties in turn). A worker
serves a handed socket exactly as one it had accepted itself: the same
uvicorn protocol (connection guards and the TLS gate included).

Counting, and why it cannot drift: after taking descriptors off its channel
and after every close, a worker reports two running totals, connections
received and connections closed (16 bytes, big-endian). The supervisor's
count for a worker is what it handed minus the latest closed total; a report
that could not be sent (the channel full) is sent again shortly with newer
totals, so a lost message is corrected by the next and nothing is counted
twice.

No connection is lost to a worker that dies before reading it: the
supervisor keeps its own copy of each handed connection until the worker's
received total covers it. A SIGKILLed process's threads take a moment to let
go of its descriptors, so a send can still succeed in that moment; when the
channel then reads as closed, the copies it never acknowledged (untouched:
the worker never read them) are handed to another worker.

A worker that died or stopped reading is skipped (its channel refuses or is
full); while no worker can take a connection the supervisor stops accepting,
so new connections wait in the listening socket's queue, as they would for
a single server that is busy.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("convmem.workers")

_REPORT = struct.Struct("!QQ")  # a worker's report: connections received, and closed, so far
_HANDED = b"c"  # the byte sent with each descriptor
#: Seconds the accept loop waits between checks of its stop flag.
ACCEPT_POLL = 0.2
#: Seconds before a worker retries a report its full channel refused.
REPORT_RETRY = 0.05


class Dispatcher:
    """Supervisor side: accepts on ``listener`` and hands each connection to the least-loaded worker."""

    def __init__(self, listener: socket.socket, count: int) -> None:
        self._listener = listener
        self._channels: list[socket.socket | None] = [None] * count
        self._handed = [0] * count
        self._closed = [0] * count
        # A worker's channel counts once the worker has said it is serving (its first report).
        self._serving = [False] * count
        # Our copies of connections handed to each worker and not yet acknowledged, oldest first.
        self._unacked: list[collections.deque[socket.socket]] = [collections.deque() for _ in range(count)]
        # Accepted connections (or ones a dead worker never read) waiting to be handed.
        self._waiting: collections.deque[socket.socket] = collections.deque()
        self._turn = 0
        self._lock = threading.Lock()

    def attach(self, i: int) -> socket.socket:
        """A fresh channel for worker ``i`` (a new or restarted process); returns the worker's end.

        The caller passes that end to the worker process and closes its own copy
        once the process has started.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        theirs.set_inheritable(True)
        with self._lock:
            self._detach(i)
            self._channels[i] = ours
            self._handed[i] = self._closed[i] = 0
            self._serving[i] = False
        return theirs

    def open_connections(self) -> list[int]:
        """Connections each worker holds, as far as its reports tell (``-1``: not serving)."""
        with self._lock:
            self._read_reports()
            return [
                self._handed[i] - self._closed[i] if ch is not None and self._serving[i] else -1
                for i, ch in enumerate(self._channels)
            ]

    def close(self) -> None:
        with self._lock:
            for i in range(len(self._channels)):
                self._detach(i)
            while self._waiting:  # stopping: closed unanswered, as a stopping server's queue would be
                self._waiting.popleft().close()

    def run(self, stop: threading.Event) -> None:
        """Accept and hand off until ``stop`` is set (run in a thread of its own)."""
        self._listener.settimeout(ACCEPT_POLL)
        while not stop.is_set():
            with self._lock:
                self._read_reports()
                self._hand_waiting()
                ready = not self._waiting and any(
                    ch is not None and up for ch, up in zip(self._channels, self._serving, strict=True)
                )
            if not ready:  # no worker to take one: leave new connections in the listen queue
                stop.wait(REPORT_RETRY)
                continue
            try:
                conn, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if stop.is_set():
                    break
                # EMFILE and the like: the connection stays queued; try again shortly.
                logger.warning("accept failed: %s", exc)
                stop.wait(REPORT_RETRY)
                continue
            with self._lock:
                self._waiting.append(conn)
                self._hand_waiting()

    def _hand_waiting(self) -> None:
        """Hand every waiting connection to a live worker, fewest open connections first (lock held)."""
        while self._waiting:
            conn = self._waiting[0]
            for i in self._by_load():
                ch = self._channels[i]
                assert ch is not None
                try:
                    socket.send_fds(ch, [_HANDED], [conn.fileno()], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue  # that worker is not reading its channel: try the next
                except OSError as exc:
                    if exc.errno not in (errno.EPIPE, errno.ECONNREFUSED, errno.ECONNRESET):
                        raise
                    self._detach(i)  # the worker is gone; it gets a new channel when restarted
                    continue
                self._waiting.popleft()
                self._unacked[i].append(conn)
                self._handed[i] += 1
                self._turn = (i + 1) % len(self._channels)
                break
            else:
                return  # every worker gone or full: the connection waits for the next round

    def _by_load(self) -> list[int]:
        """Serving workers, fewest open connections first; ties start from the worker after the last used.

        A worker still starting is left out, so no client waits for its start-up.
        """
        n = len(self._channels)
        live = [i for i in range(n) if self._channels[i] is not None and self._serving[i]]
        return sorted(live, key=lambda i: (self._handed[i] - self._closed[i], (i - self._turn) % n))

    def _read_reports(self) -> None:
        """Take in every pending report (the latest totals win); notice workers whose channel closed."""
        for i, ch in enumerate(self._channels):
            if ch is None:
                continue
            while True:
                try:
                    msg = ch.recv(64)
                except BlockingIOError:
                    break
                except OSError:
                    msg = b""
                if not msg:  # the worker's end is closed: the process is gone
                    self._detach(i)
                    break
                if len(msg) != _REPORT.size:
                    continue
                received, closed = _REPORT.unpack(msg)
                self._serving[i] = True
                self._closed[i] = max(self._closed[i], closed)
                acknowledged = self._handed[i] - len(self._unacked[i])
                for _ in range(min(received - acknowledged, len(self._unacked[i]))):
                    self._unacked[i].popleft().close()  # the worker has its own copy now

    def _detach(self, i: int) -> None:
        """Forget worker ``i``'s channel; connections it never acknowledged wait for another worker."""
        ch = self._channels[i]
        if ch is not None:
            ch.close()
        self._channels[i] = None
        self._waiting.extendleft(reversed(self._unacked[i]))
        self._unacked[i].clear()


class Receiver:
    """Worker side: takes handed connections off the channel and serves them with uvicorn's protocol."""

    def __init__(self, channel_fd: int) -> None:
        self._channel = socket.socket(fileno=channel_fd)
        self._channel.setblocking(False)
        self._received = 0
        self._closed = 0
        self._retry: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._ssl: Any = None

    def start(self, factory: Callable[[], asyncio.Protocol], ssl: Any = None) -> None:
        """Begin serving handed connections on the running loop with ``factory``'s protocols."""
        self._loop = asyncio.get_running_loop()
        self._factory = factory
        self._ssl = ssl
        self._loop.add_reader(self._channel.fileno(), self._take)
        self._report()  # tells the supervisor this worker is serving

    def stop(self) -> None:
        """Take no more connections (those being served go on; their closes are still reported)."""
        if self._loop is not None:
            self._loop.remove_reader(self._channel.fileno())

    def close(self) -> None:
        self.stop()
        if self._retry is not None:
            self._retry.cancel()
        self._channel.close()

    def _take(self) -> None:
        assert self._loop is not None
        while True:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self._channel, 16, 16)
            except BlockingIOError:
                return
            except OSError as exc:
                logger.warning("the supervisor's channel failed: %s", exc)
                self.stop()
                return
            if not msg and not fds:  # the supervisor is gone (its pipe watch stops this process)
                self.stop()
                return
            for fd in fds:
                sock = socket.socket(fileno=fd)
                sock.setblocking(False)
                self._loop.create_task(self._serve(sock))
            self._received += len(fds)
            self._report()  # the supervisor may drop its copies now

    async def _serve(self, sock: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(self._counted, sock, ssl=self._ssl)
        except OSError as exc:  # the client left before we started (or TLS set-up failed)
            logger.debug("a handed connection could not be served: %s", exc)
            sock.close()
            self._one_closed()

    def _counted(self) -> asyncio.Protocol:
        """uvicorn's protocol for one connection, reporting to the supervisor when it closes."""
        assert self._factory is not None
        protocol = self._factory()
        lost = protocol.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            try:
                lost(exc)
            finally:
                self._one_closed()

        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    def _one_closed(self) -> None:
        self._closed += 1
        self._report()

    def _report(self) -> None:
        self._retry = None
        try:
            self._channel.send(_REPORT.pack(self._received, self._closed), socket.MSG_DONTWAIT)
        except BlockingIOError:
            # The supervisor has not read its channel lately; a later total replaces this one.
            if self._retry is None and self._loop is not None:
                self._retry = self._loop.call_later(REPORT_RETRY, self._report)
        except OSError:
            pass  # the supervisor is gone; this worker is stopping

