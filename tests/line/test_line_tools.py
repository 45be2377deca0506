"""``bargein.line.tools``: Line 0.1's tool declarations (``EndCallTool``, ``DTMFToolCall``,
``TransferToolCall``) and ``ToolDefinition`` with exactly Line's abstract methods, so tool classes
written for Line instantiate unchanged; plus the module paths of ``line.utils`` and ``line.evals``."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from google.genai import types

import bargein.line.tools as tools
from bargein.line.events import EndCall
from bargein.line.tools.system_tools import DTMF_BUTTONS, DTMFToolCall, EndCallTool, TransferToolCall
from bargein.line.tools.tool_types import ToolDefinition, anthropic_tool_from_openai


class WeatherTool(ToolDefinition):
    """A user's tool as Line's docs wrote one: the four class methods, nothing else."""

    @classmethod
    def name(cls) -> str:
        return "get_weather"

    @classmethod
    def description(cls) -> str:
        return "The weather in a city."

    @classmethod
    def to_gemini_tool(cls) -> Any:
        return None

    @classmethod
    def to_openai_tool(cls) -> dict[str, object]:
        return {
            "type": "function",
            "name": cls.name(),
            "description": cls.description(),
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }


class PerRegionTool(ToolDefinition):
    """A user's tool declared per instance, in TransferToolCall's style."""

    def __init__(self, region: str) -> None:
        self.region = region

    @classmethod
    def name(cls) -> str:
        return "regional"

    def description(self) -> str:  # type: ignore[override]
        return f"Looks things up in {self.region}."

    def to_gemini_tool(self) -> Any:  # type: ignore[override]
        return None

    def to_openai_tool(self) -> dict[str, object]:  # type: ignore[override]
        return {"type": "function", "function": {"name": self.name(), "description": self.description()}}


def test_tool_definition_has_exactly_lines_abstract_methods() -> None:
    assert ToolDefinition.__abstractmethods__ == {"name", "description", "to_gemini_tool", "to_openai_tool"}


def test_line_tool_classes_and_line_style_subclasses_instantiate() -> None:
    for tool in (
        EndCallTool(),
        DTMFToolCall(),
        TransferToolCall(["+15550100"]),
        WeatherTool(),
        PerRegionTool("EU"),
    ):
        assert isinstance(tool, ToolDefinition)

    class Incomplete(ToolDefinition):
        @classmethod
        def name(cls) -> str:
            return "x"

    with pytest.raises(TypeError):
        Incomplete()  # type: ignore[abstract]


def test_to_anthropic_tool_is_derived_from_the_openai_declaration_on_classes_and_instances() -> None:
    expected = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    assert WeatherTool.to_anthropic_tool() == expected
    assert WeatherTool().to_anthropic_tool() == expected
    assert PerRegionTool("EU").to_anthropic_tool() == {  # the chat completions shape works too
        "name": "regional",
        "description": "Looks things up in EU.",
        "input_schema": {"type": "object", "properties": {}},
    }
    transfer: Any = TransferToolCall(["+15550100"]).to_anthropic_tool()
    assert transfer["input_schema"]["properties"]["target_phone_number"]["enum"] == ["+15550100"]
    assert "strict" not in transfer["input_schema"]
    assert anthropic_tool_from_openai({"name": "n", "parameters": {"type": "object", "strict": True}}) == {
        "name": "n",
        "description": "",
        "input_schema": {"type": "object"},
    }


def test_dtmf_tool_call_declares_the_keypad() -> None:
    assert DTMFToolCall.name() == "dtmf_tool_call" and DTMFToolCall.description()
    openai: Any = DTMFToolCall.to_openai_tool()
    assert (openai["type"], openai["name"], openai["strict"]) == ("function", "dtmf_tool_call", True)
    button = openai["parameters"]["properties"]["button"]
    assert button["enum"] == list(DTMF_BUTTONS) == [*"0123456789", "*", "#"]
    assert button["description"] == DTMFToolCall.parameters_description()
    assert openai["parameters"]["required"] == ["button"]
    assert openai["parameters"]["additionalProperties"] is False
    anthropic: Any = DTMFToolCall.to_anthropic_tool()
    assert anthropic["name"] == "dtmf_tool_call" and anthropic["input_schema"]["required"] == ["button"]


def test_transfer_tool_call_declares_only_its_numbers() -> None:
    tool = TransferToolCall(["+15550100", "+442071838750"])
    assert tool.name() == TransferToolCall.name() == "transfer_tool"
    assert tool.description() and tool.target_phone_numbers == ["+15550100", "+442071838750"]
    openai: Any = tool.to_openai_tool()
    number = openai["parameters"]["properties"]["target_phone_number"]
    assert number["enum"] == ["+15550100", "+442071838750"]
    assert number["description"] == TransferToolCall.parameters_description()
    assert openai["parameters"]["required"] == ["target_phone_number"]
    custom = TransferToolCall(["+15550100"], description="Send the caller to billing.")
    assert custom.description() == "Send the caller to billing." == custom.to_openai_tool()["description"]


@pytest.mark.parametrize("bad", ["5550100", "+1 555 0100", "+1234", ""])
def test_transfer_tool_call_refuses_numbers_that_are_not_e164(bad: str) -> None:
    with pytest.raises(ValueError, match=r"E\.164"):
        TransferToolCall(["+15550100", bad])


def test_gemini_declarations() -> None:
    for tool, parameter in (
        (EndCallTool.to_gemini_tool(), "goodbye_message"),
        (DTMFToolCall.to_gemini_tool(), "button"),
        (TransferToolCall(["+15550100"]).to_gemini_tool(), "target_phone_number"),
    ):
        assert isinstance(tool, types.Tool) and tool.function_declarations
        (declaration,) = tool.function_declarations
        assert declaration.parameters is not None and declaration.parameters.properties
        assert parameter in declaration.parameters.properties
    (transfer,) = TransferToolCall(["+15550100"]).to_gemini_tool().function_declarations
    assert transfer.name == "transfer_tool"
    assert transfer.parameters.properties["target_phone_number"].enum == ["+15550100"]


def test_the_package_exports_lines_names() -> None:
    for name in ("EndCall", "end_call", "EndCallArgs", "ToolDefinition", "DTMFToolCall", "TransferToolCall"):
        assert getattr(tools, name) is not None, name
    assert tools.EndCall is EndCall


LAYOUT = {
    "bargein.line.utils.aio": ["await_tasks_safe", "cancel_tasks_safe"],
    "bargein.line.utils.dtmf_lookahead_buffer": [
        "DTMFLookAheadCharacterBuffer",
        "DTMFLookAheadStringBuffer",
        "split_dtmf_output",
        "DTMF_EXPRESSION",
    ],
    "bargein.line.utils.gemini_utils": [
        "convert_messages_to_gemini",
        "log_gemini_messages",
        "message_to_str",
        "serialize_part",
    ],
    "bargein.line.utils.openai_utils": [
        "convert_messages_to_openai",
        "extract_text_from_response",
        "extract_tool_calls_from_response",
        "has_tool_calls",
    ],
    "bargein.line.utils.str": ["is_e164_phone_number"],
    "bargein.line.utils.log_aiter": ["log_afunc", "log_aiter_func", "context_log"],
    "bargein.line.evals": ["ConversationRunner", "AgentTurn", "Turn", "UserTurn"],
    "bargein.line.evals.conversation_runner": ["ConversationRunner"],
    "bargein.line.evals.turn": [
        "ToolCall",
        "Turn",
        "UserTurn",
        "AgentTurn",
        "make_turn",
        "load_conversation_json",
    ],
    "bargein.line.evals.similarity_utils": [
        "SimilarityResult",
        "is_statement_pattern",
        "extract_statement",
        "check_string_statement",
        "is_similar_str",
        "is_similar_via_statement_pattern",
        "is_similar_via_single_text_comparison",
        "is_similar_text",
        "is_similar_dict",
    ],
    "bargein.line.tools.system_tools": [
        "EndCall",
        "EndCallArgs",
        "EndCallTool",
        "end_call",
        "DTMFToolCall",
        "TransferToolCall",
    ],
}


@pytest.mark.parametrize("module", sorted(LAYOUT))
def test_line_module_paths_have_lines_names(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [name for name in LAYOUT[module] if not hasattr(mod, name)]
    assert missing == []
    assert all(hasattr(mod, name) for name in getattr(mod, "__all__", []))
