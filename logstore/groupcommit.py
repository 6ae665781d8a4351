"""Group commit: several threads' batches of one conversation in one write and one sync.

Group commit (LevelDB's writer queue): every caller queues its batch and
waits; the caller at the head of the queue is the leader. It takes the
batches queued behind it (up to :data:`GROUP_MAX_BATCHES` and
:data:`GROUP_MAX_BYTES`), writes them as separate records (each with its
own seqs and ``recorded_at``) in one write and one ``fdatasync``, and
acknowledges each; when the write or the sync fails, every batch of the
group fails and none is acknowledged. While the leader writes and syncs it
releases ``mutex`` (so that batches can queue behind it), with
``_inflight`` set: reads then use the state as it was (the group is not
acknowledged yet), and :meth:`Conversation.close` waits.

This module is the queue and its leader only; how a group is judged and
written is :meth:`logstore.writer.Writer._append_group`'s.
"""

from __future__ import annotations

import time

from . import follow, frame, idempotency
from .convstate import ConversationState
from .errors import Timeout


class Batch:
    """One caller's batch in the conversation's writer queue, and what became of it.

    ``body`` is the record's body: for a keyed batch (``key`` set) the key and
    then the items, whose digest is ``digest``. ``expect`` is the caller's
    ``expected_next_seq``. A batch answered from its key without being written
    gets a result whose ``recorded_at_us`` is 0.
    """

    __slots__ = ("body", "count", "digest", "done", "error", "expect", "key", "result", "taken")

    def __init__(self, body: bytes, count: int, key: str | None = None, expect: int | None = None) -> None:
        self.key = key
        self.expect = expect
        self.digest = idempotency.digest(body) if key is not None else b""
        self.body = frame.keyed_body(key.encode("ascii"), body) if key is not None else body
        self.count = count
        self.taken = False  # part of a group being written: the caller must wait for its outcome
        self.done = False
        self.result: tuple[int, int, int] = (0, 0, 0)
        self.error: BaseException | None = None


#: Seconds a leader waits for the writers of the last group to queue their next batches.
GATHER_WAIT = 0.0002

#: A group commit takes at most this many batches ...
GROUP_MAX_BATCHES = 64

#: ... and at most this many bytes of records (more when the first batch alone is bigger).
GROUP_MAX_BYTES = 1 << 20


class GroupCommit(ConversationState):
    """The conversation's writer queue and its leader (see the module's docstring)."""

    def append(
        self,
        body: bytes,
        count: int,
        deadline: float,
        started: float,
        key: str | None = None,
        expect: int | None = None,
    ) -> tuple[int, int, int]:
        """Append one encoded batch; return ``(first_seq, last_seq, recorded_at_us)``.

        Caller holds ``mutex``. Durable on return. Gives up with Timeout at
        ``deadline`` (a ``time.monotonic()`` value) when another process holds
        the conversation, or when the batch is still queued then.

        ``key`` (a validated idempotency key): when a retained batch carries
        it, nothing is written and its range is returned with
        ``recorded_at_us`` 0, or IdempotencyConflict is raised when its items
        differ. ``expect``: SeqConflict, nothing written, unless the batch
        would start at that seq (a keyed retry is answered before this check).
        """
        me = Batch(body, count, key, expect)
        queue = self._queue
        queue.append(me)
        if self._gathering:
            self._cond.notify_all()  # a leader waits for the writers of the last group
        while not me.done and queue[0] is not me:
            left = deadline - time.monotonic()
            if left <= 0 and not me.taken:
                queue.remove(me)
                self._cond.notify_all()
                raise Timeout(time.monotonic() - started)
            self._cond.wait(max(left, 0.001))
        if not me.done:
            self._lead(deadline, started)
        if me.error is not None:
            raise me.error
        return me.result

    def _lead(self, deadline: float, started: float) -> None:
        """Write the batches at the head of the queue as one group (this thread's batch first).

        When the last group held several batches and fewer are queued now, the
        leader first waits a little (at most :data:`GATHER_WAIT`) for their
        writers to come back with their next batch, as PostgreSQL's
        ``commit_delay`` does when other transactions are active: otherwise the
        first writer back from a group finds the queue empty and syncs alone,
        and the groups alternate between one batch and the rest.
        """
        queue = self._queue
        want = min(self._last_batches, GROUP_MAX_BATCHES)
        if 1 < want and len(queue) < want:
            self._gathering = True
            until = time.monotonic() + GATHER_WAIT
            try:
                while len(queue) < want:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._gathering = False
        group: list[Batch] = []
        size = 0
        for b in queue:
            if group and (len(group) >= GROUP_MAX_BATCHES or size + len(b.body) > GROUP_MAX_BYTES):
                break
            b.taken = True
            group.append(b)
            size += len(b.body) + frame.RECORD_OVERHEAD
        try:
            written = self._append_group(group, deadline, started)
        except BaseException as exc:
            written = len(group)
            for b in group:
                b.error = exc
        finally:
            for b in group:
                b.taken = False
        for b in group[:written]:
            b.done = True
            queue.popleft()
        self._last_batches = written
        self._cond.notify_all()
        follow.changed(self.path)  # this process's followers (others learn of the write by inotify)

    def _append_group(self, group: list[Batch], deadline: float, started: float) -> int:
        """Write a prefix of ``group`` (at least one batch) in one sync; how many (:class:`logstore.writer.Writer`)."""
        raise NotImplementedError
