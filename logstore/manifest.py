"""The site manifest: which conversations a site holds, for listings.

It is derived data, rebuilt from the segments whenever missing or damaged.
On disk it is a snapshot plus an append-only activity log (FORMAT.md):

* before a batch is written, its conversation logs an *intent*, synced for
  the conversation's first batch in the epoch (per writing process), so that
  after a power cut the log names every conversation written since its
  snapshot, even when the later, unsynced records are lost; a new
  conversation's intent is not synced: after a reboot the first listing
  *walks* the site's directories for conversations the listing does not know
  and logs a *walked* record of the boot once it found them all;
* after the batch is durable, a *commit* with the conversation's new extent
  (not synced: a power cut may lose it). It is not written at once but owed:
  the conversation's next intent carries it (one record), or the process
  logs it at its close (or with its next record once many are owed; its own
  listings apply it in memory), so an append costs one record and one locked
  write of the log. Until then the batch's intent is pending, exactly as if
  its writer had died after the data sync, and a listing in another process
  probes it;
* an intent that is never followed by a commit (its writer crashed) is
  *resolved* later by probing the conversation itself;
* a writer opening an epoch's log logs a *boot* record naming this boot of
  the machine;
* after loading an epoch, every conversation with an intent logged before the
  first boot record of this boot (a power cut since may have lost its
  commits) is checked against its log (*recovery*): a lost commit is logged
  again, so ``last_appended_at`` and the order always follow the logs. A
  compaction before that check carries those conversations into the snapshot
  as pending, so the next listing probes them.

Entries merge monotonically: a record only ever moves a conversation forward
(larger ``next_seq``), so records may be applied twice or late without harm.
In memory the committed entries are kept in a sorted list keyed by
``(-last_appended_at, conversation_id)``; a page costs a bisection plus what
it returns.

The parts, each in its own module: :mod:`logstore.manifestcodec` (the bytes),
:mod:`logstore.manifestfiles` (the lock and the epochs),
:mod:`logstore.manifestapply` (loading and applying the log),
:mod:`logstore.manifestwrite` (intents, owed commits, compaction) and
:mod:`logstore.manifestrecovery` (probes that settle, recover and walk);
here, the listing a page sees, refreshed (:meth:`SiteManifest._refresh`).
"""

from __future__ import annotations

import functools

from sortedcontainers import SortedList

from . import bootid
from .errors import StoreError
from .manifestcodec import WALKED, Entry
from .manifestrecovery import ListingRecovery


class SiteManifest(ListingRecovery):
    """One site's listing, shared safely by the threads and processes using it.

    ``probe(conversation_id, wait, settle)`` returns the conversation's true
    extent from its segments, read holding the conversation's file lock (None
    when it holds nothing; with ``wait`` False it raises Timeout rather than
    wait for a writer), and calls ``settle`` with it before letting the lock
    go. A writer holds that lock from before its intent until its batch is
    durable, so what a probe finds settles every intent logged before it.

    Every record that settles an intent from a probe is logged by ``settle``,
    under the conversation's lock (the invariant, where it is enforced:
    :mod:`logstore.manifestrecovery`). ``walk()`` yields every conversation id
    that has a directory. Both come from the store.
    """

    def _refresh(self) -> None:
        with self._mutex:
            if not self._loaded:
                self._load()
            self._tail()
            if not self._loaded:
                self._load()
                self._tail()
            # The commits this process still owes are applied to the listing in memory (a
            # listing writes nothing): its own batches are listed from them, never probed.
            with self._qlock:
                owed_now = list(self._owed.values())
            for owed in owed_now:
                self._apply(owed)
            rebuild = not self._complete
            # An intent without its commit: its writer still owes the commit (idle, or
            # at work on its next batch), or it died or failed to log the commit after
            # the data sync. Each is probed, waiting (as a read does) for a writer that
            # holds the conversation: with the commit owed, its acknowledged batch is
            # known only from the log until the writer's next intent carries the commit.
            due = [(c, p) for c in self._pending if (p := self._repo[c].pending) is not None]
        if rebuild:
            self.rebuild()
            return
        with self._recovering:
            # Other threads wait for the check rather than list what it is about to correct.
            with self._mutex:
                recover, self._recover = self._recover, set()
                walk = not self._walked
            if recover:
                self._recover_listing(recover, {c for c, _ in due})
                with self._mutex:
                    self._tail()
            if walk:
                with self._mutex:
                    self._tail()
                    walk = not self._walked  # another process may have walked meanwhile
                if walk and self._walk_unknown():
                    self._write([WALKED, bootid.boot_id, 0, 0, 0], sync=False)
                with self._mutex:
                    self._tail()
        for conv, pending in due:
            assert pending is not None
            # Probed without holding the manifest: an appender holds the conversation, then the manifest.
            try:
                self._probe(conv, True, functools.partial(self._resolve, conv, pending[2]))
            except StoreError:
                continue  # busy or damaged: listed as last committed; fsck reports damage
        if due:
            with self._mutex:
                self._tail()

    def page(self, after: tuple[int, str] | None, limit: int) -> tuple[list[Entry], bool]:
        """Up to ``limit`` entries after keyset position ``(last_us, id)``; and whether more remain."""
        self._refresh()
        with self._mutex:
            order = self._order
            if order is None:
                order = self._order = SortedList((-e.last_us, c) for c, e in self._repo.items() if e.next_seq > 0)
            i = 0 if after is None else order.bisect_right((-after[0], after[1]))
            keys = list(order.islice(i, i + limit + 1))
            more = len(keys) > limit
            out = []
            for _neg, conv in keys[:limit]:
                e = self._repo[conv]
                out.append(Entry(conv, e.created_us, e.last_us, e.next_seq))
            return out, more

    def entries(self) -> list[Entry]:
        """Every committed entry (for checks and tools)."""
        self._refresh()
        with self._mutex:
            return [
                Entry(e.conversation_id, e.created_us, e.last_us, e.next_seq)
                for e in self._repo.values()
                if e.next_seq > 0
            ]
