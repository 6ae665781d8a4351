"""Several server processes and the CLI on one data directory, all at once.

Two servers, one of them ``serve --workers 2`` (three server processes in all),
take appends and memory writes for three sites from four client threads, each
call sent to a server picked at random (each client's kept-alive connection
to the ``--workers`` server goes to the worker holding fewer, so both serve), while this process runs,
one after another: ``site passwd``, ``site remove --force`` then ``site add``
(of the site that is replaced again and again), ``backup``, ``fsck --repair``,
``export`` then ``import`` into a new site. Afterwards (all of it through one
server, a fifth through the other): every acknowledged append and memory is
readable, no site ever returned an
item written for another site (or for an earlier owner of its name), no call
ever answered ``Corrupted``, and fsck finds nothing. The random seed is printed
(``COHERENCE_SEED`` replays it).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx2
import pytest
from coherence_support import auth, call, create_memory, error_code, new_memory
from mcp_helpers import ServerProcess, run_convmem

from convmem.logstore.site_credentials import CredentialFile

STABLE = ("alpha", "bravo")
REPLACED = "romeo"
IMPORTED = "india"
LOAD_SECONDS = 12.0
#: Successful client calls the load phase waits for, at most 4 x LOAD_SECONDS more (38 came in 12 s at load 10).
MIN_OK_CALLS = 50
#: fsck findings that mean damage or loss, never allowed (others: a live listing catching up).
DAMAGE = {
    "corrupt-record",
    "bad-segment-header",
    "seq-gap",
    "seq-mismatch",
    "bad-batch",
    "record-after-seal",
    "recorded-at-decreasing",
    "misplaced-conversation",
    "acknowledged-lost",
    "stray-file",
}


class World:
    """What the clients were told: passwords now, generation of the replaced site, acknowledged writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.passwords = {s: f"{s}-password-0-0123456789" for s in (*STABLE, REPLACED)}
        self.generation = 0
        #: (site, conversation) -> acknowledged item numbers.
        self.acked: dict[tuple[str, str], list[int]] = defaultdict(list)
        #: (site, memory id) of acknowledged creates, with the generation for the replaced site.
        self.memories: list[tuple[str, str, int]] = []
        self.codes: Counter[str] = Counter()

    def password(self, site: str) -> str:
        with self.lock:
            return self.passwords[site]


def _client(world: World, urls: list[str], index: int, seed: int, stop: threading.Event) -> None:
    rnd = random.Random(seed * 100 + index)
    with httpx2.Client(timeout=60) as http:
        n = 0
        while not stop.is_set():
            n += 1
            site = rnd.choice((*STABLE, REPLACED))
            with world.lock:
                gen = world.generation if site == REPLACED else 0
            url = rnd.choice(urls)
            who = auth(site, world.password(site))
            if n % 7 == 0:
                res = create_memory(http, url, who, new_memory(f"{site}-g{gen}"))
                code = error_code(res)
                if code is None:
                    with world.lock:
                        world.memories.append((site, res["structuredContent"]["memory"]["id"], gen))
            else:
                cid = f"{site}-g{gen}-t{index}-c{rnd.randrange(5)}"
                item = {"site": site, "gen": gen, "n": n}
                res = call(http, url, who, "append_memory", {"conversation_id": cid, "items": [item]})
                code = error_code(res)
                if code is None:
                    with world.lock:
                        world.acked[(site, cid)].append(n)
            with world.lock:
                world.codes[code or "ok"] += 1


def _convmem_ok(*args: str, input: str | None = None) -> str:
    out = run_convmem(*args, input=input)
    assert out.returncode == 0, (args, out.stdout[-1500:], out.stderr[-1500:])
    return out.stdout


