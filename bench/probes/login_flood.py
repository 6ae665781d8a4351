"""Answers: how long does a correct first login take while wrong-password floods run?

``python -m bench.probes.login_flood``.

The target is 2 s at p99 on this machine. The probe starts a real
``convmem serve --trust-proxy 127.0.0.1`` (default login throttles; the
per-address connection cap raised, as behind any proxy) and runs
three floods at once for the whole measurement, all through spoofed
``X-Forwarded-For`` addresses:

* ``--invented`` workers (48) sending wrong passwords for invented site
  names, a new name and a new address every request;
* ``--spoofed`` workers (24) guessing the password of one real site, a new
  address every request (held to the per-site throttle);
* ``--single`` workers (8) guessing that site's password from one address
  (held to the per-address throttle).

Meanwhile, once a second, a client of another site, never seen before (a
fresh ``Authorization`` header, so a real KDF run), makes its first call
(``list_conversations``); the probe prints that call's latency at p50, p99
and max over ``--samples`` logins, the same for a few logins before the
floods start, and the load average. With 20 samples, p99 is the maximum.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2

from convmem.logstore.site_credentials import CredentialFile

ATTACKED, ATTACKED_PASSWORD = "attacked-site", "attacked-password-0001"
BODY = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_conversations"}})


def _headers(site: str, password: str, address: str) -> dict[str, str]:
    return {
        "Authorization": "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode(),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "X-Forwarded-For": address,
    }


def _start(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "convmem", "serve", "--data-dir", str(data), "--port", "0"),
            *("--trust-proxy", "127.0.0.1", "--log-level", "warning"),
            # Every connection comes from the proxy's address: its cap must hold them all.
            *("--max-connections-per-address", "256"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"MCP endpoint \(streamable HTTP\): (\S+)", line)
        if match:
            return proc, match.group(1)
    raise RuntimeError("the server did not start")


def _login(url: str, site: str, password: str, address: str) -> float:
    started = time.perf_counter()
    with httpx2.Client(timeout=300) as http:
        r = http.post(url, content=BODY, headers=_headers(site, password, address))
    elapsed = time.perf_counter() - started
    if r.status_code != 200 or r.json()["result"].get("isError"):
        raise RuntimeError(f"the correct login failed: {r.text[:300]}")
    return elapsed


def _flood(url: str, kind: str, worker: int, stop: threading.Event, counts: dict[str, int]) -> None:
    n = 0
    with httpx2.Client(timeout=300) as http:
        while not stop.is_set():
            n += 1
            serial = worker * 1_000_000 + n
            address = f"10.{serial >> 16 & 255}.{serial >> 8 & 255}.{serial & 255}"
            if kind == "invented":
                site, password = f"invented-{worker:03d}-{n:07d}", "wrong-password-000"
            elif kind == "spoofed":
                site, password = ATTACKED, f"guess-{serial}"
            else:
                site, password, address = ATTACKED, f"guess-{serial}", "198.51.100.77"
            try:
                http.post(url, content=BODY, headers=_headers(site, password, address))
            except httpx2.TransportError:
                pass
            counts[kind] = counts.get(kind, 0) + 1


def _summary(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"{name}: {len(ordered)} first logins, p50 {statistics.median(ordered):.2f} s, "
        f"p99 {p99:.2f} s, max {ordered[-1]:.2f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="correct first logins during the floods")
    parser.add_argument("--quiet-samples", type=int, default=5, help="correct first logins before the floods")
    parser.add_argument("--invented", type=int, default=48)
    parser.add_argument("--spoofed", type=int, default=24)
    parser.add_argument("--single", type=int, default=8)
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="login-flood-"))
    try:
        data = tmp / "data"
        creds = CredentialFile(data)
        creds.add(ATTACKED, ATTACKED_PASSWORD)
        sites = [(f"legit-site-{i:04d}", f"legit-password-{i:04d}") for i in range(args.samples + args.quiet_samples)]
        for site, password in sites:  # one scrypt run each: this takes a while
            creds.add(site, password)
        proc, url = _start(data)
        try:
            quiet = [_login(url, s, p, f"192.0.2.{i}") for i, (s, p) in enumerate(sites[: args.quiet_samples])]
            stop = threading.Event()
            counts: dict[str, int] = {}
            floods = [
                threading.Thread(target=_flood, args=(url, kind, w, stop, counts), daemon=True)
                for kind, n in (("invented", args.invented), ("spoofed", args.spoofed), ("single", args.single))
                for w in range(n)
            ]
            for t in floods:
                t.start()
            time.sleep(2.0)  # the floods' queues fill
            flooded: list[float] = []
            for i, (site, password) in enumerate(sites[args.quiet_samples :]):
                flooded.append(_login(url, site, password, f"203.0.113.{i}"))
                time.sleep(max(0.0, 1.0 - flooded[-1]))
            stop.set()
            for t in floods:
                t.join(300)
        finally:
            proc.terminate()
            proc.wait(60)
        print(_summary("quiet", quiet))
        print(_summary("under flood", flooded))
        print(f"flood requests answered: {dict(sorted(counts.items()))}")
        print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
