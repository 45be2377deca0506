"""The helpers Line's examples imported besides the route API: ``line.tools.system_tools`` (ending
the call from a tool call) and ``line.user_bridge.register_observability_event``."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import pytest

from bargein.line import Bridge, Node, VoiceAgentSystem, register_observability_event
from bargein.line.events import AgentResponse, CustomReceived, EndCall, LogMetric
from bargein.line.tools.system_tools import EndCallArgs, EndCallTool, end_call
from bargein.line.tools.tool_types import ToolDefinition
from bargein.testing import LocalSession

from . import line_agent, wait_for


async def test_end_call_says_goodbye_then_ends_the_call() -> None:
    items = [item async for item in end_call(EndCallArgs(goodbye_message="Bye now."))]
    assert items == [AgentResponse(content="Bye now."), EndCall()]


def test_end_call_tool_declarations() -> None:
    assert issubclass(EndCallTool, ToolDefinition) and EndCallTool.name() == "end_call"
    openai: Any = EndCallTool.to_openai_tool()
    assert openai["type"] == "function" and openai["name"] == "end_call"
    assert openai["parameters"]["required"] == ["goodbye_message"]
    anthropic: Any = EndCallTool.to_anthropic_tool()
    assert anthropic["name"] == "end_call" and "goodbye_message" in anthropic["input_schema"]["properties"]


def test_end_call_gemini_declaration_needs_google_genai() -> None:
    if importlib.util.find_spec("google.genai") is None:
        with pytest.raises(ImportError, match="google-genai"):
            EndCallTool.to_gemini_tool()
    else:
        tool = EndCallTool.to_gemini_tool()
        assert tool.function_declarations[0].name == "end_call"


async def test_register_observability_event_logs_what_the_bridge_hears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="n")
        bridge = Bridge(node)
        register_observability_event(bridge, None, LogMetric)
        system.with_speaking_node(node, bridge)

    caplog.set_level(logging.INFO, logger="bargein.line.observability")
    async with LocalSession(line_agent(build)) as s:
        await s.emit(LogMetric(name="latency_ms", value=42))
        await s.emit(CustomReceived(metadata={"not": "registered"}))
        await wait_for(lambda: "latency_ms" in caplog.text)
    records = [r.getMessage() for r in caplog.records if r.name == "bargein.line.observability"]
    assert records == ["LogMetric from user: {'name': 'latency_ms', 'value': 42}"]


def test_register_observability_event_rejects_non_events() -> None:
    with pytest.raises(TypeError):
        register_observability_event(Bridge(Node()), None, dict)  # type: ignore[arg-type]
