"""`convmem serve` freezes its start-up objects out of the cycle collector: garbage collected first, the rest frozen."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import gc, json, weakref
    from convmem.mcp_adapter import startup_gc

    class Node:
        pass

    garbage = Node(); garbage.self = garbage  # a cycle nothing refers to: start-up garbage
    dead = weakref.ref(garbage)
    del garbage
    kept = Node(); kept.self = kept  # a cycle the process keeps
    thresholds = gc.get_threshold()
    frozen = startup_gc.freeze_start_up()
    tracked = {id(o) for o in gc.get_objects()}
    after = Node(); after.self = after  # made after start-up: an ordinary collected object
    seen_after = id(after) in {id(o) for o in gc.get_objects()}
    print(json.dumps({
        "frozen": frozen, "freeze_count": gc.get_freeze_count(), "garbage_freed": dead() is None,
        "kept_frozen": id(kept) not in tracked, "after_tracked": seen_after, "enabled": gc.isenabled(),
        "thresholds_unchanged": gc.get_threshold() == thresholds,
    }))
    """
)


def test_start_up_objects_are_collected_once_then_frozen() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60)
    seen = json.loads(out.stdout)
    assert seen["frozen"] > 1000 and seen["frozen"] == seen["freeze_count"]  # the imports' objects, at least
    assert seen["garbage_freed"]  # collected before the freeze, not frozen with the rest
    assert seen["kept_frozen"]  # a live start-up object is out of every later collection
    assert seen["after_tracked"]  # later objects are collected as usual
    assert seen["enabled"] and seen["thresholds_unchanged"]


def test_serve_freezes_before_its_event_loop_runs() -> None:
    import inspect

    from convmem.mcp_adapter import serve

    source = inspect.getsource(serve.serve_http)
    assert source.index("startup_gc.freeze_start_up()") < source.index("run_event_loop)(_serve_uvicorn(")
