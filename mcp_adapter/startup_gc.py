"""The cycle collector after start-up: what the server holds by then is left out of every later collection.

``convmem serve`` imports the SDK, pydantic's models and validators, Starlette
and uvicorn, and builds its app: about 90,000 objects the cycle collector
tracks and that live as long as the process. A ``ping`` allocates enough
short-lived objects for about 8 youngest-generation collections per 1,000
requests and, every fifteen thousand or so, a full collection, which walks
all of them again: 3-3.5 us a request averaged over those requests, each
full collection a pause of tens of milliseconds for the request it falls on
(``python -m bench.mcp_profile --floor``, against ``--without gc-freeze``;
docs/performance-mcp.md).

:func:`freeze_start_up` collects once and moves every object alive at that
point to the collector's permanent generation (``gc.freeze``), the usual
server set-up: they are never walked again, and are still freed as usual by
reference counting if dropped. The thresholds are left at Python's defaults
(raising them moved nothing measurable). Each ``--workers`` worker is a fresh
interpreter running the same start-up (:mod:`.workers`), so each freezes its
own objects; the supervisor serves no requests and does not, nor does ``--stdio``
(one client, its process as short-lived as the client's session).
"""

from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collect, then freeze every object the collector tracks now; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