def _operations(world: World, data: Path, tmp: Path, rnd: random.Random, stop: threading.Event) -> list[str]:
    """The CLI operations, in a random order, repeated until the load time is over; what ran."""
    ran: list[str] = []
    ops = ["passwd", "replace", "backup", "fsck", "import"]
    deadline = time.monotonic() + LOAD_SECONDS
    imported = False
    while time.monotonic() < deadline:
        rnd.shuffle(ops)
        for op in ops:
            if op == "passwd":
                site = rnd.choice(STABLE)
                new = f"{site}-password-{len(ran)}-0123456789"
                _convmem_ok("site", "passwd", site, "--password-stdin", "--data-dir", str(data), input=new)
                with world.lock:
                    world.passwords[site] = new
            elif op == "replace":
                _convmem_ok("site", "remove", REPLACED, "--force", "--grace", "1", "--data-dir", str(data))
                with world.lock:
                    world.generation += 1
                    new = f"{REPLACED}-password-{world.generation}-0123456789"
                # Calls admitted before the revocation may have written again: then the name needs --purge-data.
                _convmem_ok(
                    "site", "add", REPLACED, "--password-stdin", "--purge-data", "--data-dir", str(data), input=new
                )
                with world.lock:
                    world.passwords[REPLACED] = new
            elif op == "backup":
                _convmem_ok("backup", str(data), str(tmp / f"backup-{len(ran)}"))
            elif op == "fsck":
                out = run_convmem("fsck", "--repair", "--json", str(data))
                assert out.returncode in (0, 1), out.stdout[-2000:]
                # A live directory may show listings behind their logs (they resolve themselves); never damage.
                damage = [p for p in json.loads(out.stdout)["problems"] if p["kind"] in DAMAGE]
                assert not damage, damage
            elif op == "import" and not imported:
                export = tmp / "alpha.jsonl"
                _convmem_ok("export", "--site", "alpha", "--output", str(export), str(data))
                _convmem_ok(
                    "site", "add", IMPORTED, "--password-stdin", "--data-dir", str(data), input="india-pw-0123456789"
                )
                _convmem_ok("import", "--site", IMPORTED, "--input", str(export), str(data))
                imported = True
            ran.append(op)
    # Enough calls to mean something even on a loaded machine (a floor asserted below), within a bound.
    hard = time.monotonic() + 4 * LOAD_SECONDS
    while time.monotonic() < hard:
        with world.lock:
            if world.codes["ok"] > MIN_OK_CALLS:
                break
        time.sleep(0.1)
    stop.set()
    return ran


def _read_all(http: httpx2.Client, url: str, who: str, cid: str) -> list[dict[str, Any]]:
    res = call(http, url, who, "recall_memory", {"conversation_id": cid, "count": 250})
    assert error_code(res) is None, res
    return [i["payload"] if "payload" in i else i for i in res["structuredContent"]["items"]]


@pytest.mark.timeout(240)
def test_servers_and_cli_on_one_data_directory_keep_every_site_whole_and_apart(tmp_path: Path) -> None:
    seed = int(os.environ.get("COHERENCE_SEED") or random.randrange(1 << 30))
    print(f"COHERENCE_SEED={seed}")
    rnd = random.Random(seed)
    data = tmp_path / "data"
    world = World()
    creds = CredentialFile(data)
    for site, pw in world.passwords.items():
        creds.add(site, pw)
    # Three server processes: a --workers 2 server (a supervisor handing connections to two workers) and
    # a plain one.
    servers = [ServerProcess(data, "--workers", "2"), ServerProcess(data)]
    urls = [s.url for s in servers]
    stop = threading.Event()
    clients = [threading.Thread(target=_client, args=(world, urls, i, seed, stop), daemon=True) for i in range(4)]
    try:
        for t in clients:
            t.start()
        try:
            ran = _operations(world, data, tmp_path, rnd, stop)
        finally:
            stop.set()
            for t in clients:
                t.join(timeout=90)
        print("operations:", " ".join(ran), "calls:", dict(world.codes))
        assert world.codes["Corrupted"] == 0, world.codes
        assert world.codes["ok"] > MIN_OK_CALLS, world.codes
        with httpx2.Client(timeout=60) as http:
            # Everything through one server, every fifth conversation and memory through the other.
            _check(http, urls[0], world, 1)
            _check(http, urls[1], world, 5)
            # The imported site holds what alpha's export held: alpha's items, never anything else.
            who = auth(IMPORTED, "india-pw-0123456789")
            listing = call(http, urls[0], who, "list_conversations", {"limit": 100})
            for conv in listing["structuredContent"]["conversations"]:
                assert conv["conversation_id"].startswith("alpha-")
    finally:
        for s in servers:
            assert s.stop() == 0, s.log()[-3000:]
    out = run_convmem("fsck", "--json", str(data))
    assert out.returncode == 0, out.stdout[-3000:]


def _check(http: httpx2.Client, url: str, world: World, every: int) -> None:
    """Through ``url``: each site lists only its own current conversations; every ``every``-th write reads back."""
    for site in (*STABLE, REPLACED):
        who = auth(site, world.password(site))
        listing = call(http, url, who, "list_conversations", {"limit": 100})
        assert error_code(listing) is None, listing
        listed = {c["conversation_id"] for c in listing["structuredContent"]["conversations"]}
        for cid in listed:
            assert cid.startswith(f"{site}-"), (site, cid)
            if site == REPLACED:
                assert cid.startswith(f"{site}-g{world.generation}-"), (cid, world.generation)
        for (s, cid), numbers in list(world.acked.items())[::every]:
            if s != site or (site == REPLACED and not cid.startswith(f"{site}-g{world.generation}-")):
                continue
            assert cid in listed, (site, cid)
            items = _read_all(http, url, who, cid)
            assert all(i["site"] == site for i in items), items
            assert {i["n"] for i in items} >= set(numbers), (cid, numbers, items)
        for s, mid, gen in world.memories[::every]:
            if s != site or (site == REPLACED and gen != world.generation):
                continue
            got = call(http, url, who, "memory_get", {"memory_id": mid})
            assert error_code(got) is None, (site, mid, got)
