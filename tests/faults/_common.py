"""Shared helpers of the fault-injection suite (no pytest imports: writer.py uses it too).

Writers append batches whose payloads are a pure function of
``(writer, batch, index, count, pad)``, and record every acknowledged range in
an ack file (one JSON line per acknowledged batch, written with a single
``os.write`` after ``append`` returned). A verifier re-derives every payload
from that, so a checker needs nothing from the process that was killed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer.py")

#: Figures for the summary line printed at the end of the session.
STATS: Counter[str] = Counter()

SITE = "faultsite"

_COUNTED: set[object] = set()


def soak() -> bool:
    """True in soak mode (``CONVMEM_SOAK=1`` or ``--soak``)."""
    return os.environ.get("CONVMEM_SOAK", "") not in ("", "0")


def rounds(ci: int, soak_rounds: int) -> int:
    """How many rounds a randomized test runs: ``ci`` normally, many more in soak mode."""
    override = os.environ.get("CONVMEM_FAULT_ROUNDS")
    if override:
        return int(override)
    return soak_rounds if soak() else ci


def fault_rng(what: str) -> random.Random:
    """The random source of a randomised fault test, from ``CONVMEM_FAULT_SEED`` or a fresh seed.

    The seed is printed (pytest shows a failed test's output), so any failure
    can be rerun exactly with ``CONVMEM_FAULT_SEED=<seed>``.
    """
    env = os.environ.get("CONVMEM_FAULT_SEED", "")
    seed = int(env) if env else random.randrange(1, 2**32)
    print(f"{what}: seed {seed} (rerun with CONVMEM_FAULT_SEED={seed})", flush=True)
    return random.Random(seed)


#: The summary's figures, in order: (STATS key, how it reads). A figure is
#: printed only when a check that counts it ran in this session.
SUMMARY_FIGURES = [
    ("crash rounds", "crash rounds"),
    ("server kill rounds", "server kill rounds"),
    ("crash points", "crash-point runs"),
    ("crash points not reached", "crash-point runs whose point the workload never reached (not counted above)"),
    ("acked batches verified", "acked batches verified"),
    ("torn tails", "torn tails"),
    ("flipped bytes", "flipped bytes"),
    ("disk full appends", "disk-full appends"),
    ("fsync faults", "fsync faults"),
    ("lock timeouts", "lock timeouts"),
    ("clock steps", "clock steps"),
    ("derived deletions", "derived-data deletions"),
    ("bad inputs", "bad inputs"),
    ("power-cut states", "power-cut states"),
    ("power-cut strict", "of them under the strict model"),
    ("power-cut lenient", "under the lenient model"),
    ("power-cut batches checked", "acked batches checked after power cuts"),
]


def summary_line(stats: Counter[str]) -> str | None:
    """The session's one-line summary, from the counters the checks that ran set (None when none ran).

    Acknowledged items lost is a count :func:`verify` computes by comparing
    every acknowledged item with what the store returns; it is reported with
    how many such verifications ran, and as "not checked" when none did.
    """
    if not stats:
        return None
    parts = [f"{stats[key]} {words}" for key, words in SUMMARY_FIGURES if key in stats]
    known = {key for key, _ in SUMMARY_FIGURES} | {"lost", "loss checks"}
    parts += [f"{stats[key]} {key}" for key in sorted(stats) if key not in known]
    checks = stats.get("loss checks", 0)
    if checks:
        parts.append(f"{stats['lost']} acknowledged items lost (counted by {checks} verifications)")
    else:
        parts.append("acknowledged items lost: not checked (no verification ran)")
    return "faults: " + ", ".join(parts)


def make_payload(w: str, b: int, i: int, n: int, pad: int) -> dict[str, Any]:
    """Item ``i`` of ``n`` of batch ``b`` of writer ``w``; ``pad`` sizes it."""
    seed = hashlib.sha256(f"{w}:{b}:{i}".encode()).hexdigest()
    text = (seed * (pad // 64 + 1))[:pad]
    return {"w": w, "b": b, "i": i, "n": n, "p": pad, "t": text, "u": "é✓"}


def make_batch(w: str, b: int, n: int, pad: int) -> list[dict[str, Any]]:
    return [make_payload(w, b, i, n, pad) for i in range(n)]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CONVMEM_CRASH_AT", None)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def writer_cmd(*args: str) -> list[str]:
    return [sys.executable, WRITER, *args]


@dataclass(frozen=True)
class Ack:
    """One acknowledged batch: conversation, seq range, and what was in it."""

    conv: str
    first: int
    last: int
    w: str
    b: int
    n: int
    pad: int

    def line(self) -> bytes:
        d = {"c": self.conv, "f": self.first, "l": self.last, "w": self.w, "b": self.b, "n": self.n, "p": self.pad}
        return (json.dumps(d, separators=(",", ":")) + "\n").encode()


def read_acks(path: str) -> list[Ack]:
    """Acks recorded in ``path``; a last line cut short by a kill is ignored."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    out = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        try:
            d = json.loads(raw)
        except ValueError:
            continue  # the writer was killed inside the write of its last line
        out.append(Ack(d["c"], d["f"], d["l"], d["w"], d["b"], d["n"], d["p"]))
    return out


def read_all(store: Any, site: str, conv: str) -> list[Any]:
    """Every item of a conversation, by pages of Range reads."""
    from convmem.logstore import Range

    out: list[Any] = []
    while True:
        page = store.read(site, conv, Range(len(out), 1000))
        out.extend(page)
        if len(page) < 1000:
            return out


def list_all(store: Any, site: str, page: int = 7) -> list[Any]:
    """The whole listing of a site, walked page by page with cursors."""
    from convmem.logstore import ListSelector

    out: list[Any] = []
    cursor = None
    while True:
        listing = store.list_conversations(site, ListSelector(cursor=cursor, limit=page))
        out.extend(listing.summaries)
        cursor = listing.next_cursor
        if cursor is None:
            return out


def check_log(conv: str, items: list[Any]) -> None:
    """Structural checks of one conversation's items as read back.

    Seqs are 0..n-1 with no gap; every item is exactly the payload its
    ``(w, b, i, n, p)`` fields say it should be; every batch is whole
    (items 0..n-1 contiguous, one ``recorded_at``) and appears once;
    ``recorded_at`` never decreases.
    """
    seen: set[tuple[str, int]] = set()
    pos = 0
    prev_stamp = ""
    while pos < len(items):
        it = items[pos]
        assert it.seq == pos, f"{conv}: item at position {pos} has seq {it.seq} (gap or reorder)"
        p = it.payload
        w, b, n, pad = p["w"], p["b"], p["n"], p["p"]
        assert p["i"] == 0, f"{conv}: seq {pos} starts inside batch {w}/{b} (item {p['i']}): partial batch"
        assert (w, b) not in seen, f"{conv}: batch {w}/{b} appears twice"
        seen.add((w, b))
        assert pos + n <= len(items), f"{conv}: batch {w}/{b} at seq {pos} is cut short: partial batch visible"
        for i in range(n):
            item = items[pos + i]
            assert item.seq == pos + i, f"{conv}: gap at seq {pos + i}"
            assert item.payload == make_payload(w, b, i, n, pad), f"{conv}: seq {pos + i} holds wrong data"
            assert item.recorded_at == it.recorded_at, f"{conv}: batch {w}/{b} has two recorded_at values"
        assert it.recorded_at >= prev_stamp, f"{conv}: recorded_at went backwards at seq {pos}"
        prev_stamp = it.recorded_at
        pos += n


def verify(store: Any, site: str, acks: list[Ack], convs: list[str]) -> dict[str, list[Any]]:
    """Check a reopened store against every acknowledged batch; return the items read.

    Raises AssertionError naming the first broken promise. Counts lost items
    in ``STATS["lost"]`` before failing.
    """
    logs = {c: read_all(store, site, c) for c in convs}
    for conv, items in logs.items():
        check_log(conv, items)
    lost = 0
    problems = []
    for a in acks:
        items = logs[a.conv]
        for seq in range(a.first, a.last + 1):
            want = make_payload(a.w, a.b, seq - a.first, a.n, a.pad)
            if seq >= len(items) or items[seq].payload != want:
                lost += 1
                problems.append(f"{a.conv} seq {seq} (batch {a.w}/{a.b})")
    fresh = [a for a in acks if a not in _COUNTED]
    _COUNTED.update(fresh)
    STATS["acked batches verified"] += len(fresh)
    STATS["lost"] += lost
    STATS["loss checks"] += 1
    assert not problems, f"{lost} acknowledged items lost or wrong, e.g. {problems[:5]}"
    # Listing: every conversation holding an acknowledged item is listed, once, in order.
    listing = list_all(store, site)
    ids = [s.conversation_id for s in listing]
    assert len(ids) == len(set(ids)), f"listing repeats a conversation: {ids}"
    check_listing_order(listing)
    by_id = {s.conversation_id: s for s in listing}
    last_acked: dict[str, int] = {}
    for a in acks:
        last_acked[a.conv] = max(last_acked.get(a.conv, -1), a.last)
    for conv, last in last_acked.items():
        assert conv in by_id, f"{conv} holds acknowledged items but is not listed"
        s = by_id[conv]
        items = logs[conv]
        assert s.created_at == items[0].recorded_at, f"{conv}: created_at {s.created_at} != {items[0].recorded_at}"
        assert items[last].recorded_at <= s.last_appended_at <= items[-1].recorded_at, (
            f"{conv}: last_appended_at {s.last_appended_at} outside [{items[last].recorded_at}, "
            f"{items[-1].recorded_at}]"
        )
    for conv in by_id:
        assert logs.get(conv), f"listing names {conv}, which holds nothing"
    return logs


def check_listing_order(listing: list[Any]) -> None:
    """Most recently appended first; ties by ascending id (RFC 3339 text sorts in time order)."""
    for a, b in itertools.pairwise(listing):
        ok = a.last_appended_at > b.last_appended_at or (
            a.last_appended_at == b.last_appended_at and a.conversation_id < b.conversation_id
        )
        assert ok, f"listing out of order: {a} before {b}"


# ------------------------------------------------------------ directory images


def _skip_pool(dirpath: str, dirs: list[str]) -> None:
    """Leave a site's pool of pre-created conversations (logstore.convpool) out of an ``os.walk``.

    It is no conversation's data, and the engine refills it in the background.
    """
    if os.path.basename(os.path.dirname(dirpath)) == "sites" and "pool" in dirs:
        dirs.remove("pool")


def snapshot_dir(root: str) -> dict[str, bytes]:
    """Every regular file under ``root`` (relative path -> bytes), a site's pool left out."""
    out: dict[str, bytes] = {}
    for dirpath, dirs, files in os.walk(root):
        _skip_pool(dirpath, dirs)
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def restore_dir(root: str, image: dict[str, bytes]) -> None:
    """Make ``root`` hold exactly ``image`` again.

    Files this function wrote are stamped with an mtime of 1 ns past the
    epoch; any later write (by the engine or a test) moves it to the present.
    Files still carrying the stamp are not rewritten: the tests run thousands
    of cases against one small image.
    """
    stamps = _RESTORED.setdefault(root, {})
    if stamps.get("\0image") != (id(image), 0):
        shutil.rmtree(root, ignore_errors=True)
        stamps.clear()
        stamps["\0image"] = (id(image), 0)
    present: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        _skip_pool(dirpath, dirs)  # left as it is: not in the image
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel not in image:
                os.unlink(path)
                continue
            st = os.stat(path)
            if st.st_mtime_ns == 1 and stamps.get(rel) == st.st_size:
                present.add(rel)
    for rel, data in image.items():
        if rel in present:
            continue
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, ns=(1, 1))
        stamps[rel] = len(data)


