"""The bus message handed to routes, filters, conditions and interrupt handlers, and who sent it.

It mirrors Cartesia Line 0.1's ``Message`` (``.event``, ``.source``, ``.id``, ``.timestamp``) so
Line-style handlers run unchanged, and adds where the event sits in the session (session, turn,
seq, epoch) so handlers can reason about turns without reaching for the envelope. How a message
crosses the wire is the wire layer's business (:mod:`bargein.wire.envelope`), not this one's.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Final

from bargein.agent.events import Event


class Source:
    """Who put an event on the bus (``Message.source``, ``Envelope.source``).

    Agent output carries the id of the node that produced it; everything else carries one of these.
    Events from the caller's side of the call are accepted by every bridge, even one that
    :meth:`~bargein.agent.routes.Bridge.authorize`\\ d only some nodes.
    """

    USER: Final = "user"  # the caller (a test's Caller, or a client edge publishing on its behalf)
    EDGE: Final = "edge"  # the client edge itself: delivery reports, hang-ups
    SPEECH: Final = "speech"  # the speech tier: the caller's turn events and transcripts
    STOP_BUTTON: Final = "stop-button"  # a client's stop button: a barge-in that is not speech
    SYSTEM: Final = "system"  # the runtime itself (the greeting a Line-style agent sends first)

    CALLER_SIDE: Final = frozenset({USER, EDGE, SPEECH, STOP_BUTTON})


@dataclass(frozen=True)
class Message:
    event: Event
    source: str = Source.USER
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    timestamp: float = field(default_factory=time.time)
    session: str = ""
    turn: int = 0
    seq: int = 0
    epoch: int = 0
    trace: dict[str, str] = field(default_factory=dict)

    @property
    def from_caller_side(self) -> bool:
        return self.source in Source.CALLER_SIDE
