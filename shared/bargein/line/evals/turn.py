"""``line.evals.turn``: the turns of an expected conversation, and the comparison of an actual turn
with an expected one.

A conversation test is written as alternating :class:`UserTurn` and :class:`AgentTurn` objects (or
loaded from JSON with :func:`load_conversation_json`). A user turn becomes the event the node would
have received (``to_events``); what the node yields is folded back into a turn (``from_events``)
and compared with the expected agent turn (``is_similar``): role, text (by meaning, see
:mod:`~bargein.line.evals.similarity_utils`), tool calls with their arguments and results, and the
telephony events (key presses, transfers, hang-ups).

In :meth:`Turn.is_similar` the turn it is called on is the expected one, as
:class:`~bargein.line.evals.conversation_runner.ConversationRunner` calls it: an expected argument
of None accepts any value, and the error messages say "expected" of that turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from bargein.agent.events import (
    AgentResponse,
    DTMFOutputEvent,
    EndCall,
    Event,
    ToolResult,
    TransferCall,
    UserTranscriptionReceived,
)
from bargein.agent.events import ToolCall as ToolCallEvent
from bargein.line.evals.similarity_utils import is_similar_dict, is_similar_text

__all__ = [
    "AgentTurn",
    "TelephonyEvent",
    "ToolCall",
    "Turn",
    "UserTurn",
    "load_conversation_json",
    "make_turn",
]


def _telephony_kind(value: Any) -> str | None:
    """Which telephony event ``value`` is (an event, or its fields as read from JSON): bargein's
    ``TransferCall`` and ``EndCall`` have only optional fields, so the type cannot be guessed by
    trying each, and a key press is told by ``button``, a transfer by its number."""
    for kind in (DTMFOutputEvent, TransferCall, EndCall):
        if isinstance(value, kind):
            return kind.__name__
    if isinstance(value, Mapping):
        if "button" in value:
            return DTMFOutputEvent.__name__
        if "target_phone_number" in value or "timeout_s" in value:
            return TransferCall.__name__
        return EndCall.__name__
    return None


TelephonyEvent = Annotated[
    Annotated[DTMFOutputEvent, Tag("DTMFOutputEvent")]
    | Annotated[TransferCall, Tag("TransferCall")]
    | Annotated[EndCall, Tag("EndCall")],
    Discriminator(_telephony_kind),
]
"""What an agent does to the call rather than says: a key press, a transfer or a hang-up."""


class ToolCall(BaseModel):
    """A tool call within a turn: the tool, its arguments and (once run) its result."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any = None


class Turn(BaseModel):
    """One turn of a conversation. ``text`` may list several acceptable texts for an agent turn
    (any one matching is enough); a user turn has exactly one."""

    role: Literal["user", "assistant"]
    text: list[str] | str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    telephony_events: list[TelephonyEvent] = Field(default_factory=list)

    @property
    def is_user(self) -> bool:
        return self.role == "user"

    @property
    def is_agent(self) -> bool:
        return self.role == "assistant"

    def to_events(self) -> list[Event]:
        """The events this turn stands for in a node's history: the caller's transcript, or the
        agent's tool calls (each followed by its result, if it has one) and then its text (the first
        text, when several are listed). Telephony events are not part of the history."""
        if self.role == "user":
            if isinstance(self.text, str):
                return [UserTranscriptionReceived(content=self.text)]
            if len(self.text) != 1:
                raise RuntimeError(f"a user turn has exactly one text, this one has {len(self.text)}")
            return [UserTranscriptionReceived(content=self.text[0])]
        events: list[Event] = []
        for call in self.tool_calls:
            events.append(ToolCallEvent(tool_name=call.name, tool_args=call.arguments))
            if call.result is not None:
                events.append(ToolResult(tool_name=call.name, tool_args=call.arguments, result=call.result))
        if self.text:
            events.append(AgentResponse(content=self.text if isinstance(self.text, str) else self.text[0]))
        return events

    @classmethod
    def from_events(cls, events: Sequence[Event]) -> Turn:
        """Fold what a node yielded into a turn: text joined (and stripped), one tool call per tool
        name with its result, and the telephony events in order. The role is that of the last
        caller or agent event (the agent's when there is none)."""
        role: Literal["user", "assistant"] = "assistant"
        text = ""
        calls: dict[str, ToolCall] = {}
        telephony: list[DTMFOutputEvent | TransferCall | EndCall] = []
        for event in events:
            if isinstance(event, UserTranscriptionReceived):
                role, text = "user", text + event.content
            elif isinstance(event, AgentResponse):
                role, text = "assistant", text + event.content
            elif isinstance(event, ToolCallEvent):
                role = "assistant"
                calls[event.tool_name] = ToolCall(name=event.tool_name, arguments=event.tool_args)
            elif isinstance(event, ToolResult):
                role = "assistant"
                if event.tool_name in calls:
                    calls[event.tool_name].result = event.result
                else:  # a result whose call was not yielded
                    calls[event.tool_name] = ToolCall(
                        name=event.tool_name, arguments=event.tool_args, result=event.result
                    )
            elif isinstance(event, DTMFOutputEvent | TransferCall | EndCall):
                role = "assistant"
                telephony.append(event)
        return cls(role=role, text=text.strip(), tool_calls=list(calls.values()), telephony_events=telephony)

    def is_similar(self, other: Turn) -> str | None:
        """Compare ``other`` (what happened) with this turn (what was expected): None if it
        matches, otherwise what differs."""
        if self.role != other.role:
            return f"Role mismatch: expected '{self.role}', got '{other.role}'"
        if self.text or other.text:
            text = is_similar_text(self.text, other.text)
            if text.is_success is False:
                return f"Text mismatch: {text.error}"
        if len(self.tool_calls) != len(other.tool_calls):
            return f"Tool call count mismatch: expected {len(self.tool_calls)}, got {len(other.tool_calls)}"
        by_name = sorted(self.tool_calls, key=lambda c: c.name)
        for want, got in zip(by_name, sorted(other.tool_calls, key=lambda c: c.name), strict=True):
            if want.name != got.name:
                return f"Tool name mismatch: expected '{want.name}', got '{got.name}'"
            if want.arguments or got.arguments:
                arguments = is_similar_dict(got.arguments, want.arguments)
                if arguments.is_success is False:
                    return f"Tool '{want.name}' arguments mismatch: {arguments.error}"
            if want.result != got.result:
                return f"Tool '{want.name}' result mismatch: expected {want.result}, got {got.result}"
        if self.telephony_events != other.telephony_events:
            return (
                f"telephony_events mismatch: expected {self.telephony_events}, got {other.telephony_events}"
            )
        return None


class UserTurn(Turn):
    """What the caller says."""

    role: Literal["user"] = "user"


class AgentTurn(Turn):
    """What the agent is expected to say and do."""

    role: Literal["assistant"] = "assistant"


def make_turn(data: Mapping[str, Any]) -> UserTurn | AgentTurn:
    """A turn from its fields (as in a JSON file); ``role`` says which kind. Raises ``ValueError``
    for a role other than ``"user"`` or ``"assistant"``."""
    role = data.get("role")
    if role == "user":
        return UserTurn.model_validate(data)
    if role == "assistant":
        return AgentTurn.model_validate(data)
    raise ValueError(f"invalid role {role!r}: a turn's role is 'user' or 'assistant'")


def load_conversation_json(file_path: str | Path) -> list[UserTurn | AgentTurn]:
    """The turns of a conversation stored as a JSON list of turn objects."""
    with open(file_path, encoding="utf-8") as f:
        data = json.load(f)
    return [make_turn(item) for item in data]