_RESTORED: dict[str, dict[str, object]] = {}


def conversation_dir(root: str, site: str, conv: str) -> str:
    from convmem.logstore import layout

    return layout.conversation_dir(root, site, conv)


def segments(root: str, site: str, conv: str) -> list[str]:
    """Paths of a conversation's segments, in seq order."""
    d = conversation_dir(root, site, conv)
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".seg"))


def record_spans(path: str) -> list[tuple[int, int, int]]:
    """``(start, end, kind)`` of each record of a healthy segment file (up to its preallocated zeros)."""
    from convmem.logstore import frame

    with open(path, "rb") as f:
        data = f.read()
    pos = frame.SEGMENT_HEADER_SIZE
    out = []
    while pos + frame.RECORD_HEADER_SIZE <= len(data) and any(data[pos : pos + frame.RECORD_HEADER_SIZE]):
        h = frame.decode_record_header(data, pos)
        out.append((pos, pos + h.size, h.kind))
        pos += h.size
    return out


def build_small_store(
    root: str, convs: list[str], batches: int, *, segment_bytes: int = 1024, index_interval: int = 256, seed: int = 1
) -> dict[str, list[Any]]:
    """A store with a few multi-segment conversations; returns every conversation's items.

    Halfway through, the manifest is compacted so that the snapshot holds
    entries and the activity log holds the rest.
    """
    import random

    from convmem.logstore import FileStore

    rng = random.Random(seed)
    store = FileStore(root, segment_bytes=segment_bytes, index_interval=index_interval)
    try:
        for b in range(batches):
            conv = convs[b % len(convs)]
            store.append(SITE, conv, make_batch("s", b, rng.randint(1, 4), rng.randint(0, 90)))
            if b == batches // 2:
                store.rebuild_manifest(SITE)
        return {c: read_all(store, SITE, c) for c in convs}
    finally:
        store.close()
