"""A closed FileStore holds no descriptor on its data directory, however often it is opened.

The site guard used to keep each site's ``site.id`` open past ``close()``:
one descriptor per open-append-close cycle, found when the power-cut suite's
soak run (thousands of reopenings in one process) died with "Too many open
files".
"""

from __future__ import annotations

import os
from pathlib import Path

from convmem.logstore import FileStore
from convmem.logstore.maintenance import check
from convmem.logstore.model import ListSelector


def _open_under(root: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(str(root)):
            found.append(target)
    return found


def test_a_closed_store_leaves_no_descriptor_open_on_its_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for i in range(30):
        store = FileStore(str(root))
        store.append(f"site-{i % 3}", f"conversation-{i % 5}", [{"i": i}])
        store.list_conversations(f"site-{i % 3}", ListSelector(limit=10))
        store.close()
        assert _open_under(root) == [], i
    check(str(root))
    assert _open_under(root) == []
