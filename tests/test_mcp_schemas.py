"""The tool schemas match the contract exactly, apart from our own descriptions.

The only additions to the spec's schemas are optional properties: ``memory_context`` on the requests of
append_memory and recall_memory, ``memories`` (with its ``SurfacedMemory`` definition) on their responses.
"""

from __future__ import annotations

from typing import Any

import pytest

from convmem.mcp_adapter.memory_schemas import MEMORY_TOOL_NAMES
from convmem.mcp_adapter.schemas import TOOL_NAMES, input_schema, output_schema
from convmem.mcp_adapter.tools import tool_definitions

# The contract's schemas with every "description" removed (structure, bounds, defaults, titles).
EXPECTED: dict[str, dict[str, Any]] = {
    "AppendMemoryRequest": {
        "properties": {
            "conversation_id": {"type": "string"},
            "items": {
                "items": {"additionalProperties": True, "type": "object"},
                "maxItems": 250,
                "minItems": 1,
                "type": "array",
            },
        },
        "required": ["conversation_id", "items"],
        "title": "AppendMemoryRequest",
        "type": "object",
    },
    "AppendMemoryResponse": {
        "properties": {
            "first_seq": {"format": "uint64", "minimum": 0, "type": "integer"},
            "last_seq": {"format": "uint64", "minimum": 0, "type": "integer"},
        },
        "required": ["first_seq", "last_seq"],
        "title": "AppendMemoryResponse",
        "type": "object",
    },
    "ListConversationsRequest": {
        "properties": {
            "cursor": {"default": None, "type": ["string", "null"]},
            "limit": {"default": 50, "format": "uint64", "maximum": 1000, "minimum": 0, "type": "integer"},
        },
        "title": "ListConversationsRequest",
        "type": "object",
    },
    "ListConversationsResponse": {
        "$defs": {
            "McpConversationSummary": {
                "properties": {
                    "conversation_id": {"type": "string"},
                    "created_at": {"type": "string"},
                    "last_appended_at": {"type": "string"},
                },
                "required": ["conversation_id", "created_at", "last_appended_at"],
                "type": "object",
            }
        },
        "properties": {
            "conversations": {"items": {"$ref": "#/$defs/McpConversationSummary"}, "type": "array"},
            "next_cursor": {"type": ["string", "null"]},
        },
        "required": ["conversations"],
        "title": "ListConversationsResponse",
        "type": "object",
    },
    "RecallMemoryRequest": {
        "properties": {
            "conversation_id": {"type": "string"},
            "count": {"default": 50, "format": "uint64", "maximum": 1000, "minimum": 0, "type": "integer"},
        },
        "required": ["conversation_id"],
        "title": "RecallMemoryRequest",
        "type": "object",
    },
    "RecallMemoryResponse": {
        "$defs": {
            "McpMemoryItem": {
                "properties": {
                    "payload": {"additionalProperties": True, "type": "object"},
                    "recorded_at": {"type": "string"},
                    "seq": {"format": "uint64", "minimum": 0, "type": "integer"},
                },
                "required": ["seq", "recorded_at", "payload"],
                "type": "object",
            }
        },
        "properties": {"items": {"items": {"$ref": "#/$defs/McpMemoryItem"}, "type": "array"}},
        "required": ["items"],
        "title": "RecallMemoryResponse",
        "type": "object",
    },
    "ReplayMemoryRequest": {
        "properties": {
            "conversation_id": {"type": "string"},
            "limit": {"format": "uint64", "maximum": 1000, "minimum": 0, "type": "integer"},
            "offset": {"default": 0, "format": "uint64", "minimum": 0, "type": "integer"},
        },
        "required": ["conversation_id", "limit"],
        "title": "ReplayMemoryRequest",
        "type": "object",
    },
    "ReplayMemoryResponse": {
        "$defs": {
            "McpMemoryItem": {
                "properties": {
                    "payload": {"additionalProperties": True, "type": "object"},
                    "recorded_at": {"type": "string"},
                    "seq": {"format": "uint64", "minimum": 0, "type": "integer"},
                },
                "required": ["seq", "recorded_at", "payload"],
                "type": "object",
            }
        },
        "properties": {"items": {"items": {"$ref": "#/$defs/McpMemoryItem"}, "type": "array"}},
        "required": ["items"],
        "title": "ReplayMemoryResponse",
        "type": "object",
    },
}

