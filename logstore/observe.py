"""Optional observation of the engine, for an embedding application's metrics.

The engine reports a few measurements through one process-wide callback that
an application (the MCP server) may register; logstore itself depends on no
metrics library. With no callback registered every report is a no-op.

Events and their values:

* ``"fdatasync"``, ``"fsync"``: seconds one sync call took (data files,
  manifests and directories alike), successful or not;
* ``"lock_wait"``: seconds an append or probe waited for a conversation held
  by another thread or process (reported only when it had to wait);
* ``"append_bytes"``: size of an acknowledged batch's JSON body.

The callback runs on the engine's thread, inside the operation: it must be
fast, thread-safe, and must not raise.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

Observer = Callable[[str, float], None]

_observer: Observer | None = None


def set_observer(observer: Observer | None) -> None:
    """Register the process-wide callback (None removes it)."""
    global _observer
    _observer = observer


def emit(event: str, value: float) -> None:
    """Report one measurement to the registered callback, if any."""
    observer = _observer
    if observer is not None:
        observer(event, value)


@contextlib.contextmanager
def timed(event: str) -> Iterator[None]:
    """Report how long the ``with`` body took as ``event`` (nothing is timed without a callback)."""
    observer = _observer
    if observer is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        observer(event, time.perf_counter() - started)
