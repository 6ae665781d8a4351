"""Fault 1, second form: the MCP server killed with SIGKILL under load.

Client threads append over HTTP to their own conversations and to one shared
by all, recording every acknowledged range (a 200 response carrying
``first_seq``/``last_seq``). The server is killed at a random moment; the
data directory is then checked with the engine exactly as in the writer
test, a new server is started, and appends through it must continue where
the log left off.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import httpx2

from convmem.logstore import FileStore

from . import _server
from ._common import SITE, STATS, Ack, fault_rng, make_batch, rounds, verify

CLIENTS = 4
SHARED = "srv-shared-conv"


def _own(c: int) -> list[str]:
    return [f"srv-c{c}-conv-a", f"srv-c{c}-conv-b"]


def _client(url: str, c: int, round_no: int, seed: int, acks: list[Ack], stop: threading.Event) -> None:
    rng = random.Random(seed)
    convs = [*_own(c), SHARED]
    b = round_no * 1_000_000
    with httpx2.Client(timeout=30) as http:
        while not stop.is_set():
            conv = rng.choice(convs)
            n, pad = rng.randint(1, 5), rng.randint(0, 300)
            try:
                result = _server.call(
                    http, url, "append_memory", {"conversation_id": conv, "items": make_batch(f"c{c}", b, n, pad)}
                )
            except httpx2.TransportError:
                return  # the server is gone
            if not result.get("isError"):
                sc = result["structuredContent"]
                acks.append(Ack(conv, sc["first_seq"], sc["last_seq"], f"c{c}", b, n, pad))
            b += 1


#: Rounds against one data directory (a soak run starts a fresh one after this many).
ROUNDS_PER_DIR = 30


def test_sigkill_server(tmp_path: Path) -> None:
    n_rounds = rounds(6, 500)
    rng = fault_rng("test_sigkill_server")
    for start in range(0, n_rounds, ROUNDS_PER_DIR):
        stop = min(start + ROUNDS_PER_DIR, n_rounds)
        _rounds_on_one_dir(tmp_path / f"run-{start}" / "data", range(start + 1, stop + 1), rng)


def _rounds_on_one_dir(data: Path, round_nos: range, rng: random.Random) -> None:
    all_convs = [SHARED] + [c for i in range(CLIENTS) for c in _own(i)]
    acks: list[Ack] = []
    for round_no in round_nos:
        server = _server.start(data)
        with httpx2.Client(timeout=60) as http:
            # Log in once first: the (deliberately slow) password check is not what the kill window is for.
            _server.call(http, server.url, "list_conversations", {})
        stop = threading.Event()
        threads = [
            threading.Thread(target=_client, args=(server.url, c, round_no, rng.randrange(1 << 30), acks, stop))
            for c in range(CLIENTS)
        ]
        try:
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.2, 1.2))
            server.proc.send_signal(signal.SIGKILL)
            rc = server.stop()
            assert rc == -signal.SIGKILL
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
            if server.proc.poll() is None:
                server.stop(signal.SIGKILL)
        STATS["server kill rounds"] += 1

        store = FileStore(data)
        try:
            logs = verify(store, SITE, acks, all_convs)
        finally:
            store.close()
        # A new server carries on where the log left off.
        server = _server.start(data)
        try:
            with httpx2.Client(timeout=30) as http:
                for conv in all_convs:
                    batch = make_batch("v", round_no, 2, 10)
                    result = _server.call(http, server.url, "append_memory", {"conversation_id": conv, "items": batch})
                    sc = result["structuredContent"]
                    assert sc["first_seq"] == len(logs[conv]), f"{conv}: the restarted server appended at {sc}"
                    acks.append(Ack(conv, sc["first_seq"], sc["last_seq"], "v", round_no, 2, 10))
        finally:
            assert server.stop() == 0, server.log()
    assert len(acks) > len(round_nos) * len(all_convs), "the clients acknowledged nothing: the test tested nothing"
