"""``line.events``: the events of Cartesia Line 0.1, under the names and fields Line gave them.

These are bargein's own event classes (:mod:`bargein.agent.events`), not copies: an agent that imports
``UserStartedSpeaking`` from here and one that imports it from ``bargein`` talk about the same class,
so migrated and native agents can share a session.

What differs from Line, and why:

* Every event is an :class:`Event` (a pydantic model registered by class name). Line's events were
  plain ``BaseModel`` s because they never left the process; bargein's travel between processes, so
  the wire name must map back to a class. Your own events subclass :class:`Event` too.
* ``AgentHandoff`` is delivered to bridges (Line's bus swallowed it) and overtakes queued work, so
  ``interrupt_on(AgentHandoff)`` works.
* ``EmergencyStop`` is bargein's; Line had none. ``Authorize`` and ``LogEvent`` are not provided
  (see docs/migrating-from-line.md).

``EventType``, ``EventInstance`` and ``EventTypeOrAlias`` are the type aliases Line's annotations
used; they are kept so annotated agent code still imports.
"""

from __future__ import annotations

from typing import TypeAlias

from bargein.agent.events import (
    AgentError,
    AgentGenerationComplete,
    AgentHandoff,
    AgentResponse,
    AgentSpeechSent,
    AgentStartedSpeaking,
    AgentStoppedSpeaking,
    CustomReceived,
    DTMFInputEvent,
    DTMFOutputEvent,
    DTMFStoppedEvent,
    EmergencyStop,
    EndCall,
    Event,
    LogMetric,
    ToolCall,
    ToolResult,
    TransferCall,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    UserUnknownInputReceived,
)

EventType: TypeAlias = type[Event]
"""An event class (Line: ``Type[T]``)."""

EventInstance: TypeAlias = Event
"""An event object (Line: ``T``)."""

EventTypeOrAlias: TypeAlias = type[Event] | str
"""A class, or a string pattern over :class:`EventsRegistry` aliases (``"user.*"``, ``"*"``)."""


class EventsRegistry:
    """Line's registry of string aliases for event classes (``bridge.on("user.*")`` matches the
    classes whose alias fits the pattern). One per process, as Line's was."""

    events: dict[type, str] = {}

    @classmethod
    def register(cls, alias: str, event_type: type) -> None:
        if event_type in cls.events:
            raise ValueError(f"{event_type.__name__} already has the alias {cls.events[event_type]!r}")
        if not isinstance(alias, str):
            raise TypeError(f"an alias is a string, got {alias!r}")
        cls.events[event_type] = alias

    @classmethod
    def get(cls, event_type: type) -> str | None:
        return cls.events.get(event_type)


__all__ = [
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
    "DTMFStoppedEvent",
    "EmergencyStop",
    "EndCall",
    "Event",
    "EventInstance",
    "EventType",
    "EventTypeOrAlias",
    "EventsRegistry",
    "LogMetric",
    "ToolCall",
    "ToolResult",
    "TransferCall",
    "UserStartedSpeaking",
    "UserStoppedSpeaking",
    "UserTranscriptionReceived",
    "UserUnknownInputReceived",
]
