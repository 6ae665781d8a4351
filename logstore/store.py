"""The backend-neutral interface every store implements.

Everything above :mod:`logstore` (the MCP adapter, the tools) talks to a
:class:`MemoryStore`. The file-based engine (:class:`logstore.FileStore`) is
one implementation; a backend on another database implements the same methods
with the same semantics and errors.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import msgspec

from .model import ConversationListing, ListSelector, MemoryItem, Range, RawMemoryItem, ReadSelector, SeqRange

_encoder = msgspec.json.Encoder()


@runtime_checkable
class HealthProbe(Protocol):
    """An optional store capability: a store on a database service checks that service for ``/healthz``.

    A store without it (the file store) is healthy when its data directory is.
    """

    def ping(self) -> bool:
        """True when the backing service answers."""
        ...


@runtime_checkable
class OpenConversationCount(Protocol):
    """An optional store capability: how many conversations it holds open now (a metrics gauge)."""

    def open_conversations(self) -> int: ...


class MemoryStore(abc.ABC):
    """Durable, append-only, per-conversation logs, grouped by site (tenant).

    Sites and conversation ids are given as ``str`` and validated on every call
    (:class:`~logstore.InvalidConversationId`). Implementations are safe to use
    from many threads at once.
    """

    @abc.abstractmethod
    def append(
        self,
        site: str,
        conversation_id: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
        expected_next_seq: int | None = None,
    ) -> SeqRange:
        """Append ``payloads`` as one atomic batch; return the seqs it occupies.

        Returns only once the batch is durable. Raises ``EmptyBatch``,
        ``BatchTooLarge``, ``PayloadTooLarge``, ``InvalidPayload`` or
        ``ConversationFull`` (nothing written), ``Timeout`` (lock wait; nothing
        written), ``Io`` (not acknowledged), ``Corrupted``.

        ``idempotency_key`` (1-128 of ``[A-Za-z0-9_-]``, else
        ``InvalidIdempotencyKey``) is made durable with the batch. When a
        retained batch of the conversation carries it (the last 10,000
        batches or 24 hours, whichever is more), nothing is written: the
        same items return that batch's range, other items raise
        ``IdempotencyConflict`` naming it. ``expected_next_seq``: unless the
        batch would start at that seq, nothing is written and
        ``SeqConflict`` carries the actual next seq (a keyed retry of a
        committed batch is answered from its key first).
        """

    @abc.abstractmethod
    def read(self, site: str, conversation_id: str, selector: ReadSelector) -> list[MemoryItem]:
        """Items chosen by ``selector``, in ascending seq order.

        An unknown conversation, or a start past the end, reads as ``[]``.
        Every returned item's record has had its checksum verified.
        """

    def read_raw(self, site: str, conversation_id: str, selector: ReadSelector) -> list[RawMemoryItem]:
        """:meth:`read`, with each payload as the compact JSON bytes of its object instead of a dict.

        For callers that only pass items on (the MCP server writes them into
        its response): a backend that keeps payloads as JSON can skip
        decoding them. The same items, checks and errors as :meth:`read`;
        this default encodes what :meth:`read` returns.
        """
        return [
            RawMemoryItem(i.seq, i.recorded_at, msgspec.Raw(_encoder.encode(i.payload)))
            for i in self.read(site, conversation_id, selector)
        ]

    def try_read_raw(
        self, site: str, conversation_id: str, selector: ReadSelector, max_bytes: int
    ) -> list[RawMemoryItem] | None:
        """:meth:`read_raw` when it can be answered at once, without waiting; else None.

        For a caller on an event loop: None (this default, always) means "call
        :meth:`read_raw` in a thread". An implementation answers only when it
        needs no lock another holder could keep and reads about ``max_bytes``
        or less; its answers and errors are those of :meth:`read_raw`.
        """
        return None

    def wait_for_items(self, site: str, conversation_id: str, seq: int, timeout: float) -> bool:
        """Wait until the conversation holds seq ``seq`` (an item arrived), at most ``timeout`` seconds.

        True when it holds it. For following a conversation (``wait_ms`` of
        replay_memory): implementations wake for appends by any writer of the
        same data, without polling. This default does not wait: it says
        whether the item is there now.
        """
        return bool(self.read_raw(site, conversation_id, Range(seq, 1)))

    @abc.abstractmethod
    def list_conversations(self, site: str, selector: ListSelector) -> ConversationListing:
        """One page of the site's conversations, most recently appended first.

        Ties on ``last_appended_at`` are broken by ascending conversation id.
        """

    @abc.abstractmethod
    def sites(self) -> list[str]:
        """Names of the sites that hold (or held) conversations, sorted."""

    @abc.abstractmethod
    def drop_site(self, site: str) -> None:
        """Delete every conversation of ``site``. Irreversible."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release files and locks. Later calls raise ``Unavailable``."""

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
