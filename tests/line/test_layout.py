"""Line 0.1's module paths, names and signatures exist under ``bargein.line``, and each name is
bargein's own class, or (``Bridge``, ``RouteBuilder``: they also carry Line's in-process engine) a
subclass of it, so a Line route runs on bargein's runtime (a migration is a find-and-replace of
``line`` with ``bargein.line``)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import pytest

import bargein
from bargein.agent import context, message, nodes, routes
from bargein.line import system

LAYOUT: dict[str, list[str]] = {
    "bargein.line": [
        "Bridge",
        "Bus",
        "CallRequest",
        "ConversationContext",
        "Message",
        "Node",
        "PreCallResult",
        "ReasoningNode",
        "RouteBuilder",
        "RouteConfig",
        "VoiceAgentApp",
        "VoiceAgentSystem",
        "register_observability_event",
    ],
    "bargein.line.bridge": ["Bridge"],
    "bargein.line.bus": ["Bus", "Message"],
    "bargein.line.routes": ["RouteBuilder", "RouteConfig", "RouteHandler", "RouteState"],
    "bargein.line.harness": ["ConversationHarness"],
    "bargein.line.nodes": ["ConversationContext", "Node", "ReasoningNode"],
    "bargein.line.nodes.base": ["Node"],
    "bargein.line.nodes.reasoning": ["Node", "ReasoningNode"],
    "bargein.line.nodes.conversation_context": ["ConversationContext"],
    "bargein.line.voice_agent_system": ["VoiceAgentSystem"],
    "bargein.line.voice_agent_app": ["CallRequest", "PreCallResult", "VoiceAgentApp"],
    "bargein.line.call_request": ["CallRequest", "PreCallResult"],
    "bargein.line.user_bridge": ["register_observability_event"],
    "bargein.line.tools.system_tools": ["EndCallArgs", "EndCallTool", "end_call"],
    "bargein.line.tools.tool_types": ["ToolDefinition"],
    "bargein.line.events": [
        "AgentError",
        "AgentGenerationComplete",
        "AgentHandoff",
        "AgentResponse",
        "AgentSpeechSent",
        "AgentStartedSpeaking",
        "AgentStoppedSpeaking",
        "CustomReceived",
        "DTMFInputEvent",
        "DTMFOutputEvent",
        "EndCall",
        "EventInstance",
        "EventsRegistry",
        "EventType",
        "LogMetric",
        "ToolCall",
        "ToolResult",
        "TransferCall",
        "UserStartedSpeaking",
        "UserStoppedSpeaking",
        "UserTranscriptionReceived",
    ],
}

SUBCLASS_OF_BARGEIN: dict[str, Any] = {"Bridge": routes.Bridge, "RouteBuilder": routes.Route}
SAME_AS_BARGEIN: dict[str, Any] = {
    "Message": message.Message,
    "Node": nodes.Node,
    "ReasoningNode": nodes.ReasoningNode,
    "ConversationContext": context.ConversationContext,
    "VoiceAgentSystem": system.VoiceAgentSystem,
    "CallRequest": system.CallRequest,
}


@pytest.mark.parametrize(
    "module, name", [(m, n) for m, names in LAYOUT.items() for n in names], ids=lambda v: str(v)
)
def test_line_names_import_from_line_module_paths(module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    if name in SUBCLASS_OF_BARGEIN:
        assert issubclass(obj, SUBCLASS_OF_BARGEIN[name]), f"{module}.{name} is not a bargein {name}"
    elif name in SAME_AS_BARGEIN:
        assert obj is SAME_AS_BARGEIN[name], f"{module}.{name} is not bargein's own {name}"
    elif (
        module == "bargein.line.events"
        and name[0].isupper()
        and name
        not in (
            "EventType",
            "EventInstance",
            "EventsRegistry",
        )
    ):
        assert obj is getattr(bargein, name), f"{module}.{name} is not bargein.{name}"


@pytest.mark.parametrize("module", sorted(LAYOUT))
def test_every_exported_name_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    for name in getattr(mod, "__all__", []):
        assert getattr(mod, name) is not None


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def test_bridge_on_takes_filter_fn_and_event_property_filters() -> None:
    from bargein.line import Bridge

    params = _params(Bridge.on)
    assert "filter_fn" in params
    assert any(p.kind is p.VAR_KEYWORD for p in params.values())


def test_route_methods_have_lines_arguments() -> None:
    from bargein.line import RouteBuilder

    interrupt = _params(RouteBuilder.interrupt_on)
    assert list(interrupt)[1:4] == ["event_type", "handler", "filter_fn"]  # Line's, positionally too
    assert interrupt["handler"].default is None and interrupt["filter_fn"].default is None
    assert "condition" in interrupt  # the seed's name for filter_fn
    for method in (RouteBuilder.suspend_on, RouteBuilder.resume_on):
        assert list(_params(method))[1:3] == ["event_type", "handler"]
    assert _params(RouteBuilder.broadcast)["event_type"].default is None
    for name in ("map", "filter", "stream", "on"):
        assert callable(getattr(RouteBuilder, name))


def test_node_and_reasoning_node_constructors() -> None:
    from bargein.line import Node, ReasoningNode

    assert _params(Node.__init__)["node_id"].default is None
    params = _params(ReasoningNode.__init__)
    assert list(params)[1:4] == ["system_prompt", "max_context_length", "node_id"]
    assert params["max_context_length"].default == 100 and params["node_id"].default is None
    for name in ("start", "cleanup", "on_interrupt_generate", "generate"):
        assert callable(getattr(Node, name))
    for name in ("add_event", "clear_context", "process_context", "generate"):
        assert callable(getattr(ReasoningNode, name))
    node = ReasoningNode("be brief", node_id="n")
    assert node.conversation_events == [] and node.id == "n" and node.system_prompt == "be brief"


def test_conversation_context_fields_and_methods() -> None:
    from bargein.line.nodes.conversation_context import ConversationContext

    assert [f.name for f in dataclasses.fields(ConversationContext)] == [
        "events",
        "system_prompt",
        "metadata",
    ]
    assert _params(ConversationContext.format_events)["max_messages"].default is None
    for name in (
        "get_latest_user_transcript_message",
        "get_event_count",
        "add_metadata",
        "get_committed_events",
    ):
        assert callable(getattr(ConversationContext, name))


def test_message_has_lines_fields() -> None:
    from bargein.line.bus import Message
    from bargein.line.events import UserStartedSpeaking

    m = Message(event=UserStartedSpeaking(), source="user")
    assert (m.source, type(m.event)) == ("user", UserStartedSpeaking)
    assert isinstance(m.id, str) and m.id and isinstance(m.timestamp, float)


def test_voice_agent_system_methods() -> None:
    from bargein.line import VoiceAgentSystem

    for name in ("with_speaking_node", "with_node", "send_initial_message", "start", "wait_for_shutdown"):
        assert callable(getattr(VoiceAgentSystem, name))
    assert list(_params(VoiceAgentSystem.with_speaking_node))[1:] == ["node", "bridge"]
    assert list(_params(VoiceAgentSystem.with_node))[1:] == ["node", "bridge"]


def _line_events() -> Any:
    from bargein.line import events

    return events


# Each event of the issue's list, built with Line 0.1.12's field names.
LINE_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("UserStartedSpeaking", {}),
    ("UserStoppedSpeaking", {}),
    ("UserTranscriptionReceived", {"content": "hello"}),
    ("AgentStartedSpeaking", {}),
    ("AgentStoppedSpeaking", {}),
    ("AgentSpeechSent", {"content": "hi"}),
    ("AgentResponse", {"content": "hi"}),
    ("AgentGenerationComplete", {}),
    ("ToolCall", {"tool_name": "lookup", "tool_args": {"q": 1}, "tool_call_id": "c1"}),
    ("ToolResult", {"tool_name": "lookup", "tool_args": {"q": 1}, "result": {"a": 2}, "tool_call_id": "c1"}),
    ("EndCall", {}),
    ("TransferCall", {"target_phone_number": "+15550100"}),
    ("AgentHandoff", {"target_agent": "billing", "reason": "asked for billing"}),
    ("AgentError", {"error": "the tool failed", "code": "tool"}),
    ("DTMFInputEvent", {"button": "5"}),
    ("DTMFOutputEvent", {"button": "#"}),
    ("CustomReceived", {"metadata": {"plan": "gold"}}),
    ("LogMetric", {"name": "latency_ms", "value": 12.5}),
]


@pytest.mark.parametrize("name, fields", LINE_EVENTS, ids=[n for n, _ in LINE_EVENTS])
def test_line_events_take_lines_fields_and_cross_the_wire(name: str, fields: dict[str, Any]) -> None:
    from bargein.line.bus import Message
    from bargein.wire.envelope import decode_message, encode_message

    cls = getattr(_line_events(), name)
    event = cls(**fields)
    for key, value in fields.items():
        assert getattr(event, key) == value
    decoded = decode_message(encode_message(Message(event=event, session="s1"))).event
    assert decoded == event


def test_agent_response_chunk_type_defaults_to_text() -> None:
    assert _line_events().AgentResponse(content="x").chunk_type == "text"


# Line 0.1.12 fields beyond the issue's list that migrated agents set or read.
LINE_EXTRA_FIELDS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("TransferCall", {"target_phone_number": "+15550100", "timeout_s": 20}, {"timeout_s": 20}),
    ("ToolCall", {"tool_name": "t", "raw_response": {"id": "r"}}, {"raw_response": {"id": "r"}}),
    (
        "ToolResult",
        {"tool_name": "t", "result": {"a": 1}, "metadata": {"ms": 3}},
        {"metadata": {"ms": 3}, "result_str": '{"a": 1}', "success": True},
    ),
]


@pytest.mark.parametrize(
    "name, fields, expected", LINE_EXTRA_FIELDS, ids=[n for n, _, _ in LINE_EXTRA_FIELDS]
)
def test_line_extra_event_fields(name: str, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    event = getattr(_line_events(), name)(**fields)
    for key, value in expected.items():
        assert getattr(event, key) == value


@pytest.mark.parametrize("name", ["DTMFStoppedEvent", "UserUnknownInputReceived"])
def test_line_events_bargein_lacks(name: str) -> None:
    """Line 0.1.12 defined these and its DTMF example broadcast DTMFStoppedEvent."""
    assert issubclass(getattr(_line_events(), name), _line_events().Event)
