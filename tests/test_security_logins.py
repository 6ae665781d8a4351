"""Logins under a wrong-password flood: the mechanisms that keep a correct login fast (in process, real scrypt).

How fast a correct login completes during a flood is measured by
``python -m bench.probes.login_flood``; these tests pin down why: the order in
which queued checks are admitted, that invented site names never occupy a
KDF slot, and how long a cached login lives.
"""

from __future__ import annotations

import base64
from pathlib import Path

import anyio
import pytest

from convmem.logstore.site_credentials import CredentialFile, PasswordHash
from convmem.mcp_adapter import auth as auth_module
from convmem.mcp_adapter.auth import Authenticator
from convmem.mcp_adapter.errors import ToolFailure
from convmem.mcp_adapter.fairslots import FairSlots
from convmem.mcp_adapter.throttle import LoginThrottle, ThrottleSettings

pytestmark = pytest.mark.anyio

ATTACKED, QUIET = "attacked-site", "quiet-site-01"
ATTACKED_PASSWORD, QUIET_PASSWORD = "attacked-password-01", "quiet-password-0001"
#: Throttles wide enough that a flood is limited by the KDF slots only.
OPEN = ThrottleSettings(address_burst=1000, address_rate=1.0, site_burst=1000, site_rate=1.0)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def creds(tmp_path: Path) -> CredentialFile:
    creds = CredentialFile(tmp_path / "data")
    creds.add(ATTACKED, ATTACKED_PASSWORD)
    creds.add(QUIET, QUIET_PASSWORD)
    return creds


class KdfLog:
    """Records, in order, the password each real KDF run checked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.passwords: list[str] = []
        real = PasswordHash.verify

        def verify(hash_: PasswordHash, password: str) -> bool:
            self.passwords.append(password)
            return real(hash_, password)

        monkeypatch.setattr(auth_module.PasswordHash, "verify", verify)


async def _fails(authenticator: Authenticator, user: str, password: str, address: str) -> None:
    with pytest.raises(ToolFailure) as info:
        await authenticator.authenticate(header(user, password), address)
    assert info.value.code == "Unauthenticated"


async def _wait_queued(slots: FairSlots, count: int) -> None:
    with anyio.fail_after(60):
        while slots.waiting < count:
            await anyio.sleep(0.01)


async def test_a_login_for_another_site_is_admitted_before_a_floods_queued_checks(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight wrong passwords for one site are queued first; the other site's login is the next check run."""
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, throttle=LoginThrottle(OPEN), kdf_concurrency=1)
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(_fails, authenticator, ATTACKED, f"guess-{i:04d}", f"203.0.113.{i}")
        await _wait_queued(authenticator.slots, 7)  # one runs, seven wait
        assert await authenticator.authenticate(header(QUIET, QUIET_PASSWORD), "198.51.100.1") == QUIET
        assert log.passwords.index(QUIET_PASSWORD) == 1, log.passwords  # right after the check already running
        assert authenticator.slots.waiting >= 5  # the flood's queue is still there


async def test_within_an_attacked_site_another_address_gets_its_turn(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One address queues eight guesses at a site; a correct login to that site from elsewhere goes next."""
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, throttle=LoginThrottle(OPEN), kdf_concurrency=1)
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(_fails, authenticator, ATTACKED, f"guess-{i:04d}", "203.0.113.9")
        await _wait_queued(authenticator.slots, 7)
        assert await authenticator.authenticate(header(ATTACKED, ATTACKED_PASSWORD), "198.51.100.2") == ATTACKED
        assert log.passwords.index(ATTACKED_PASSWORD) == 1, log.passwords


async def test_guesses_at_one_site_leave_a_slot_free_for_the_others(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two slots, a site with failed logins lately uses one of them at most while its guesses wait."""
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, throttle=LoginThrottle(OPEN), kdf_concurrency=2)
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(_fails, authenticator, ATTACKED, f"guess-{i:04d}", f"203.0.113.{i}")
        await _wait_queued(authenticator.slots, 5)
        assert await authenticator.authenticate(header(QUIET, QUIET_PASSWORD), "198.51.100.1") == QUIET
        assert log.passwords.index(QUIET_PASSWORD) <= 3, log.passwords  # not behind the eight
        assert authenticator.slots.waiting >= 3


