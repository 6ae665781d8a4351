"""Creating a conversation: its first segment written with its first batches, or a pool entry claimed.

A conversation with no directory yet may take a pre-created one from the
site's pool (:meth:`ConversationCreation._claim_from_pool`,
:mod:`logstore.convpool`); its first segment, the conversation's identity
record between the header and the batches, is then written into the
entry's synced zeros and the rename into place is synced after the
acknowledgement (:mod:`logstore.poolclaims` moves an entry back when a power
cut undid it). Otherwise the directory is made and the first segment created
in place with the first batch (:meth:`ConversationCreation._create_first_segment`).
Either way no batch is acknowledged before the segment holding it is durable
(FORMAT.md 6, "Creating a conversation" and "A first append in one sync").
"""

from __future__ import annotations

import os

from . import convpool, fileio, frame, index, layout
from .activesegment import ActiveSegment
from .frame import SEGMENT_HEADER_SIZE
from .groupcommit import Batch
from .segmentroll import SegmentRoll


class ConversationCreation(SegmentRoll):
    """Claims a pool entry for a new conversation, and creates its first segment."""

    def _claim_from_pool(self) -> bool:
        """For a conversation with no directory yet: claim a pre-created one (:mod:`logstore.convpool`).

        True when this conversation's directory is a claimed pool entry whose
        first segment is not written yet; its lock file's flock, held, is then
        the conversation's writer lock. Caller holds ``mutex``.
        """
        if self._claim is not None:
            return True
        missing, self._missing = self._missing, None  # (a hint for this first attempt only)
        pool = self.pool
        if pool is None or not self._pool_fits(pool) or (missing is None and os.path.isdir(self.path)):
            return False
        claim = pool.claim(self.path, missing)
        if claim is None:
            return False
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self._lock_fd = claim.lock_fd
        self._claim = claim
        # What loading it would find: one segment of zeros, a torn creation, so nothing.
        self._close_files()
        self._loaded = True
        return True

    def _pool_fits(self, pool: convpool.SitePool) -> bool:
        """Whether ``pool``'s entries are the size this conversation's options give a claimed first segment."""
        return pool.entry_bytes == convpool.entry_bytes(self._first_chunk(), self.options.segment_bytes)

    def _create_first_segment(self, todo: list[Batch], stamp: int) -> None:
        """Create the conversation's first segment holding its first batches, durably, with the fewest syncs.

        The segment is created in place (FORMAT.md 6, "Creating a conversation"):
        its header, the batches' records and the first chunk of preallocated
        zeros go in one write from offset 0, so the
        header lies whole in the file's first sector; then, at the same time, its
        ``fdatasync``, the sync of the conversation directory and of each
        directory above it this process has not yet seen made durable
        (:func:`logstore.fileio.sync_dir_chain`). A power cut before all that
        leaves no segment, or one whose first sector is all zeros (a torn
        creation, which recovery treats as empty and the next append rewrites),
        or a whole header with a torn record (a torn tail): never an
        acknowledged batch. The index file is created with the first index entry.

        In a claimed pool entry (FORMAT.md 6, "A first append in one sync") the
        same write, with the conversation's identity record between the header
        and the records, goes into the entry's synced zeros, and only that file
        is synced (one ``fdatasync``): the rename into place is synced after the acknowledgement
        (:meth:`logstore.convpool.SitePool.settle_later`), and a power cut that
        undoes it leaves the entry for :mod:`logstore.poolclaims` to move back.
        """
        salt = frame.new_salt()
        records = self._encode(todo, stamp, salt)
        claim, self._claim = self._claim, None
        # The identity lies under the batch's own sync: a power cut that undoes the rename leaves
        # it beside the data, for poolclaims to move the entry back into place.
        ident = frame.encode_identity(salt, stamp, self.conversation_id) if claim is not None else b""
        data = frame.encode_segment_header(0, salt) + ident + b"".join(records)
        if claim is not None:
            # A claimed pool entry: its file is the pool's entry_bytes of synced zeros, so the write
            # goes into allocated space (extending it only when the batch is bigger, and its sync then
            # commits the new size too).
            size = claim.size if len(data) <= claim.size else self._extended_size(claim.size, len(data))
            fd = claim.seg_fd
            self._close_active()
            seg = self.active = ActiveSegment(self.path, 0, fd, salt)
            seg.pending_end = 0  # on failure the file is emptied: an empty file is a torn creation
            # The only sync: the rename is synced after the acknowledgement.
            fileio.pwrite_synced(fd, data if size == claim.size else data + bytes(size - len(data)), 0,
                                 ("after-file-create", "pool-claim-written", "before-data-sync"))
            fileio.crashpoint("pool-claim-synced")
        else:
            size = self._extended_size(0, len(data))
            # O_TRUNC: a torn creation's file may be there (only then: there is no segment otherwise).
            fd = fileio.open_create(self._seg_path(0), os.O_RDWR | os.O_TRUNC)
            self._close_active()
            seg = self.active = ActiveSegment(self.path, 0, fd, salt)
            seg.pending_end = 0  # on failure the file is emptied: an empty file is a torn creation
            fileio.pwrite_all(fd, data + bytes(size - len(data)), 0)
            fileio.crashpoint("after-file-create")
            fileio.crashpoint("before-data-sync")
            # The data sync and the directory syncs at the same time (measured faster than one after
            # the other on the benchmark machine's filesystem; see fileio.fsync_dirs). A claim that
            # failed before its first segment was durable left its directories to sync here.
            fileio.sync_dir_chain(self.path, layout.sites_dir_of_conversation(self.path), data_fd=fd,
                                  also=convpool.unsettled(self.path))
        convpool.settled(self.path)
        if claim is not None and self.pool is not None:
            self.pool.settle_later(claim)
        fileio.crashpoint("after-data-sync")
        # The pool is refilled once the append is done (_commit_group): the fill's syncs and
        # interpreter time would otherwise compete with this append's.
        self._refill_pool = self.pool is not None and self._pool_fits(self.pool)
        seg.alloc = size
        self._segments = [0]
        seg.idx = index.SparseIndex(0, salt)
        seg.idx_lazy = True
        self._written(records, todo, stamp, SEGMENT_HEADER_SIZE + len(ident))
