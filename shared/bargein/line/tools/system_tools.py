"""``line.tools.system_tools``: the tools a model uses to act on the call itself.

* ``end_call``: :class:`EndCallTool` declares it, :func:`end_call` carries it out. It yields the
  goodbye as an ``AgentResponse`` and then ``EndCall``; in bargein the client edge plays the goodbye
  and then ends the session, because ``EndCall`` is published after the goodbye's chunks in the same
  ordered stream.
* :class:`DTMFToolCall` declares a key press (``button``, one of ``0-9 * #``); the node answers the
  call with ``DTMFOutputEvent(button=...)``.
* :class:`TransferToolCall` declares a transfer to one of the phone numbers it was built with
  (checked to be E.164, since telephony dials them as written); the node answers the call with
  ``TransferCall(target_phone_number=...)``.

Each declaration comes in OpenAI's Responses format, Gemini's (with ``google-genai`` installed) and
Anthropic's (derived from the OpenAI one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field

from bargein.agent.events import AgentResponse, EndCall, Event
from bargein.line.tools.tool_types import ToolDefinition, gemini_function_tool
from bargein.line.utils.str import is_e164_phone_number

__all__ = [
    "DTMF_BUTTONS",
    "DTMFToolCall",
    "EndCall",
    "EndCallArgs",
    "EndCallTool",
    "TransferToolCall",
    "end_call",
]

DTMF_BUTTONS: tuple[str, ...] = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "*", "#")
"""The keys of a phone keypad, the only values :class:`DTMFToolCall` lets a model choose."""


def _openai_function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, object]:
    """A strict Responses API function tool: every property required, nothing else accepted."""
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {**parameters, "additionalProperties": False},
        "strict": True,
    }


class EndCallArgs(BaseModel):
    """The arguments a model passes to ``end_call``."""

    goodbye_message: str = Field(description="What to say to the caller before hanging up")


def _end_call_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "goodbye_message": {
                "type": "string",
                "description": EndCallArgs.model_fields["goodbye_message"].description,
            }
        },
        "required": ["goodbye_message"],
    }


class EndCallTool(ToolDefinition):
    """Declares ``end_call`` so a model can decide to hang up."""

    @classmethod
    def name(cls) -> str:
        return "end_call"

    @classmethod
    def description(cls) -> str:
        return (
            "Hang up. Use it once the caller has said goodbye or confirmed they need nothing else; put "
            "your farewell in goodbye_message instead of saying it separately."
        )

    @classmethod
    def to_openai_tool(cls) -> dict[str, object]:
        return _openai_function(cls.name(), cls.description(), _end_call_parameters())

    @classmethod
    def to_anthropic_tool(cls) -> dict[str, object]:
        return {"name": cls.name(), "description": cls.description(), "input_schema": _end_call_parameters()}

    @classmethod
    def to_gemini_tool(cls) -> Any:
        """Needs the ``google-genai`` package (bargein's ``line`` extra)."""
        return gemini_function_tool(cls.name(), cls.description(), _end_call_parameters())


async def end_call(args: EndCallArgs) -> AsyncIterator[Event]:
    """Say the goodbye, then end the call."""
    yield AgentResponse(content=args.goodbye_message)
    yield EndCall()


class DTMFToolCall(ToolDefinition):
    """Declares ``dtmf_tool_call``: press one key of the keypad (``button``), e.g. to pick an option
    an automated phone menu reads out."""

    @classmethod
    def name(cls) -> str:
        return "dtmf_tool_call"

    @classmethod
    def description(cls) -> str:
        return (
            "Press a key on the phone keypad (send a DTMF tone). Use it when an automated phone system "
            "asks you to press a button and you know which option you need."
        )

    @classmethod
    def parameters_description(cls) -> str:
        """How the ``button`` parameter is described to the model."""
        return "The keypad button to press"

    @classmethod
    def _parameters(cls) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "button": {
                    "type": "string",
                    "description": cls.parameters_description(),
                    "enum": list(DTMF_BUTTONS),
                }
            },
            "required": ["button"],
        }

    @classmethod
    def to_gemini_tool(cls) -> Any:
        """Needs the ``google-genai`` package (bargein's ``line`` extra)."""
        return gemini_function_tool(cls.name(), cls.description(), cls._parameters())

    @classmethod
    def to_openai_tool(cls) -> dict[str, object]:
        return _openai_function(cls.name(), cls.description(), cls._parameters())


class TransferToolCall(ToolDefinition):
    """Declares ``transfer_tool``: transfer the call to one of ``target_phone_numbers`` (the model
    may pick only these). Unlike Line's other tools it is declared per instance, since the numbers
    belong to the agent's configuration; ``description`` overrides the default description.

    Raises ``ValueError`` if a number is not in E.164 form (``+`` and 5 to 15 digits).
    """

    def __init__(self, target_phone_numbers: list[str], description: str | None = None) -> None:
        for number in target_phone_numbers:
            if not is_e164_phone_number(number):
                raise ValueError(f"transfer destination {number!r} is not an E.164 phone number")
        self.target_phone_numbers = target_phone_numbers
        self._description = description

    @classmethod
    def name(cls) -> str:
        return "transfer_tool"

    def description(self) -> str:  # type: ignore[override]  # per instance, as in Line
        return self._description or "Transfer the call to the destination phone number."

    @classmethod
    def parameters_description(cls) -> str:
        """How the ``target_phone_number`` parameter is described to the model."""
        return "The phone number to transfer the call to"

    def _parameters(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "target_phone_number": {
                    "type": "string",
                    "description": self.parameters_description(),
                    "enum": list(self.target_phone_numbers),
                }
            },
            "required": ["target_phone_number"],
        }

    def to_gemini_tool(self) -> Any:  # type: ignore[override]  # per instance, as in Line
        """Needs the ``google-genai`` package (bargein's ``line`` extra)."""
        return gemini_function_tool(self.name(), self.description(), self._parameters())

    def to_openai_tool(self) -> dict[str, object]:  # type: ignore[override]  # per instance, as in Line
        return _openai_function(self.name(), self.description(), self._parameters())
