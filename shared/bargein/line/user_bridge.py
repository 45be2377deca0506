"""``line.user_bridge``: :func:`register_observability_event`.

In Line the "user bridge" was a bridge wrapped around the WebSocket harness, and this function made it
forward an event type to Cartesia's call log. bargein has no user bridge (the speaking node's output
goes to the client edge) and no platform log, so the equivalent is to log every such event the given
bridge hears with the standard :mod:`logging` module (logger ``bargein.line.observability``).
"""

from __future__ import annotations

import logging
from typing import Any

from bargein.agent.events import Event
from bargein.agent.message import Message
from bargein.agent.routes import Bridge

log = logging.getLogger("bargein.line.observability")

__all__ = ["register_observability_event"]


def register_observability_event(
    bridge: Bridge, harness: Any = None, event_type: type[Event] | None = None
) -> None:
    """Log each ``event_type`` event ``bridge`` receives (name and fields). ``harness`` is Line's
    WebSocket harness; bargein has none, so it is accepted and ignored."""
    if event_type is None or not (isinstance(event_type, type) and issubclass(event_type, Event)):
        raise TypeError(f"register_observability_event needs an Event subclass, got {event_type!r}")

    def record(message: Message) -> None:
        log.info(
            "%s from %s: %s",
            type(message.event).__name__,
            message.source,
            message.event.model_dump(mode="json"),
        )

    bridge.on(event_type).map(record)
