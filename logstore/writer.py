"""The append path: one batch, one record, durable before it is acknowledged.

An append holds the conversation exclusively (thread mutex and file lock),
re-verifies the tail (:mod:`logstore.recovery`), logs its intent in the site
manifest, writes the record and syncs it, then owes the manifest its commit
(kept in memory and carried by the conversation's next intent, or logged at
close; FORMAT.md section 5: no manifest write after the sync). Each batch of a
group is judged here (:meth:`Writer._append_group`: answered from its
idempotency key, refused for a seq conflict or the item limit) before the
group is written.

The parts, each in its own module: :mod:`logstore.groupcommit` (the writer
queue and its leader), :mod:`logstore.convcreate` (a conversation's first
segment, or a claimed pool entry), :mod:`logstore.segmentroll` (rolling to
the next segment), :mod:`logstore.activewrites` (a group's write and sync
into the active segment, :class:`logstore.activesegment.ActiveSegment`) and
:mod:`logstore.preallocation` (the zero-filled space ahead, and extend-ahead).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from . import fileio, frame, idempotency
from .convcreate import ConversationCreation
from .convstate import Tip
from .errors import ConversationFull, IdempotencyConflict, IdempotencyRedacted, Io, SeqConflict
from .frame import SEGMENT_HEADER_SIZE
from .groupcommit import Batch, GroupCommit
from .limits import MAX_CONVERSATION_ITEMS
from .redaction import redacted_in_retry
from .timefmt import now_us


class Writer(GroupCommit, ConversationCreation):
    """Appends batches to the conversation's active segment (see the module's docstring)."""

    #: The idempotency keys of recent batches (:mod:`logstore.idempotency`), built on the first keyed append.
    _keys: idempotency.KeyTable | None = None

    def _append_group(self, group: list[Batch], deadline: float, started: float) -> int:
        """Append a prefix of ``group`` (at least one batch), each its own record, in one sync; how many.

        A batch that would take the conversation past its item limit fails
        alone (ConversationFull); batches left out (the group did not fit the
        segment) stay queued for the next leader.
        """
        # What _exclusive does, without a generator's cost on every append.
        self._take_exclusive(deadline, started)
        try:
            # recorded_at never decreases within a conversation, whatever the wall clock does.
            stamp = max(now_us(), self._last_us)
            nxt = self._next_seq
            if len(group) == 1 and group[0].key is None and group[0].expect is None:
                b = group[0]
                if nxt + b.count > MAX_CONVERSATION_ITEMS:
                    b.error = ConversationFull(MAX_CONVERSATION_ITEMS, nxt + b.count)
                    return 1
                b.result = (nxt, nxt + b.count - 1, stamp)
                self._commit_group(group, stamp)  # one batch always fits (a segment takes at least one)
                self._note_keys(group)
                return 1
            keys = self._key_table() if any(b.key is not None for b in group) else None
            pending: dict[str, Batch] = {}  # keys of this group's batches to be written
            todo: list[Batch] = []
            for b in group:
                b.error = None  # a batch left over from the last group is judged afresh
                if b.key is not None and self._answer_from_key(b, keys, pending):
                    continue
                if b.expect is not None and b.expect != nxt:
                    b.error = SeqConflict(b.expect, nxt)
                    continue
                if nxt + b.count > MAX_CONVERSATION_ITEMS:
                    b.error = ConversationFull(MAX_CONVERSATION_ITEMS, nxt + b.count)
                    continue
                b.result = (nxt, nxt + b.count - 1, stamp)
                nxt += b.count
                todo.append(b)
                if b.key is not None:
                    pending[b.key] = b
            if todo:
                taken = self._commit_group(todo, stamp)
                self._note_keys(todo[:taken])
                if taken < len(todo):
                    # Left for the next leader: every batch behind the last one written.
                    return group.index(todo[taken])
            return len(group)
        finally:
            self._unlock()

    def _load(self, writable: bool) -> None:
        """Load the log afresh (as :class:`Recovery`); a log that lost seqs was forgotten since.

        The listing's commits this process still owes for those seqs are then
        stale, and are dropped.
        """
        known = self._next_seq if self._loaded else 0
        super()._load(writable)
        if self._next_seq < known:
            self.manifest.shrank(self.conversation_id, self._next_seq)

    def _key_table(self) -> idempotency.KeyTable:
        """The conversation's key table, current with the log (exclusive lock held, tail verified)."""
        table = self._keys
        if table is None or table.covered > self._next_seq:
            table = self._keys = idempotency.build(self)
        elif table.covered < self._next_seq:
            idempotency.catch_up(self, table)  # another process appended since
        return table

    def _answer_from_key(self, b: Batch, keys: idempotency.KeyTable | None, pending: dict[str, Batch]) -> bool:
        """Answer a keyed batch from a retained batch with its key, if any (True: nothing to write)."""
        assert b.key is not None and keys is not None
        found = keys.get(b.key)
        stored: tuple[bytes, list[bytes]] | None = None
        if found is not None:
            first, last, dig = found.first, found.last, found.digest
            # The batch as stored now decides: a redaction since may have rewritten it (the table's
            # digest is of the items as appended). A retry is rare; this reads one record.
            stored = idempotency.stored_batch(self, first)
            if stored is not None:
                dig = stored[0]
        elif (twin := pending.get(b.key)) is not None:
            first, last, dig = twin.result[0], twin.result[1], twin.digest  # the same key twice in one group
        else:
            return False
        if dig != b.digest:
            b.error = self._key_conflict(b, first, last, stored[1] if stored is not None else None)
        else:
            b.result = (first, last, 0)
        return True

    @staticmethod
    def _key_conflict(b: Batch, first: int, last: int, stored: list[bytes] | None) -> IdempotencyConflict:
        """The error of a keyed retry whose items differ from its batch's ``stored`` items (None: unknown):
        IdempotencyRedacted when a redaction of the batch may be why, else IdempotencyConflict."""
        assert b.key is not None
        if stored is not None:
            retried = [bytes(r) for r in idempotency.RAW_ITEMS.decode(frame.items_body(frame.KIND_KEYED, b.body))]
            hidden = redacted_in_retry(stored, retried)
            if hidden is not None:
                return IdempotencyRedacted(b.key, first, last, [first + i for i in hidden])
        return IdempotencyConflict(b.key, first, last)

    def _note_keys(self, written: list[Batch]) -> None:
        """Keep the key table (if built) current with batches just written (``mutex`` held)."""
        table = self._keys
        if table is None or not written or table.covered != written[0].result[0]:
            return  # not built, or behind the log: the next keyed append catches it up
        for b in written:
            table.note(b.key, b.result[0], b.result[1], b.digest, b.result[2])
        table.prune(written[-1].result[2])

    @contextlib.contextmanager
    def _exclusive(self, deadline: float, started: float) -> Iterator[None]:
        """Hold the conversation for writing, its tail verified and undamaged. Caller holds ``mutex``."""
        self._take_exclusive(deadline, started)
        try:
            yield
        finally:
            self._unlock()

    def _take_exclusive(self, deadline: float, started: float) -> None:
        """Take the file lock (exclusive) and verify the tail, as :meth:`_exclusive`; the caller unlocks."""
        if self.active is None:
            # No segment open: a lease proves nothing about a state that must be loaded anyway, and a
            # claim would replace its descriptor (closing it would let the lock go behind our back).
            self._release_lease()
        if self.active is None and not self._claim_from_pool():
            # No segment open: the directory may not exist yet. Made here, unsynced (its lock
            # file lives in it); the first segment's creation makes it durable before any
            # batch in it is acknowledged (_create_first_segment).
            fileio.make_dirs(self.path)
        fileio.resync_failed_dirs(self.path)
        # Held already (an extend-ahead job of ours, or our lease: see ConversationState._lock):
        # nobody else can have written, so the state is current, unless it was dropped since or
        # loaded by a read (read-only descriptors).
        held = self._lock(True, deadline, started)
        try:
            try:
                seg = self.active
                current = held and self._loaded and seg is not None and self._damage is None and (
                    seg.idx_fd is not None or seg.idx_lazy
                )
                if not current and self._claim is None:
                    # A claimed pool entry: its state was set at the claim (nobody else can write it).
                    self._refresh(True)
            except OSError as exc:
                self._close_files()
                raise Io(f"reading the conversation's tail failed: {exc}", exc.errno) from exc
            if self._damage is not None:
                raise self._damage
        except BaseException:
            self._unlock()
            raise

    def _commit_group(self, todo: list[Batch], stamp: int) -> int:
        """Log the intent, write and sync the records, log the commit (inside :meth:`_exclusive`); batches written."""
        seg = self.active
        if seg is not None:
            seg.pending_end = None
        limit = self.options.segment_bytes
        first_size = len(todo[0].body) + frame.RECORD_OVERHEAD
        roll = bool(self._segments) and seg is not None and (
            seg.sealed or (seg.end > SEGMENT_HEADER_SIZE and seg.end + first_size > limit)
        )
        # Only the records that fit the segment (at least one): the rest wait for the next group.
        n, end = 0, seg.end if seg is not None and self._segments and not roll else SEGMENT_HEADER_SIZE
        if self._claim is not None:
            end += frame.RECORD_OVERHEAD + len(self.conversation_id)  # the identity record (_create_first_segment)
        for b in todo:
            size = len(b.body) + frame.RECORD_OVERHEAD
            if n and end + size > limit:
                break
            end += size
            n += 1
        todo = todo[:n]
        first = todo[0].result[0]
        last = todo[-1].result[1] + 1
        created = self._created_us if self._created_us is not None else stamp
        tip = Tip(created, stamp, last)
        self.manifest.intent(self.conversation_id, tip, new=first == 0)
        fileio.crashpoint("manifest-intent")
        try:
            if not self._segments:
                self._create_first_segment(todo, stamp)
            else:
                if roll:
                    self._roll()
                assert self.active is not None
                self._write_records(self._encode(todo, stamp, self.active.salt), todo, stamp)
        except OSError as exc:
            self._poison()
            raise Io(f"appending to the log failed: {os.strerror(exc.errno or errno.EIO)}", exc.errno) from exc
        self._created_us = created
        # In memory only (no I/O, nothing to fail): the batches are durable and acknowledged
        # whatever becomes of the owed commit; a listing elsewhere probes the pending intent.
        self.manifest.commit(self.conversation_id, tip)
        fileio.crashpoint("manifest-commit")
        self._schedule_extension()
        return n

    def _commit_batch(self, body: bytes, count: int, first: int, stamp: int) -> None:
        """Append one batch at seq ``first`` stamped ``stamp`` (a restore; in :meth:`_exclusive`, ``mutex`` held)."""
        b = Batch(body, count)
        b.result = (first, first + count - 1, stamp)
        self._commit_group([b], stamp)
