"""``line.utils.gemini_utils``: a conversation's events as Gemini ``contents``, and their log form.

A node that calls Gemini itself (``google.genai``) builds its request from the node's history;
:func:`convert_messages_to_gemini` does that the way Line did, so a migrated node sends the model
the same conversation. In bargein the history is the committed one (an interrupted answer is cut to
what the caller heard), so the model is not told it said words the caller never got.

The mapping, as in Line: caller transcripts and DTMF input are user content, the agent's responses
and DTMF output are model content, and a tool result is model content with a function response
(left out when it would be the first message, which Gemini rejects). Other events are dropped
unless ``handlers`` says how to convert their type.

``google-genai`` is optional for bargein (the ``line`` extra): it is imported when these functions
run, not when the module is, so importing this module costs nothing and fails on nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from bargein.agent.events import (
    AgentResponse,
    DTMFInputEvent,
    DTMFOutputEvent,
    Event,
    ToolResult,
    UserTranscriptionReceived,
)

if TYPE_CHECKING:
    from google.genai import types

__all__ = [
    "GeminiMessage",
    "convert_messages_to_gemini",
    "log_gemini_messages",
    "message_to_str",
    "serialize_part",
]

log = logging.getLogger(__name__)

GeminiMessage: TypeAlias = "types.Content | dict[str, Any]"
"""One entry of a request's ``contents``: a ``Content``, or what a handler returns for its type."""

_TEXT_EVENTS = (AgentResponse, UserTranscriptionReceived)


def _missing_genai(what: str) -> ImportError:
    return ImportError(f"{what} needs the google-genai package: pip install 'bargein[line]'")


def convert_messages_to_gemini(
    events: Sequence[Event],
    handlers: Mapping[type[Event], Callable[[Event], GeminiMessage]] | None = None,
    text_events_only: bool = False,
) -> list[GeminiMessage]:
    """The ``contents`` of a Gemini request for a conversation's ``events``.

    ``handlers`` maps an event class (the exact class, not its subclasses) to a function returning
    that event's entry; it takes precedence over the built-in mapping. With ``text_events_only``
    only ``AgentResponse`` and ``UserTranscriptionReceived`` events are kept (before any handler).
    """
    try:
        from google.genai import types
    except ImportError as exc:
        raise _missing_genai("convert_messages_to_gemini") from exc

    convert = dict(handlers or {})
    contents: list[GeminiMessage] = []
    for event in events:
        kind = type(event)
        if text_events_only and kind not in _TEXT_EVENTS:
            continue
        if kind in convert:
            contents.append(convert[kind](event))
        elif isinstance(event, UserTranscriptionReceived):
            contents.append(types.UserContent(parts=[types.Part.from_text(text=event.content)]))
        elif isinstance(event, AgentResponse):
            if event.content:  # an answer that said nothing (bargein keeps its place in the history)
                contents.append(types.ModelContent(parts=[types.Part.from_text(text=event.content)]))
        elif isinstance(event, DTMFInputEvent):
            contents.append(types.UserContent(parts=[types.Part.from_text(text=event.button)]))
        elif isinstance(event, DTMFOutputEvent):
            contents.append(types.ModelContent(parts=[types.Part.from_text(text=event.button)]))
        elif isinstance(event, ToolResult):
            if not contents:  # Gemini answers 400 to a request that opens with a function response
                log.debug("dropping a ToolResult (%s) that would open the contents", event.tool_name)
                continue
            response = types.Part.from_function_response(
                name=event.tool_name or "unknown_tool", response={"output": event.result}
            )
            contents.append(types.ModelContent(parts=[response]))
    log.debug("converted %d events to %d Gemini contents", len(events), len(contents))
    return contents


def log_gemini_messages(
    message: str, gemini_messages: Iterable[types.Content], statistics: object | None = None
) -> None:
    """Log ``gemini_messages`` at INFO as one readable block titled ``message`` (with
    ``statistics`` under it, when given): what a node sent to the model or got back."""
    block = f"\n====== BEGIN {message} ======\n{message_to_str(gemini_messages)}"
    if statistics:
        block += f"\n[Statistics: {statistics}]\n"
    block += f"======== END {message} =========\n"
    log.info("Logging Gemini messages: %s", block)


def message_to_str(gemini_messages: Iterable[types.Content]) -> str:
    """Render contents one per line as ``role: text``, with a blank line after each user line that
    follows a model line (so each exchange stands apart). Several parts render as a JSON list."""
    try:
        from google.genai import types
    except ImportError as exc:
        raise _missing_genai("message_to_str") from exc

    lines = ""
    previous_role: str | None = None
    for content in gemini_messages:
        if isinstance(content, types.UserContent):
            role = "user"
        elif isinstance(content, types.ModelContent):
            role = "model"
        else:  # a plain Content says its role itself
            role = content.role or "unknown"
        parts = [serialize_part(part) for part in content.parts or []]
        body = parts[0] if len(parts) == 1 else json.dumps(parts, indent=2)
        lines += f"{role}: {body}\n"
        if role == "user" and previous_role == "model":
            lines += "\n"
        previous_role = role
    return lines


def serialize_part(part: types.Part) -> str:
    """A part as text: its text, ``[function call] name({args})``, ``[function response] name:
    {response}``, or ``[unsupported part type] ...`` for anything else (images, code...)."""
    if part.text is not None and part.text.strip():
        return part.text
    if part.function_call is not None:
        call = part.function_call
        args = json.dumps(dict(call.args), indent=2, default=str) if call.args else "{}"
        return f"[function call] {call.name}({args})"
    if part.function_response is not None:
        reply = part.function_response
        response = json.dumps(dict(reply.response), indent=2, default=str) if reply.response else "{}"
        return f"[function response] {reply.name}: {response}"
    return f"[unsupported part type] {part}"
