"""Fault 9 for the erasures: a power cut during ``convmem redact`` and ``convmem forget``, with appends around them.

The workload (recorded as in ``test_powercut.py``) appends to three
conversations, redacts a seq range of the first that spans several segments
(the active one included, held open by the appending store, two batches cut
in the middle), appends to it again, forgets the second conversation (also
held open), appends to it again (it starts afresh at seq 0) and to the third.
Every state a power cut after each recorded operation could leave is opened
as after a reboot and must show:

* every acknowledged item outside the redacted range byte for byte, and never
  part of a batch; no seq reading as ``Corrupted`` or ``ItemsLost``;
* each redacted item either as appended (the redaction's rewrite of its
  segment not yet durable) or as the tombstone, the whole record one or the
  other; only tombstones once the redaction returned;
* the forgotten conversation whole before the forget began, a prefix of it
  (never a hole) while it ran, and only what was appended after it once it
  returned;
* no file under the data directory holding a byte of the redacted items (once
  the redaction returned) or of the forgotten conversation (once the forget
  returned); fsck finding nothing the engine does not resolve by itself, the
  listing agreeing with the logs, and a further append at the next seq.

Then the redaction (and a forget that had not returned) is run again on the
state: it reaches the after state, and fsck finds nothing but what the cut
itself may leave and the engine resolves (a torn tail, an intent with no commit).

CI checks each cut point with the two fixed strict variants, one random
strict variant and the lenient model (CONVMEM_SOAK=1: many random variants).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

from convmem.logstore import FileStore, bootid
from convmem.logstore.maintenance import check, forget_conversation, redact_items

from ._common import SITE, Ack, make_batch, make_payload
from .test_powercut import (  # noqa: F401 - fixtures are used by name
    CONVS,
    OPTS,
    Recording,
    Writer,
    _check_listing,
    _files_holding,
    _pool_filled_inline,
    _print_seed,
    explore,
    read_tolerant,
    record,
    shm_path,
)

RED, GONE_CONV, PLAIN = CONVS
TOMBSTONE = {"redacted": True}
#: The redacted seqs of RED: from inside its second batch to inside its last (setup) batch.
LO, HI = 2, 11
#: Batches (conversation, items, pad) appended before recording. RED: seqs 0-12 over several segments.
SETUP = [(RED, 3, 200), (RED, 2, 300), (GONE_CONV, 2, 150), (RED, 3, 250), (RED, 2, 100), (PLAIN, 1, 60), (RED, 3, 90)]
#: Marks in the acknowledgement list (not batches): when an erasure began, when it returned.
_MARKS = ("redact-began", "redacted", "forget-began", "forgotten")


def _mark(w: Writer, what: str) -> None:
    assert w.rec is not None
    w.rec.acks.append((len(w.rec.disk.ops), Ack("", -1, -1, what, 0, 0, 0)))


def _needle(a: Ack, seq: int) -> bytes:
    """Bytes found only in the stored payload of ``seq`` of batch ``a`` (its text, a digest of its identity)."""
    assert a.pad >= 32
    return hashlib.sha256(f"{a.w}:{a.b}:{seq - a.first}".encode()).hexdigest()[:32].encode()


def _setup(w: Writer) -> None:
    for conv, n, pad in SETUP:
        w.append(conv, n, pad)
    assert sum(n for c, n, _ in SETUP if c == RED) > HI + 1


def _work(w: Writer) -> None:
    w.append(RED, 1, 40)
    w.append(GONE_CONV, 1, 80)  # the appending store holds both open, and owes the listing this commit
    _mark(w, "redact-began")
    done = redact_items(w.store.root, SITE, RED, LO, HI, lock_timeout=5.0)
    assert done.segments >= 3, done
    _mark(w, "redacted")
    w.append(RED, 2, 60)
    _mark(w, "forget-began")
    forget_conversation(w.store.root, SITE, GONE_CONV, lock_timeout=5.0)
    _mark(w, "forgotten")
    assert w.append(GONE_CONV, 1, 50).first == 0
    w.append(PLAIN, 1, 40)


def _redacted_needles(before: list[Ack]) -> list[bytes]:
    return [_needle(a, s) for a in before if a.conv == RED for s in range(a.first, a.last + 1) if LO <= s <= HI]


def _check_tail(conv: str, items: list[Any], start: int) -> None:
    """Items past the acknowledged ones: at most whole batches (an append in flight at the cut)."""
    pos = start
    while pos < len(items):
        p = items[pos].payload
        assert p != TOMBSTONE and p["i"] == 0, f"{conv}: seq {pos} starts inside a batch: {p}"
        for i in range(p["n"]):
            assert pos + i < len(items), f"{conv}: batch {p['w']}/{p['b']} at seq {pos} is cut short"
            assert items[pos + i].payload == make_payload(p["w"], p["b"], i, p["n"], p["p"]), f"{conv}: {pos + i}"
        pos += p["n"]


def _check_log(conv: str, items: list[Any], acked: list[Ack], redacted: bool | None) -> str:
    """``items`` hold exactly ``acked`` (then at most a batch in flight); RED's range as ``redacted`` says.

    ``redacted``: True, only tombstones in the range; False, only originals; None, either, per record.
    Returns which the range held ("original", "tombstones" or "" when ``conv`` is not RED).
    """
    for seq, it in enumerate(items):
        assert not isinstance(it, str), f"{conv}: seq {seq} reads as {it}"
        assert it.seq == seq
    end = 0
    seen: set[bool] = set()
    for a in acked:
        assert a.first == end, f"{conv}: batch {a.w}/{a.b} acknowledged at {a.first}, the log had {end} before it"
        for seq in range(a.first, a.last + 1):
            assert seq < len(items), f"{conv}: acknowledged seq {seq} (batch {a.w}/{a.b}) is missing"
            want = make_payload(a.w, a.b, seq - a.first, a.n, a.pad)
            got = items[seq].payload
            if conv == RED and LO <= seq <= HI:
                assert got in (want, TOMBSTONE), f"{conv}: redacted seq {seq} holds neither it nor a tombstone: {got}"
                seen.add(got == TOMBSTONE)
            else:
                assert got == want, f"{conv}: acknowledged seq {seq} holds other data: {got}"
        if conv == RED:  # one record is rewritten as a whole: its redacted items are all one or the other
            record = {items[s].payload == TOMBSTONE for s in range(max(a.first, LO), min(a.last, HI) + 1)}
            assert len(record) <= 1, f"{conv}: batch {a.b} holds tombstones and originals in the range"
        end = a.last + 1
    _check_tail(conv, items, end)
    if conv != RED:
        return ""
    if redacted is not None:
        assert seen == {redacted}, f"{conv}: the range holds {seen}, expected only {redacted}"
    return "tombstones" if seen == {True} else "original" if seen == {False} else "both"


def _check_erasure(root: str, rec: Recording, acked: list[Ack], nth: int, held: Counter[str]) -> None:
    marks = {a.w for a in acked if not a.conv}
    batches = [a for a in acked if a.conv]
    forget_began, forgotten = "forget-began" in marks, "forgotten" in marks
    began_at = _index_of_mark(acked, "forget-began")
    before_forget = [a for i, a in enumerate(batches) if a.conv == GONE_CONV and i < began_at]
    after_forget = [a for a in batches if a.conv == GONE_CONV and a not in before_forget]
    red_needles = _redacted_needles(rec.before)
    gone_needles = [_needle(a, s) for a in before_forget if a.pad >= 32 for s in range(a.first, a.last + 1)]
    # Nothing an erasure that returned removed is in any byte of any file.
    leaks = _files_holding(root, (red_needles if "redacted" in marks else []) + (gone_needles if forgotten else []))
    assert not leaks, f"erased bytes survive the cut: {leaks}"
    report = check(root)
    assert not report.unrepaired, [f"{p.kind}: {p.detail}" for p in report.unrepaired]
    booted = bootid.boot_id
    bootid.boot_id = f"restarted-after-power-cut-{nth}"
    store = FileStore(root, **OPTS)
    try:
        logs = {c: read_tolerant(store, c) for c in CONVS}
        held["opened"] += 1
        state = _check_log(RED, logs[RED], [a for a in batches if a.conv == RED], True if "redacted" in marks else None)
        held[f"range read as {state}"] += 1
        _check_log(PLAIN, logs[PLAIN], [a for a in batches if a.conv == PLAIN], None)
        gone = logs[GONE_CONV]
        if not forget_began:
            _check_log(GONE_CONV, gone, before_forget, None)
        elif not forgotten:  # a prefix of the log, never a hole, and nothing appended yet
            assert not after_forget
            full = [make_payload(a.w, a.b, i, a.n, a.pad) for a in before_forget for i in range(a.n)]
            assert [it.payload for it in gone] == full[: len(gone)], f"{GONE_CONV}: not a prefix of its log"
            held["forget in flight, a prefix left"] += 1
        else:
            _check_log(GONE_CONV, gone, after_forget, None)
        held["acknowledged batches intact"] += len(batches)
        _check_listing(store, logs)
        held["listings agree"] += 1
        conv = CONVS[nth % len(CONVS)]
        r = store.append(SITE, conv, make_batch("after", nth, 1, 10))
        assert r.first == len(logs[conv]), f"{conv}: the next append got seq {r.first}, expected {len(logs[conv])}"
        held["appends continued"] += 1
    finally:
        store.close()
        bootid.boot_id = booted
    # Run again, the erasures reach the after state.
    redact_items(root, SITE, RED, LO, HI, lock_timeout=5.0)
    if forget_began and not forgotten:
        forget_conversation(root, SITE, GONE_CONV, lock_timeout=5.0)
    leaks = _files_holding(root, red_needles + (gone_needles if forget_began else []))
    assert not leaks, f"erased bytes survive the rerun: {leaks}"
    report = check(root)  # only what the cut itself left and the engine resolves (a torn tail, an intent)
    assert not report.unrepaired, [f"{p.kind}: {p.detail}" for p in report.unrepaired]
    with FileStore(root, **OPTS) as store:
        after = read_tolerant(store, RED)
        red_batches = [a for a in batches if a.conv == RED]
        assert _check_log(RED, after[: red_batches[-1].last + 1], red_batches, True) == "tombstones"
        if forget_began and not forgotten:
            assert read_tolerant(store, GONE_CONV) == []
    held["rerun reached the after state"] += 1


def _index_of_mark(acked: list[Ack], what: str) -> int:
    """How many batches were acknowledged before mark ``what`` (all of them when it is not reached)."""
    n = 0
    for a in acked:
        if not a.conv and a.w == what:
            return n
        n += bool(a.conv)
    return n


def test_power_cut_redact_and_forget(shm_path: Path) -> None:  # noqa: F811
    rec = record(shm_path / "data", CONVS, _setup, _work)
    ops = {op[0] for op in rec.disk.ops}
    assert {"rename", "unlink", "truncate", "dirsync"} <= ops, sorted(ops)
    assert [a.w for _, a in rec.acks if not a.conv] == list(_MARKS)
    counts = explore(rec, "redact and forget", shm_path, checker=_check_erasure)
    assert counts["strict"] and counts["lenient"]