TOOLS = {
    "append_memory": ("AppendMemoryRequest", "AppendMemoryResponse"),
    "recall_memory": ("RecallMemoryRequest", "RecallMemoryResponse"),
    "replay_memory": ("ReplayMemoryRequest", "ReplayMemoryResponse"),
    "list_conversations": ("ListConversationsRequest", "ListConversationsResponse"),
}


def strip_descriptions(node: Any) -> Any:
    """``node`` without any ``description`` member, recursively."""
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


#: The optional long-term memory additions, per spec tool: (request properties, response properties, response $defs).
ADDITIONS = {
    "append_memory": ({"memory_context", "idempotency_key", "expected_next_seq"}, {"memories"}, {"SurfacedMemory"}),
    "recall_memory": ({"memory_context"}, {"memories"}, {"SurfacedMemory"}),
    "replay_memory": ({"wait_ms"}, set(), set()),
}


def without_additions(tool: str, request: dict[str, Any], response: dict[str, Any]) -> tuple[Any, Any]:
    """The schemas with our optional additions removed, after checking that they are optional."""
    req_props, resp_props, resp_defs = ADDITIONS.get(tool, (set(), set(), set()))
    for schema, props in ((request, req_props), (response, resp_props)):
        assert props <= set(schema["properties"]), (tool, props)
        assert not props & set(schema.get("required", [])), "an addition must be optional"
        for name in props:
            del schema["properties"][name]
    for name in resp_defs:
        del response["$defs"][name]
    if "$defs" in response and not response["$defs"]:
        del response["$defs"]
    return request, response


def property_nodes(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every property schema, including those under ``$defs``."""
    nodes = list(schema["properties"].values())
    for definition in schema.get("$defs", {}).values():
        nodes += list(definition["properties"].values())
    return nodes


def test_tool_names_are_the_contracts() -> None:
    assert set(TOOL_NAMES) == set(TOOLS)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_schemas_match_the_contract_exactly(tool: str) -> None:
    request, response = TOOLS[tool]
    got_request, got_response = without_additions(tool, input_schema(tool), output_schema(tool))
    assert strip_descriptions(got_request) == EXPECTED[request]
    assert strip_descriptions(got_response) == EXPECTED[response]


def test_memory_context_bounds() -> None:
    for tool in ("append_memory", "recall_memory"):
        prop = input_schema(tool)["properties"]["memory_context"]
        assert (prop["type"], prop["minLength"], prop["maxLength"]) == ("string", 1, 1000)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_property_is_described(tool: str) -> None:
    for schema in (input_schema(tool), output_schema(tool)):
        for node in property_nodes(schema):
            assert isinstance(node.get("description"), str) and len(node["description"]) > 20, node


def test_schema_copies_are_independent() -> None:
    first = input_schema("append_memory")
    first["properties"]["items"]["maxItems"] = 1
    assert input_schema("append_memory")["properties"]["items"]["maxItems"] == 250


def test_tool_definitions_carry_the_schemas_and_annotations() -> None:
    tools = {t.name: t for t in tool_definitions()}
    assert set(tools) == set(TOOLS) | set(MEMORY_TOOL_NAMES)
    for name, tool in tools.items():
        if name in MEMORY_TOOL_NAMES:
            continue
        assert tool.input_schema == input_schema(name)
        assert tool.output_schema == output_schema(name)
        assert tool.description and len(tool.description) > 200
        assert tool.annotations is not None
        assert tool.annotations.destructive_hint is False
        assert tool.annotations.read_only_hint is (name != "append_memory")
