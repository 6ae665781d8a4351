"""This boot of the machine, as the site manifest's activity log and the conversation pool name it.

Records logged after a ``BOOT`` record carrying :data:`boot_id` cannot have been
lost to a power cut (this boot's page cache holds them); ``pool/settled``
names the boot whose claims are all durable (:mod:`logstore.poolclaims`).
Every user reads ``bootid.boot_id`` at the time of use, so a test that sets it
simulates the restart after a power cut everywhere at once.
"""

from __future__ import annotations

import os


def _read_boot_id() -> str:
    """This boot of the machine (Linux); elsewhere a per-process id, which only makes recovery check more."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return f"process-{os.getpid()}-{os.urandom(8).hex()}"


#: Names this boot in the activity log: records logged after a ``BOOT`` record
#: carrying it cannot have been lost to a power cut (this boot's page cache holds
#: them). Tests set it to simulate the restart after a power cut.
boot_id = _read_boot_id()
