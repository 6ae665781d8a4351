"""The published tool schemas and the validation behind them state the same rules.

Each tool's input schema (``schemas.py``, ``memory_schemas.py``) is what a
client reads; the msgspec structs in ``validation.py`` and ``memory_calls.py``
are what the server enforces. Both take their bounds from the same constants,
and these tests keep them from drifting apart in either direction:

* structurally: the struct's own JSON schema (``msgspec.json.schema``) has the
  same properties, the same required set and the same bounds, types,
  patterns, enums and defaults as the published one, apart from the few rules
  listed in ``ENFORCED_ELSEWHERE`` (checked before msgspec runs, with codes of
  their own, or by the store);
* behaviourally: for every bound the published schema states on a top-level
  argument, the value at the bound is accepted by the real argument parser and
  the value one step past it is refused with a tool error. This covers the
  rules enforced by hand as well as msgspec's.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from convmem.mcp_adapter.errors import ToolFailure
from convmem.mcp_adapter.memory_calls import MEMORY_ARGUMENT_TYPES, parse_memory_arguments
from convmem.mcp_adapter.memory_schemas import MEMORY_TOOL_NAMES, memory_input_schema
from convmem.mcp_adapter.schemas import TOOL_NAMES, input_schema
from convmem.mcp_adapter.validation import ARGUMENT_TYPES, parse_arguments

Schema = dict[str, Any]

#: Published rules that the struct does not carry, and where they are enforced instead.
ENFORCED_ELSEWHERE: dict[tuple[str, str], dict[str, str]] = {
    # EmptyBatch and BatchTooLarge have codes of their own, so the parser checks them before msgspec.
    ("append_memory", "items"): {"minItems": "parse_arguments", "maxItems": "parse_arguments",
                                 "items.additionalProperties": "JSON objects are open"},
    # A memory id's shape is the store's to check (it answers NotFound / InvalidArguments itself).
    **{(tool, "memory_id"): {"minLength": "the store", "maxLength": "the store"}
       for tool in ("memory_verify", "memory_upsert", "memory_delete", "memory_get")},
    # The memory's own fields are checked by the store, which names the nested field.
    ("memory_verify", "candidate"): {"$ref": "the store"},
    ("memory_upsert", "memory"): {"$ref": "the store"},
}

#: Keywords that only describe (format names the uint64 range, checked by hand for offsets).
DESCRIPTIVE = {"description", "title", "format", "examples"}

#: A valid call of each tool, to which one argument at a time is pushed to a bound.
VALID: dict[str, dict[str, Any]] = {
    "append_memory": {"conversation_id": "conv_agreement", "items": [{"role": "user"}]},
    "recall_memory": {"conversation_id": "conv_agreement"},
    "replay_memory": {"conversation_id": "conv_agreement", "limit": 10},
    "list_conversations": {},
    "memory_verify": {"intent": "create", "candidate": {"category": "c", "subject": "s", "summary": "t"}},
    "memory_upsert": {"memory": {"category": "c", "subject": "s", "summary": "t"}},
    "memory_delete": {"memory_id": "mem_01J00000000000000000000000"},
    "memory_get": {"memory_id": "mem_01J00000000000000000000000"},
    "memory_search": {"query": "units"},
}

ALL_TOOLS = sorted((*TOOL_NAMES, *MEMORY_TOOL_NAMES))


def published(tool: str) -> Schema:
    return input_schema(tool) if tool in TOOL_NAMES else memory_input_schema(tool)


def enforced(tool: str) -> Schema:
    kind = ARGUMENT_TYPES.get(tool) or MEMORY_ARGUMENT_TYPES[tool]
    doc = msgspec.json.schema(kind)
    name = doc["$ref"].rsplit("/", 1)[1]
    return dict(doc["$defs"][name])


def parse(tool: str, arguments: dict[str, Any]) -> object:
    if tool in TOOL_NAMES:
        return parse_arguments(tool, arguments)
    return parse_memory_arguments(tool, arguments)


def normalise(node: Schema) -> Schema:
    """One property schema in a comparable form: ``anyOf [X, null]`` and ``type: [X, "null"]`` both
    become X with ``nullable``; descriptive keywords go; enums are sorted; item schemas recurse."""
    out = {k: v for k, v in node.items() if k not in DESCRIPTIVE}
    variants = out.pop("anyOf", None)
    if variants is not None:
        rest = [v for v in variants if v != {"type": "null"}]
        assert len(rest) == 1, node
        out = {**normalise(rest[0]), **out, "nullable": len(rest) < len(variants)}
    kinds = out.get("type")
    if isinstance(kinds, list):
        others = [k for k in kinds if k != "null"]
        out["type"] = others[0] if len(others) == 1 else sorted(others)
        out["nullable"] = len(others) < len(kinds)
    if "enum" in out:
        out["enum"] = sorted(out["enum"])
        out.pop("type", None)  # msgspec states an enum of strings without a type
    if isinstance(out.get("items"), dict):
        out["items"] = normalise(out["items"])
    return out


def flatten(node: Schema, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if key == "items" and isinstance(value, dict):
            flat.update(flatten(value, "items."))
        else:
            flat[prefix + key] = value
    return flat


@pytest.mark.parametrize("tool", ALL_TOOLS)
def test_the_schema_and_the_struct_have_the_same_arguments(tool: str) -> None:
    pub, enf = published(tool), enforced(tool)
    assert set(pub["properties"]) == set(enf["properties"]), tool
    assert set(pub.get("required", [])) == set(enf.get("required", [])), tool


@pytest.mark.parametrize("tool", ALL_TOOLS)
def test_the_schema_and_the_struct_state_the_same_rules(tool: str) -> None:
    pub, enf = published(tool), enforced(tool)
    for name, node in pub["properties"].items():
        elsewhere = ENFORCED_ELSEWHERE.get((tool, name), {})
        want = {k: v for k, v in flatten(normalise(node)).items() if k not in elsewhere}
        got = flatten(normalise(enf["properties"][name]))
        # An optional argument may also be given as null on the server's side (null means "not
        # given"); the published schema need not advertise that leniency.
        if got.get("nullable") and not want.get("nullable"):
            assert name not in pub.get("required", []), (tool, name)
            del got["nullable"]
            if got.get("default", "absent") is None and "default" not in want:
                del got["default"]
        if want.get("nullable") is False:
            del want["nullable"]
        # A memory's fields are published by reference; at the top level the struct takes any object.
        if "$ref" in elsewhere:
            want["type"] = "object"
        assert want == got, (tool, name, "published", want, "enforced", got)


def at_and_past(node: Schema) -> list[tuple[str, Any, Any]]:
    """(rule, a value at the bound, a value one step past it) for each bound the schema states."""
    cases: list[tuple[str, Any, Any]] = []
    if "minimum" in node:
        cases.append(("minimum", node["minimum"], node["minimum"] - 1))
    if "maximum" in node:
        cases.append(("maximum", node["maximum"], node["maximum"] + 1))
    if node.get("minLength", 0) > 0:
        n = node["minLength"]
        cases.append(("minLength", "a" * n, "a" * (n - 1)))
    if "maxLength" in node:
        n = node["maxLength"]
        cases.append(("maxLength", "a" * n, "a" * (n + 1)))
    if "pattern" in node:
        cases.append(("pattern", "a" * max(1, node.get("minLength", 1)), "a b"))
    element: Any = {"role": "user"} if node.get("items", {}).get("type") == "object" else "t"
    if node.get("minItems", 0) > 0:
        n = node["minItems"]
        cases.append(("minItems", [element] * n, [element] * (n - 1)))
    if "maxItems" in node:
        n = node["maxItems"]
        cases.append(("maxItems", [element] * n, [element] * (n + 1)))
    if "enum" in node:
        cases.append(("enum", node["enum"][0], "not-one-of-them"))
    return cases


def bound_cases() -> list[tuple[str, str, str, Any, Any]]:
    cases = []
    for tool in ALL_TOOLS:
        schema = published(tool)
        for name, node in schema["properties"].items():
            elsewhere = ENFORCED_ELSEWHERE.get((tool, name), {})
            for rule, ok, bad in at_and_past(node):
                if elsewhere.get(rule) == "the store":
                    continue
                cases.append((tool, name, rule, ok, bad))
    return cases


@pytest.mark.parametrize(("tool", "name", "rule", "ok", "bad"), bound_cases(),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
def test_every_published_bound_is_the_one_enforced(tool: str, name: str, rule: str, ok: Any, bad: Any) -> None:
    parse(tool, {**VALID[tool], name: ok})
    with pytest.raises(ToolFailure):
        parse(tool, {**VALID[tool], name: bad})


def test_the_bound_cases_cover_every_bounded_argument() -> None:
    """The probe above is not vacuous: every argument with a stated bound yields cases."""
    covered = {(tool, name) for tool, name, *_ in bound_cases()}
    for tool in ALL_TOOLS:
        for name, node in published(tool)["properties"].items():
            bounded = {"minimum", "maximum", "maxLength", "maxItems", "enum", "pattern"} & set(node)
            skipped = {r for r, where in ENFORCED_ELSEWHERE.get((tool, name), {}).items() if where == "the store"}
            if bounded - skipped:
                assert (tool, name) in covered, (tool, name)
    assert len(covered) >= 15
