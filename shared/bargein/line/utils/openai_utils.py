"""``line.utils.openai_utils``: a conversation's events as OpenAI Responses API input, and the
text and tool calls out of a response.

For nodes that call OpenAI's Responses API themselves (bargein's own LLM client speaks the chat
completions format instead; see :meth:`ConversationContext.format_messages`). The mapping is Line's:
the caller's transcripts are ``user`` messages, the agent's responses ``assistant`` messages, a
:class:`ToolCall` is replayed as the raw output item the model produced (``raw_response``, which
:func:`extract_tool_calls_from_response` fills in), and a :class:`ToolResult` with a
``tool_call_id`` becomes a ``function_call_output``. Events of other types are dropped unless
``handlers`` converts them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)

from bargein.agent.events import AgentResponse, Event, ToolCall, ToolResult, UserTranscriptionReceived

__all__ = [
    "convert_messages_to_openai",
    "extract_text_from_response",
    "extract_tool_calls_from_response",
    "has_tool_calls",
]


def convert_messages_to_openai(
    events: Sequence[Event],
    handlers: Mapping[type[Event], Callable[[Event], dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The ``input`` items of a Responses API request for a conversation's ``events``.

    ``handlers`` maps an event class (exactly that class) to a function returning its item, and
    takes precedence over the built-in mapping. A ``ToolCall`` without ``raw_response`` and a
    ``ToolResult`` without ``tool_call_id`` are left out: the API cannot pair them.
    """
    convert = dict(handlers or {})
    items: list[dict[str, Any]] = []
    for event in events:
        kind = type(event)
        if kind in convert:
            items.append(convert[kind](event))
        elif isinstance(event, AgentResponse):
            if event.content:  # an answer that said nothing (bargein keeps its place in the history)
                items.append({"role": "assistant", "content": event.content})
        elif isinstance(event, UserTranscriptionReceived):
            items.append({"role": "user", "content": event.content})
        elif isinstance(event, ToolCall):
            if event.raw_response:
                items.append(event.raw_response)
        elif isinstance(event, ToolResult) and event.tool_call_id:
            items.append(
                {"type": "function_call_output", "call_id": event.tool_call_id, "output": event.result_str}
            )
    return items


def extract_text_from_response(response: Response) -> str:
    """All the text of a response's output messages, refusals included, in order."""
    text = ""
    for item in response.output:
        if isinstance(item, ResponseOutputMessage):
            for content in item.content:
                if isinstance(content, ResponseOutputText):
                    text += content.text
                elif isinstance(content, ResponseOutputRefusal):
                    text += content.refusal
    return text


def extract_tool_calls_from_response(response: Response) -> list[ToolCall]:
    """The function calls in a response, as ``ToolCall`` events: the name, the parsed arguments,
    the output item's ``id`` as ``tool_call_id`` (as Line had it) and the item itself as
    ``raw_response``, so :func:`convert_messages_to_openai` can replay it."""
    return [
        ToolCall(
            tool_name=item.name,
            tool_args=json.loads(item.arguments),
            tool_call_id=item.id,
            # The API's own field names, unset ones left out, so the item can be sent back as input.
            raw_response=item.model_dump(by_alias=True, exclude_none=True),
        )
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall)
    ]


def has_tool_calls(response: Response) -> bool:
    """Whether the response asks for any function call."""
    return any(isinstance(item, ResponseFunctionToolCall) for item in response.output)
