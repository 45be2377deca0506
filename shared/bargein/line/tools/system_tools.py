"""``line.tools.system_tools``: ending the call from a model's tool call.

``end_call(args)`` yields the goodbye as an ``AgentResponse`` and then ``EndCall``; in bargein the
client edge plays the goodbye and then ends the session, because ``EndCall`` is published after the
goodbye's chunks in the same ordered stream. :class:`EndCallTool` declares the tool to a model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, Field

from bargein.agent.events import AgentResponse, EndCall, Event
from bargein.line.tools.tool_types import ToolDefinition

__all__ = ["EndCallArgs", "EndCallTool", "end_call"]


class EndCallArgs(BaseModel):
    """The arguments a model passes to ``end_call``."""

    goodbye_message: str = Field(description="What to say to the caller before hanging up")


def _parameters() -> dict[str, Any]:
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
        return {
            "type": "function",
            "name": cls.name(),
            "description": cls.description(),
            "parameters": {**_parameters(), "additionalProperties": False},
            "strict": True,
        }

    @classmethod
    def to_anthropic_tool(cls) -> dict[str, object]:
        return {"name": cls.name(), "description": cls.description(), "input_schema": _parameters()}

    @classmethod
    def to_gemini_tool(cls) -> Any:
        """Needs the ``google-genai`` package, which bargein does not depend on."""
        try:
            from google.genai import types  # type: ignore[import-untyped, import-not-found, unused-ignore]
        except ImportError as exc:
            raise ImportError(
                "EndCallTool.to_gemini_tool() needs the google-genai package (pip install google-genai)"
            ) from exc
        return types.Tool(
            function_declarations=[
                types.FunctionDeclaration(
                    name=cls.name(), description=cls.description(), parameters=_parameters()
                )
            ]
        )


async def end_call(args: EndCallArgs) -> AsyncIterator[Event]:
    """Say the goodbye, then end the call."""
    yield AgentResponse(content=args.goodbye_message)
    yield EndCall()