async def test_invented_site_names_run_no_kdf_and_leave_the_slots_free(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, throttle=LoginThrottle(OPEN), kdf_concurrency=1)
    # One real check first, so the time a check takes is known.
    assert await authenticator.authenticate(header(QUIET, QUIET_PASSWORD), "198.51.100.3") == QUIET
    assert log.passwords == [QUIET_PASSWORD]
    async with anyio.create_task_group() as tg:
        for i in range(48):
            tg.start_soon(_fails, authenticator, f"invented-{i:04d}", "whatever-000", f"192.0.2.{i}")
        await anyio.sleep(0.05)  # all 48 are waiting out their time now
        assert authenticator.slots.waiting == 0
        assert await authenticator.authenticate(header(ATTACKED, ATTACKED_PASSWORD), "198.51.100.4") == ATTACKED
    assert log.passwords == [QUIET_PASSWORD, ATTACKED_PASSWORD]  # the 48 invented names ran no KDF


async def test_an_invented_name_takes_as_long_as_a_check_without_a_real_one_to_measure(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any real check has run, the first unknown name measures one dummy KDF run; later ones reuse it."""
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, throttle=LoginThrottle(OPEN))
    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(_fails, authenticator, f"invented-{i:04d}", "whatever-000", f"192.0.2.{i}")
    assert len(log.passwords) == 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cached_login_slides_while_used_but_not_past_its_maximum_age(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = KdfLog(monkeypatch)
    clock = Clock()
    authenticator = Authenticator(creds, ttl=60, max_age=300, clock=clock)
    good = header(QUIET, QUIET_PASSWORD)
    await authenticator.authenticate(good)
    for _ in range(5):  # used every 50 s: 250 s after its check, still the one KDF run
        clock.now += 50
        await authenticator.authenticate(good)
    assert len(log.passwords) == 1
    clock.now += 59  # 309 s after the check: past the maximum age although used 59 s ago
    await authenticator.authenticate(good)
    assert len(log.passwords) == 2
    clock.now += 61  # idle longer than the sliding lifetime
    await authenticator.authenticate(good)
    assert len(log.passwords) == 3


async def test_forget_site_drops_that_sites_logins_only(creds: CredentialFile, monkeypatch: pytest.MonkeyPatch) -> None:
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds)
    await authenticator.authenticate(header(QUIET, QUIET_PASSWORD))
    await authenticator.authenticate(header(ATTACKED, ATTACKED_PASSWORD))
    assert authenticator.forget_site(QUIET) == 1
    await authenticator.authenticate(header(ATTACKED, ATTACKED_PASSWORD))
    assert len(log.passwords) == 2
    await authenticator.authenticate(header(QUIET, QUIET_PASSWORD))
    assert len(log.passwords) == 3


async def test_a_flood_of_rejections_cannot_evict_good_logins(
    creds: CredentialFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = KdfLog(monkeypatch)
    authenticator = Authenticator(creds, max_entries=4, throttle=LoginThrottle(OPEN))
    await authenticator.authenticate(header(QUIET, QUIET_PASSWORD))
    async with anyio.create_task_group() as tg:
        for i in range(12):
            tg.start_soon(_fails, authenticator, f"invented-{i:04d}", "whatever-000", f"192.0.2.{i}")
    runs = len(log.passwords)
    await authenticator.authenticate(header(QUIET, QUIET_PASSWORD))
    assert len(log.passwords) == runs


async def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    slots = FairSlots(1)
    order: list[str] = []

    async def take(name: str, site: str) -> None:
        async with slots.slot(site, None):
            order.append(name)
            await anyio.sleep(0.05)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, "first", "a")
        await anyio.sleep(0.01)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await take("cancelled", "b")  # gives up while waiting
        tg.start_soon(take, "second", "c")
    assert order == ["first", "second"]
    assert slots.waiting == 0
